/* `kvedge layermap`: which cloud layer each edge layer matches (CE-LSLM Eq. 11-16), measured
 * by running both models over calibration text (clients/e2e/layermap.h); prints the map, writes
 * it (--out), the similarity heatmaps (--heatmap, with gnuplot), fits the K/V adapter for the
 * map (--adapter, clients/e2e/adapter.h) and registers the map with the Storage Master
 * (--register). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/mview.h"
#include "clients/e2e/adapter.h"
#include "clients/cli/cli.h"
#include "clients/decoder/tokenizer.h"
#include "clients/e2e/e2e.h"
#include "clients/e2e/layermap.h"
#include "gpu/rsa.h"
#include "access/codec/error.h"
#include "access/codec/model.h"

extern char **environ;

enum {
    S_O_CLOUD = 1000,
    S_O_EDGE,
    S_O_TOKENIZER,
    S_O_CALIB,
    S_O_SAMPLES,
    S_O_CKA_MIN,
    S_O_RSA_MIN,
    S_O_OUT,
    S_O_HEATMAP,
    S_O_CLOUD_ID,
    S_O_EDGE_ID,
    S_O_SHOW,
    S_O_REGISTER,
    S_O_MASTER_PUB,
    S_O_SERVER_KEY,
    S_O_CERT,
    S_O_ADAPTER,
    S_O_ADAPT,
    S_O_RIDGE,
    S_O_EVAL_TEXT,
    S_O_SHOW_ADAPTER,
    S_O_ADAPT_SAMPLES,
};

/* How long --register waits for the master's snapshot, then for its answer to the SET. */
#define S_REGISTER_DEADLINE_MS 3000
/* Largest calibration or evaluation text read. */
#define S_TEXT_MAX_BYTES (256u << 20)
/* Most calibration tokens an adapter is fitted on: the fit keeps every mapped pair's K, V
 * (and the cloud's Q) in memory, (3 x cloud width + 2 x edge width) x 4 bytes a token and
 * mapped layer (3.3 KiB for the KJV pair). */
#define S_ADAPT_SAMPLES_MAX 1048576u
/* Calibration tokens an adapter is fitted on by default: on the KJV pair the held-out error
 * falls from 2048 to 32768 samples and the gap between fit and held-out closes
 * (docs/largesmall.md, "Adapting the cloud's K/V"); about 45 s and 420 MB there. */
#define S_ADAPT_SAMPLES_DEFAULT 32768u

#define S_ARGS                                                                                     \
    "(--cloud W_CLOUD --edge W_EDGE --tokenizer DIR --calib FILE [--samples N] [--cka-min X] "     \
    "[--rsa-min Y] [--out MAP] [--heatmap PREFIX] [--adapter FILE [--adapt linear|heads] "         \
    "[--ridge R] [--adapt-samples N] [--eval-text FILE]] | --show MAP | --show-adapter FILE) "     \
    "[--cloud-id ID] "                                                                             \
    "[--edge-id ID] [--register MASTER [--master-pub PUB] [--server-key K --cert C]]"

static const char s_help[] =
    "Runs both OPT models (safetensors) over the first N tokens of the calibration text, in\n"
    "windows of up to 256 tokens, compares every edge layer's output hidden states with every\n"
    "cloud layer's by linear CKA and RSA, and picks for each edge layer the cloud layer of\n"
    "Eq. 16: among the cloud layers with CKA >= X and RSA >= Y, the shallowest whose\n"
    "(CKA + RSA) / 2 is within 0.02 of the best; or none (docs/largesmall.md).\n\n"
    "      --cloud FILE       the large model's weights\n"
    "      --edge FILE        the small model's weights\n"
    "      --tokenizer PATH   a folder with vocab.json + merges.txt (else tokenizer.json), or a\n"
    "                         tokenizer.json\n"
    "      --calib FILE       calibration text\n"
    "      --samples N        token positions compared (default 2048; 3..16384)\n"
    "      --cka-min X        CKA threshold (default 0.5)\n"
    "      --rsa-min Y        RSA threshold (default 0.5)\n"
    "      --out MAP          write the map file (format in docs/largesmall.md)\n"
    "      --heatmap PREFIX   PREFIX_cka.png and PREFIX_rsa.png (with .dat and .gp beside them)\n"
    "                         when gnuplot is on PATH\n"
    "      --cloud-id ID, --edge-id ID\n"
    "                         model ids in the map (default: from the path: DIR/SUB of\n"
    "                         DIR/SUB/model.safetensors, else the file name without "
    ".safetensors)\n"
    "      --adapter FILE     also fit the K/V adapter of the map on the same calibration\n"
    "                         tokens and write it (safetensors); prints each mapped layer's\n"
    "                         relative error ||Y - XW|| / ||Y|| for K and V\n"
    "      --adapt KIND       linear (default: least squares with a bias) or heads (head\n"
    "                         matching by CKA + ThinK channels, the paper's mechanism)\n"
    "      --ridge R          the linear fit's ridge, relative to the mean diagonal of X^T X\n"
    "                         (default 0.001)\n"
    "      --adapt-samples N  calibration tokens the adapter is fitted on (3..1048576; default\n"
    "                         32768, or all the text has when fewer, at least --samples); its\n"
    "                         error is reported on the first --samples of them\n"
    "      --eval-text FILE   also measure the adapter's error on the first N tokens of FILE\n"
    "      --show-adapter FILE\n"
    "                         read an adapter (strictly) and print what it is; with --show MAP,\n"
    "                         check that it fits the map\n"
    "      --show MAP         read a saved map (strictly) and print it; with --register, its\n"
    "                         ids may be replaced by --cloud-id and --edge-id, and --cloud\n"
    "                         with --edge give the model records to register as well\n"
    "      --register MASTER  SET the map as map/CLOUD_ID/EDGE_ID in the Storage Master at\n"
    "                         MASTER (its ROUTER); the ids must be registry model ids (no\n"
    "                         '/'), and the layer counts those of the models the master (or\n"
    "                         the built-in table) knows under those ids; a model the master\n"
    "                         does not know yet is registered first from its weights (model/ID:\n"
    "                         layers, heads, head size, fp16), so proxies can use the map\n"
    "                         before any node stores that model\n"
    "      --master-pub PUB   the master's PUB (default: for tcp://HOST:PORT, PORT+1)\n"
    "      --server-key KEY   the master's public key or certificate (none: plaintext, loopback\n"
    "                         and ipc only)\n"
    "      --cert FILE        this client's secret certificate (with --server-key)\n\n"
    "--json prints the map and both score matrices as one JSON object; with --register, a\n"
    "second line is the registration's JSON object.\n\n"
    "exit codes: 2 usage, a calibration text shorter than N tokens, a tokenizer or model that\n"
    "is refused or whose vocabularies do not fit, ids that are not registry ids; 4 a map\n"
    "(--show) or adapter (--show-adapter) that is refused (the message names the file and\n"
    "line or field), an adapter that does not fit the map, or a map whose layer\n"
    "counts disagree with the master's model records; 5 no master within the deadline; 6 the\n"
    "master refused the client's key; 1 a file that cannot be read or written, or a SET the\n"
    "master refused.\n";

