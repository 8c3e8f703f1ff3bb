/* Storage Master messages: the kvmsg codec, the key space and the record formats (pure
 * functions on bytes). */
#include "runtime/kvmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"
static bool s_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* ---------------------------------------------------------------- kvmsg */

static const char *const s_cmd_names[] = {
    NULL, "ICANHAZ", "KVSYNC", "KTHXBAI", "SET",    "HEARTBEAT",
    "OK", "ERR",     "KVPUB",  "HUGZ",    "STATUS",
};
#define S_CMD_COUNT      (sizeof s_cmd_names / sizeof s_cmd_names[0])
#define S_STATUS_KEY_LEN (sizeof KVEDGE_KVMSG_STATUS_KEY - 1)

const char *kvedge_kvmsg_cmd_name(int cmd)
{
    return cmd > 0 && (size_t)cmd < S_CMD_COUNT ? s_cmd_names[cmd] : NULL;
}

bool kvedge_kvmsg_is_pub(kvedge_kvmsg_cmd_t cmd)
{
    return cmd == KVEDGE_KVMSG_KVPUB || cmd == KVEDGE_KVMSG_HUGZ;
}

static bool s_graph(uint8_t c)
{
    return c >= 0x21 && c <= 0x7E;
}

bool kvedge_kvmsg_key_ok(const uint8_t *key, size_t len)
{
    if (!key || len == 0 || len > KVEDGE_KVMSG_MAX_KEY_BYTES)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!s_graph(key[i]))
            return false;
    return true;
}

/* A prefix: 0 … 255 key characters. */
static bool s_prefix_ok(const uint8_t *p, size_t len)
{
    return len == 0 || kvedge_kvmsg_key_ok(p, len);
}

static bool s_reason_ok(const uint8_t *p, size_t len)
{
    if (len > KVEDGE_KVMSG_MAX_REASON_BYTES)
        return false;
    for (size_t i = 0; i < len; i++)
        if (p[i] < 0x20 || p[i] > 0x7E)
            return false;
    return true;
}

static int s_cmd_parse(const kvedge_wire_frame_t *f)
{
    for (size_t c = 1; c < S_CMD_COUNT; c++)
        if (f->len == strlen(s_cmd_names[c]) && memcmp(f->data, s_cmd_names[c], f->len) == 0)
            return (int)c;
    return 0;
}

int kvedge_kvmsg_parse(const kvedge_wire_frame_t *f, size_t n, kvedge_kvmsg_t *m)
{
    memset(m, 0, sizeof *m);
    if (!f || n < 4 || n > KVEDGE_KVMSG_MAX_FRAMES)
        return KVEDGE_EPROTO;
    if (n == 5 && f[4].len == 8)
        m->rid = kvedge_le_get64(f[4].data);
    int cmd = s_cmd_parse(&f[0]);
    if (cmd == 0)
        return KVEDGE_EPROTO;
    m->cmd = (kvedge_kvmsg_cmd_t)cmd;
    if (n != (kvedge_kvmsg_is_pub(m->cmd) ? 4u : 5u) || f[2].len != 8 || (n == 5 && f[4].len != 8))
        return KVEDGE_EPROTO;
    m->key = f[1].len ? f[1].data : NULL;
    m->key_len = f[1].len;
    m->seq = kvedge_le_get64(f[2].data);
    m->body = f[3].len ? f[3].data : NULL;
    m->body_len = f[3].len;
    const uint8_t *b = m->body;
    bool ok = false;
    switch (m->cmd) {
    case KVEDGE_KVMSG_ICANHAZ:
        ok = s_prefix_ok(m->key, m->key_len) && m->seq == 0 && m->body_len == 0;
        break;
    case KVEDGE_KVMSG_KVSYNC:
        ok = kvedge_kvmsg_key_ok(m->key, m->key_len) && m->seq >= 1 && m->body_len >= 1 &&
             m->body_len <= KVEDGE_KVMSG_MAX_BODY_BYTES;
        break;
    case KVEDGE_KVMSG_KTHXBAI:
        ok = s_prefix_ok(m->key, m->key_len) && m->body_len == KVEDGE_KVMSG_KTHXBAI_BYTES &&
             s_zero(b + 4, 4);
        if (ok) {
            m->count = kvedge_le_get32(b);
            m->registry = kvedge_le_get64(b + 8);
            m->body = NULL;
            m->body_len = 0;
        }
        break;
    case KVEDGE_KVMSG_SET:
        ok = kvedge_kvmsg_key_ok(m->key, m->key_len) && m->seq == 0 &&
             m->body_len <= KVEDGE_KVMSG_MAX_BODY_BYTES;
        break;
    case KVEDGE_KVMSG_HEARTBEAT: {
        char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
        ok = m->key_len >= 1 && m->key_len <= KVEDGE_MASTER_MAX_ID_BYTES && m->seq == 0 &&
             m->body_len == 0;
        if (ok) {
            memcpy(id, m->key, m->key_len);
            id[m->key_len] = '\0';
            ok = kvedge_master_id_ok(id);
        }
        break;
    }
    case KVEDGE_KVMSG_OK:
        /* A body only in the answer to STATUS (key "status"): the master's JSON document. */
        ok = kvedge_kvmsg_key_ok(m->key, m->key_len) &&
             (m->body_len == 0 || (m->key_len == S_STATUS_KEY_LEN &&
                                   memcmp(m->key, KVEDGE_KVMSG_STATUS_KEY, S_STATUS_KEY_LEN) == 0 &&
                                   m->body_len <= KVEDGE_KVMSG_MAX_BODY_BYTES));
        break;
    case KVEDGE_KVMSG_STATUS:
        ok = m->key_len == 0 && m->seq == 0 && m->body_len == 0;
        break;
    case KVEDGE_KVMSG_ERR:
        ok = s_prefix_ok(m->key, m->key_len) && m->seq == 0 && m->body_len >= 4 &&
             s_reason_ok(b + 4, m->body_len - 4);
        if (ok) {
            int32_t wire = (int32_t)kvedge_le_get32(b);
            ok = wire < 0;
            m->status = kvedge_err_from_wire(wire);
            m->body = m->body_len > 4 ? b + 4 : NULL;
            m->body_len -= 4;
        }
        break;
    case KVEDGE_KVMSG_KVPUB:
        ok = kvedge_kvmsg_key_ok(m->key, m->key_len) && m->seq >= 1 &&
             m->body_len <= KVEDGE_KVMSG_MAX_BODY_BYTES;
        break;
    case KVEDGE_KVMSG_HUGZ:
        ok = m->key_len == 0 && m->body_len == KVEDGE_KVMSG_HUGZ_BYTES;
        if (ok) {
            m->registry = kvedge_le_get64(b);
            m->body = NULL;
            m->body_len = 0;
        }
        break;
    }
    return ok ? KVEDGE_OK : KVEDGE_EPROTO;
}

