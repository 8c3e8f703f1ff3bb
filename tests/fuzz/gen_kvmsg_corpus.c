/* Writes the seed corpus for fuzz_kvmsg: one valid message per kvmsg command, and a SET of a
 * valid record of every type, in fuzz_kvmsg's input format. Run: gen_kvmsg_corpus DIR. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kvmsg.h"
#include "access/codec/error.h"

/* Checks the message is valid, encodes it as fuzz_kvmsg reads it, and writes it. */
static void s_write(const char *dir, const char *name, const kvedge_kvmsg_t *m)
{
    kvedge_kvmsg_buf_t buf;
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    size_t n;
    if (kvedge_kvmsg_pack(m, &buf, f, &n) != KVEDGE_OK) {
        fprintf(stderr, "%s: not a valid message\n", name);
        exit(1);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    if (!out) {
        perror(path);
        exit(1);
    }
    fputc((int)n, out);
    for (size_t i = 0; i < n; i++) {
        if (i + 1 < n) {
            fputc((int)(f[i].len & 0xFF), out);
            fputc((int)(f[i].len >> 8), out);
        }
        if (f[i].len && fwrite(f[i].data, 1, f[i].len, out) != f[i].len) {
            perror(path);
            exit(1);
        }
    }
    if (fclose(out) != 0) {
        perror(path);
        exit(1);
    }
}

static kvedge_kvmsg_t s_msg(kvedge_kvmsg_cmd_t cmd, const char *key, uint64_t seq,
                            const uint8_t *body, size_t len)
{
    kvedge_kvmsg_t m = {.cmd = cmd,
                        .key = (const uint8_t *)key,
                        .key_len = key ? strlen(key) : 0,
                        .seq = seq,
                        .body = body,
                        .body_len = len,
                        .rid = kvedge_kvmsg_is_pub(cmd) ? 0 : 0x1234};
    return m;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    uint8_t rec[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    kvedge_kvmsg_t m;

    m = s_msg(KVEDGE_KVMSG_ICANHAZ, "node/", 0, NULL, 0);
    s_write(dir, "icanhaz", &m);
    m = s_msg(KVEDGE_KVMSG_ICANHAZ, NULL, 0, NULL, 0);
    s_write(dir, "icanhaz-all", &m);
    m = s_msg(KVEDGE_KVMSG_KTHXBAI, "node/", 42, NULL, 0);
    m.count = 3;
    m.registry = 0x0102030405060708ull;
    s_write(dir, "kthxbai", &m);
    m = s_msg(KVEDGE_KVMSG_HEARTBEAT, "edge-1", 0, NULL, 0);
    s_write(dir, "heartbeat", &m);
    m = s_msg(KVEDGE_KVMSG_OK, "health/edge-1", 9, NULL, 0);
    s_write(dir, "ok", &m);
    const char *reason = "body is not a valid record for this key";
    m = s_msg(KVEDGE_KVMSG_ERR, "node/x", 0, (const uint8_t *)reason, strlen(reason));
    m.status = KVEDGE_EPROTO;
    s_write(dir, "err", &m);
    m = s_msg(KVEDGE_KVMSG_HUGZ, NULL, 77, NULL, 0);
    m.registry = 99;
    s_write(dir, "hugz", &m);

    kvedge_master_node_t node = {
        KVEDGE_ROLE_CLOUD, "us-east", "tcp://10.0.0.7:7400", "", 1ull << 40, 1250000000ull, 800};
    memcpy(node.public_key, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", 41);
    if (kvedge_master_node_pack(&node, rec, &len) != 0)
        return 1;
    m = s_msg(KVEDGE_KVMSG_SET, "node/cloud-1", 0, rec, len);
    s_write(dir, "set-node", &m);
    m = s_msg(KVEDGE_KVMSG_KVPUB, "node/cloud-1", 5, rec, len);
    s_write(dir, "kvpub-node", &m);
    m = s_msg(KVEDGE_KVMSG_KVSYNC, "node/cloud-1", 5, rec, len);
    s_write(dir, "kvsync-node", &m);
    m = s_msg(KVEDGE_KVMSG_SET, "node/cloud-1", 0, NULL, 0);
    s_write(dir, "set-delete", &m);

    kvedge_master_health_t h = {KVEDGE_MASTER_HEALTH_SUSPECT, 1700000000000ull, 1700000003000ull};
    if (kvedge_master_health_pack(&h, rec, &len) != 0)
        return 1;
    m = s_msg(KVEDGE_KVMSG_KVPUB, "health/edge-1", 6, rec, len);
    s_write(dir, "kvpub-health", &m);

    kvedge_model_t model;
    if (kvedge_model_builtin("llama-3-8b", &model) != 0 ||
        kvedge_master_model_pack(&model, rec, &len) != 0)
        return 1;
    m = s_msg(KVEDGE_KVMSG_SET, "model/llama-3-8b", 0, rec, len);
    s_write(dir, "set-model", &m);

    static kvedge_master_map_t map;
    map.cloud_layers = 32;
    map.edge_layers = 12;
    for (int i = 0; i < 12; i++)
        map.from[i] = i < 10 ? (uint16_t)(i * 3) : KVEDGE_MASTER_MAP_NONE;
    if (kvedge_master_map_pack(&map, rec, &len) != 0)
        return 1;
    m = s_msg(KVEDGE_KVMSG_SET, "map/llama-2-7b/opt-125m", 0, rec, len);
    s_write(dir, "set-map", &m);

    kvedge_master_dir_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.model_id, sizeof d.model_id, "opt-125m");
    d.layers = 12;
    for (unsigned l = 0; l < 12; l += 2)
        kvedge_master_dir_set(&d, l);
    if (kvedge_master_dir_pack(&d, rec, &len) != 0)
        return 1;
    kvedge_chunk_id_t id;
    for (int i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++)
        id.bytes[i] = (uint8_t)(i * 7);
    char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1], key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    kvedge_master_chunk_hex(&id, hex);
    if (kvedge_master_key_format(KVEDGE_MASTER_SPACE_DIR, "edge-1", hex, key, sizeof key) != 0)
        return 1;
    m = s_msg(KVEDGE_KVMSG_SET, key, 0, rec, len);
    s_write(dir, "set-dir", &m);

    kvedge_master_link_t link = {2500, 12500000ull, 0, true, 1700000000000ull};
    if (kvedge_master_link_pack(&link, rec, &len) != 0)
        return 1;
    m = s_msg(KVEDGE_KVMSG_SET, "link/edge-1/cloud-1", 0, rec, len);
    s_write(dir, "set-link", &m);

    static kvedge_master_adapter_t ad;
    for (int i = 0; i < KVEDGE_MASTER_DIGEST_BYTES; i++)
        ad.digest[i] = (uint8_t)(i * 13 + 5);
    ad.size = 593752;
    ad.fit = KVEDGE_MASTER_FIT_DISTILLED;
    ad.cloud_layers = 6;
    ad.edge_layers = 4;
    const uint16_t afrom[4] = {1, 1, 2, KVEDGE_MASTER_MAP_NONE};
    memcpy(ad.from, afrom, sizeof afrom);
    snprintf(ad.cloud_rope, sizeof ad.cloud_rope, "theta=10000");
    snprintf(ad.edge_rope, sizeof ad.edge_rope, "theta=10000");
    if (kvedge_master_adapter_pack(&ad, rec, &len) != 0)
        return 1;
    m = s_msg(KVEDGE_KVMSG_SET, "adapter/kjv-llama-cloud/kjv-llama-edge", 0, rec, len);
    s_write(dir, "set-adapter", &m);
    return 0;
}