/* The default id of a weights file: "kjv/cloud" for models/kjv/cloud/model.safetensors,
 * "opt_tiny" for .../opt_tiny.safetensors; whitespace becomes '_'. */
static void s_default_id(const char *path, char *id, size_t len)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    if (strcmp(base, "model.safetensors") == 0 && base != buf) {
        base[-1] = '\0';
        char *dir = strrchr(buf, '/');
        if (dir) {
            *dir = '\0';
            char *up = strrchr(buf, '/');
            *dir = '/';
            base = up ? up + 1 : buf;
        } else {
            base = buf;
        }
    } else {
        size_t n = strlen(base);
        if (n > 12 && strcmp(base + n - 12, ".safetensors") == 0)
            base[n - 12] = '\0';
    }
    if (!*base)
        base = "model";
    size_t k = strlen(base) < len ? strlen(base) : len - 1; /* a long name is cut */
    memcpy(id, base, k);
    id[k] = '\0';
    for (char *p = id; *p; p++)
        if (*p == ' ' || *p == '\t' || (unsigned char)*p < 0x21 || *p == 0x7f)
            *p = '_';
}

/* True when an executable named name is on PATH. */
static bool s_on_path(const char *name)
{
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char dir[4096];
    while (*path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && n + strlen(name) + 2 < sizeof dir) {
            snprintf(dir, sizeof dir, "%.*s/%s", (int)n, path, name);
            if (access(dir, X_OK) == 0)
                return true;
        }
        path += n + (path[n] == ':');
    }
    return false;
}

/* Writes PREFIX_{cka,rsa}.dat (rows: edge layers; columns: cloud layers), PREFIX.gp, and runs
 * gnuplot on it for PREFIX_{cka,rsa}.png. Returns an exit code. */
static int s_heatmap(const char *prefix, const kvedge_layermap_t *m, const double *cka,
                     const double *rsa)
{
    if (!s_on_path("gnuplot")) {
        fprintf(stderr, "kvedge: layermap: gnuplot is not on PATH: no heatmaps written\n");
        return KVEDGE_EXIT_OK;
    }
    size_t n = strlen(prefix) + 16;
    char *name = malloc(n);
    if (!name)
        return KVEDGE_EXIT_FAILURE;
    static const char *const what[2] = {"cka", "rsa"};
    for (int k = 0; k < 2; k++) {
        snprintf(name, n, "%s_%s.dat", prefix, what[k]);
        FILE *f = fopen(name, "w");
        const double *s = k ? rsa : cka;
        for (uint32_t e = 0; f && e < m->edge_layers; e++)
            for (uint32_t c = 0; c < m->cloud_layers; c++)
                fprintf(f, "%.6f%c", s[(size_t)e * m->cloud_layers + c],
                        c + 1 == m->cloud_layers ? '\n' : ' ');
        if (!f || fclose(f) != 0) {
            kvedge_cli_error("layermap: cannot write %s: %s", name, strerror(errno));
            free(name);
            return KVEDGE_EXIT_FAILURE;
        }
    }
    snprintf(name, n, "%s.gp", prefix);
    FILE *g = fopen(name, "w");
    if (g) {
        /* Edge layers up the y axis, cloud layers along x, as CE-LSLM's Fig. 5. */
        fprintf(g, "set terminal pngcairo size %u,%u font \",9\"\n", 160 + 60 * m->cloud_layers,
                120 + 60 * m->edge_layers);
        fprintf(g, "set xlabel \"cloud layer (%s)\"\nset ylabel \"edge layer (%s)\"\n", m->cloud_id,
                m->edge_id);
        fprintf(g, "set xtics 1\nset ytics 1\nset palette defined (0 \"#000004\", 0.5 "
                   "\"#b63679\", 1 \"#fcfdbf\")\nset autoscale fix\n");
        for (int k = 0; k < 2; k++) {
            fprintf(g, "set output \"%s_%s.png\"\n", prefix, what[k]);
            /* The colours span the matrix's own range (the labels give the values), so the
             * diagonal shows even when every score is high. */
            fprintf(g, "set title \"%s, %u samples (colours: the matrix's range)\"\n",
                    k ? "RSA" : "linear CKA", m->samples);
            fprintf(g,
                    "plot \"%s_%s.dat\" matrix with image notitle, \"\" matrix using "
                    "1:2:(sprintf(\"%%.2f\",$3)) with labels tc rgb \"#808080\" notitle\n",
                    prefix, what[k]);
        }
    }
    if (!g || fclose(g) != 0) {
        kvedge_cli_error("layermap: cannot write %s: %s", name, strerror(errno));
        free(name);
        return KVEDGE_EXIT_FAILURE;
    }
    char *argv[] = {"gnuplot", name, NULL};
    pid_t pid;
    int st = 0;
    int rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    if (rc == 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        fprintf(stderr, "kvedge: layermap: wrote %s_cka.png and %s_rsa.png\n", prefix, prefix);
        free(name);
        return KVEDGE_EXIT_OK;
    }
    kvedge_cli_error("layermap: gnuplot failed on %s", name);
    free(name);
    return KVEDGE_EXIT_FAILURE;
}