int kvedge_kvmsg_pack(const kvedge_kvmsg_t *m, kvedge_kvmsg_buf_t *buf,
                      kvedge_wire_frame_t out[KVEDGE_KVMSG_MAX_FRAMES], size_t *n)
{
    const char *name = m ? kvedge_kvmsg_cmd_name((int)m->cmd) : NULL;
    if (!name || !buf || !out || !n)
        return KVEDGE_EINVAL;
    out[0] = (kvedge_wire_frame_t){(const uint8_t *)name, strlen(name)};
    out[1] = (kvedge_wire_frame_t){m->key, m->key_len};
    kvedge_le_put64(buf->seq, m->seq);
    out[2] = (kvedge_wire_frame_t){buf->seq, 8};
    out[3] = (kvedge_wire_frame_t){m->body, m->body_len};
    switch (m->cmd) {
    case KVEDGE_KVMSG_KTHXBAI:
        memset(buf->body, 0, KVEDGE_KVMSG_KTHXBAI_BYTES);
        kvedge_le_put32(buf->body, m->count);
        kvedge_le_put64(buf->body + 8, m->registry);
        out[3] = (kvedge_wire_frame_t){buf->body, KVEDGE_KVMSG_KTHXBAI_BYTES};
        break;
    case KVEDGE_KVMSG_HUGZ:
        kvedge_le_put64(buf->body, m->registry);
        out[3] = (kvedge_wire_frame_t){buf->body, KVEDGE_KVMSG_HUGZ_BYTES};
        break;
    case KVEDGE_KVMSG_ERR:
        if (m->body_len > KVEDGE_KVMSG_MAX_REASON_BYTES)
            return KVEDGE_EINVAL;
        kvedge_le_put32(buf->body, (uint32_t)kvedge_err_to_wire(m->status));
        if (m->body_len)
            memcpy(buf->body + 4, m->body, m->body_len);
        out[3] = (kvedge_wire_frame_t){buf->body, 4 + m->body_len};
        break;
    default:
        break;
    }
    *n = 4;
    if (!kvedge_kvmsg_is_pub(m->cmd)) {
        kvedge_le_put64(buf->rid, m->rid);
        out[4] = (kvedge_wire_frame_t){buf->rid, 8};
        *n = 5;
    }
    kvedge_kvmsg_t check;
    return kvedge_kvmsg_parse(out, *n, &check) == KVEDGE_OK ? KVEDGE_OK : KVEDGE_EINVAL;
}

/* ---------------------------------------------------------------- key space */

static bool s_id_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '@' || c == '+' || c == '-';
}

static bool s_id_ok(const char *s, size_t len)
{
    if (len == 0 || len > KVEDGE_MASTER_MAX_ID_BYTES)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!s_id_char(s[i]))
            return false;
    return true;
}

