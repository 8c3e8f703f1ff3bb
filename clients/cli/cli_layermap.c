/* `kvedge layermap`: which cloud layer each edge layer matches (CE-LSLM Eq. 11-16), measured
 * by running both models over calibration text (clients/e2e/layermap.h); prints the map, writes
 * it (--out), the similarity heatmaps (--heatmap, with gnuplot), fits the K/V adapter for the
 * map (--adapter, clients/e2e/adapter.h) and registers the map with the Storage Master
 * (--register). */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

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

static const char s_help[] =
    "Runs both models (OPT safetensors files or Hugging Face model folders) over the first N\n"
    "tokens of the calibration text, in\n"
    "windows of up to 256 tokens, compares every edge layer's output hidden states with every\n"
    "cloud layer's by linear CKA and RSA, and picks for each edge layer the cloud layer of\n"
    "Eq. 16: among the cloud layers with CKA >= X and RSA >= Y, the shallowest whose\n"
    "(CKA + RSA) / 2 is within 0.02 of the best; or none (docs/largesmall.md).\n\n"
    "Modes: measure (--cloud, --edge, --file, the calibration text, and --tokenizer unless the\n"
    "cloud model folder has a tokenizer.json), --show MAP\n"
    "or --show-adapter FILE. With --register, the global --server-key (the master's public key\n"
    "or certificate; none: plaintext, loopback and ipc only) and --cert (this client's secret\n"
    "certificate) reach the master.\n\n"
    "--json prints the map and both score matrices as one JSON object; with --register, a\n"
    "second line is the registration's JSON object.\n\n"
    "exit codes: 2 usage, a calibration text shorter than N tokens, a tokenizer or model that\n"
    "is refused or whose vocabularies do not fit, ids that are not registry ids; 4 a map\n"
    "(--show) or adapter (--show-adapter) that is refused (the message names the file and\n"
    "line or field), an adapter that does not fit the map, or a map whose layer\n"
    "counts disagree with the master's model records; 5 no master within the deadline; 6 the\n"
    "master refused the client's key; 1 a file that cannot be read or written, or a SET the\n"
    "master refused.\n";

/* What `kvedge layermap` runs on. */
typedef struct {
    const char *cloud, *edge, *tokenizer, *file, *out, *heatmap, *cloud_id, *edge_id;
    uint32_t samples, adapt_samples;
    double cka_min, rsa_min, ridge;
    int adapt; /* kvedge_adapt_kind_t */
    const char *adapter, *eval_text, *show, *show_adapter, *reg, *master_pub;
} s_opts_t;

static const kvedge_setting_choice_t s_adapt_kinds[] = {
    {"linear", KVEDGE_ADAPT_LINEAR}, {"heads", KVEDGE_ADAPT_HEADS}, {NULL, 0}};