/* Where --register goes. */
typedef struct {
    const char *master;     /* the master's ROUTER; NULL: no registration */
    const char *pub;        /* its PUB; NULL: the ROUTER's port + 1 */
    const char *server_key; /* NULL: plaintext */
    const char *cert;
    int deadline_ms;
} s_reg_t;

/* The layer count the registry gives model id (built in, else its model record, as the proxy
 * resolves it), or 0 when it knows none. */
static uint32_t s_known_layers(kvedge_mview_t *v, const char *id)
{
    kvedge_model_t m;
    if (kvedge_model_builtin(id, &m) == KVEDGE_OK || kvedge_mview_model(v, id, &m) == KVEDGE_OK)
        return m.layers;
    return 0;
}

/* Whether cloud and edge can name a map in the registry (key receives map/CLOUD/EDGE); says
 * what to do when not. */
static bool s_registry_ids(const char *cloud, const char *edge, char *key, size_t cap)
{
    if (kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, cloud, edge, key, cap) == KVEDGE_OK)
        return true;
    kvedge_cli_error("layermap: '%s' and '%s' are not both registry model ids (1..%u printable "
                     "bytes, no '/'): give the ids the models are served under with --cloud-id "
                     "and --edge-id (e.g. --cloud-id kjv-cloud --edge-id kjv-edge for the trained "
                     "pair); nothing registered",
                     cloud, edge, KVEDGE_MASTER_MAX_MODEL_ID_BYTES);
    return false;
}

/* `--register`: the map as the master's record, checked against the models the registry
 * knows, SET as map/CLOUD/EDGE; prints what was registered. models (cloud, edge; NULL when
 * the weights are not at hand, as with --show) are the two models' records from their
 * weights: one the registry lacks is registered first (model/ID), so proxies can check and
 * use the map before any node stores that model. Nothing is written when a check fails.
 * Returns an exit code. */
static int s_register(kvedge_cli_t *cli, const kvedge_layermap_t *map, const s_reg_t *r,
                      const kvedge_model_t *models)
{
    kvedge_master_map_t *rec = malloc(sizeof *rec);
    if (!rec)
        return KVEDGE_EXIT_FAILURE;
    char why[KVEDGE_LAYERMAP_WHY_BYTES] = "", key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    int ex = KVEDGE_EXIT_OK, rc = kvedge_layermap_to_master(map, rec, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: the map cannot be registered: %s (%s)", why,
                         kvedge_strerror(rc));
        ex = KVEDGE_EXIT_CORRUPT;
    } else if (!s_registry_ids(map->cloud_id, map->edge_id, key, sizeof key)) {
        ex = KVEDGE_EXIT_USAGE;
    }
    char pub[300];
    if (!ex && !r->pub && kvedge_cli_default_pub(r->master, pub, sizeof pub) != 0) {
        kvedge_cli_error("layermap: give --master-pub for %s", r->master);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && r->server_key && !r->cert) {
        kvedge_cli_error("layermap: --server-key needs --cert (this client's secret "
                         "certificate)");
        ex = KVEDGE_EXIT_USAGE;
    }
    if (ex) {
        free(rec);
        return ex;
    }
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = r->master;
    vo.pub = r->pub ? r->pub : pub;
    vo.server_key = r->server_key;
    vo.client_cert = r->server_key ? r->cert : NULL;
    vo.prefix = "m"; /* model/ and map/, nothing else */
    vo.start_wait_ms = r->deadline_ms;
    kvedge_mview_t *v = NULL;
    rc = kvedge_mview_start(&vo, &v);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot reach the master: %s%s", kvedge_strerror(rc),
                         rc == KVEDGE_EDENIED ? " (plaintext is for loopback and ipc only: give "
                                                "--server-key and --cert)"
                                              : "");
        free(rec);
        return rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    if (kvedge_mview_state(v) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("layermap: no snapshot from the master at %s within %d ms (master down, "
                         "wrong endpoint, or key not allowed); nothing registered",
                         r->master, r->deadline_ms);
        ex = KVEDGE_EXIT_UNAVAILABLE;
    }
    const char *side[2] = {"cloud", "edge"}, *id[2] = {map->cloud_id, map->edge_id};
    const uint32_t layers[2] = {map->cloud_layers, map->edge_layers};
    bool add[2] = {false, false};
    for (int i = 0; !ex && i < 2; i++) {
        uint32_t known = s_known_layers(v, id[i]);
        if (known && known != layers[i]) {
            kvedge_cli_error("layermap: the map gives the %s model %s %u layers, but the "
                             "registry's model %s has %u: a map of other models, or another "
                             "model under that id; nothing registered",
                             side[i], id[i], layers[i], id[i], known);
            ex = KVEDGE_EXIT_CORRUPT;
        } else if (!known && models) {
            add[i] = true;
        } else if (!known) {
            fprintf(stderr,
                    "kvedge: layermap: note: the master has no record of model %s; proxies "
                    "ignore the map until it has\n",
                    id[i]);
        }
    }
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = 0;
    for (int i = 0; !ex && i < 2; i++) {
        char mkey[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        if (!add[i])
            continue;
        kvedge_model_t m = models[i];
        snprintf(m.id, sizeof m.id, "%s", id[i]);
        rc = kvedge_master_key_format(KVEDGE_MASTER_SPACE_MODEL, id[i], NULL, mkey, sizeof mkey);
        if (rc == KVEDGE_OK && (rc = kvedge_master_model_pack(&m, body, &len)) == KVEDGE_OK)
            rc = kvedge_mview_set(v, mkey, body, len, r->deadline_ms);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("layermap: the master did not register %s: %s; the map is not "
                             "registered",
                             mkey, kvedge_strerror(rc));
            ex = rc == KVEDGE_ETIMEDOUT ? KVEDGE_EXIT_UNAVAILABLE
                 : rc == KVEDGE_EDENIED ? KVEDGE_EXIT_DENIED
                                        : KVEDGE_EXIT_FAILURE;
        } else if (!cli->json) {
            printf("registered %s at %s: the %s model, %u layers x %u heads x %u\n", mkey,
                   r->master, side[i], m.layers, m.kv_heads, m.head_dim);
        }
    }
    if (!ex && (rc = kvedge_master_map_pack(rec, body, &len)) == KVEDGE_OK)
        rc = kvedge_mview_set(v, key, body, len, r->deadline_ms);
    if (!ex && rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: the master did not register %s: %s", key, kvedge_strerror(rc));
        ex = rc == KVEDGE_ETIMEDOUT ? KVEDGE_EXIT_UNAVAILABLE
             : rc == KVEDGE_EDENIED ? KVEDGE_EXIT_DENIED
                                    : KVEDGE_EXIT_FAILURE;
    }
    if (!ex) {
        if (cli->json) {
            printf("{\"registered\":");
            kvedge_cli_json_str(stdout, key);
            printf(",\"master\":");
            kvedge_cli_json_str(stdout, r->master);
            printf(",\"seq\":%llu,\"cloud_layers\":%u,\"edge_layers\":%u,\"from\":[",
                   (unsigned long long)kvedge_mview_seq(v), rec->cloud_layers, rec->edge_layers);
        } else {
            printf("registered %s at %s (seq %llu): cloud_layers=%u edge_layers=%u from=", key,
                   r->master, (unsigned long long)kvedge_mview_seq(v), rec->cloud_layers,
                   rec->edge_layers);
        }
        for (uint32_t e = 0; e < rec->edge_layers; e++) {
            const char *comma = e ? "," : "";
            if (rec->from[e] == KVEDGE_MASTER_MAP_NONE)
                printf("%s%s", comma, cli->json ? "null" : "-");
            else
                printf("%s%u", comma, rec->from[e]);
        }
        printf("%s\n", cli->json ? "]}" : "");
        if (fflush(stdout) != 0)
            ex = KVEDGE_EXIT_FAILURE;
    }
    kvedge_mview_destroy(&v);
    free(rec);
    return ex;
}