bool kvedge_master_id_ok(const char *id)
{
    return id && s_id_ok(id, strnlen(id, KVEDGE_MASTER_MAX_ID_BYTES + 1));
}

/* Model ids in keys: printable, no space, no '/'. */
static bool s_model_id_ok(const char *s, size_t len)
{
    if (len == 0 || len > KVEDGE_MASTER_MAX_MODEL_ID_BYTES)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!s_graph((uint8_t)s[i]) || s[i] == '/')
            return false;
    return true;
}

static bool s_hex_ok(const char *s, size_t len, size_t want)
{
    if (len != want)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static const struct {
    const char *prefix;
    kvedge_master_space_t space;
    int parts; /* components after the prefix */
} s_spaces[] = {
    {"node/", KVEDGE_MASTER_SPACE_NODE, 1},     {"health/", KVEDGE_MASTER_SPACE_HEALTH, 1},
    {"model/", KVEDGE_MASTER_SPACE_MODEL, 1},   {"map/", KVEDGE_MASTER_SPACE_MAP, 2},
    {"dir/", KVEDGE_MASTER_SPACE_DIR, 2},       {"link/", KVEDGE_MASTER_SPACE_LINK, 2},
    {"tmodel/", KVEDGE_MASTER_SPACE_TMODEL, 2}, {"adapter/", KVEDGE_MASTER_SPACE_ADAPTER, 2},
};
#define S_SPACE_COUNT (sizeof s_spaces / sizeof s_spaces[0])

/* Is s[0..len) a valid component number `which` (0 or 1) of a key of space sp? */
static bool s_part_ok(kvedge_master_space_t sp, int which, const char *s, size_t len)
{
    switch (sp) {
    case KVEDGE_MASTER_SPACE_MODEL:
    case KVEDGE_MASTER_SPACE_MAP:
    case KVEDGE_MASTER_SPACE_ADAPTER:
        return s_model_id_ok(s, len);
    case KVEDGE_MASTER_SPACE_DIR:
        return which == 0 ? s_id_ok(s, len) : s_hex_ok(s, len, KVEDGE_MASTER_CHUNK_HEX_BYTES);
    case KVEDGE_MASTER_SPACE_TMODEL:
        return which == 0 ? s_hex_ok(s, len, KVEDGE_MASTER_TENANT_HEX_BYTES)
                          : s_model_id_ok(s, len);
    default:
        return s_id_ok(s, len);
    }
}

int kvedge_master_key_parse(const char *key, size_t len, kvedge_master_key_t *out)
{
    memset(out, 0, sizeof *out);
    if (!kvedge_kvmsg_key_ok((const uint8_t *)key, len))
        return KVEDGE_EINVAL;
    for (size_t i = 0; i < S_SPACE_COUNT; i++) {
        size_t pl = strlen(s_spaces[i].prefix);
        if (len <= pl || memcmp(key, s_spaces[i].prefix, pl) != 0)
            continue;
        const char *rest = key + pl;
        size_t rl = len - pl;
        const char *slash = memchr(rest, '/', rl);
        size_t al = slash ? (size_t)(slash - rest) : rl;
        kvedge_master_space_t sp = s_spaces[i].space;
        if (s_spaces[i].parts == 1 ? slash != NULL : slash == NULL)
            return KVEDGE_EINVAL;
        if (!s_part_ok(sp, 0, rest, al))
            return KVEDGE_EINVAL;
        memcpy(out->a, rest, al);
        if (slash) {
            size_t bl = rl - al - 1;
            if (!s_part_ok(sp, 1, slash + 1, bl))
                return KVEDGE_EINVAL;
            memcpy(out->b, slash + 1, bl);
        }
        out->space = sp;
        return KVEDGE_OK;
    }
    return KVEDGE_EINVAL;
}

int kvedge_master_key_format(kvedge_master_space_t space, const char *a, const char *b, char *out,
                             size_t cap)
{
    for (size_t i = 0; i < S_SPACE_COUNT; i++) {
        if (s_spaces[i].space != space)
            continue;
        bool two = s_spaces[i].parts == 2;
        if (!a || (two && !b))
            return KVEDGE_EINVAL;
        size_t al = strnlen(a, KVEDGE_MASTER_MAX_MODEL_ID_BYTES + 1);
        size_t bl = two ? strnlen(b, KVEDGE_MASTER_MAX_MODEL_ID_BYTES + 1) : 0;
        if (!s_part_ok(space, 0, a, al) || (two && !s_part_ok(space, 1, b, bl)))
            return KVEDGE_EINVAL;
        int n = two ? snprintf(out, cap, "%s%s/%s", s_spaces[i].prefix, a, b)
                    : snprintf(out, cap, "%s%s", s_spaces[i].prefix, a);
        return n >= 0 && (size_t)n < cap ? KVEDGE_OK : KVEDGE_ENOSPACE;
    }
    return KVEDGE_EINVAL;
}

void kvedge_master_tenant_hex(const uint8_t tag[16], char out[KVEDGE_MASTER_TENANT_HEX_BYTES + 1])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[tag[i] >> 4];
        out[2 * i + 1] = hex[tag[i] & 15];
    }
    out[KVEDGE_MASTER_TENANT_HEX_BYTES] = '\0';
}