static const kvedge_cmdopt_t s_opt_list[] = {
    {.name = "cloud",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, cloud),
     .help = "the large model's weights"},
    {.name = "edge",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, edge),
     .help = "the small model's weights"},
    {.name = "tokenizer",
     .arg = "PATH",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, tokenizer),
     .def_text = "the cloud model folder's tokenizer.json",
     .help = "a folder with vocab.json + merges.txt (else tokenizer.json), or a tokenizer.json"},
    {.name = "file",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, file),
     .alias = "calib",
     .help = "calibration text"},
    {.name = "samples",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, samples),
     .min = 3,
     .max = KVEDGE_RSA_MAX_SAMPLES,
     .def_num = KVEDGE_LAYERMAP_SAMPLES_DEFAULT,
     .help = "token positions compared"},
    {.name = "cka-min",
     .arg = "X",
     .type = KVEDGE_CMDOPT_DOUBLE,
     KVEDGE_CMDOPT_AT(s_opts_t, cka_min),
     .dmin = 0,
     .dmax = 1,
     .def_double = KVEDGE_LAYERMAP_CKA_MIN_DEFAULT,
     .help = "CKA threshold"},
    {.name = "rsa-min",
     .arg = "Y",
     .type = KVEDGE_CMDOPT_DOUBLE,
     KVEDGE_CMDOPT_AT(s_opts_t, rsa_min),
     .dmin = -1,
     .dmax = 1,
     .def_double = KVEDGE_LAYERMAP_RSA_MIN_DEFAULT,
     .help = "RSA threshold"},
    {.name = "out",
     .arg = "MAP",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, out),
     .help = "write the map file (format in docs/largesmall.md)"},
    {.name = "heatmap",
     .arg = "PREFIX",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, heatmap),
     .help = "PREFIX_cka.png and PREFIX_rsa.png (with .dat and .gp beside them) when gnuplot "
             "is on PATH"},
    {.name = "cloud-id",
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, cloud_id),
     .def_text = "from the path: DIR/SUB of DIR/SUB/model.safetensors, else the file name "
                 "without .safetensors",
     .help = "the cloud model's id in the map"},
    {.name = "edge-id",
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, edge_id),
     .def_text = "from the path, as --cloud-id",
     .help = "the edge model's id in the map"},
    {.name = "adapter",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, adapter),
     .help = "also fit the K/V adapter of the map on the same calibration tokens and write it "
             "(safetensors); prints each mapped layer's relative error ||Y - XW|| / ||Y|| for K "
             "and V. With --register the file is registered beside the map (adapter/CLOUD/EDGE: "
             "its digest, size, fit, map and rotary settings; edges check their copy against "
             "it); with --show MAP --register, FILE is an existing adapter of that map (e.g. "
             "distilled), read and registered, not fitted"},
    {.name = "adapt",
     .type = KVEDGE_CMDOPT_ENUM,
     KVEDGE_CMDOPT_AT(s_opts_t, adapt),
     .choices = s_adapt_kinds,
     .def = "linear",
     .help = "linear (least squares with a bias) or heads (head matching by CKA + ThinK "
             "channels, the paper's mechanism)"},
    {.name = "ridge",
     .arg = "R",
     .type = KVEDGE_CMDOPT_DOUBLE,
     KVEDGE_CMDOPT_AT(s_opts_t, ridge),
     .dmin = 0,
     .dmax = 1e9,
     .def_double = KVEDGE_ADAPT_RIDGE_DEFAULT,
     .help = "the linear fit's ridge, relative to the mean diagonal of X^T X"},
    {.name = "adapt-samples",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, adapt_samples),
     .min = 3,
     .max = S_ADAPT_SAMPLES_MAX,
     .def_text = "32768, or all the text has when fewer, at least --samples",
     .help = "calibration tokens the adapter is fitted on; its error is reported on the first "
             "--samples of them"},
    {.name = "eval-text",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, eval_text),
     .help = "also measure the adapter's error on the first N tokens of FILE"},
    {.name = "show-adapter",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, show_adapter),
     .help = "read an adapter (strictly) and print what it is; with --show MAP, check that it "
             "fits the map"},
    {.name = "show",
     .arg = "MAP",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, show),
     .help = "read a saved map (strictly) and print it; with --register, its ids may be "
             "replaced by --cloud-id and --edge-id, and --cloud with --edge give the model "
             "records to register as well"},
    {.name = "register",
     .arg = "EPS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, reg),
     .help = "SET the map as map/CLOUD_ID/EDGE_ID in the Storage Master at EPS (its ROUTER, "
             "or a list EP[,EP...] of the masters of one cluster: the leader takes it); the ids "
             "must be registry model "
             "ids (no '/'), and the layer counts those "
             "of the models the master (or the built-in table) knows under those ids; a model "
             "the master does not know yet is registered first from its weights (model/ID: "
             "layers, heads, head size, fp16), so proxies can use the map before any node "
             "stores that model"},
    {.name = "master-pub",
     .arg = "PUBS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, master_pub),
     .def_text = "for tcp://HOST:PORT, PORT+1",
     .help = "the master's PUB"},
};

static const kvedge_cmdopts_t s_opts = {
    .command = "layermap",
    .summary = "Match each edge layer to a cloud layer by CKA and RSA over calibration text.",
    .about = s_help,
    KVEDGE_CMDOPTS_OF(s_opts_t, s_opt_list)};

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
    const char *adapter; /* the adapter file registered beside the map (adapter/...), or NULL */
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

/* Registers the models of the map the registry does not know yet (models: their records
 * from the weights, or NULL), after checking that those it knows have the map's layer counts.
 * Returns an exit code. */
