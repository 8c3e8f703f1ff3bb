/* Fuzz target for the Storage Master's codecs (access/master.c): kvmsg parse and pack, the
 * key space, every record parser and the SET rule. Built with libFuzzer (KVEDGE_FUZZ=ON,
 * clang) it fuzzes; built normally it replays the committed corpus (tests/fuzz/corpus/kvmsg).
 *
 * Input: byte 0 = flags: bits 0-2 number of frames (0 … 7), bit 3 stretch frame 3 (the body)
 * to 65536 bytes, bit 4 one more byte (65537: one past the limit); then every frame but the
 * last as u16 little-endian length + bytes (cut short where the input ends); the rest is the
 * last frame. Each frame is copied into its own exact-size buffer so ASan sees any read past
 * it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kvmsg.h"
#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define S_MAX_FRAMES 7

/* The codec must hold its own contract: anything else is a bug worth a crash. */
static void s_require(bool ok)
{
    if (!ok)
        abort();
}

static bool s_rec_rc_ok(int rc)
{
    return rc == KVEDGE_OK || rc == KVEDGE_EPROTO || rc == KVEDGE_EVERSION;
}

/* Every record parser on one buffer; what parses packs back to the same bytes. */
static void s_records(const uint8_t *p, size_t len)
{
    uint8_t back[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t bl = 0;
    int rc;

    kvedge_master_node_t node;
    rc = kvedge_master_node_parse(p, len, &node);
    s_require(s_rec_rc_ok(rc));
    if (rc == KVEDGE_OK)
        s_require(kvedge_master_node_pack(&node, back, &bl) == KVEDGE_OK && bl == len &&
                  memcmp(back, p, len) == 0);

    kvedge_master_health_t h;
    rc = kvedge_master_health_parse(p, len, &h);
    s_require(s_rec_rc_ok(rc));
    if (rc == KVEDGE_OK)
        s_require(kvedge_master_health_pack(&h, back, &bl) == KVEDGE_OK && bl == len &&
                  memcmp(back, p, len) == 0);

    kvedge_model_t m;
    rc = kvedge_master_model_parse(p, len, &m);
    s_require(s_rec_rc_ok(rc));
    if (rc == KVEDGE_OK)
        s_require(kvedge_master_model_pack(&m, back, &bl) == KVEDGE_OK && bl == len &&
                  memcmp(back, p, len) == 0);

    static kvedge_master_map_t map; /* 2 KiB: off the stack */
    rc = kvedge_master_map_parse(p, len, &map);
    s_require(s_rec_rc_ok(rc));
    if (rc == KVEDGE_OK)
        s_require(kvedge_master_map_pack(&map, back, &bl) == KVEDGE_OK && bl == len &&
                  memcmp(back, p, len) == 0);

    static kvedge_master_adapter_t ad; /* 2 KiB: off the stack */
    rc = kvedge_master_adapter_parse(p, len, &ad);
    s_require(s_rec_rc_ok(rc));
    if (rc == KVEDGE_OK)
        s_require(kvedge_master_adapter_pack(&ad, back, &bl) == KVEDGE_OK && bl == len &&
                  memcmp(back, p, len) == 0);

    kvedge_master_dir_t d;
    rc = kvedge_master_dir_parse(p, len, &d);
    s_require(s_rec_rc_ok(rc));
    if (rc == KVEDGE_OK)
        s_require(kvedge_master_dir_pack(&d, back, &bl) == KVEDGE_OK && bl == len &&
                  memcmp(back, p, len) == 0);

    kvedge_master_link_t l;
    rc = kvedge_master_link_parse(p, len, &l);
    s_require(s_rec_rc_ok(rc));
    if (rc == KVEDGE_OK)
        s_require(kvedge_master_link_pack(&l, back, &bl) == KVEDGE_OK && bl == len &&
                  memcmp(back, p, len) == 0);
}

/* A key that parses formats back to itself; the SET rule answers only documented codes. */
static void s_key(const uint8_t *key, size_t klen, const uint8_t *body, size_t blen)
{
    kvedge_master_key_t k;
    int rc = kvedge_master_key_parse((const char *)key, klen, &k);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EINVAL);
    if (rc == KVEDGE_OK) {
        char back[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        s_require(kvedge_master_key_format(k.space, k.a, k.b, back, sizeof back) == KVEDGE_OK &&
                  strlen(back) == klen && memcmp(back, key, klen) == 0);
    }
    rc = kvedge_master_check_set((const char *)key, klen, body, blen);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ||
              rc == KVEDGE_EPROTO || rc == KVEDGE_EVERSION);
    if (rc == KVEDGE_OK && blen == 0)
        s_require(k.space != 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvedge_kvmsg_t m;
    if (size == 0) {
        s_require(kvedge_kvmsg_parse(NULL, 0, &m) == KVEDGE_EPROTO);
        return 0;
    }
    size_t nf = data[0] & 7, pos = 1;
    bool stretch = (data[0] & 8) != 0, one_more = (data[0] & 16) != 0;
    uint8_t *bufs[S_MAX_FRAMES] = {0};
    kvedge_wire_frame_t frames[S_MAX_FRAMES];
    for (size_t i = 0; i < nf; i++) {
        size_t len = size - pos;
        if (i + 1 < nf) {
            size_t want = size - pos >= 2 ? (size_t)(data[pos] | (data[pos + 1] << 8)) : 0;
            pos += size - pos >= 2 ? 2 : size - pos;
            len = want < size - pos ? want : size - pos;
        }
        size_t alloc = len;
        if (i == 3 && stretch)
            alloc = KVEDGE_KVMSG_MAX_BODY_BYTES + (one_more ? 1 : 0);
        if (alloc < len)
            alloc = len;
        bufs[i] = calloc(1, alloc ? alloc : 1);
        if (!bufs[i])
            goto out;
        if (len)
            memcpy(bufs[i], data + pos, len);
        frames[i] = (kvedge_wire_frame_t){bufs[i], alloc};
        pos += len;
    }

    int rc = kvedge_kvmsg_parse(nf ? frames : NULL, nf, &m);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO);
    if (nf >= 4)
        s_records(frames[3].data, frames[3].len);
    if (nf >= 2)
        s_key(frames[1].data, frames[1].len, nf >= 4 ? frames[3].data : NULL,
              nf >= 4 ? frames[3].len : 0);
    if (rc != KVEDGE_OK)
        goto out;
    /* What parses is canonical: packing it gives the same frames back. */
    s_require(nf == (kvedge_kvmsg_is_pub(m.cmd) ? 4u : 5u));
    s_require(kvedge_kvmsg_cmd_name((int)m.cmd) != NULL);
    kvedge_kvmsg_buf_t buf;
    kvedge_wire_frame_t back[KVEDGE_KVMSG_MAX_FRAMES];
    size_t nb = 0;
    s_require(kvedge_kvmsg_pack(&m, &buf, back, &nb) == KVEDGE_OK && nb == nf);
    /* An ERR's status is canonical after the library's mapping: one it does not know reads
     * as KVEDGE_EPROTO and is packed as EPROTO's wire value (access/codec/errwire.h). */
    if (m.cmd == KVEDGE_KVMSG_ERR)
        kvedge_le_put32(bufs[3], (uint32_t)kvedge_err_to_wire(
                                     kvedge_err_from_wire((int32_t)kvedge_le_get32(bufs[3]))));
    for (size_t i = 0; i < nf; i++)
        s_require(back[i].len == frames[i].len &&
                  (back[i].len == 0 || memcmp(back[i].data, frames[i].data, back[i].len) == 0));
    if (m.cmd == KVEDGE_KVMSG_SET || m.cmd == KVEDGE_KVMSG_KVPUB || m.cmd == KVEDGE_KVMSG_KVSYNC)
        s_require(kvedge_kvmsg_key_ok(m.key, m.key_len) &&
                  m.body_len <= KVEDGE_KVMSG_MAX_BODY_BYTES);
    if (m.cmd == KVEDGE_KVMSG_ERR)
        s_require(m.status < 0 && m.body_len <= KVEDGE_KVMSG_MAX_REASON_BYTES);
out:
    for (size_t i = 0; i < nf; i++)
        free(bufs[i]);
    return 0;
}