void kvedge_master_chunk_hex(const kvedge_chunk_id_t *id,
                             char out[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++) {
        out[2 * i] = hex[id->bytes[i] >> 4];
        out[2 * i + 1] = hex[id->bytes[i] & 15];
    }
    out[KVEDGE_MASTER_CHUNK_HEX_BYTES] = '\0';
}

/* ---------------------------------------------------------------- records */

#define S_REC_NODE   'N'
#define S_REC_HEALTH 'H'
#define S_REC_MODEL  'M'
#define S_REC_MAP    'P'
#define S_REC_DIR    'D'
#define S_REC_LINK   'L'
#define S_REC_ADAPT  'A'

const char *kvedge_master_health_name(int state)
{
    switch (state) {
    case KVEDGE_MASTER_HEALTH_UP:
        return "up";
    case KVEDGE_MASTER_HEALTH_SUSPECT:
        return "suspect";
    case KVEDGE_MASTER_HEALTH_DOWN:
        return "down";
    default:
        return "?";
    }
}

/* Type and version: EPROTO for another type or a short record, EVERSION for another
 * version of this type. */
static int s_rec_head(const uint8_t *in, size_t len, uint8_t type)
{
    if (!in || len < 4 || in[0] != type)
        return KVEDGE_EPROTO;
    return in[1] == KVEDGE_MASTER_RECORD_VERSION ? KVEDGE_OK : KVEDGE_EVERSION;
}

static void s_rec_head_pack(uint8_t *out, uint8_t type)
{
    out[0] = type;
    out[1] = KVEDGE_MASTER_RECORD_VERSION;
    out[2] = 0;
    out[3] = 0;
}

/* Z85: 40 characters of the alphabet, every 5-character group below 2^32. */
static bool s_z85_ok(const char *s, size_t len)
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW"
                                   "XYZ.-:+=^!/*?&<>()[]{}@%$#";
    if (len != KVEDGE_MASTER_KEY_Z85_BYTES)
        return false;
    for (size_t g = 0; g < len; g += 5) {
        uint64_t v = 0;
        for (size_t i = g; i < g + 5; i++) {
            const char *p = s[i] ? strchr(alphabet, s[i]) : NULL;
            if (!p)
                return false;
            v = v * 85 + (uint64_t)(p - alphabet);
        }
        if (v > 0xFFFFFFFFull)
            return false;
    }
    return true;
}

static bool s_print_ok(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!s_graph((uint8_t)s[i]))
            return false;
    return true;
}

int kvedge_master_node_pack(const kvedge_master_node_t *r,
                            uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len)
{
    size_t rl = strnlen(r->region, sizeof r->region), el = strnlen(r->endpoint, sizeof r->endpoint),
           kl = strnlen(r->public_key, sizeof r->public_key);
    if ((r->role != KVEDGE_ROLE_CLOUD && r->role != KVEDGE_ROLE_EDGE) ||
        rl > KVEDGE_MASTER_MAX_ID_BYTES || (rl && !s_id_ok(r->region, rl)) || el == 0 ||
        el > KVEDGE_MASTER_MAX_ENDPOINT_BYTES || !s_print_ok(r->endpoint, el) ||
        (kl && !s_z85_ok(r->public_key, kl)))
        return KVEDGE_EINVAL;
    memset(out, 0, KVEDGE_MASTER_NODE_FIXED_BYTES);
    s_rec_head_pack(out, S_REC_NODE);
    out[2] = (uint8_t)r->role;
    kvedge_le_put64(out + 4, r->capacity_bytes);
    kvedge_le_put64(out + 12, r->bandwidth_bytes_per_s);
    kvedge_le_put32(out + 20, r->rtt_us);
    out[24] = (uint8_t)rl;
    out[25] = (uint8_t)el;
    out[26] = (uint8_t)kl;
    uint8_t *p = out + KVEDGE_MASTER_NODE_FIXED_BYTES;
    memcpy(p, r->region, rl);
    memcpy(p + rl, r->endpoint, el);
    memcpy(p + rl + el, r->public_key, kl);
    *len = KVEDGE_MASTER_NODE_FIXED_BYTES + rl + el + kl;
    return KVEDGE_OK;
}

