/* Layer maps in the Storage Master (docs/largesmall.md, "Registering a map"): `kvedge layermap
 * --register` on the tiny fixture against itself, read back through a view and master-dump;
 * the maps it refuses with nothing registered (ids that are no registry ids, layer counts
 * that disagree with the registry's models); and the proxy's accessor, which ignores a bad map
 * written straight into the registry and says so once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/log.h"
#include "runtime/mview.h"
#include "clients/e2e/layermap.h"
#include "proxy/proxy_impl.h"
#include "access/codec/error.h"
#include "store/master/master.h"
#include "tests/common/logcap.h"
#include "tests/common/shell.h"
#include "tests/common/testutil.h"

static char s_dir[64];
static char s_ep[128], s_pub[128];
static kvedge_master_t *s_master;
static kvedge_mview_t *s_view;

static void s_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* The character byte b stands for in a byte-level BPE vocabulary (GPT-2's table). */
static unsigned s_byte_char(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
            k++;
    return 256 + k;
}

/* A byte tokenizer (ids 0..255, no merges) that fits opt_tiny's 256 ids, and calibration text. */
static void s_inputs(void)
{
    char path[160];
    snprintf(path, sizeof path, "%s/vocab.json", s_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputc('{', f);
    for (unsigned b = 0; b < 256; b++)
        fprintf(f, "%s\"\\u%04x\": %u", b ? ", " : "", s_byte_char(b), b);
    fputs("}\n", f);
    assert_int_equal(fclose(f), 0);
    snprintf(path, sizeof path, "%s/merges.txt", s_dir);
    s_write(path, "#version: 0.2\n");
    snprintf(path, sizeof path, "%s/calib.txt", s_dir);
    s_write(path, "In the beginning God created the heaven and the earth. And the earth was "
                  "without form, and void.\n");
}

/* Registers a model record of the given layer count. */
static void s_model(const char *id, uint16_t layers)
{
    kvedge_model_t m = {
        .layers = layers, .kv_heads = 2, .head_dim = 64, .dtype = KVEDGE_DTYPE_FP16};
    snprintf(m.id, sizeof m.id, "%s", id);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_model_pack(&m, body, &len), KVEDGE_OK);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    assert_int_equal(kvedge_master_key_format(KVEDGE_MASTER_SPACE_MODEL, id, NULL, key, sizeof key),
                     KVEDGE_OK);
    assert_int_equal(kvedge_mview_set(s_view, key, body, len, 0), KVEDGE_OK);
}

/* Writes a map record straight into the registry (only the record's own rules are checked). */
static void s_map(const char *cloud, const char *edge, const kvedge_master_map_t *r)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_map_pack(r, body, &len), KVEDGE_OK);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    assert_int_equal(
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, cloud, edge, key, sizeof key), KVEDGE_OK);
    assert_int_equal(kvedge_mview_set(s_view, key, body, len, 0), KVEDGE_OK);
}

/* Map records the view holds. */
static int s_count_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)key, (void)seq, (void)body, (void)len;
    (*(size_t *)ctx)++;
    return 0;
}

static size_t s_maps(void)
{
    size_t n = 0;
    assert_int_equal(kvedge_mview_foreach(s_view, "map/", s_count_cb, &n), KVEDGE_OK);
    return n;
}

/* The flags that register with the test's master. */
#define S_REG "--register %s --master-pub %s"

/* ---------------------------------------------------------------- tests */

