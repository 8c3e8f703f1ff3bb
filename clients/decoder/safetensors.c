/* The safetensors reader: maps a weights file and checks its header against the bytes before
 * any tensor is handed out. The JSON is parsed by cJSON; every rule here is the format's own
 * (the reference implementation rejects the same files). */
#include "clients/decoder/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/codec/error.h"
#include "access/codec/half.h"

/* Bytes of the little-endian header length that opens every file. */
#define S_PREFIX_BYTES 8
/* JSON numbers are doubles: integers above 2^53 are not exact, so no offset may exceed it. */
#define S_MAX_EXACT_INT 9007199254740992.0

typedef struct {
    kvedge_safetensors_tensor_t pub;
    uint64_t begin, end; /* data_offsets, relative to the data section */
} s_tensor_t;

struct _kvedge_safetensors_t {
    uint8_t *map;                             /* the mmap'd file, or NULL */
    size_t map_len;                           /* its length */
    uint8_t *copy;                            /* the bytes given to parse, or NULL */
    cJSON *json;                              /* parsed header; owns tensor names */
    const cJSON *meta;                        /* __metadata__ object inside json, or NULL */
    s_tensor_t *tensors;                      /* in ascending offset order */
    const s_tensor_t **by_name;               /* the tensors sorted by name */
    size_t count;                             /* tensors */
    char err[KVEDGE_SAFETENSORS_ERROR_BYTES]; /* detail of the last failure */
};

kvedge_safetensors_t *kvedge_safetensors_new(void)
{
    return calloc(1, sizeof(kvedge_safetensors_t));
}

/* Drops whatever a failed or finished parse left behind, keeping the error text. */
static void s_reset(kvedge_safetensors_t *self)
{
    free(self->by_name);
    free(self->tensors);
    cJSON_Delete(self->json);
    free(self->copy);
    if (self->map)
        munmap(self->map, self->map_len);
    self->by_name = NULL;
    self->tensors = NULL;
    self->json = NULL;
    self->meta = NULL;
    self->copy = NULL;
    self->map = NULL;
    self->map_len = 0;
    self->count = 0;
}

void kvedge_safetensors_destroy(kvedge_safetensors_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    s_reset(*self_p);
    free(*self_p);
    *self_p = NULL;
}

__attribute__((format(printf, 3, 4))) static int s_fail(kvedge_safetensors_t *self, int rc,
                                                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->err, sizeof self->err, fmt, ap);
    va_end(ap);
    return rc;
}

const char *kvedge_safetensors_error(const kvedge_safetensors_t *self)
{
    return self ? self->err : "";
}

size_t kvedge_safetensors_dtype_size(kvedge_safetensors_dtype_t dtype)
{
    switch (dtype) {
    case KVEDGE_SAFETENSORS_F32:
        return 4;
    case KVEDGE_SAFETENSORS_F16:
    case KVEDGE_SAFETENSORS_BF16:
        return 2;
    }
    return 0;
}

const char *kvedge_safetensors_dtype_name(kvedge_safetensors_dtype_t dtype)
{
    switch (dtype) {
    case KVEDGE_SAFETENSORS_F32:
        return "F32";
    case KVEDGE_SAFETENSORS_F16:
        return "F16";
    case KVEDGE_SAFETENSORS_BF16:
        return "BF16";
    }
    return NULL;
}

/* A JSON number that is a non-negative integer represented exactly. */
static bool s_json_uint(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item))
        return false;
    double d = item->valuedouble;
    if (!isfinite(d) || d < 0 || d > S_MAX_EXACT_INT || floor(d) != d)
        return false;
    *out = (uint64_t)d;
    return true;
}