int kvedge_master_node_parse(const uint8_t *in, size_t len, kvedge_master_node_t *r)
{
    memset(r, 0, sizeof *r);
    int rc = s_rec_head(in, len, S_REC_NODE);
    if (rc != KVEDGE_OK)
        return rc;
    if (len < KVEDGE_MASTER_NODE_FIXED_BYTES || in[3] != 0 || in[27] != 0)
        return KVEDGE_EPROTO;
    size_t rl = in[24], el = in[25], kl = in[26];
    const char *p = (const char *)in + KVEDGE_MASTER_NODE_FIXED_BYTES;
    if ((in[2] != KVEDGE_ROLE_CLOUD && in[2] != KVEDGE_ROLE_EDGE) ||
        len != KVEDGE_MASTER_NODE_FIXED_BYTES + rl + el + kl || rl > KVEDGE_MASTER_MAX_ID_BYTES ||
        (rl && !s_id_ok(p, rl)) || el == 0 || !s_print_ok(p + rl, el) ||
        (kl && !s_z85_ok(p + rl + el, kl)))
        return KVEDGE_EPROTO;
    r->role = (kvedge_role_t)in[2];
    r->capacity_bytes = kvedge_le_get64(in + 4);
    r->bandwidth_bytes_per_s = kvedge_le_get64(in + 12);
    r->rtt_us = kvedge_le_get32(in + 20);
    memcpy(r->region, p, rl);
    memcpy(r->endpoint, p + rl, el);
    memcpy(r->public_key, p + rl + el, kl);
    return KVEDGE_OK;
}

int kvedge_master_health_pack(const kvedge_master_health_t *r,
                              uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len)
{
    if (r->state < KVEDGE_MASTER_HEALTH_UP || r->state > KVEDGE_MASTER_HEALTH_DOWN)
        return KVEDGE_EINVAL;
    s_rec_head_pack(out, S_REC_HEALTH);
    out[2] = (uint8_t)r->state;
    kvedge_le_put64(out + 4, r->last_seen_ms);
    kvedge_le_put64(out + 12, r->changed_ms);
    *len = KVEDGE_MASTER_HEALTH_BYTES;
    return KVEDGE_OK;
}

int kvedge_master_health_parse(const uint8_t *in, size_t len, kvedge_master_health_t *r)
{
    memset(r, 0, sizeof *r);
    int rc = s_rec_head(in, len, S_REC_HEALTH);
    if (rc != KVEDGE_OK)
        return rc;
    if (len != KVEDGE_MASTER_HEALTH_BYTES || in[2] < KVEDGE_MASTER_HEALTH_UP ||
        in[2] > KVEDGE_MASTER_HEALTH_DOWN || in[3] != 0)
        return KVEDGE_EPROTO;
    r->state = (kvedge_master_health_state_t)in[2];
    r->last_seen_ms = kvedge_le_get64(in + 4);
    r->changed_ms = kvedge_le_get64(in + 12);
    return KVEDGE_OK;
}