static void test_register_round_trip(void **state)
{
    (void)state;
    const char *w = KVEDGE_FIXTURES "/opt_tiny.safetensors";
    s_model("tiny-cloud", 3);
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s/calib.txt "
                           "--samples 50 --cloud-id tiny-cloud --edge-id tiny-edge --out %s/t.map "
                           "--adapter %s/t.adapter " S_REG " > %s/out.txt 2> %s/err.txt",
                           KVEDGE_BIN, w, w, s_dir, s_dir, s_dir, s_dir, s_ep, s_pub, s_dir, s_dir),
                     0);
    char path[160];
    snprintf(path, sizeof path, "%s/out.txt", s_dir);
    assert_true(kt_file_has(path, "registered map/tiny-cloud/tiny-edge at "));
    /* With --adapter the adapter just fitted is registered beside the map (its digest). */
    assert_true(kt_file_has(path, "registered adapter/tiny-cloud/tiny-edge at "));
    assert_true(kt_file_has(path, ", least-squares, "));
    assert_true(kt_file_has(path, "cloud_layers=3 edge_layers=3 from=0,1,2"));
    /* The master knew tiny-cloud, not tiny-edge: its record is registered from the weights
     * first, so proxies can use the map before any node stores that model. */
    assert_true(kt_file_has(path, "registered model/tiny-edge at "));
    assert_false(kt_file_has(path, "registered model/tiny-cloud"));

    kvedge_master_map_t *r = malloc(sizeof *r);
    assert_non_null(r);
    /* The view has what the master holds now (the command's records are in). */
    assert_int_equal(kvedge_mview_wait(s_view, kvedge_master_seq(s_master), KT_WAIT_MS), KVEDGE_OK);
    assert_int_equal(kvedge_mview_map(s_view, "tiny-cloud", "tiny-edge", r), KVEDGE_OK);
    assert_int_equal(r->cloud_layers, 3);
    assert_int_equal(r->edge_layers, 3);
    for (uint16_t e = 0; e < 3; e++)
        assert_int_equal(r->from[e], e);
    kvedge_model_t em;
    assert_int_equal(kvedge_mview_model(s_view, "tiny-edge", &em), KVEDGE_OK);
    assert_int_equal(em.layers, 3);

    /* The conversion: none becomes KVEDGE_MASTER_MAP_NONE. */
    kvedge_layermap_t m;
    char why[KVEDGE_LAYERMAP_WHY_BYTES];
    snprintf(path, sizeof path, "%s/t.map", s_dir);
    assert_int_equal(kvedge_layermap_read(path, &m, why, sizeof why), KVEDGE_OK);
    m.entry[1].cloud = KVEDGE_LAYERMAP_NONE;
    assert_int_equal(kvedge_layermap_to_master(&m, r, why, sizeof why), KVEDGE_OK);
    assert_int_equal(r->from[0], 0);
    assert_int_equal(r->from[1], KVEDGE_MASTER_MAP_NONE);
    assert_int_equal(r->from[2], 2);
    m.entry[1].cloud = 7; /* out of range: check refuses it */
    assert_int_equal(kvedge_layermap_to_master(&m, r, why, sizeof why), KVEDGE_ECORRUPT);
    kvedge_layermap_clear(&m);
    free(r);

    /* A saved map under other ids, with --json: the map, then the registration; without
     * the weights the unknown edge model is only noted. */
    assert_int_equal(kt_sh("%s --json layermap --show %s/t.map --cloud-id tiny-cloud --edge-id "
                           "tiny-edge2 " S_REG " > %s/out.json 2> %s/err.txt",
                           KVEDGE_BIN, s_dir, s_ep, s_pub, s_dir, s_dir),
                     0);
    snprintf(path, sizeof path, "%s/out.json", s_dir);
    assert_true(kt_file_has(path, "{\"registered\":\"map/tiny-cloud/tiny-edge2\""));
    assert_true(kt_file_has(path, "\"from\":[0,1,2]}"));
    snprintf(path, sizeof path, "%s/err.txt", s_dir);
    assert_true(kt_file_has(path, "no record of model tiny-edge2")); /* a note, not an error */
    /* With --cloud and --edge, the saved map's models are registered from the weights; weights
     * that are not the map's models (here: not a model at all) are refused before anything
     * is registered, and --cloud needs --edge. */
    assert_int_equal(kt_sh("%s layermap --show %s/t.map --cloud-id tiny-cloud --edge-id "
                           "tiny-edge3 --cloud %s --edge %s " S_REG " > %s/out.txt",
                           KVEDGE_BIN, s_dir, w, w, s_ep, s_pub, s_dir),
                     0);
    snprintf(path, sizeof path, "%s/out.txt", s_dir);
    assert_true(kt_file_has(path, "registered model/tiny-edge3 at "));
    assert_true(kt_file_has(path, "registered map/tiny-cloud/tiny-edge3 at "));
    assert_int_equal(kt_sh("%s layermap --show %s/t.map --cloud-id tiny-cloud --edge-id "
                           "tiny-edge4 --cloud %s --edge %s " S_REG " > /dev/null 2> %s/err.txt",
                           KVEDGE_BIN, s_dir, w, KVEDGE_FIXTURES "/opt_tiny_expected.safetensors",
                           s_ep, s_pub, s_dir),
                     2);
    assert_int_equal(kt_sh("%s layermap --show %s/t.map --cloud %s " S_REG " 2> %s/err.txt",
                           KVEDGE_BIN, s_dir, w, s_ep, s_pub, s_dir),
                     2);
    /* master-dump decodes it. */
    assert_int_equal(kt_sh("%s master-dump --master %s --pub %s --prefix map/ > %s/dump.txt",
                           KVEDGE_BIN, s_ep, s_pub, s_dir),
                     0);
    snprintf(path, sizeof path, "%s/dump.txt", s_dir);
    assert_true(kt_file_has(path, "map/tiny-cloud/tiny-edge2 seq="));
    assert_true(kt_file_has(path, "cloud_layers=3 edge_layers=3 from=0,1,2"));
}