/* Fills t from one header entry; checks everything that concerns the entry alone. */
static int s_parse_entry(kvedge_safetensors_t *self, const cJSON *entry, uint64_t data_len,
                         s_tensor_t *t)
{
    const char *name = entry->string;
    if (!cJSON_IsObject(entry))
        return s_fail(self, KVEDGE_ECORRUPT, "tensor '%.64s': entry is not an object", name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets))
        return s_fail(self, KVEDGE_ECORRUPT,
                      "tensor '%.64s': needs string dtype, array shape and array data_offsets",
                      name);

    memset(t, 0, sizeof *t);
    t->pub.name = name;
    static const kvedge_safetensors_dtype_t dtypes[] = {
        KVEDGE_SAFETENSORS_F32, KVEDGE_SAFETENSORS_F16, KVEDGE_SAFETENSORS_BF16};
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtype->valuestring, kvedge_safetensors_dtype_name(dtypes[i])) == 0)
            t->pub.dtype = dtypes[i];
    if (t->pub.dtype == 0)
        return s_fail(self, KVEDGE_EINVAL,
                      "tensor '%.64s': dtype '%.16s' is not supported (F32, F16, BF16 are)", name,
                      dtype->valuestring);

    int ndim = cJSON_GetArraySize(shape);
    if (ndim > KVEDGE_SAFETENSORS_MAX_DIMS)
        return s_fail(self, KVEDGE_ECORRUPT, "tensor '%.64s': %d dimensions, at most %d", name,
                      ndim, KVEDGE_SAFETENSORS_MAX_DIMS);
    t->pub.ndim = (uint32_t)ndim;
    uint64_t numel = 1;
    bool zero = false, huge = false;
    const cJSON *dim;
    int d = 0;
    cJSON_ArrayForEach(dim, shape)
    {
        uint64_t v;
        if (!s_json_uint(dim, &v))
            return s_fail(self, KVEDGE_ECORRUPT, "tensor '%.64s': shape[%d] is not a count", name,
                          d);
        if (v == 0)
            zero = true;
        else if (__builtin_mul_overflow(numel, v, &numel))
            huge = true;
        t->pub.shape[d++] = v;
    }
    size_t esz = kvedge_safetensors_dtype_size(t->pub.dtype);
    if (zero)
        numel = 0;
    else if (huge || numel > data_len / esz)
        return s_fail(self, KVEDGE_ECORRUPT,
                      "tensor '%.64s': shape needs more bytes than the %llu-byte data section",
                      name, (unsigned long long)data_len);
    t->pub.numel = numel;

    if (cJSON_GetArraySize(offsets) != 2 ||
        !s_json_uint(cJSON_GetArrayItem(offsets, 0), &t->begin) ||
        !s_json_uint(cJSON_GetArrayItem(offsets, 1), &t->end))
        return s_fail(self, KVEDGE_ECORRUPT, "tensor '%.64s': data_offsets is not [begin, end]",
                      name);
    if (t->begin > t->end || t->end > data_len)
        return s_fail(self, KVEDGE_ECORRUPT,
                      "tensor '%.64s': data_offsets [%llu, %llu] outside the %llu data bytes", name,
                      (unsigned long long)t->begin, (unsigned long long)t->end,
                      (unsigned long long)data_len);
    if (numel * esz != t->end - t->begin)
        return s_fail(self, KVEDGE_ECORRUPT,
                      "tensor '%.64s': shape needs %llu bytes but data_offsets span %llu", name,
                      (unsigned long long)(numel * esz), (unsigned long long)(t->end - t->begin));
    t->pub.nbytes = (size_t)(t->end - t->begin);
    return KVEDGE_OK;
}