/* `--show MAP`: the strict reader, then the table or JSON; with --register, the map (its ids
 * replaced by cloud_id and edge_id when given) goes to the master. Returns an exit code. */
static int s_show(kvedge_cli_t *cli, const char *path, bool others, const char *cloud_id,
                  const char *edge_id, const s_reg_t *reg, const char *cloud_w, const char *edge_w)
{
    if (others || (!reg->master && (cloud_id || edge_id || cloud_w || edge_w)) ||
        (!cloud_w != !edge_w)) {
        kvedge_cli_error("layermap: --show takes no other flag but --json and --register (with "
                         "--cloud-id, --edge-id, the master's flags, and --cloud with --edge to "
                         "register the model records too)");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_layermap_t map;
    char why[KVEDGE_LAYERMAP_WHY_BYTES] = "";
    int rc = kvedge_layermap_read(path, &map, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: %s (%s)", why, kvedge_strerror(rc));
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
    }
    int ex = KVEDGE_EXIT_OK;
    const char *ids[2] = {cloud_id, edge_id};
    char *dst[2] = {map.cloud_id, map.edge_id};
    for (int i = 0; i < 2; i++) {
        if (!ids[i])
            continue;
        if (!*ids[i] || strlen(ids[i]) > KVEDGE_LAYERMAP_ID_MAX_BYTES ||
            strpbrk(ids[i], " \t\n\r")) {
            kvedge_cli_error("layermap: a model id is one word of at most %u bytes",
                             KVEDGE_LAYERMAP_ID_MAX_BYTES);
            ex = KVEDGE_EXIT_USAGE;
        } else {
            snprintf(dst[i], KVEDGE_LAYERMAP_ID_MAX_BYTES + 1, "%s", ids[i]);
        }
    }
    if (!ex && kvedge_layermap_print(stdout, &map, cli->json, NULL, NULL) != KVEDGE_OK)
        ex = KVEDGE_EXIT_FAILURE;
    /* With the weights, the two model records too (checked against the map's shapes). */
    kvedge_model_t recs[2];
    kvedge_decoder_t *w[2] = {NULL, NULL};
    const char *wpath[2] = {cloud_w, edge_w}, *side[2] = {"cloud", "edge"};
    const uint32_t layers[2] = {map.cloud_layers, map.edge_layers},
                   hidden[2] = {map.cloud_hidden, map.edge_hidden};
    for (int i = 0; !ex && cloud_w && i < 2; i++) {
        ex = kvedge_cli_load_model("layermap", wpath[i], side[i], &w[i]);
        const kvedge_decoder_config_t *c = ex ? NULL : kvedge_decoder_config(w[i]);
        if (!ex && (c->layers != layers[i] || c->hidden != hidden[i])) {
            kvedge_cli_error("layermap: %s has %u layers x %u, the map's %s model %u x %u",
                             wpath[i], c->layers, c->hidden, side[i], layers[i], hidden[i]);
            ex = KVEDGE_EXIT_USAGE;
        }
        if (!ex && kvedge_e2e_model(w[i], i ? map.edge_id : map.cloud_id, &recs[i]) != KVEDGE_OK) {
            kvedge_cli_error("layermap: %s cannot be a registry record", wpath[i]);
            ex = KVEDGE_EXIT_USAGE;
        }
    }
    if (!ex && reg->master)
        ex = s_register(cli, &map, reg, cloud_w ? recs : NULL);
    kvedge_decoder_destroy(&w[0]);
    kvedge_decoder_destroy(&w[1]);
    kvedge_layermap_clear(&map);
    return ex;
}

/* The cloud head edge head h of layer e selects (a heads adapter), or -1. */
static int s_head_source(const kvedge_adapter_t *a, uint32_t e, uint32_t h, uint32_t *kept)
{
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    const float *w = kvedge_adapter_weights(a, e, false);
    const size_t din = (size_t)i->cloud_heads * i->cloud_head_dim,
                 dout = (size_t)i->edge_heads * i->edge_head_dim;
    int src = -1;
    *kept = 0;
    for (size_t r = 0; w && r < din; r++)
        for (uint32_t j = 0; j < i->edge_head_dim; j++)
            if (w[r * dout + (size_t)h * i->edge_head_dim + j] == 1.0f) {
                src = (int)(r / i->cloud_head_dim);
                (*kept)++;
            }
    return src;
}

/* Prints what an adapter is: models, shapes, kind, layer pairs; for heads, which cloud head
 * each edge head takes. */
static int s_print_adapter(kvedge_cli_t *cli, const char *path, const kvedge_adapter_t *a)
{
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    if (cli->json) {
        printf("{\"adapter\":");
        kvedge_cli_json_str(stdout, path);
        printf(",\"kind\":\"%s\",\"ridge\":%.17g,\"samples\":%u,\"cloud\":{\"id\":",
               kvedge_adapt_kind_name(i->kind), i->ridge, i->samples);
        kvedge_cli_json_str(stdout, i->cloud_id);
        printf(",\"layers\":%u,\"heads\":%u,\"head_dim\":%u},\"edge\":{\"id\":", i->cloud_layers,
               i->cloud_heads, i->cloud_head_dim);
        kvedge_cli_json_str(stdout, i->edge_id);
        printf(",\"layers\":%u,\"heads\":%u,\"head_dim\":%u},\"from\":[", i->edge_layers,
               i->edge_heads, i->edge_head_dim);
        for (uint32_t e = 0; e < i->edge_layers; e++) {
            const int32_t c = kvedge_adapter_from(a, e);
            if (c == KVEDGE_LAYERMAP_NONE)
                printf("%snull", e ? "," : "");
            else
                printf("%s%d", e ? "," : "", c);
        }
        printf("]}\n");
    } else {
        printf("adapter %s: %s", path, kvedge_adapt_kind_name(i->kind));
        if (i->kind == KVEDGE_ADAPT_LINEAR)
            printf(", ridge %g", i->ridge);
        printf(", fitted on %u samples\n", i->samples);
        printf("cloud %s: %u layers x %u heads x %u; edge %s: %u layers x %u heads x %u\n",
               i->cloud_id, i->cloud_layers, i->cloud_heads, i->cloud_head_dim, i->edge_id,
               i->edge_layers, i->edge_heads, i->edge_head_dim);
        printf("%-10s %-11s%s\n", "edge", "cloud",
               i->kind == KVEDGE_ADAPT_HEADS ? " edge head <- cloud head (channels)" : "");
        for (uint32_t e = 0; e < i->edge_layers; e++) {
            const int32_t c = kvedge_adapter_from(a, e);
            char cs[16];
            snprintf(cs, sizeof cs, c == KVEDGE_LAYERMAP_NONE ? "none" : "%d", c);
            printf("%-10u %-11s", e, cs);
            for (uint32_t h = 0;
                 c != KVEDGE_LAYERMAP_NONE && i->kind == KVEDGE_ADAPT_HEADS && h < i->edge_heads;
                 h++) {
                uint32_t kept = 0;
                const int src = s_head_source(a, e, h, &kept);
                printf(" %u<-%d(%u)", h, src, kept);
            }
            printf("\n");
        }
    }
    return fflush(stdout) == 0 ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

/* `--show-adapter FILE [--show MAP]`: the strict reader, the description, and with a map the
 * check that the adapter is the map's. Returns an exit code. */
static int s_show_adapter(kvedge_cli_t *cli, const char *path, const char *map_path)
{
    kvedge_adapter_t *a = NULL;
    char why[KVEDGE_LAYERMAP_WHY_BYTES] = "";
    int rc = kvedge_adapter_load(path, &a, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: %s (%s)", why[0] ? why : path, kvedge_strerror(rc));
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
    }
    int ex = s_print_adapter(cli, path, a);
    if (!ex && map_path) {
        kvedge_layermap_t map;
        rc = kvedge_layermap_read(map_path, &map, why, sizeof why);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("layermap: %s (%s)", why, kvedge_strerror(rc));
            ex =
                rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
        } else if ((rc = kvedge_adapter_check(a, &map, NULL, NULL, why, sizeof why)) != KVEDGE_OK) {
            kvedge_cli_error("layermap: the adapter %s does not fit the map %s: %s", path, map_path,
                             why);
            ex = KVEDGE_EXIT_CORRUPT;
        } else if (!cli->json) {
            printf("fits the map %s\n", map_path);
        }
        kvedge_layermap_clear(&map);
    }
    kvedge_adapter_destroy(&a);
    return ex;
}

/* What --adapter does after the map is built. */
typedef struct {
    const char *path; /* the adapter file */
    kvedge_adapt_kind_t kind;
    double ridge;          /* < 0: the default */
    const char *eval_text; /* or NULL */
    uint64_t samples;      /* calibration tokens the fit uses; 0: those of the map */
} s_adapt_opts_t;

/* Reads and encodes a text; its tokens in *ids (caller frees). Returns an exit code. */
static int s_encode_file(kvedge_tokenizer_t *tok, const char *path, int32_t **ids, size_t *n)
{
    char *text = NULL;
    size_t len = 0;
    int ex = kvedge_cli_slurp("layermap", "the text", path, S_TEXT_MAX_BYTES, &text, &len);
    if (ex)
        return ex;
    int rc = kvedge_tokenizer_encode(tok, text, len, ids, n);
    free(text);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot encode %s: %s", path, kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* Fits the adapter of map on the calibration tokens, writes it, and prints each mapped
 * layer's relative error on those tokens (and on --eval-text). Returns an exit code. */
static int s_adapter(kvedge_cli_t *cli, const s_adapt_opts_t *o, const kvedge_decoder_t *cloud,
                     const kvedge_decoder_t *edge, kvedge_tokenizer_t *tok,
                     const kvedge_layermap_t *map, const int32_t *ids, size_t n, uint32_t samples)
{
    kvedge_adapter_t *a = NULL;
    /* Default: the whole calibration text up to S_ADAPT_SAMPLES_DEFAULT, never fewer than the
     * map's samples (the caller checked the text holds those). */
    uint32_t fit = (uint32_t)o->samples;
    if (!fit)
        fit = n < S_ADAPT_SAMPLES_DEFAULT ? (uint32_t)n : S_ADAPT_SAMPLES_DEFAULT;
    if (fit < samples)
        fit = samples;
    int rc = kvedge_adapter_fit(cloud, edge, map, ids, n, fit, o->kind, o->ridge, &a);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot fit the adapter: %s", kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    int ex = KVEDGE_EXIT_OK;
    if ((rc = kvedge_adapter_save(a, o->path)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot write %s: %s", o->path,
                         rc == KVEDGE_EIO ? strerror(errno) : kvedge_strerror(rc));
        ex = KVEDGE_EXIT_FAILURE;
    }
    const uint32_t L = map->edge_layers;
    double *err = calloc(4 * (size_t)L, sizeof(double));
    int32_t *eids = NULL;
    size_t en = 0;
    uint32_t esamples = 0;
    if (!ex && !err)
        ex = KVEDGE_EXIT_FAILURE;
    if (!ex &&
        (rc = kvedge_adapter_eval(a, cloud, edge, ids, n, samples, err, err + L)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot measure the adapter: %s", kvedge_strerror(rc));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex && o->eval_text && !(ex = s_encode_file(tok, o->eval_text, &eids, &en))) {
        const uint32_t cv = kvedge_decoder_config(cloud)->vocab,
                       ev = kvedge_decoder_config(edge)->vocab;
        esamples = en < samples ? (uint32_t)en : samples;
        for (size_t j = 0; !ex && j < esamples; j++)
            if (eids[j] < 0 || (uint32_t)eids[j] >= cv || (uint32_t)eids[j] >= ev) {
                kvedge_cli_error("layermap: token %zu of %s is outside a model's vocabulary", j,
                                 o->eval_text);
                ex = KVEDGE_EXIT_USAGE;
            }
        if (!ex && esamples < 2) {
            kvedge_cli_error("layermap: %s gives %zu tokens, too short to measure on", o->eval_text,
                             en);
            ex = KVEDGE_EXIT_USAGE;
        }
        if (!ex && (rc = kvedge_adapter_eval(a, cloud, edge, eids, en, esamples, err + 2 * L,
                                             err + 3 * L)) != KVEDGE_OK) {
            kvedge_cli_error("layermap: cannot measure the adapter on %s: %s", o->eval_text,
                             kvedge_strerror(rc));
            ex = KVEDGE_EXIT_FAILURE;
        }
    }
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    if (!ex && cli->json) {
        printf("{\"adapter\":");
        kvedge_cli_json_str(stdout, o->path);
        printf(",\"kind\":\"%s\",\"ridge\":%.17g,\"samples\":%u,\"fit_error_samples\":%u,"
               "\"eval_samples\":%u,\"layers\":[",
               kvedge_adapt_kind_name(i->kind), i->ridge, i->samples, samples, esamples);
        bool first = true;
        for (uint32_t e = 0; e < L; e++) {
            if (kvedge_adapter_from(a, e) == KVEDGE_LAYERMAP_NONE)
                continue;
            printf("%s{\"edge\":%u,\"cloud\":%d,\"k_fit\":%.6f,\"v_fit\":%.6f", first ? "" : ",", e,
                   kvedge_adapter_from(a, e), err[e], err[L + e]);
            if (o->eval_text)
                printf(",\"k_eval\":%.6f,\"v_eval\":%.6f", err[2 * L + e], err[3 * L + e]);
            printf("}");
            first = false;
        }
        printf("]}\n");
    } else if (!ex) {
        printf("\nadapter %s", kvedge_adapt_kind_name(i->kind));
        if (i->kind == KVEDGE_ADAPT_LINEAR)
            printf(" (ridge %g)", i->ridge);
        printf(" fitted on %u calibration samples, written to %s; relative error ||Y - XW|| / "
               "||Y|| on the first %u of them",
               i->samples, o->path, samples);
        if (o->eval_text)
            printf(" and %u of %s", esamples, o->eval_text);
        printf("\n%-10s %-11s %-8s %-8s%s\n", "edge", "cloud", "K fit", "V fit",
               o->eval_text ? " K eval   V eval" : "");
        for (uint32_t e = 0; e < L; e++) {
            if (kvedge_adapter_from(a, e) == KVEDGE_LAYERMAP_NONE)
                continue;
            printf("%-10u %-11d %-8.4f %-8.4f", e, kvedge_adapter_from(a, e), err[e], err[L + e]);
            if (o->eval_text)
                printf(" %-8.4f %.4f", err[2 * L + e], err[3 * L + e]);
            printf("\n");
        }
    }
    if (!ex && fflush(stdout) != 0)
        ex = KVEDGE_EXIT_FAILURE;
    free(eids);
    free(err);
    kvedge_adapter_destroy(&a);
    return ex;
}

static bool s_threshold(const char *s, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > 1)
        return false;
    *out = v;
    return true;
}

static int s_cmd_layermap(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"cloud", required_argument, NULL, S_O_CLOUD},
        {"edge", required_argument, NULL, S_O_EDGE},
        {"tokenizer", required_argument, NULL, S_O_TOKENIZER},
        {"calib", required_argument, NULL, S_O_CALIB},
        {"samples", required_argument, NULL, S_O_SAMPLES},
        {"cka-min", required_argument, NULL, S_O_CKA_MIN},
        {"rsa-min", required_argument, NULL, S_O_RSA_MIN},
        {"out", required_argument, NULL, S_O_OUT},
        {"heatmap", required_argument, NULL, S_O_HEATMAP},
        {"cloud-id", required_argument, NULL, S_O_CLOUD_ID},
        {"edge-id", required_argument, NULL, S_O_EDGE_ID},
        {"show", required_argument, NULL, S_O_SHOW},
        {"register", required_argument, NULL, S_O_REGISTER},
        {"master-pub", required_argument, NULL, S_O_MASTER_PUB},
        {"server-key", required_argument, NULL, S_O_SERVER_KEY},
        {"cert", required_argument, NULL, S_O_CERT},
        {"adapter", required_argument, NULL, S_O_ADAPTER},
        {"adapt", required_argument, NULL, S_O_ADAPT},
        {"ridge", required_argument, NULL, S_O_RIDGE},
        {"eval-text", required_argument, NULL, S_O_EVAL_TEXT},
        {"show-adapter", required_argument, NULL, S_O_SHOW_ADAPTER},
        {"adapt-samples", required_argument, NULL, S_O_ADAPT_SAMPLES},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {
        "layermap", NULL, S_ARGS, "Match edge layers to cloud layers by CKA and RSA.", NULL, NULL};
    const char *cloud_path = NULL, *edge_path = NULL, *tok_path = NULL, *calib = NULL;
    const char *out = NULL, *heatmap = NULL, *cloud_id = NULL, *edge_id = NULL, *show = NULL;
    s_reg_t reg = {NULL, NULL, cli->server_key, cli->cert,
                   cli->deadline_ms > 0 ? cli->deadline_ms : S_REGISTER_DEADLINE_MS};
    uint64_t samples = KVEDGE_LAYERMAP_SAMPLES_DEFAULT;
    double cka_min = KVEDGE_LAYERMAP_CKA_MIN_DEFAULT, rsa_min = KVEDGE_LAYERMAP_RSA_MIN_DEFAULT;
    s_adapt_opts_t ad = {NULL, KVEDGE_ADAPT_LINEAR, -1.0, NULL, 0};
    const char *show_adapter = NULL;
    bool adapt_flags = false;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        bool ok = true;
        switch (ch) {
        case S_O_CLOUD:
            cloud_path = optarg;
            break;
        case S_O_EDGE:
            edge_path = optarg;
            break;
        case S_O_TOKENIZER:
            tok_path = optarg;
            break;
        case S_O_CALIB:
            calib = optarg;
            break;
        case S_O_OUT:
            out = optarg;
            break;
        case S_O_HEATMAP:
            heatmap = optarg;
            break;
        case S_O_CLOUD_ID:
            cloud_id = optarg;
            break;
        case S_O_EDGE_ID:
            edge_id = optarg;
            break;
        case S_O_SHOW:
            show = optarg;
            break;
        case S_O_REGISTER:
            reg.master = optarg;
            break;
        case S_O_MASTER_PUB:
            reg.pub = optarg;
            break;
        case S_O_SERVER_KEY:
            reg.server_key = optarg;
            break;
        case S_O_CERT:
            reg.cert = optarg;
            break;
        case S_O_ADAPTER:
            ad.path = optarg;
            break;
        case S_O_ADAPT:
            ok = kvedge_adapt_kind_parse(optarg, &ad.kind) == KVEDGE_OK;
            adapt_flags = true;
            break;
        case S_O_RIDGE: {
            char *end;
            errno = 0;
            ad.ridge = strtod(optarg, &end);
            ok = *optarg && !*end && !errno && isfinite(ad.ridge) && ad.ridge >= 0;
            adapt_flags = true;
            break;
        }
        case S_O_EVAL_TEXT:
            ad.eval_text = optarg;
            adapt_flags = true;
            break;
        case S_O_ADAPT_SAMPLES:
            ok = kvedge_cli_parse_u64(optarg, 3, S_ADAPT_SAMPLES_MAX, &ad.samples) == 0;
            adapt_flags = true;
            break;
        case S_O_SHOW_ADAPTER:
            show_adapter = optarg;
            break;
        case S_O_SAMPLES:
            ok = kvedge_cli_parse_u64(optarg, 3, KVEDGE_RSA_MAX_SAMPLES, &samples) == 0;
            break;
        case S_O_CKA_MIN:
            ok = s_threshold(optarg, 0, &cka_min);
            break;
        case S_O_RSA_MIN:
            ok = s_threshold(optarg, -1, &rsa_min);
            break;
        case 'h':
            kvedge_cli_usage(stdout, &cmd, s_help);
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("layermap: unknown option or missing value '%s' (see kvedge "
                             "layermap --help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (!ok) {
            kvedge_cli_error("layermap: bad value '%s' for %s (samples 3..16384, --cka-min in "
                             "[0, 1], --rsa-min in [-1, 1], --adapt linear or heads, --ridge "
                             ">= 0)",
                             optarg, argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("layermap: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    if (!reg.master && (reg.pub || reg.server_key != cli->server_key || reg.cert != cli->cert)) {
        kvedge_cli_error("layermap: --master-pub, --server-key and --cert go with --register");
        return KVEDGE_EXIT_USAGE;
    }
    if (adapt_flags && !ad.path) {
        kvedge_cli_error("layermap: --adapt, --ridge, --adapt-samples and --eval-text go with "
                         "--adapter");
        return KVEDGE_EXIT_USAGE;
    }
    if (show_adapter) {
        if (ad.path || reg.master || cloud_path || edge_path || tok_path || calib || out ||
            heatmap || cloud_id || edge_id) {
            kvedge_cli_error("layermap: --show-adapter takes no other flag but --json and --show");
            return KVEDGE_EXIT_USAGE;
        }
        return s_show_adapter(cli, show_adapter, show);
    }
    if (show && ad.path) {
        kvedge_cli_error("layermap: --adapter fits on the models: it does not go with --show");
        return KVEDGE_EXIT_USAGE;
    }
    if (show)
        return s_show(cli, show, tok_path || calib || out || heatmap, cloud_id, edge_id, &reg,
                      cloud_path, edge_path);
    if (!cloud_path || !edge_path || !tok_path || !calib) {
        kvedge_cli_error("layermap: --cloud, --edge, --tokenizer and --calib are required");
        return KVEDGE_EXIT_USAGE;
    }
    char cid[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1], eid[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1];
    s_default_id(cloud_path, cid, sizeof cid);
    s_default_id(edge_path, eid, sizeof eid);
    if (cloud_id)
        snprintf(cid, sizeof cid, "%s", cloud_id);
    if (edge_id)
        snprintf(eid, sizeof eid, "%s", edge_id);
    if ((cloud_id && strlen(cloud_id) >= sizeof cid) ||
        (edge_id && strlen(edge_id) >= sizeof eid) || strpbrk(cid, " \t\n\r") ||
        strpbrk(eid, " \t\n\r") || !*cid || !*eid) {
        kvedge_cli_error("layermap: a model id is one word of at most %u bytes",
                         KVEDGE_LAYERMAP_ID_MAX_BYTES);
        return KVEDGE_EXIT_USAGE;
    }
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (reg.master && !s_registry_ids(cid, eid, key, sizeof key))
        return KVEDGE_EXIT_USAGE; /* before the models run */

    kvedge_tokenizer_t *tok = NULL;
    kvedge_decoder_t *cloud = NULL, *edge = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    kvedge_layermap_t map = {0};
    double *cka = NULL, *rsa = NULL;
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    struct stat st;
    int rc = stat(tok_path, &st) == 0 && S_ISDIR(st.st_mode)
                 ? kvedge_tokenizer_load_dir(tok_path, &tok, why, sizeof why)
                 : kvedge_tokenizer_load_json(tok_path, &tok, why, sizeof why);
    int ex = KVEDGE_EXIT_OK;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot load the tokenizer: %s", why);
        ex = rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_USAGE;
    }
    if (!ex)
        ex = kvedge_cli_slurp("layermap", "the calibration text", calib, S_TEXT_MAX_BYTES, &text,
                              &len);
    if (!ex && (rc = kvedge_tokenizer_encode(tok, text, len, &ids, &n)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot encode %s: %s", calib, kvedge_strerror(rc));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex && n < samples) {
        kvedge_cli_error("layermap: %s gives %zu tokens, too short for %llu samples (give a "
                         "longer text or a smaller --samples, at least 3)",
                         calib, n, (unsigned long long)samples);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && n < ad.samples) {
        kvedge_cli_error("layermap: %s gives %zu tokens, too short for --adapt-samples %llu", calib,
                         n, (unsigned long long)ad.samples);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex)
        ex = kvedge_cli_load_model("layermap", cloud_path, "cloud", &cloud);
    if (!ex)
        ex = kvedge_cli_load_model("layermap", edge_path, "edge", &edge);
    for (size_t i = 0; !ex && i < (samples > ad.samples ? samples : ad.samples); i++) {
        const uint32_t cv = kvedge_decoder_config(cloud)->vocab,
                       ev = kvedge_decoder_config(edge)->vocab;
        if (ids[i] < 0 || (uint32_t)ids[i] >= cv || (uint32_t)ids[i] >= ev) {
            kvedge_cli_error("layermap: token %zu of %s is id %d, outside the vocabulary of the "
                             "%s model (%u): the tokenizer does not fit the models",
                             i, calib, ids[i], (uint32_t)ids[i] >= cv ? "cloud" : "edge",
                             (uint32_t)ids[i] >= cv ? cv : ev);
            ex = KVEDGE_EXIT_USAGE;
        }
    }
    if (!ex) {
        rc = kvedge_layermap_build(cloud, cid, edge, eid, ids, n, (uint32_t)samples, cka_min,
                                   rsa_min, &map, &cka, &rsa);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("layermap: %s", kvedge_strerror(rc));
            ex = KVEDGE_EXIT_FAILURE;
        }
    }
    if (!ex && out && (rc = kvedge_layermap_save(out, &map)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot write %s: %s", out,
                         rc == KVEDGE_EIO ? strerror(errno) : kvedge_strerror(rc));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex && kvedge_layermap_print(stdout, &map, cli->json, cka, rsa) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot write the output: %s", strerror(errno));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex && heatmap)
        ex = s_heatmap(heatmap, &map, cka, rsa);
    if (!ex && ad.path)
        ex = s_adapter(cli, &ad, cloud, edge, tok, &map, ids, n, (uint32_t)samples);
    kvedge_model_t recs[2];
    if (!ex && reg.master) {
        /* The records a node would publish for these weights (kvedge_e2e_model: fp16). */
        if ((rc = kvedge_e2e_model(cloud, cid, &recs[0])) != KVEDGE_OK ||
            (rc = kvedge_e2e_model(edge, eid, &recs[1])) != KVEDGE_OK) {
            kvedge_cli_error("layermap: the models cannot be registry records (%s): give "
                             "--cloud-id and --edge-id the served ids",
                             kvedge_strerror(rc));
            ex = KVEDGE_EXIT_USAGE;
        }
    }
    if (!ex && reg.master)
        ex = s_register(cli, &map, &reg, recs);
    free(cka);
    free(rsa);
    kvedge_layermap_clear(&map);
    kvedge_decoder_destroy(&edge);
    kvedge_decoder_destroy(&cloud);
    free(ids);
    free(text);
    kvedge_tokenizer_destroy(&tok);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_layermap_cmds[] = {
    {"layermap", s_cmd_layermap, S_ARGS,
     "Match each edge layer to a cloud layer by CKA and RSA over calibration text.", NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