static void test_register_refused(void **state)
{
    (void)state;
    const char *w = KVEDGE_FIXTURES "/opt_tiny.safetensors";
    char path[160], err[160];
    snprintf(err, sizeof err, "%s/err.txt", s_dir);
    snprintf(path, sizeof path, "%s/r.map", s_dir);
    s_write(path, "kvedge-layermap 1\ncloud kjv/cloud 3 32\nedge kjv/edge 3 32\nsamples 50\n"
                  "thresholds 0.500000 0.500000\nlayer 0 0 0.9 0.9\nlayer 1 1 0.9 0.9\n"
                  "layer 2 none 0.1 0.1\nend\n");
    size_t before = s_maps();
    /* Ids with '/', as the default ids of models/kjv: refused, before the models run. */
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s/calib.txt "
                           "--samples 50 --cloud-id kjv/cloud --edge-id kjv/edge " S_REG " > "
                           "/dev/null 2> %s",
                           KVEDGE_BIN, w, w, s_dir, s_dir, s_ep, s_pub, err),
                     2);
    assert_true(kt_file_has(err, "not both registry model ids"));
    assert_true(kt_file_has(err, "--cloud-id kjv-cloud --edge-id kjv-edge"));
    assert_int_equal(kt_sh("%s layermap --show %s " S_REG " > /dev/null 2> %s", KVEDGE_BIN, path,
                           s_ep, s_pub, err),
                     2);
    assert_true(kt_file_has(err, "'kjv/cloud' and 'kjv/edge' are not both registry model ids"));
    /* The registry's models disagree with the map: 4 cloud layers, 3 in the map. */
    s_model("big-4", 4);
    assert_int_equal(kt_sh("%s layermap --show %s --cloud-id big-4 --edge-id small-3 " S_REG
                           " > /dev/null 2> %s",
                           KVEDGE_BIN, path, s_ep, s_pub, err),
                     4);
    assert_true(kt_file_has(err, "the registry's model big-4 has 4"));
    assert_true(kt_file_has(err, "nothing registered"));
    /* A built-in model's layer count counts too (opt-1.3b has 24). */
    assert_int_equal(kt_sh("%s layermap --show %s --cloud-id opt-1.3b --edge-id small-3 " S_REG
                           " > /dev/null 2> %s",
                           KVEDGE_BIN, path, s_ep, s_pub, err),
                     4);
    /* --register flags without --register; no master at all. */
    assert_int_equal(
        kt_sh("%s layermap --show %s --master-pub %s 2> %s", KVEDGE_BIN, path, s_pub, err), 2);
    assert_int_equal(kt_sh("%s --deadline 300 layermap --show %s --cloud-id a --edge-id b "
                           "--register ipc://%s/none.sock --master-pub ipc://%s/nonep.sock "
                           "> /dev/null 2> %s",
                           KVEDGE_BIN, path, s_dir, s_dir, err),
                     5);
    assert_true(kt_file_has(err, "no snapshot from the master"));
    assert_int_equal(kvedge_mview_wait(s_view, kvedge_mview_seq(s_view), 3000), KVEDGE_OK);
    assert_int_equal(s_maps(), before);
}