static int s_register_models(kvedge_cli_t *cli, kvedge_mview_t *v, const kvedge_layermap_t *map,
                             const s_reg_t *r, const kvedge_model_t *models)
{
    const char *side[2] = {"cloud", "edge"}, *id[2] = {map->cloud_id, map->edge_id};
    const uint32_t layers[2] = {map->cloud_layers, map->edge_layers};
    bool add[2] = {false, false};
    for (int i = 0; i < 2; i++) {
        uint32_t known = s_known_layers(v, id[i]);
        if (known && known != layers[i]) {
            kvedge_cli_error("layermap: the map gives the %s model %s %u layers, but the "
                             "registry's model %s has %u: a map of other models, or another "
                             "model under that id; nothing registered",
                             side[i], id[i], layers[i], id[i], known);
            return KVEDGE_EXIT_CORRUPT;
        }
        add[i] = !known && models;
        if (!known && !models)
            fprintf(stderr,
                    "kvedge: layermap: note: the master has no record of model %s; proxies "
                    "ignore the map until it has\n",
                    id[i]);
    }
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = 0;
    for (int i = 0; i < 2; i++) {
        char mkey[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        if (!add[i])
            continue;
        kvedge_model_t m = models[i];
        snprintf(m.id, sizeof m.id, "%s", id[i]);
        int rc =
            kvedge_master_key_format(KVEDGE_MASTER_SPACE_MODEL, id[i], NULL, mkey, sizeof mkey);
        if (rc == KVEDGE_OK && (rc = kvedge_master_model_pack(&m, body, &len)) == KVEDGE_OK)
            rc = kvedge_mview_set(v, mkey, body, len, r->deadline_ms);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("layermap: the master did not register %s: %s; the map is not "
                             "registered",
                             mkey, kvedge_strerror(rc));
            return rc == KVEDGE_ETIMEDOUT ? KVEDGE_EXIT_UNAVAILABLE
                   : rc == KVEDGE_EDENIED ? KVEDGE_EXIT_DENIED
                                          : KVEDGE_EXIT_FAILURE;
        }
        if (!cli->json)
            printf("registered %s at %s: the %s model, %u layers x %u KV heads x %u\n", mkey,
                   r->master, side[i], m.layers, m.kv_heads, m.head_dim);
    }
    return KVEDGE_EXIT_OK;
}

/* What was registered, as text or JSON. Returns an exit code. */
static int s_register_print(const kvedge_cli_t *cli, const char *key, const char *master,
                            uint64_t seq, const kvedge_master_map_t *rec)
{
    if (cli->json) {
        printf("{\"registered\":");
        kvedge_cli_json_str(stdout, key);
        printf(",\"master\":");
        kvedge_cli_json_str(stdout, master);
        printf(",\"seq\":%llu,\"cloud_layers\":%u,\"edge_layers\":%u,\"from\":[",
               (unsigned long long)seq, rec->cloud_layers, rec->edge_layers);
    } else {
        printf("registered %s at %s (seq %llu): cloud_layers=%u edge_layers=%u from=", key, master,
               (unsigned long long)seq, rec->cloud_layers, rec->edge_layers);
    }
    for (uint32_t e = 0; e < rec->edge_layers; e++) {
        const char *comma = e ? "," : "";
        if (rec->from[e] == KVEDGE_MASTER_MAP_NONE)
            printf("%s%s", comma, cli->json ? "null" : "-");
        else
            printf("%s%u", comma, rec->from[e]);
    }
    printf("%s\n", cli->json ? "]}" : "");
    return fflush(stdout) == 0 ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

/* The replica view of the master's model/ and map/ records for --register, synced; or an
 * exit code said why. Returns an exit code. */
static int s_register_view(const s_reg_t *r, const char *pub, kvedge_mview_t **v)
{
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = r->master;
    vo.pub = r->pub ? r->pub : pub;
    vo.server_key = r->server_key;
    vo.client_cert = r->server_key ? r->cert : NULL;
    vo.prefix = "m"; /* model/ and map/, nothing else */
    vo.start_wait_ms = r->deadline_ms;
    int rc = kvedge_mview_start(&vo, v);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot reach the master: %s%s", kvedge_strerror(rc),
                         rc == KVEDGE_EDENIED ? " (plaintext is for loopback and ipc only: give "
                                                "--server-key and --cert)"
                                              : "");
        return rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    if (kvedge_mview_state(*v) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("layermap: no snapshot from the master at %s within %d ms (master down, "
                         "wrong endpoint, or key not allowed); nothing registered",
                         r->master, r->deadline_ms);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    return KVEDGE_EXIT_OK;
}

/* The adapter file to register beside map: read strictly, checked against the map, its
 * digest taken (kvedge_adapter_load_digest); rec receives its record. Returns an exit code. */
static int s_adapter_record(const char *path, const kvedge_layermap_t *map,
                            kvedge_master_adapter_t *rec)
{
    kvedge_adapter_t *a = NULL;
    uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES];
    uint64_t size = 0;
    char why[KVEDGE_ADAPTER_REG_WHY_BYTES] = "";
    int rc = kvedge_adapter_load_digest(path, &a, digest, &size, why, sizeof why);
    int ex = KVEDGE_EXIT_OK;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: %s (%s); nothing registered", why[0] ? why : path,
                         kvedge_strerror(rc));
        ex = rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
    } else if ((rc = kvedge_adapter_check(a, map, NULL, NULL, why, sizeof why)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: the adapter %s does not fit the map of %s -> %s: %s; nothing "
                         "registered",
                         path, map->cloud_id, map->edge_id, why);
        ex = KVEDGE_EXIT_CORRUPT;
    } else if ((rc = kvedge_adapter_to_master(a, digest, size, rec, why, sizeof why)) !=
               KVEDGE_OK) {
        kvedge_cli_error("layermap: the adapter %s cannot be registered: %s; nothing registered",
                         path, why);
        ex = KVEDGE_EXIT_CORRUPT;
    }
    kvedge_adapter_destroy(&a);
    return ex;
}