static int s_cmp_offset(const void *a, const void *b)
{
    const s_tensor_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int s_cmp_name(const void *a, const void *b)
{
    const s_tensor_t *x = *(const s_tensor_t *const *)a, *y = *(const s_tensor_t *const *)b;
    return strcmp(x->pub.name, y->pub.name);
}

/* Parses the file image buf[0..len), which the reader already owns. */
static int s_parse(kvedge_safetensors_t *self, const uint8_t *buf, size_t len)
{
    if (len < S_PREFIX_BYTES)
        return s_fail(self, KVEDGE_ETRUNCATED, "%zu bytes: shorter than the 8-byte header length",
                      len);
    uint64_t hlen = 0;
    for (int i = 0; i < S_PREFIX_BYTES; i++)
        hlen |= (uint64_t)buf[i] << (8 * i);
    if (hlen > KVEDGE_SAFETENSORS_MAX_HEADER_BYTES)
        return s_fail(self, KVEDGE_ETOOBIG, "header length %llu over the %u-byte limit",
                      (unsigned long long)hlen, KVEDGE_SAFETENSORS_MAX_HEADER_BYTES);
    if (hlen > len - S_PREFIX_BYTES)
        return s_fail(self, KVEDGE_ETRUNCATED, "header of %llu bytes runs past the %zu-byte file",
                      (unsigned long long)hlen, len);
    const char *hdr = (const char *)buf + S_PREFIX_BYTES;
    const uint8_t *data = buf + S_PREFIX_BYTES + hlen;
    uint64_t data_len = len - S_PREFIX_BYTES - hlen;

    /* cJSON gets a NUL-terminated copy, so no parser path can read past the header. */
    char *text = malloc((size_t)hlen + 1);
    if (!text)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory for a %llu-byte header",
                      (unsigned long long)hlen);
    memcpy(text, hdr, (size_t)hlen);
    text[hlen] = '\0';
    const char *end = NULL;
    self->json = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, false);
    ptrdiff_t stop = end ? end - text : 0;
    free(text);
    if (!self->json)
        return s_fail(self, KVEDGE_ECORRUPT, "header is not valid JSON (near byte %td)", stop);
    /* Writers pad the header with spaces to align the data; anything else after it is not
     * a safetensors file. */
    for (const char *p = hdr + stop; p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return s_fail(self, KVEDGE_ECORRUPT, "bytes after the JSON header at byte %td",
                          p - hdr);
    if (!cJSON_IsObject(self->json))
        return s_fail(self, KVEDGE_ECORRUPT, "header is not a JSON object");

    size_t n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, self->json)
    {
        if (item->string && strcmp(item->string, "__metadata__") == 0) {
            if (self->meta || !cJSON_IsObject(item))
                return s_fail(self, KVEDGE_ECORRUPT, "__metadata__ is repeated or not an object");
            const cJSON *kv;
            cJSON_ArrayForEach(kv, item)
            {
                if (!cJSON_IsString(kv))
                    return s_fail(self, KVEDGE_ECORRUPT, "__metadata__ value is not a string");
            }
            self->meta = item;
        } else {
            n++;
        }
    }
    self->tensors = calloc(n ? n : 1, sizeof *self->tensors);
    self->by_name = calloc(n ? n : 1, sizeof *self->by_name);
    if (!self->tensors || !self->by_name)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory for %zu tensors", n);
    cJSON_ArrayForEach(item, self->json)
    {
        if (item == self->meta)
            continue;
        int rc = s_parse_entry(self, item, data_len, &self->tensors[self->count]);
        if (rc != KVEDGE_OK)
            return rc;
        self->count++;
    }

    /* The format forbids overlaps and holes: the tensors tile the data section exactly. */
    qsort(self->tensors, n, sizeof *self->tensors, s_cmp_offset);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        s_tensor_t *t = &self->tensors[i];
        if (t->begin != at)
            return s_fail(self, KVEDGE_ECORRUPT, "tensor '%.64s' at byte %llu %s byte %llu",
                          t->pub.name, (unsigned long long)t->begin,
                          t->begin < at ? "overlaps the tensor ending at" : "leaves a hole after",
                          (unsigned long long)at);
        at = t->end;
        t->pub.data = data + t->begin;
    }
    if (at != data_len)
        return s_fail(self, KVEDGE_ECORRUPT, "%llu data bytes after the last tensor",
                      (unsigned long long)(data_len - at));

    for (size_t i = 0; i < n; i++)
        self->by_name[i] = &self->tensors[i];
    qsort(self->by_name, n, sizeof *self->by_name, s_cmp_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(self->by_name[i]->pub.name, self->by_name[i - 1]->pub.name) == 0)
            return s_fail(self, KVEDGE_ECORRUPT, "tensor name '%.64s' appears twice",
                          self->by_name[i]->pub.name);
    return KVEDGE_OK;
}