static void test_proxy_accessor(void **state)
{
    (void)state;
    kt_log_t log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kvedge_log_set_sink(kt_log_sink, &log);
    kvedge_proxy_impl_t *p = calloc(1, sizeof *p);
    kvedge_master_map_t *r = malloc(sizeof *r), *got = malloc(sizeof *got);
    assert_non_null(p);
    assert_non_null(r);
    assert_non_null(got);
    p->view = s_view;
    s_model("pa-cloud", 6);
    s_model("pa-edge", 3);
    s_model("pa-edge2", 3);

    /* A good map. */
    memset(r, 0, sizeof *r);
    r->cloud_layers = 6;
    r->edge_layers = 3;
    r->from[0] = 0;
    r->from[1] = KVEDGE_MASTER_MAP_NONE;
    r->from[2] = 4;
    s_map("pa-cloud", "pa-edge", r);
    assert_int_equal(kvedge_proxy_impl_map(p, "pa-cloud", "pa-edge", got), KVEDGE_OK);
    assert_int_equal(got->edge_layers, 3);
    assert_int_equal(got->from[1], KVEDGE_MASTER_MAP_NONE);
    assert_int_equal(got->from[2], 4);

    /* Edge layers that disagree with the edge model's record: ignored, said once. */
    r->edge_layers = 2;
    s_map("pa-cloud", "pa-edge2", r);
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvedge_proxy_impl_map(p, "pa-cloud", "pa-edge2", got), KVEDGE_EPROTO);
    assert_int_equal(got->edge_layers, 0);
    assert_int_equal(kt_log_count(&log, "ignoring layer map map/pa-cloud/pa-edge2 from the master",
                                  "it has 2 edge layers, model pa-edge2 has 3",
                                  "those layers are computed locally", NULL),
                     1);
    /* Cloud layers that disagree (4 in the map, 6 in the record); from[] within the map's 4. */
    r->cloud_layers = 4;
    r->edge_layers = 3;
    r->from[2] = 3;
    s_map("pa-cloud", "pa-edge", r);
    assert_int_equal(kvedge_proxy_impl_map(p, "pa-cloud", "pa-edge", got), KVEDGE_EPROTO);
    assert_int_equal(kt_log_count(&log, "map/pa-cloud/pa-edge ", "it has 4 cloud layers", NULL), 1);
    /* A model nobody registered: nothing to check the map against. */
    r->cloud_layers = 6;
    s_map("pa-cloud", "pa-ghost", r);
    assert_int_equal(kvedge_proxy_impl_map(p, "pa-cloud", "pa-ghost", got), KVEDGE_EPROTO);
    assert_int_equal(
        kt_log_count(&log, "map/pa-cloud/pa-ghost", "no record of model pa-ghost", NULL), 1);
    /* No map, bad ids, no view: not logged. */
    size_t lines = log.n;
    assert_int_equal(kvedge_proxy_impl_map(p, "pa-cloud", "pa-none", got), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_proxy_impl_map(p, "kjv/cloud", "pa-edge", got), KVEDGE_EINVAL);
    p->view = NULL;
    assert_int_equal(kvedge_proxy_impl_map(p, "pa-cloud", "pa-edge", got), KVEDGE_ENOTFOUND);
    assert_int_equal(log.n, lines);

    kvedge_log_set_sink(NULL, NULL);
    kt_log_clear(&log);
    free(got);
    free(r);
    free(p);
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-test-lmreg-XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    s_inputs();
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    char data[128];
    snprintf(data, sizeof data, "%s/master", s_dir);
    snprintf(s_ep, sizeof s_ep, "ipc://%s/m.sock", s_dir);
    snprintf(s_pub, sizeof s_pub, "ipc://%s/mp.sock", s_dir);
    o.bind = s_ep;
    o.pub = s_pub;
    o.data_dir = data;
    o.insecure = true;
    if (kvedge_master_start(&o, &s_master, NULL, 0) != KVEDGE_OK)
        return -1;
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = s_ep;
    vo.pub = s_pub;
    vo.start_wait_ms = 5000;
    if (kvedge_mview_start(&vo, &s_view) != KVEDGE_OK ||
        kvedge_mview_state(s_view) != KVEDGE_MVIEW_SYNCED)
        return -1;
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kvedge_mview_destroy(&s_view);
    kvedge_master_destroy(&s_master);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_round_trip),
        cmocka_unit_test(test_register_refused),
        cmocka_unit_test(test_proxy_accessor),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
