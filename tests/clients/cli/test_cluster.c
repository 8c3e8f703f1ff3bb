/* `kvedge -H MASTER[,MASTER...] cluster` against real masters: the embedded default (role
 * single) with cloud and edge nodes, health and a directory (per-node counts, chunks held whole
 * by fewer than R up cloud nodes, text and JSON); no master answering (exit 5); and two masters
 * on a real etcd, asked through the standby (the leader found from its STATUS, etcd's member
 * listed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/master/master.h"
#include "access/codec/error.h"
#include "tests/common/testutil.h"
#include "tests/common/etcd.h"
#include "tests/store/master/mclient.h"

static char s_dir[128];
static char *s_out;

/* Runs kvedge with args; stdout into s_out. Returns the exit code. */
static int s_run(const char *args)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s %s 2>%s/err", KVEDGE_BIN, args, s_dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    free(s_out);
    size_t cap = 1 << 20, n = 0;
    s_out = malloc(cap);
    assert_non_null(s_out);
    for (size_t got; (got = fread(s_out + n, 1, cap - 1 - n, p)) > 0;)
        n += got;
    s_out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct {
    char router[200], pub[200], data[200];
    kvedge_master_t *m;
} s_mfx_t;

static void s_start(s_mfx_t *f, const char *name, const char *etcd)
{
    snprintf(f->router, sizeof f->router, "ipc://%s/%s.router", s_dir, name);
    snprintf(f->pub, sizeof f->pub, "ipc://%s/%s.pub", s_dir, name);
    snprintf(f->data, sizeof f->data, "%s/%s.data", s_dir, name);
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    o.bind = f->router;
    o.pub = f->pub;
    o.data_dir = f->data;
    o.insecure = true;
    o.etcd = etcd;
    o.etcd_prefix = "/t/cluster";
    o.id = name;
    o.lease_ms = 2000;
    char why[600] = "";
    int rc = kvedge_master_start(&o, &f->m, why, sizeof why);
    if (rc != 0)
        fail_msg("master: %s", why);
}

static void s_set(const s_mfx_t *f, const char *key, const void *body, size_t len)
{
    kt_mreply_t r;
    assert_int_equal(
        kt_master_call(f->router, KVEDGE_KVMSG_SET, key, body, len, 3000, &r, NULL, NULL), 0);
    if (r.cmd != KVEDGE_KVMSG_OK)
        fail_msg("SET %s: %s", key, r.body);
}

static void s_node(const s_mfx_t *f, const char *id, kvedge_role_t role, bool heartbeat)
{
    kvedge_master_node_t n = {.role = role, .capacity_bytes = 8ull << 30};
    snprintf(n.endpoint, sizeof n.endpoint, "tcp://127.0.0.1:9");
    snprintf(n.region, sizeof n.region, "eu-1");
    uint8_t b[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = 0;
    assert_int_equal(kvedge_master_node_pack(&n, b, &len), 0);
    char key[80];
    snprintf(key, sizeof key, "node/%s", id);
    s_set(f, key, b, len);
    kt_mreply_t r;
    if (heartbeat)
        assert_int_equal(
            kt_master_call(f->router, KVEDGE_KVMSG_HEARTBEAT, id, NULL, 0, 3000, &r, NULL, NULL),
            0);
}

/* dir/<node>/<chunk c repeated> holding layers [0, held) of opt-125m's 12. */
static void s_dir_entry(const s_mfx_t *f, const char *node, char c, unsigned held)
{
    kvedge_master_dir_t d = {.layers = 12};
    snprintf(d.model_id, sizeof d.model_id, "opt-125m");
    for (unsigned l = 0; l < held; l++)
        kvedge_master_dir_set(&d, l);
    uint8_t b[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = 0;
    assert_int_equal(kvedge_master_dir_pack(&d, b, &len), 0);
    char key[200], hex[65];
    memset(hex, c, 64);
    hex[64] = '\0';
    snprintf(key, sizeof key, "dir/%s/%s", node, hex);
    s_set(f, key, b, len);
}

static const cJSON *s_node_json(const cJSON *doc, const char *id)
{
    const cJSON *n;
    cJSON_ArrayForEach(
        n, cJSON_GetObjectItem(
               doc, "nodes")) if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(n, "id")), id) ==
                                  0) return n;
    fail_msg("node %s not listed", id);
    return NULL;
}

static int s_under(const cJSON *doc, char c)
{
    const cJSON *u;
    cJSON_ArrayForEach(u, cJSON_GetObjectItem(doc, "under_replicated"))
    {
        const char *chunk = cJSON_GetStringValue(cJSON_GetObjectItem(u, "chunk"));
        if (chunk && chunk[0] == c)
            return cJSON_GetObjectItem(u, "replicas")->valueint;
    }
    return -1; /* not under-replicated */
}