int kvedge_master_model_pack(const kvedge_model_t *m, uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES],
                             size_t *len)
{
    if (!s_model_id_ok(m->id, strnlen(m->id, sizeof m->id)) ||
        kvedge_wire_model_pack(m, out + 4) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    s_rec_head_pack(out, S_REC_MODEL);
    *len = KVEDGE_MASTER_MODEL_BYTES;
    return KVEDGE_OK;
}

int kvedge_master_model_parse(const uint8_t *in, size_t len, kvedge_model_t *m)
{
    memset(m, 0, sizeof *m);
    int rc = s_rec_head(in, len, S_REC_MODEL);
    if (rc != KVEDGE_OK)
        return rc;
    if (len != KVEDGE_MASTER_MODEL_BYTES || in[2] != 0 || in[3] != 0 ||
        kvedge_wire_model_parse(in + 4, KVEDGE_WIRE_MODEL_BYTES, m) != KVEDGE_OK ||
        !s_model_id_ok(m->id, strlen(m->id)))
        return KVEDGE_EPROTO;
    return KVEDGE_OK;
}

static bool s_layers_ok(uint32_t n)
{
    return n >= 1 && n <= KVEDGE_MODEL_MAX_LAYERS;
}

int kvedge_master_map_pack(const kvedge_master_map_t *r,
                           uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len)
{
    if (!s_layers_ok(r->cloud_layers) || !s_layers_ok(r->edge_layers))
        return KVEDGE_EINVAL;
    for (uint32_t i = 0; i < r->edge_layers; i++)
        if (r->from[i] >= r->cloud_layers && r->from[i] != KVEDGE_MASTER_MAP_NONE)
            return KVEDGE_EINVAL;
    s_rec_head_pack(out, S_REC_MAP);
    kvedge_le_put16(out + 4, r->cloud_layers);
    kvedge_le_put16(out + 6, r->edge_layers);
    for (uint32_t i = 0; i < r->edge_layers; i++)
        kvedge_le_put16(out + 8 + 2 * i, r->from[i]);
    *len = KVEDGE_MASTER_MAP_FIXED_BYTES + 2 * (size_t)r->edge_layers;
    return KVEDGE_OK;
}

int kvedge_master_map_parse(const uint8_t *in, size_t len, kvedge_master_map_t *r)
{
    memset(r, 0, sizeof *r);
    int rc = s_rec_head(in, len, S_REC_MAP);
    if (rc != KVEDGE_OK)
        return rc;
    if (len < KVEDGE_MASTER_MAP_FIXED_BYTES || in[2] != 0 || in[3] != 0)
        return KVEDGE_EPROTO;
    uint16_t cl = kvedge_le_get16(in + 4), el = kvedge_le_get16(in + 6);
    if (!s_layers_ok(cl) || !s_layers_ok(el) ||
        len != KVEDGE_MASTER_MAP_FIXED_BYTES + 2 * (size_t)el)
        return KVEDGE_EPROTO;
    for (uint32_t i = 0; i < el; i++) {
        uint16_t f = kvedge_le_get16(in + 8 + 2 * i);
        if (f >= cl && f != KVEDGE_MASTER_MAP_NONE)
            return KVEDGE_EPROTO;
        r->from[i] = f;
    }
    r->cloud_layers = cl;
    r->edge_layers = el;
    return KVEDGE_OK;
}

const char *kvedge_master_fit_name(int fit)
{
    switch (fit) {
    case KVEDGE_MASTER_FIT_LEAST_SQUARES:
        return "least-squares";
    case KVEDGE_MASTER_FIT_DISTILLED:
        return "distilled";
    case KVEDGE_MASTER_FIT_HEADS:
        return "heads";
    case KVEDGE_MASTER_FIT_LINEAR:
        return "linear";
    default:
        return "?";
    }
}

/* A rotary setting of an adapter record: 1 ... ROPE_MAX_BYTES printable bytes, no space. */
static bool s_rope_ok(const char *s, size_t len)
{
    return len >= 1 && len <= KVEDGE_MASTER_ROPE_MAX_BYTES && s_print_ok(s, len);
}

/* The layer map part of an adapter record (as the map record's rules). */
static bool s_adapter_map_ok(uint16_t cl, uint16_t el, const uint16_t *from)
{
    if (!s_layers_ok(cl) || !s_layers_ok(el))
        return false;
    for (uint32_t i = 0; i < el; i++)
        if (from[i] >= cl && from[i] != KVEDGE_MASTER_MAP_NONE)
            return false;
    return true;
}

/* Layout: 'A' | version | fit | 0 | u16 cloud layers | u16 edge layers | u64 size |
 * digest[32] | u8 cloud rope length | u8 edge rope length | 0 0 | u16 from[edge layers] |
 * cloud rope | edge rope. */
int kvedge_master_adapter_pack(const kvedge_master_adapter_t *r,
                               uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len)
{
    size_t cr = strnlen(r->cloud_rope, sizeof r->cloud_rope),
           er = strnlen(r->edge_rope, sizeof r->edge_rope);
    if (r->fit < KVEDGE_MASTER_FIT_LEAST_SQUARES || r->fit > KVEDGE_MASTER_FIT_LINEAR ||
        r->size == 0 || r->size > KVEDGE_MASTER_ADAPTER_MAX_SIZE || !s_rope_ok(r->cloud_rope, cr) ||
        !s_rope_ok(r->edge_rope, er) || !s_adapter_map_ok(r->cloud_layers, r->edge_layers, r->from))
        return KVEDGE_EINVAL;
    memset(out, 0, KVEDGE_MASTER_ADAPTER_FIXED_BYTES);
    s_rec_head_pack(out, S_REC_ADAPT);
    out[2] = (uint8_t)r->fit;
    kvedge_le_put16(out + 4, r->cloud_layers);
    kvedge_le_put16(out + 6, r->edge_layers);
    kvedge_le_put64(out + 8, r->size);
    memcpy(out + 16, r->digest, KVEDGE_MASTER_DIGEST_BYTES);
    out[48] = (uint8_t)cr;
    out[49] = (uint8_t)er;
    uint8_t *w = out + KVEDGE_MASTER_ADAPTER_FIXED_BYTES;
    for (uint32_t i = 0; i < r->edge_layers; i++, w += 2)
        kvedge_le_put16(w, r->from[i]);
    memcpy(w, r->cloud_rope, cr);
    memcpy(w + cr, r->edge_rope, er);
    *len = KVEDGE_MASTER_ADAPTER_FIXED_BYTES + 2 * (size_t)r->edge_layers + cr + er;
    return KVEDGE_OK;
}

int kvedge_master_adapter_parse(const uint8_t *in, size_t len, kvedge_master_adapter_t *r)
{
    memset(r, 0, sizeof *r);
    int rc = s_rec_head(in, len, S_REC_ADAPT);
    if (rc != KVEDGE_OK)
        return rc;
    if (len < KVEDGE_MASTER_ADAPTER_FIXED_BYTES || in[3] != 0 || in[50] != 0 || in[51] != 0 ||
        in[2] < KVEDGE_MASTER_FIT_LEAST_SQUARES || in[2] > KVEDGE_MASTER_FIT_LINEAR)
        return KVEDGE_EPROTO;
    uint16_t cl = kvedge_le_get16(in + 4), el = kvedge_le_get16(in + 6);
    uint64_t size = kvedge_le_get64(in + 8);
    size_t cr = in[48], er = in[49];
    if (!s_layers_ok(cl) || !s_layers_ok(el) || size == 0 ||
        size > KVEDGE_MASTER_ADAPTER_MAX_SIZE ||
        len != KVEDGE_MASTER_ADAPTER_FIXED_BYTES + 2 * (size_t)el + cr + er)
        return KVEDGE_EPROTO;
    const uint8_t *p = in + KVEDGE_MASTER_ADAPTER_FIXED_BYTES;
    for (uint32_t i = 0; i < el; i++, p += 2)
        r->from[i] = kvedge_le_get16(p);
    const char *crs = (const char *)p, *ers = crs + cr;
    if (!s_adapter_map_ok(cl, el, r->from) || !s_rope_ok(crs, cr) || !s_rope_ok(ers, er))
        return KVEDGE_EPROTO;
    memcpy(r->cloud_rope, crs, cr);
    memcpy(r->edge_rope, ers, er);
    memcpy(r->digest, in + 16, KVEDGE_MASTER_DIGEST_BYTES);
    r->fit = (kvedge_master_fit_t)in[2];
    r->size = size;
    r->cloud_layers = cl;
    r->edge_layers = el;
    return KVEDGE_OK;
}

int kvedge_master_dir_pack(const kvedge_master_dir_t *r,
                           uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len)
{
    size_t ml = strnlen(r->model_id, sizeof r->model_id), bl = ((size_t)r->layers + 7) / 8;
    if (!s_model_id_ok(r->model_id, ml) || !s_layers_ok(r->layers))
        return KVEDGE_EINVAL;
    /* Bits past the last layer must be zero: canonical bytes. */
    if (r->layers % 8 && (r->held[bl - 1] >> (r->layers % 8)) != 0)
        return KVEDGE_EINVAL;
    if (r->rungs == KVEDGE_MASTER_DIR_DERIVES) /* "derives" says nothing without a rung */
        return KVEDGE_EINVAL;
    s_rec_head_pack(out, S_REC_DIR);
    out[2] = (uint8_t)ml;
    kvedge_le_put16(out + 4, r->layers);
    kvedge_le_put16(out + 6, r->rungs);
    memcpy(out + KVEDGE_MASTER_DIR_FIXED_BYTES, r->model_id, ml);
    memcpy(out + KVEDGE_MASTER_DIR_FIXED_BYTES + ml, r->held, bl);
    *len = KVEDGE_MASTER_DIR_FIXED_BYTES + ml + bl;
    return KVEDGE_OK;
}

int kvedge_master_dir_parse(const uint8_t *in, size_t len, kvedge_master_dir_t *r)
{
    memset(r, 0, sizeof *r);
    int rc = s_rec_head(in, len, S_REC_DIR);
    if (rc != KVEDGE_OK)
        return rc;
    if (len < KVEDGE_MASTER_DIR_FIXED_BYTES || in[3] != 0)
        return KVEDGE_EPROTO;
    /* rungs: bits 0 ... 14 and the DERIVES bit; "derives" says nothing without a rung. */
    uint16_t rungs = kvedge_le_get16(in + 6);
    if (rungs == KVEDGE_MASTER_DIR_DERIVES)
        return KVEDGE_EPROTO;
    size_t ml = in[2];
    uint16_t layers = kvedge_le_get16(in + 4);
    size_t bl = ((size_t)layers + 7) / 8;
    const char *id = (const char *)in + KVEDGE_MASTER_DIR_FIXED_BYTES;
    if (!s_layers_ok(layers) || len != KVEDGE_MASTER_DIR_FIXED_BYTES + ml + bl ||
        !s_model_id_ok(id, ml))
        return KVEDGE_EPROTO;
    const uint8_t *bits = in + KVEDGE_MASTER_DIR_FIXED_BYTES + ml;
    if (layers % 8 && (bits[bl - 1] >> (layers % 8)) != 0)
        return KVEDGE_EPROTO;
    memcpy(r->model_id, id, ml);
    r->layers = layers;
    memcpy(r->held, bits, bl);
    r->rungs = rungs;
    return KVEDGE_OK;
}

int kvedge_master_rung_bit(kvedge_prec_t rung)
{
    if (!kvedge_prec_valid(rung) || rung == KVEDGE_PREC_TC)
        return -1; /* tc has no bit: 15 rungs fill the 15 bits below DERIVES */
    return (int)(KVEDGE_PREC_BASE(rung) - 1 + 5 * KVEDGE_PREC_THINK(rung));
}

bool kvedge_master_dir_serves(const kvedge_master_dir_t *d, kvedge_prec_t rung)
{
    uint16_t held = d->rungs & (uint16_t)~KVEDGE_MASTER_DIR_DERIVES;
    if (held == 0)
        return true; /* not said */
    int want = kvedge_master_rung_bit(rung);
    if (want < 0 && rung != KVEDGE_PREC_TC)
        return false;
    /* The bits are the primaries' rungs, never entropy-coded: a "+ec" rung is always made, and
     * so is tc (bitless). */
    if (want >= 0 && (held >> want & 1u) && !KVEDGE_PREC_IS_EC(rung))
        return true;
    if (!(d->rungs & KVEDGE_MASTER_DIR_DERIVES))
        return false;
    for (unsigned b = 0; b < KVEDGE_MASTER_DIR_RUNGS; b++)
        if (held >> b & 1u) {
            kvedge_prec_t from = KVEDGE_PREC_MAKE(b % 5 + 1, b / 5);
            if (kvedge_prec_derivable(from, rung))
                return true;
        }
    return false;
}

int kvedge_master_link_pack(const kvedge_master_link_t *r,
                            uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len)
{
    memset(out, 0, KVEDGE_MASTER_LINK_BYTES);
    s_rec_head_pack(out, S_REC_LINK);
    out[2] = r->declared ? 1 : 0;
    kvedge_le_put32(out + 4, r->rtt_us);
    kvedge_le_put64(out + 8, r->bw_bytes_per_s);
    kvedge_le_put32(out + 16, r->samples);
    kvedge_le_put64(out + 24, r->updated_ms);
    *len = KVEDGE_MASTER_LINK_BYTES;
    return KVEDGE_OK;
}

int kvedge_master_link_parse(const uint8_t *in, size_t len, kvedge_master_link_t *r)
{
    memset(r, 0, sizeof *r);
    int rc = s_rec_head(in, len, S_REC_LINK);
    if (rc != KVEDGE_OK)
        return rc;
    if (len != KVEDGE_MASTER_LINK_BYTES || in[2] > 1 || in[3] != 0 || !s_zero(in + 20, 4))
        return KVEDGE_EPROTO;
    r->declared = in[2] == 1;
    r->rtt_us = kvedge_le_get32(in + 4);
    r->bw_bytes_per_s = kvedge_le_get64(in + 8);
    r->samples = kvedge_le_get32(in + 16);
    r->updated_ms = kvedge_le_get64(in + 24);
    return KVEDGE_OK;
}

int kvedge_master_check_set(const char *key, size_t key_len, const uint8_t *body, size_t len)
{
    kvedge_master_key_t k;
    if (kvedge_master_key_parse(key, key_len, &k) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    if (len == 0)
        return KVEDGE_OK; /* a delete */
    if (len > KVEDGE_KVMSG_MAX_BODY_BYTES)
        return KVEDGE_EPROTO;
    switch (k.space) {
    case KVEDGE_MASTER_SPACE_NODE: {
        kvedge_master_node_t r;
        return kvedge_master_node_parse(body, len, &r);
    }
    case KVEDGE_MASTER_SPACE_HEALTH:
        return KVEDGE_EDENIED;
    case KVEDGE_MASTER_SPACE_MODEL:
    case KVEDGE_MASTER_SPACE_TMODEL: {
        kvedge_model_t m;
        int rc = kvedge_master_model_parse(body, len, &m);
        const char *id = k.space == KVEDGE_MASTER_SPACE_MODEL ? k.a : k.b;
        return rc != KVEDGE_OK ? rc : strcmp(m.id, id) == 0 ? KVEDGE_OK : KVEDGE_EPROTO;
    }
    case KVEDGE_MASTER_SPACE_MAP: {
        kvedge_master_map_t *r = malloc(sizeof *r);
        int rc = r ? kvedge_master_map_parse(body, len, r) : KVEDGE_ENOMEM;
        free(r);
        return rc;
    }
    case KVEDGE_MASTER_SPACE_DIR: {
        kvedge_master_dir_t r;
        return kvedge_master_dir_parse(body, len, &r);
    }
    case KVEDGE_MASTER_SPACE_ADAPTER: {
        kvedge_master_adapter_t *r = malloc(sizeof *r);
        int rc = r ? kvedge_master_adapter_parse(body, len, r) : KVEDGE_ENOMEM;
        free(r);
        return rc;
    }
    case KVEDGE_MASTER_SPACE_LINK: {
        kvedge_master_link_t r;
        return kvedge_master_link_parse(body, len, &r);
    }
    }
    return KVEDGE_EINVAL;
}