/* SETs adapter/CLOUD/EDGE after the map and prints it. Returns an exit code. */
static int s_register_adapter(const kvedge_cli_t *cli, kvedge_mview_t *v,
                              const kvedge_layermap_t *map, const s_reg_t *r,
                              const kvedge_master_adapter_t *rec)
{
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1], hex[2 * KVEDGE_MASTER_DIGEST_BYTES + 1];
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = 0;
    int rc = kvedge_master_key_format(KVEDGE_MASTER_SPACE_ADAPTER, map->cloud_id, map->edge_id, key,
                                      sizeof key);
    if (rc == KVEDGE_OK && (rc = kvedge_master_adapter_pack(rec, body, &len)) == KVEDGE_OK)
        rc = kvedge_mview_set(v, key, body, len, r->deadline_ms);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: the master did not register %s: %s (the map is registered)",
                         key, kvedge_strerror(rc));
        return rc == KVEDGE_ETIMEDOUT ? KVEDGE_EXIT_UNAVAILABLE
               : rc == KVEDGE_EDENIED ? KVEDGE_EXIT_DENIED
                                      : KVEDGE_EXIT_FAILURE;
    }
    sodium_bin2hex(hex, sizeof hex, rec->digest, sizeof rec->digest);
    if (cli->json) {
        printf("{\"registered\":");
        kvedge_cli_json_str(stdout, key);
        printf(",\"master\":");
        kvedge_cli_json_str(stdout, r->master);
        printf(",\"seq\":%llu,\"adapter\":", (unsigned long long)kvedge_mview_seq(v));
        kvedge_cli_json_str(stdout, r->adapter);
        printf(",\"fit\":\"%s\",\"size\":%llu,\"digest\":\"%s\"}\n",
               kvedge_master_fit_name(rec->fit), (unsigned long long)rec->size, hex);
    } else {
        printf("registered %s at %s (seq %llu): %s, %s, %llu bytes, blake2b-256 %.16s...\n", key,
               r->master, (unsigned long long)kvedge_mview_seq(v), r->adapter,
               kvedge_master_fit_name(rec->fit), (unsigned long long)rec->size, hex);
    }
    return fflush(stdout) == 0 ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
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
    kvedge_master_adapter_t *arec = malloc(sizeof *arec);
    if (!rec || !arec) {
        free(rec);
        free(arec);
        return KVEDGE_EXIT_FAILURE;
    }
    char why[KVEDGE_LAYERMAP_WHY_BYTES] = "", key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1], pub[300];
    int ex = KVEDGE_EXIT_OK, rc = kvedge_layermap_to_master(map, rec, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: the map cannot be registered: %s (%s)", why,
                         kvedge_strerror(rc));
        ex = KVEDGE_EXIT_CORRUPT;
    } else if (!s_registry_ids(map->cloud_id, map->edge_id, key, sizeof key)) {
        ex = KVEDGE_EXIT_USAGE;
    } else if (!kvedge_cli_master_pubs("layermap", "register", r->master, "master-pub", r->pub, pub,
                                       sizeof pub)) {
        ex = KVEDGE_EXIT_USAGE;
    } else if (r->server_key && !r->cert) {
        kvedge_cli_error("layermap: --server-key needs --cert (this client's secret "
                         "certificate)");
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && r->adapter)
        ex = s_adapter_record(r->adapter, map, arec);
    kvedge_mview_t *v = NULL;
    if (!ex)
        ex = s_register_view(r, pub, &v);
    if (!ex)
        ex = s_register_models(cli, v, map, r, models);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = 0;
    if (!ex && (rc = kvedge_master_map_pack(rec, body, &len)) == KVEDGE_OK)
        rc = kvedge_mview_set(v, key, body, len, r->deadline_ms);
    if (!ex && rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: the master did not register %s: %s", key, kvedge_strerror(rc));
        ex = rc == KVEDGE_ETIMEDOUT ? KVEDGE_EXIT_UNAVAILABLE
             : rc == KVEDGE_EDENIED ? KVEDGE_EXIT_DENIED
                                    : KVEDGE_EXIT_FAILURE;
    }
    if (!ex)
        ex = s_register_print(cli, key, r->master, kvedge_mview_seq(v), rec);
    if (!ex && r->adapter)
        ex = s_register_adapter(cli, v, map, r, arec);
    kvedge_mview_destroy(&v);
    free(rec);
    free(arec);
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
        int mrc = ex ? KVEDGE_OK : kvedge_e2e_model(w[i], i ? map.edge_id : map.cloud_id, &recs[i]);
        if (mrc == KVEDGE_ESHAPE) {
            kvedge_cli_error("layermap: the map's %s model id %s carries other rotary settings "
                             "than %s",
                             side[i], i ? map.edge_id : map.cloud_id, wpath[i]);
            ex = KVEDGE_EXIT_USAGE;
        } else if (mrc != KVEDGE_OK || strlen(recs[i].id) >= sizeof map.cloud_id) {
            kvedge_cli_error("layermap: %s cannot be a registry record", wpath[i]);
            ex = KVEDGE_EXIT_USAGE;
        } else if (!ex) {
            /* A rotary model's served id has its fingerprint: register the map under it. */
            snprintf(i ? map.edge_id : map.cloud_id, sizeof map.cloud_id, "%s", recs[i].id);
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

/* How kvedge_adapter_fit fitted an adapter of that kind (a file without a "fit" field). */
static const char *s_default_fit(kvedge_adapt_kind_t kind)
{
    return kind == KVEDGE_ADAPT_HEADS ? "head matching (kvedge layermap --adapt heads)"
                                      : "least squares (kvedge layermap --adapter)";
}

/* Prints what an adapter is: models, shapes, kind, how it was fitted, layer pairs; for heads, which
 * cloud head each edge head takes. */
static int s_print_adapter(kvedge_cli_t *cli, const char *path, const kvedge_adapter_t *a)
{
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    if (cli->json) {
        printf("{\"adapter\":");
        kvedge_cli_json_str(stdout, path);
        printf(",\"kind\":\"%s\",\"fitted\":\"%s\",\"fit\":", kvedge_adapt_kind_name(i->kind),
               kvedge_adapter_fit_name(i));
        if (i->fit[0])
            kvedge_cli_json_str(stdout, i->fit);
        else
            printf("null");
        printf(",\"ridge\":%.17g,\"samples\":%u,\"cloud\":{\"id\":", i->ridge, i->samples);
        kvedge_cli_json_str(stdout, i->cloud_id);
        printf(",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u},\"edge\":{\"id\":", i->cloud_layers,
               i->cloud_heads, i->cloud_head_dim);
        kvedge_cli_json_str(stdout, i->edge_id);
        printf(",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u},\"from\":[", i->edge_layers,
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
        printf("fit: %s\n", i->fit[0] ? i->fit : s_default_fit(i->kind));
        printf("cloud %s: %u layers x %u KV heads x %u; edge %s: %u layers x %u KV heads x %u\n",
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

/* The adapter's relative errors, per mapped edge layer: K and V on the fit's first samples
 * calibration tokens, and on --eval-text. */
typedef struct {
    double *k_fit, *v_fit, *k_eval, *v_eval; /* [edge layers] each, one allocation */
    uint32_t samples, eval_samples;
} s_adapt_err_t;

/* The adapter's error on the first samples tokens of --eval-text into e. Returns an exit
 * code. */
static int s_adapter_eval_text(const s_adapt_opts_t *o, const kvedge_adapter_t *a,
                               const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                               kvedge_tokenizer_t *tok, s_adapt_err_t *e)
{
    int32_t *eids = NULL;
    size_t en = 0;
    int ex = s_encode_file(tok, o->eval_text, &eids, &en);
    const uint32_t cv = kvedge_decoder_config(cloud)->vocab,
                   ev = kvedge_decoder_config(edge)->vocab;
    e->eval_samples = en < e->samples ? (uint32_t)en : e->samples;
    for (size_t j = 0; !ex && j < e->eval_samples; j++)
        if (eids[j] < 0 || (uint32_t)eids[j] >= cv || (uint32_t)eids[j] >= ev) {
            kvedge_cli_error("layermap: token %zu of %s is outside a model's vocabulary", j,
                             o->eval_text);
            ex = KVEDGE_EXIT_USAGE;
        }
    if (!ex && e->eval_samples < 2) {
        kvedge_cli_error("layermap: %s gives %zu tokens, too short to measure on", o->eval_text,
                         en);
        ex = KVEDGE_EXIT_USAGE;
    }
    int rc;
    if (!ex && (rc = kvedge_adapter_eval(a, cloud, edge, eids, en, e->eval_samples, e->k_eval,
                                         e->v_eval)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot measure the adapter on %s: %s", o->eval_text,
                         kvedge_strerror(rc));
        ex = KVEDGE_EXIT_FAILURE;
    }
    free(eids);
    return ex;
}

/* The fitted adapter and its errors, as text or JSON. */
static void s_adapter_print(const kvedge_cli_t *cli, const s_adapt_opts_t *o,
                            const kvedge_adapter_t *a, const s_adapt_err_t *e)
{
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    if (cli->json) {
        printf("{\"adapter\":");
        kvedge_cli_json_str(stdout, o->path);
        printf(",\"kind\":\"%s\",\"ridge\":%.17g,\"samples\":%u,\"fit_error_samples\":%u,"
               "\"eval_samples\":%u,\"layers\":[",
               kvedge_adapt_kind_name(i->kind), i->ridge, i->samples, e->samples, e->eval_samples);
    } else {
        printf("\nadapter %s", kvedge_adapt_kind_name(i->kind));
        if (i->kind == KVEDGE_ADAPT_LINEAR)
            printf(" (ridge %g)", i->ridge);
        printf(" fitted on %u calibration samples, written to %s; relative error ||Y - XW|| / "
               "||Y|| on the first %u of them",
               i->samples, o->path, e->samples);
        if (o->eval_text)
            printf(" and %u of %s", e->eval_samples, o->eval_text);
        printf("\n%-10s %-11s %-8s %-8s%s\n", "edge", "cloud", "K fit", "V fit",
               o->eval_text ? " K eval   V eval" : "");
    }
    bool first = true;
    for (uint32_t l = 0; l < i->edge_layers; l++) {
        if (kvedge_adapter_from(a, l) == KVEDGE_LAYERMAP_NONE)
            continue;
        if (cli->json)
            printf("%s{\"edge\":%u,\"cloud\":%d,\"k_fit\":%.6f,\"v_fit\":%.6f", first ? "" : ",", l,
                   kvedge_adapter_from(a, l), e->k_fit[l], e->v_fit[l]);
        else
            printf("%-10u %-11d %-8.4f %-8.4f", l, kvedge_adapter_from(a, l), e->k_fit[l],
                   e->v_fit[l]);
        if (o->eval_text)
            printf(cli->json ? ",\"k_eval\":%.6f,\"v_eval\":%.6f" : " %-8.4f %.4f", e->k_eval[l],
                   e->v_eval[l]);
        printf(cli->json ? "}" : "\n");
        first = false;
    }
    if (cli->json)
        printf("]}\n");
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
    s_adapt_err_t e = {err, err + L, err + 2 * L, err + 3 * L, samples, 0};
    if (!ex && !err)
        ex = KVEDGE_EXIT_FAILURE;
    if (!ex && (rc = kvedge_adapter_eval(a, cloud, edge, ids, n, samples, e.k_fit, e.v_fit)) !=
                   KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot measure the adapter: %s", kvedge_strerror(rc));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex && o->eval_text)
        ex = s_adapter_eval_text(o, a, cloud, edge, tok, &e);
    if (!ex)
        s_adapter_print(cli, o, a, &e);
    if (!ex && fflush(stdout) != 0)
        ex = KVEDGE_EXIT_FAILURE;
    free(err);
    kvedge_adapter_destroy(&a);
    return ex;
}

/* What a layermap measurement works on. */
typedef struct {
    char cid[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1], eid[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1];
    kvedge_tokenizer_t *tok;
    kvedge_decoder_t *cloud, *edge;
    char *text;
    int32_t *ids;
    size_t n;
    kvedge_layermap_t map;
    double *cka, *rsa;
} s_lm_t;

static void s_lm_free(s_lm_t *r)
{
    free(r->cka);
    free(r->rsa);
    kvedge_layermap_clear(&r->map);
    kvedge_decoder_destroy(&r->edge);
    kvedge_decoder_destroy(&r->cloud);
    free(r->ids);
    free(r->text);
    kvedge_tokenizer_destroy(&r->tok);
}

/* Which flags go together; -1 when the line asks for a measurement, else an exit code (a
 * refused line, or --show / --show-adapter, which run here). */
static int s_lm_mode(kvedge_cli_t *cli, const s_opts_t *o, const s_reg_t *reg)
{
    bool adapt_flags = o->adapt != KVEDGE_ADAPT_LINEAR || o->ridge != KVEDGE_ADAPT_RIDGE_DEFAULT ||
                       o->adapt_samples || o->eval_text;
    if (!o->reg && o->master_pub) {
        kvedge_cli_error("layermap: --master-pub, --server-key and --cert go with --register");
        return KVEDGE_EXIT_USAGE;
    }
    if (adapt_flags && !o->adapter) {
        kvedge_cli_error("layermap: --adapt, --ridge, --adapt-samples and --eval-text go with "
                         "--adapter");
        return KVEDGE_EXIT_USAGE;
    }
    if (o->show_adapter) {
        if (o->adapter || o->reg || o->cloud || o->edge || o->tokenizer || o->file || o->out ||
            o->heatmap || o->cloud_id || o->edge_id) {
            kvedge_cli_error("layermap: --show-adapter takes no other flag but --json and --show");
            return KVEDGE_EXIT_USAGE;
        }
        return s_show_adapter(cli, o->show_adapter, o->show);
    }
    if (o->show && o->adapter && !o->reg) {
        kvedge_cli_error("layermap: --adapter fits on the models; with --show it names the "
                         "adapter file to register beside the map, and needs --register");
        return KVEDGE_EXIT_USAGE;
    }
    if (o->show)
        return s_show(cli, o->show,
                      o->tokenizer || o->file || o->out || o->heatmap ||
                          (adapt_flags && o->adapter),
                      o->cloud_id, o->edge_id, reg, o->cloud, o->edge);
    char own[4096];
    if (!o->cloud || !o->edge || !o->file ||
        (!o->tokenizer && !kvedge_cli_own_tokenizer(o->cloud, own, sizeof own))) {
        kvedge_cli_error("layermap: --cloud, --edge, --file and a tokenizer (--tokenizer, or the "
                         "cloud model folder's tokenizer.json) are required");
        return KVEDGE_EXIT_USAGE;
    }
    return -1;
}

/* The model ids of the map: given, else from the weights' paths; with --register, registry
 * ids (checked before the models run). Returns an exit code. */
static int s_lm_ids(const s_opts_t *o, s_lm_t *r)
{
    s_default_id(o->cloud, r->cid, sizeof r->cid);
    s_default_id(o->edge, r->eid, sizeof r->eid);
    if (o->cloud_id)
        snprintf(r->cid, sizeof r->cid, "%s", o->cloud_id);
    if (o->edge_id)
        snprintf(r->eid, sizeof r->eid, "%s", o->edge_id);
    if ((o->cloud_id && strlen(o->cloud_id) >= sizeof r->cid) ||
        (o->edge_id && strlen(o->edge_id) >= sizeof r->eid) || strpbrk(r->cid, " \t\n\r") ||
        strpbrk(r->eid, " \t\n\r") || !*r->cid || !*r->eid) {
        kvedge_cli_error("layermap: a model id is one word of at most %u bytes",
                         KVEDGE_LAYERMAP_ID_MAX_BYTES);
        return KVEDGE_EXIT_USAGE;
    }
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (o->reg && !s_registry_ids(r->cid, r->eid, key, sizeof key))
        return KVEDGE_EXIT_USAGE;
    return KVEDGE_EXIT_OK;
}

/* The tokenizer, the calibration text's tokens (enough for --samples and --adapt-samples)
 * and both models, whose vocabularies must hold those tokens. Returns an exit code. */
static int s_lm_load(const s_opts_t *o, s_lm_t *r)
{
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "", own[4096];
    size_t len = 0;
    const char *tp =
        o->tokenizer ? o->tokenizer : kvedge_cli_own_tokenizer(o->cloud, own, sizeof own);
    int rc = kvedge_tokenizer_load_path(tp, &r->tok, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot load the tokenizer: %s", why);
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_USAGE;
    }
    int ex = kvedge_cli_slurp("layermap", "the calibration text", o->file, S_TEXT_MAX_BYTES,
                              &r->text, &len);
    if (!ex && (rc = kvedge_tokenizer_encode(r->tok, r->text, len, &r->ids, &r->n)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot encode %s: %s", o->file, kvedge_strerror(rc));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex && r->n < o->samples) {
        kvedge_cli_error("layermap: %s gives %zu tokens, too short for %u samples (give a "
                         "longer text or a smaller --samples, at least 3)",
                         o->file, r->n, o->samples);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && r->n < o->adapt_samples) {
        kvedge_cli_error("layermap: %s gives %zu tokens, too short for --adapt-samples %u", o->file,
                         r->n, o->adapt_samples);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex)
        ex = kvedge_cli_load_model("layermap", o->cloud, "cloud", &r->cloud);
    if (!ex)
        ex = kvedge_cli_load_model("layermap", o->edge, "edge", &r->edge);
    /* A rotary model is served under its id with the rotary fingerprint (kvedge_e2e_model:
     * "@rope-XXXXXXXX"): the map names the models so. */
    char *ids[2] = {r->cid, r->eid};
    for (int i = 0; !ex && i < 2; i++) {
        kvedge_model_t m;
        if (kvedge_e2e_model(i ? r->edge : r->cloud, ids[i], &m) == KVEDGE_OK &&
            strlen(m.id) < sizeof r->cid)
            snprintf(ids[i], sizeof r->cid, "%s", m.id);
    }
    size_t need = o->samples > o->adapt_samples ? o->samples : o->adapt_samples;
    for (size_t i = 0; !ex && i < need; i++) {
        const uint32_t cv = kvedge_decoder_config(r->cloud)->vocab,
                       ev = kvedge_decoder_config(r->edge)->vocab;
        if (r->ids[i] < 0 || (uint32_t)r->ids[i] >= cv || (uint32_t)r->ids[i] >= ev) {
            kvedge_cli_error("layermap: token %zu of %s is id %d, outside the vocabulary of the "
                             "%s model (%u): the tokenizer does not fit the models",
                             i, o->file, r->ids[i], (uint32_t)r->ids[i] >= cv ? "cloud" : "edge",
                             (uint32_t)r->ids[i] >= cv ? cv : ev);
            ex = KVEDGE_EXIT_USAGE;
        }
    }
    return ex;
}

/* Builds the map, writes it (--out), prints it, draws the heatmaps. Returns an exit code. */
static int s_lm_build(const kvedge_cli_t *cli, const s_opts_t *o, s_lm_t *r)
{
    int rc = kvedge_layermap_build(r->cloud, r->cid, r->edge, r->eid, r->ids, r->n, o->samples,
                                   o->cka_min, o->rsa_min, &r->map, &r->cka, &r->rsa);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: %s", kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    if (o->out && (rc = kvedge_layermap_save(o->out, &r->map)) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot write %s: %s", o->out,
                         rc == KVEDGE_EIO ? strerror(errno) : kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    if (kvedge_layermap_print(stdout, &r->map, cli->json, r->cka, r->rsa) != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot write the output: %s", strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    return o->heatmap ? s_heatmap(o->heatmap, &r->map, r->cka, r->rsa) : KVEDGE_EXIT_OK;
}

/* --register after a measurement: the records a node would publish for these weights
 * (kvedge_e2e_model: fp16), then the map. Returns an exit code. */
static int s_lm_register(kvedge_cli_t *cli, const s_reg_t *reg, s_lm_t *r)
{
    kvedge_model_t recs[2];
    int rc;
    if ((rc = kvedge_e2e_model(r->cloud, r->cid, &recs[0])) != KVEDGE_OK ||
        (rc = kvedge_e2e_model(r->edge, r->eid, &recs[1])) != KVEDGE_OK) {
        kvedge_cli_error("layermap: the models cannot be registry records (%s): give "
                         "--cloud-id and --edge-id the served ids",
                         kvedge_strerror(rc));
        return KVEDGE_EXIT_USAGE;
    }
    return s_register(cli, &r->map, reg, recs);
}

static int s_layermap(kvedge_cli_t *cli, const void *opts)
{
    const s_opts_t *o = opts;
    s_reg_t reg = {o->reg,
                   o->master_pub,
                   cli->server_key,
                   cli->cert,
                   cli->deadline_ms > 0 ? cli->deadline_ms : S_REGISTER_DEADLINE_MS,
                   o->reg ? o->adapter : NULL};
    s_adapt_opts_t ad = {o->adapter, (kvedge_adapt_kind_t)o->adapt, o->ridge, o->eval_text,
                         o->adapt_samples};
    int ex = s_lm_mode(cli, o, &reg);
    if (ex >= 0)
        return ex;
    s_lm_t *r = calloc(1, sizeof *r);
    if (!r) {
        kvedge_cli_error("layermap: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    ex = s_lm_ids(o, r);
    if (!ex)
        ex = s_lm_load(o, r);
    if (!ex)
        ex = s_lm_build(cli, o, r);
    if (!ex && o->adapter)
        ex = s_adapter(cli, &ad, r->cloud, r->edge, r->tok, &r->map, r->ids, r->n, o->samples);
    if (!ex && o->reg)
        ex = s_lm_register(cli, &reg, r);
    s_lm_free(r);
    free(r);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_layermap_cmds[] = {
    {.name = "layermap", .opts = &s_opts, .exec = s_layermap},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