static void test_cluster_single(void **state)
{
    (void)state;
    s_mfx_t f;
    s_start(&f, "single", NULL);
    uint8_t mb[KVEDGE_MASTER_RECORD_MAX_BYTES];
    s_set(&f, "model/opt-125m", mb, kt_model_body("opt-125m", mb));
    s_node(&f, "c1", KVEDGE_ROLE_CLOUD, true);
    s_node(&f, "c2", KVEDGE_ROLE_CLOUD, true);
    s_node(&f, "c3", KVEDGE_ROLE_CLOUD, false); /* registered, never heard: not up */
    s_node(&f, "e1", KVEDGE_ROLE_EDGE, true);
    s_dir_entry(&f, "c1", 'a', 12); /* a: whole on c1 and c2 */
    s_dir_entry(&f, "c2", 'a', 12);
    s_dir_entry(&f, "c1", 'b', 12); /* b: whole on c1 only */
    s_dir_entry(&f, "c2", 'c', 5);  /* c: partly on c2, whole on c3 (not up) */
    s_dir_entry(&f, "c3", 'c', 12);
    s_dir_entry(&f, "e1", 'd', 12); /* d: whole on an edge node only */

    char args[400];
    snprintf(args, sizeof args, "-H %s cluster --json", f.router);
    assert_int_equal(s_run(args), 0);
    cJSON *doc = cJSON_Parse(s_out);
    assert_non_null(doc);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(doc, "leader")), "single");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "nodes")), 4);
    const cJSON *c1 = s_node_json(doc, "c1");
    assert_int_equal(cJSON_GetObjectItem(c1, "chunks")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(c1, "blocks")->valueint, 24);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(c1, "state")), "up");
    assert_true(cJSON_GetObjectItem(c1, "bytes_fp16")->valuedouble > 0);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(s_node_json(doc, "c3"), "state")),
                        "unknown");
    assert_int_equal(s_under(doc, 'a'), -1);
    assert_int_equal(s_under(doc, 'b'), 1);
    assert_int_equal(s_under(doc, 'c'), 0);
    assert_int_equal(s_under(doc, 'd'), 0);
    assert_int_equal(cJSON_GetObjectItem(doc, "under_replicated_count")->valueint, 3);
    cJSON_Delete(doc);
    /* R = 1: only the chunks no up cloud node holds whole. */
    snprintf(args, sizeof args, "-H %s cluster --json --replicas 1", f.router);
    assert_int_equal(s_run(args), 0);
    doc = cJSON_Parse(s_out);
    assert_int_equal(cJSON_GetObjectItem(doc, "under_replicated_count")->valueint, 2);
    cJSON_Delete(doc);
    /* Text. */
    snprintf(args, sizeof args, "-H %s cluster", f.router);
    assert_int_equal(s_run(args), 0);
    assert_non_null(strstr(s_out, "leader   single"));
    assert_non_null(strstr(s_out, "  3 chunks"));
    kvedge_master_destroy(&f.m);
}

static void test_cluster_no_master(void **state)
{
    (void)state;
    char args[400];
    snprintf(args, sizeof args, "-H ipc://%s/nobody.router cluster --deadline 300", s_dir);
    assert_int_equal(s_run(args), 5);
    assert_int_equal(s_run("cluster"), 2); /* no -H */
    snprintf(args, sizeof args, "-H ipc://%s/nobody.router --server-key %040d cluster", s_dir, 0);
    assert_int_equal(s_run(args), 2); /* a key without --cert */
}

static void test_cluster_on_etcd(void **state)
{
    (void)state;
    if (!kt_etcd_installed())
        skip();
    kt_etcd_t e;
    assert_int_equal(kt_etcd_start(&e, s_dir, 1), 0);
    s_mfx_t a, b;
    s_start(&a, "m1", e.endpoints);
    kt_wait_for(strcmp(kvedge_master_role(a.m), "leader") == 0, KT_WAIT_MS);
    s_start(&b, "m2", e.endpoints);
    kt_wait_for(strcmp(kvedge_master_role(b.m), "standby") == 0, KT_WAIT_MS);
    s_node(&a, "c1", KVEDGE_ROLE_CLOUD, true);
    /* Through the standby only: the leader comes from its STATUS. */
    char args[400];
    snprintf(args, sizeof args, "-H %s cluster --json", b.router);
    kt_wait_for(s_run(args) == 0 && strstr(s_out, "\"standby\""), KT_WAIT_MS);
    cJSON *doc = cJSON_Parse(s_out);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(doc, "leader")), "m1");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "masters")), 2);
    const cJSON *etcd = cJSON_GetObjectItem(doc, "etcd");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(etcd, "members")), 1);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "nodes")), 1);
    cJSON_Delete(doc);
    snprintf(args, sizeof args, "-H %s cluster", b.router);
    assert_int_equal(s_run(args), 0);
    assert_non_null(strstr(s_out, "leader   m1"));
    assert_non_null(strstr(s_out, "standby  m2"));
    assert_non_null(strstr(s_out, "etcd     healthy"));
    kvedge_master_destroy(&b.m);
    kvedge_master_destroy(&a.m);
    kt_etcd_stop(&e);
}

int main(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-test-cluster-%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", s_dir, s_dir);
    if (system(cmd) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_single),
        cmocka_unit_test(test_cluster_no_master),
        cmocka_unit_test(test_cluster_on_etcd),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(s_out);
    if (rc == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
        rc = system(cmd) == 0 ? 0 : 1;
    }
    return rc;
}