int kvedge_safetensors_parse(kvedge_safetensors_t *self, const uint8_t *buf, size_t len)
{
    if (!self || (!buf && len))
        return KVEDGE_EINVAL;
    if (self->copy || self->map)
        return s_fail(self, KVEDGE_EINVAL, "reader already holds a file");
    self->err[0] = '\0';
    self->copy = malloc(len ? len : 1);
    if (!self->copy)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory for %zu bytes", len);
    if (len)
        memcpy(self->copy, buf, len);
    int rc = s_parse(self, self->copy, len);
    if (rc != KVEDGE_OK)
        s_reset(self);
    return rc;
}

int kvedge_safetensors_open(kvedge_safetensors_t *self, const char *path)
{
    if (!self || !path)
        return KVEDGE_EINVAL;
    if (self->copy || self->map)
        return s_fail(self, KVEDGE_EINVAL, "reader already holds a file");
    self->err[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return s_fail(self, KVEDGE_EIO, "%.160s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return s_fail(self, KVEDGE_EIO, "%.160s: not a regular file", path);
    }
    if ((uint64_t)st.st_size < S_PREFIX_BYTES) {
        close(fd);
        return s_fail(self, KVEDGE_ETRUNCATED, "%.160s: %lld bytes, shorter than a header", path,
                      (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return s_fail(self, KVEDGE_ETOOBIG, "%.160s: too large to map", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return s_fail(self, KVEDGE_EIO, "%.160s: mmap: %s", path, strerror(errno));
    self->map = m;
    self->map_len = (size_t)st.st_size;
    int rc = s_parse(self, self->map, self->map_len);
    if (rc != KVEDGE_OK)
        s_reset(self);
    return rc;
}

size_t kvedge_safetensors_count(const kvedge_safetensors_t *self)
{
    return self ? self->count : 0;
}

const kvedge_safetensors_tensor_t *kvedge_safetensors_at(const kvedge_safetensors_t *self, size_t i)
{
    return self && i < self->count ? &self->tensors[i].pub : NULL;
}

const kvedge_safetensors_tensor_t *kvedge_safetensors_find(const kvedge_safetensors_t *self,
                                                           const char *name)
{
    if (!self || !name)
        return NULL;
    size_t lo = 0, hi = self->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const s_tensor_t *t = self->by_name[mid];
        int c = strcmp(name, t->pub.name);
        if (c == 0)
            return &t->pub;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *kvedge_safetensors_metadata(const kvedge_safetensors_t *self, const char *key)
{
    if (!self || !self->meta || !key)
        return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(self->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int kvedge_safetensors_to_f32(const kvedge_safetensors_tensor_t *t, float *out, size_t out_count)
{
    if (!t || (!out && t->numel))
        return KVEDGE_EINVAL;
    if (out_count < t->numel)
        return KVEDGE_ENOSPACE;
    const uint8_t *p = t->data;
    /* Bytes are assembled explicitly: the data is little-endian and unaligned. */
    switch (t->dtype) {
    case KVEDGE_SAFETENSORS_F32:
        for (uint64_t i = 0; i < t->numel; i++, p += 4)
            out[i] = kvedge_f32_from_bits((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                          (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        return KVEDGE_OK;
    case KVEDGE_SAFETENSORS_F16:
        for (uint64_t i = 0; i < t->numel; i++, p += 2)
            out[i] = kvedge_fp16_to_f32((uint16_t)(p[0] | p[1] << 8));
        return KVEDGE_OK;
    case KVEDGE_SAFETENSORS_BF16:
        for (uint64_t i = 0; i < t->numel; i++, p += 2)
            out[i] = kvedge_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
        return KVEDGE_OK;
    }
    return KVEDGE_EINVAL;
}
