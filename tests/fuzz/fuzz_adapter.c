/* Fuzz target for the adapter reader (clients/e2e/adapter.h): adapter files come from disk beside
 * a layer map. The safetensors layer has its own fuzzer; this one reaches the metadata strings
 * (numbers, ids, the "from" list), the tensor names and shapes, and the weight checks. A
 * refused file leaves a "PATH: reason" and no adapter; an accepted one, written back, reads
 * back the same, bit for bit. Built with libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes; built
 * normally it replays the committed corpus. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clients/e2e/adapter.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An in-memory file holding len bytes; its /proc path in path. */
static int s_memfile(const void *bytes, size_t len, char *path, size_t cap)
{
    int fd = memfd_create("adapter", 0);
    if (fd < 0 || (len && write(fd, bytes, len) != (ssize_t)len))
        abort();
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], why[512] = "";
    int fd = s_memfile(data, size, path, sizeof path);
    kvedge_adapter_t *a = NULL;
    int rc = kvedge_adapter_load(path, &a, why, sizeof why);
    close(fd);
    if (rc != KVEDGE_OK) {
        if (why[0] == '\0' || a)
            abort();
        return 0;
    }
    char back[64];
    snprintf(back, sizeof back, "/tmp/fuzz_adapter.%ld", (long)getpid());
    kvedge_adapter_t *b = NULL;
    if (kvedge_adapter_save(a, back) != KVEDGE_OK ||
        kvedge_adapter_load(back, &b, why, sizeof why) != KVEDGE_OK)
        abort();
    unlink(back);
    const kvedge_adapter_info_t *x = kvedge_adapter_info(a), *y = kvedge_adapter_info(b);
    if (x->kind != y->kind || strcmp(x->cloud_id, y->cloud_id) != 0 ||
        strcmp(x->edge_id, y->edge_id) != 0 || x->samples != y->samples ||
        memcmp(&x->ridge, &y->ridge, sizeof x->ridge) != 0 || x->edge_layers != y->edge_layers)
        abort();
    const size_t bytes = ((size_t)x->cloud_heads * x->cloud_head_dim + 1) * x->edge_heads *
                         x->edge_head_dim * sizeof(float);
    for (uint32_t e = 0; e < x->edge_layers; e++) {
        if (kvedge_adapter_from(a, e) != kvedge_adapter_from(b, e))
            abort();
        for (int v = 0; v < 2; v++) {
            const float *p = kvedge_adapter_weights(a, e, v), *q = kvedge_adapter_weights(b, e, v);
            if (!p != !q || (p && memcmp(p, q, bytes) != 0))
                abort();
        }
    }
    kvedge_adapter_destroy(&b);
    kvedge_adapter_destroy(&a);
    return 0;
}
