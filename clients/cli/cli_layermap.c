/* `kvedge layermap`: which cloud layer each edge layer matches (CE-LSLM Eq. 11-16), measured
 * by running both models over calibration text (clients/layermap.h); prints the map, writes
 * it (--out), the similarity heatmaps (--heatmap, with gnuplot), and registers it with the
 * Storage Master (--register). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access/mview.h"
#include "clients/cli/cli.h"
#include "clients/decoder/tokenizer.h"
#include "clients/layermap.h"
#include "gpu/rsa.h"
#include "store/error.h"
#include "store/model.h"

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
};

/* How long --register waits for the master's snapshot, then for its answer to the SET. */
#define S_REGISTER_DEADLINE_MS 3000

#define S_ARGS                                                                                     \
    "(--cloud W_CLOUD --edge W_EDGE --tokenizer DIR --calib FILE [--samples N] [--cka-min X] "     \
    "[--rsa-min Y] [--out MAP] [--heatmap PREFIX] | --show MAP) [--cloud-id ID] [--edge-id ID] "   \
    "[--register MASTER [--master-pub PUB] [--server-key K --cert C]]"

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
    "      --show MAP         read a saved map (strictly) and print it; with --register, its\n"
    "                         ids may be replaced by --cloud-id and --edge-id\n"
    "      --register MASTER  SET the map as map/CLOUD_ID/EDGE_ID in the Storage Master at\n"
    "                         MASTER (its ROUTER); the ids must be registry model ids (no\n"
    "                         '/'), and the layer counts those of the models the master (or\n"
    "                         the built-in table) knows under those ids\n"
    "      --master-pub PUB   the master's PUB (default: for tcp://HOST:PORT, PORT+1)\n"
    "      --server-key KEY   the master's public key or certificate (none: plaintext, loopback\n"
    "                         and ipc only)\n"
    "      --cert FILE        this client's secret certificate (with --server-key)\n\n"
    "--json prints the map and both score matrices as one JSON object; with --register, a\n"
    "second line is the registration's JSON object.\n\n"
    "exit codes: 2 usage, a calibration text shorter than N tokens, a tokenizer or model that\n"
    "is refused or whose vocabularies do not fit, ids that are not registry ids; 4 a map\n"
    "(--show) that is refused (the message names the file and line), or one whose layer\n"
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

/* Reads a file into a new buffer. Returns 0 or -1 (errno set). */
static int s_slurp(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    int e = buf ? (ferror(f) ? EIO : 0) : ENOMEM;
    fclose(f);
    if (e) {
        free(buf);
        errno = e;
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int s_load_model(const char *path, const char *side, kvedge_decoder_t **out)
{
    kvedge_decoder_t *md = kvedge_decoder_new();
    int rc = md ? kvedge_decoder_load(md, path, 0) : KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("layermap: cannot load the %s model %s: %s%s%s", side, path,
                         kvedge_strerror(rc), md && *kvedge_decoder_error(md) ? ": " : "",
                         md ? kvedge_decoder_error(md) : "");
        kvedge_decoder_destroy(&md);
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_USAGE;
    }
    *out = md;
    return KVEDGE_EXIT_OK;
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

/* The PUB endpoint next to a ROUTER endpoint tcp://HOST:PORT: tcp://HOST:PORT+1. */
static int s_default_pub(const char *master, char *out, size_t cap)
{
    const char *colon = strrchr(master, ':');
    uint64_t port;
    if (strncmp(master, "tcp://", 6) != 0 || !colon ||
        kvedge_cli_parse_u64(colon + 1, 1, 65534, &port) != 0)
        return -1;
    snprintf(out, cap, "%.*s:%llu", (int)(colon - master), master, (unsigned long long)port + 1);
    return 0;
}

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
 * knows, SET as map/CLOUD/EDGE; prints what was registered. Nothing is written when a check
 * fails. Returns an exit code. */
static int s_register(kvedge_cli_t *cli, const kvedge_layermap_t *map, const s_reg_t *r)
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
    if (!ex && !r->pub && s_default_pub(r->master, pub, sizeof pub) != 0) {
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
    for (int i = 0; !ex && i < 2; i++) {
        uint32_t known = s_known_layers(v, id[i]);
        if (known && known != layers[i]) {
            kvedge_cli_error("layermap: the map gives the %s model %s %u layers, but the "
                             "registry's model %s has %u: a map of other models, or another "
                             "model under that id; nothing registered",
                             side[i], id[i], layers[i], id[i], known);
            ex = KVEDGE_EXIT_CORRUPT;
        } else if (!known) {
            fprintf(stderr,
                    "kvedge: layermap: note: the master has no record of model %s; proxies "
                    "ignore the map until it has\n",
                    id[i]);
        }
    }
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
                  const char *edge_id, const s_reg_t *reg)
{
    if (others || (!reg->master && (cloud_id || edge_id))) {
        kvedge_cli_error("layermap: --show takes no other flag but --json and --register (with "
                         "--cloud-id, --edge-id and the master's flags)");
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
    if (!ex && reg->master)
        ex = s_register(cli, &map, reg);
    kvedge_layermap_clear(&map);
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
    static const struct option opts[] = {{"cloud", required_argument, NULL, S_O_CLOUD},
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
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"layermap", NULL, S_ARGS,
                                  "Match edge layers to cloud layers by CKA and RSA."};
    const char *cloud_path = NULL, *edge_path = NULL, *tok_path = NULL, *calib = NULL;
    const char *out = NULL, *heatmap = NULL, *cloud_id = NULL, *edge_id = NULL, *show = NULL;
    s_reg_t reg = {NULL, NULL, cli->server_key, cli->cert,
                   cli->deadline_ms > 0 ? cli->deadline_ms : S_REGISTER_DEADLINE_MS};
    uint64_t samples = KVEDGE_LAYERMAP_SAMPLES_DEFAULT;
    double cka_min = KVEDGE_LAYERMAP_CKA_MIN_DEFAULT, rsa_min = KVEDGE_LAYERMAP_RSA_MIN_DEFAULT;
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
                             "[0, 1], --rsa-min in [-1, 1])",
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
    if (show)
        return s_show(cli, show, cloud_path || edge_path || tok_path || calib || out || heatmap,
                      cloud_id, edge_id, &reg);
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
    if (!ex && s_slurp(calib, &text, &len) != 0) {
        kvedge_cli_error("layermap: cannot read %s: %s", calib, strerror(errno));
        ex = KVEDGE_EXIT_FAILURE;
    }
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
    if (!ex)
        ex = s_load_model(cloud_path, "cloud", &cloud);
    if (!ex)
        ex = s_load_model(edge_path, "edge", &edge);
    for (size_t i = 0; !ex && i < samples; i++) {
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
    if (!ex && reg.master)
        ex = s_register(cli, &map, &reg);
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
     "Match each edge layer to a cloud layer by CKA and RSA over calibration text."},
    {NULL, NULL, NULL, NULL},
};
