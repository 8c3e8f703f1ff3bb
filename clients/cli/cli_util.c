/* Helpers of the kvedge command: errors, exit codes, store opening, number formats, JSON. */
#include <czmq.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clients/cli/cli.h"
#include "clients/decoder/decoder.h"
#include "clients/decoder/tokenizer.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "clients/lib/kvedge.h"
#include "access/codec/block.h"
#include "access/codec/error.h"

const kvedge_setting_choice_t kvedge_cli_schemes[] = {{"lossless", KVEDGE_SCHEME_LOSSLESS},
                                                      {"int8", KVEDGE_SCHEME_INT8},
                                                      {"int4", KVEDGE_SCHEME_INT4},
                                                      {NULL, 0}};

void kvedge_cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvedge: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int kvedge_cli_exit_code(int err)
{
    switch (err) {
    case KVEDGE_OK:
        return KVEDGE_EXIT_OK;
    case KVEDGE_ENOTFOUND:
    case KVEDGE_ENOMODEL:
        return KVEDGE_EXIT_NOTFOUND;
    case KVEDGE_EINVAL:
    case KVEDGE_EAMBIGUOUS:
        return KVEDGE_EXIT_USAGE;
    case KVEDGE_EBUSY:
    case KVEDGE_ELOCKED:
    case KVEDGE_EBACKLOG:
    case KVEDGE_ENOTLEADER:
    case KVEDGE_EVERSION:
    case KVEDGE_EREADONLY:
        return KVEDGE_EXIT_UNAVAILABLE;
    case KVEDGE_ECORRUPT:
        return KVEDGE_EXIT_CORRUPT;
    case KVEDGE_EDENIED:
        return KVEDGE_EXIT_DENIED;
    default:
        return KVEDGE_EXIT_FAILURE;
    }
}

/* The engine's reason without its own "cannot open store DIR: " head: the messages below
 * name the store once. */
static const char *s_open_detail(const char *why, const char *dir)
{
    char head[600];
    snprintf(head, sizeof head, "cannot open store %s: ", dir);
    size_t n = strlen(head);
    return strncmp(why, head, n) == 0 ? why + n : why;
}

static int s_open(kvedge_cli_t *cli, bool writable, bool create, kvedge_engine_t **out)
{
    kvedge_engine_opts_t opts;
    kvedge_engine_opts_default(&opts);
    opts.create_if_missing = create;
    opts.read_only = !writable;
    char why[1024] = "";
    int rc = kvedge_engine_open(cli->data_dir, &opts, out, why, sizeof why);
    if (rc == KVEDGE_OK)
        return KVEDGE_EXIT_OK;
    const char *detail = s_open_detail(why, cli->data_dir);
    switch (rc) {
    case KVEDGE_ENOTFOUND:
        kvedge_cli_error("no kvedge store at %s (create one with `kvedge --data %s "
                         "put-synthetic ...` or point --data / KVEDGE_DATA at a store)",
                         cli->data_dir, cli->data_dir);
        break;
    case KVEDGE_ELOCKED: /* why: "store DIR is in use by another process or handle (...)" */
        kvedge_cli_error("%s; stop it, or use a read-only command such as inspect",
                         why[0] ? why : "store is in use by another process");
        break;
    case KVEDGE_EVERSION:
        kvedge_cli_error("store %s was written by a newer kvedge: %s", cli->data_dir, detail);
        break;
    case KVEDGE_ECORRUPT:
        kvedge_cli_error("store %s is damaged: %s", cli->data_dir, detail);
        break;
    default:
        kvedge_cli_error("cannot open store %s: %s (%s)", cli->data_dir,
                         detail[0] ? detail : "no reason given", kvedge_strerror(rc));
        break;
    }
    return KVEDGE_EXIT_UNAVAILABLE;
}

int kvedge_cli_open(kvedge_cli_t *cli, bool writable, kvedge_engine_t **out)
{
    return s_open(cli, writable, false, out);
}

int kvedge_cli_open_create(kvedge_cli_t *cli, kvedge_engine_t **out)
{
    return s_open(cli, true, true, out);
}

const char *kvedge_cli_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

int kvedge_cli_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v))
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1048576.0;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1073741824.0;
        end++;
        break;
    case 't':
    case 'T':
        mul = 1099511627776.0;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0' || v * mul > 1.8e19)
        return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

int kvedge_cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int kvedge_cli_default_pub(const char *master, char *out, size_t cap)
{
    return master ? kvedge_mview_default_pubs(master, out, cap) : -1;
}

const char *kvedge_cli_master_pubs(const char *cmd, const char *master_flag, const char *master,
                                   const char *pub_flag, const char *pub, char *buf, size_t cap)
{
    char why[600] = "";
    if (!master || kvedge_mview_check_endpoints(master, why, sizeof why) != 0 || !*master) {
        kvedge_cli_error("%s: --%s '%s' %s", cmd, master_flag, master ? master : "",
                         why[0] ? why : "is empty");
        return NULL;
    }
    if (pub && kvedge_mview_check_endpoints(pub, why, sizeof why) != 0) {
        kvedge_cli_error("%s: --%s '%s' %s", cmd, pub_flag, pub, why);
        return NULL;
    }
    if (!pub && kvedge_cli_default_pub(master, buf, cap) != 0) {
        kvedge_cli_error("%s: give --%s for %s (the default, PORT+1, is for tcp://HOST:PORT "
                         "masters only)",
                         cmd, pub_flag, master);
        return NULL;
    }
    size_t nm = kvedge_mview_count_endpoints(master);
    size_t np = kvedge_mview_count_endpoints(pub ? pub : buf);
    if (nm != np) {
        kvedge_cli_error("%s: --%s lists %zu masters and --%s %zu PUB endpoints: give one "
                         "PUB per master, in the same order",
                         cmd, master_flag, nm, pub_flag, np);
        return NULL;
    }
    return pub ? pub : buf;
}

void kvedge_cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void kvedge_cli_usage(FILE *f, const kvedge_cli_cmd_t *cmd, const char *details)
{
    char syn[512];
    if (cmd->opts)
        kvedge_cmdopts_synopsis(cmd->opts, syn, sizeof syn);
    fprintf(f, "usage: kvedge [--data DIR] [--json] %s %s\n\n%s\n", cmd->name,
            cmd->opts ? syn : cmd->args, kvedge_cli_summary(cmd));
    if (details)
        fprintf(f, "\n%s", details);
}

const char *kvedge_cli_summary(const kvedge_cli_cmd_t *cmd)
{
    return cmd->opts ? cmd->opts->summary : cmd->summary;
}

/* How --help writes the start of a command's line: a node's commands need -H. */
static const char *s_prog(const kvedge_cli_cmd_t *cmd)
{
    const kvedge_cli_cmd_t *const remote[] = {kvedge_cli_remote_cmds, kvedge_cli_top_cmds};
    for (size_t t = 0; t < sizeof remote / sizeof remote[0]; t++)
        for (const kvedge_cli_cmd_t *c = remote[t]; c->name; c++)
            if (c == cmd)
                return "kvedge -H ENDPOINT [--json]";
    return "kvedge [--data DIR] [--json]";
}

int kvedge_cli_dispatch(kvedge_cli_t *cli, const kvedge_cli_cmd_t *cmd, int argc, char **argv)
{
    if (!cmd->opts)
        return cmd->run(cli, argc, argv);
    void *opts = calloc(1, cmd->opts->struct_size);
    if (!opts) {
        kvedge_cli_error("%s: out of memory", cmd->name);
        return KVEDGE_EXIT_FAILURE;
    }
    bool help = false;
    char why[600];
    int ex;
    if (kvedge_cmdopts_parse(cmd->opts, opts, argc, argv, &help, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("%s: %s (see kvedge %s --help)", cmd->name, why, cmd->name);
        ex = KVEDGE_EXIT_USAGE;
    } else if (help) {
        kvedge_cmdopts_help(cmd->opts, s_prog(cmd), stdout);
        ex = KVEDGE_EXIT_OK;
    } else {
        ex = cmd->exec(cli, opts);
    }
    free(opts);
    return ex;
}

static volatile sig_atomic_t s_stop;
static sigset_t s_stop_signals; /* SIGINT and SIGTERM */

static const char s_at_once[] = "kvedge: a second signal during the stop: exiting at once (a "
                                "store replays its write-ahead log at the next start)\n";

/* Async-signal-safe: write(2) and _exit(2) only. */
static void s_exit_at_once(void)
{
    ssize_t w = write(STDERR_FILENO, s_at_once, sizeof s_at_once - 1);
    (void)w;
    _exit(KVEDGE_EXIT_FAILURE);
}

/* Only a thread that does not block the signals runs this (none of ours: they are blocked
 * before any starts, and libzmq's threads block every signal). */
static void s_on_signal(int sig)
{
    (void)sig;
    if (s_stop)
        s_exit_at_once();
    s_stop = 1;
}

/* SIGINT and SIGTERM are blocked in every thread (threads inherit the mask) and taken with
 * sigtimedwait: no signal interrupts a call in flight. Delivered as a handler, a second one
 * made libzmq's recv return EINTR inside zactor_destroy's wait, which then returned while the
 * actor was still closing RocksDB, and the process exited under it. */
void kvedge_cli_trap_signals(void)
{
    zsys_handler_set(NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigemptyset(&s_stop_signals);
    sigaddset(&s_stop_signals, SIGINT);
    sigaddset(&s_stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &s_stop_signals, NULL);
}

/* Waits for a second signal while the daemon stops: then it exits at once. */
static void *s_second_signal(void *arg)
{
    (void)arg;
    int sig;
    while (sigwait(&s_stop_signals, &sig) != 0)
        ;
    s_exit_at_once();
    return NULL;
}

void kvedge_cli_wait_signal(void)
{
    const struct timespec tick = {0, 50 * 1000 * 1000};
    while (!s_stop)
        if (sigtimedwait(&s_stop_signals, NULL, &tick) > 0)
            s_stop = 1;
    pthread_t t;
    if (pthread_create(&t, NULL, s_second_signal, NULL) == 0)
        pthread_detach(t);
}

int kvedge_cli_connect(kvedge_cli_t *cli, const char *name, kvedge_client_t **out)
{
    if (cli->server_key && !cli->cert) {
        kvedge_cli_error("--server-key needs --cert (this client's secret certificate, made "
                         "by `kvedge keygen`)");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = cli->host;
    o.server_key = cli->server_key;
    o.client_cert = cli->cert;
    o.deadline_ms = cli->deadline_ms;
    o.link = cli->link;
    o.no_pack = cli->no_pack;
    o.name = name;
    int rc = kvedge_client_connect(&o, out);
    if (rc == KVEDGE_OK)
        return KVEDGE_EXIT_OK;
    if (rc == KVEDGE_ETIMEDOUT)
        kvedge_cli_error("no answer from %s within the deadline: it is down, or this client's "
                         "key is not in its allowlist, or the node key is wrong%s",
                         cli->host,
                         cli->server_key ? "" : " (no --server-key: plaintext, loopback only)");
    else if (rc == KVEDGE_EINVAL && cli->link)
        kvedge_cli_error("cannot connect to %s: bad endpoint or --link '%s' (want RATE,LATENCY "
                         "such as 100mbit,20ms)",
                         cli->host, cli->link);
    else if (kvedge_client_last_error()[0]) /* the option or file at fault, and its form */
        kvedge_cli_error("cannot connect to %s: %s (%s)", cli->host, kvedge_client_last_error(),
                         kvedge_strerror(rc));
    else
        kvedge_cli_error("cannot connect to %s: %s", cli->host, kvedge_strerror(rc));
    return KVEDGE_EXIT_UNAVAILABLE;
}

int kvedge_cli_daemon_settings(kvedge_cli_t *cli, const kvedge_cli_cmd_t *cmd, const char *about,
                               const kvedge_settings_table_t *t, void *settings,
                               kvedge_cli_check_fn *check, int argc, char **argv)
{
    kvedge_settings_args_t args;
    char why[1024] = "";
    if (kvedge_settings_resolve(t, settings, argc, argv, &args, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("%s: %s", cmd->name, why);
        return KVEDGE_EXIT_USAGE;
    }
    if (args.help) {
        kvedge_cli_usage(stdout, cmd, about);
        fputc('\n', stdout);
        kvedge_settings_help(t, stdout);
        return KVEDGE_EXIT_OK;
    }
    const kvedge_setting_t *data = kvedge_settings_find(t, "data");
    char value[64] = "";
    if (data && kvedge_settings_value(data, settings, 0, value, sizeof value) == KVEDGE_OK &&
        !value[0] &&
        kvedge_settings_set(t, settings, "data", cli->data_dir, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("%s: --data: %s", cmd->name, why);
        return KVEDGE_EXIT_USAGE;
    }
    if (check && check(settings, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("%s: %s", cmd->name, why);
        return KVEDGE_EXIT_USAGE;
    }
    if (args.check) {
        kvedge_settings_print(t, settings, stdout);
        return KVEDGE_EXIT_OK;
    }
    const kvedge_setting_t *log = kvedge_settings_find(t, "log");
    kvedge_log_level_t level;
    if (log && kvedge_settings_value(log, settings, 0, value, sizeof value) == KVEDGE_OK &&
        kvedge_log_parse(value, &level) == 0)
        kvedge_log_set_level(level);
    kvedge_cli_trap_signals(); /* the first SIGINT/SIGTERM starts a clean stop */
    return -1;
}

/* ---- files, documents and models ---- */

const char *kvedge_cli_flag_name(const struct option *opts, int ch)
{
    for (; opts && opts->name; opts++)
        if (opts->val == ch)
            return opts->name;
    return "?";
}

int kvedge_cli_slurp(const char *cmd, const char *what, const char *path, size_t max_bytes,
                     char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvedge_cli_error("%s: cannot read %s %s: %s", cmd, what, path, strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap || ferror(f))
            break;
        if (cap >= max_bytes) {
            kvedge_cli_error("%s: cannot read %s %s: over %zu MiB", cmd, what, path,
                             max_bytes >> 20);
            free(buf);
            fclose(f);
            return KVEDGE_EXIT_USAGE;
        }
        char *more = realloc(buf, 2 * cap + 1);
        if (!more)
            free(buf);
        buf = more;
        cap *= 2;
    }
    bool err = !buf || ferror(f);
    fclose(f);
    if (err) {
        const char *why = buf ? "read error" : "out of memory";
        free(buf);
        kvedge_cli_error("%s: cannot read %s %s: %s", cmd, what, path, why);
        return KVEDGE_EXIT_FAILURE;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KVEDGE_EXIT_OK;
}

void kvedge_cli_docs_free(kvedge_cli_docs_t *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->doc[i]);
    free(d->doc);
    free(d->len);
    memset(d, 0, sizeof *d);
}

int kvedge_cli_docs_add(kvedge_cli_docs_t *d, int32_t *ids, size_t n)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 64;
        int32_t **doc = realloc(d->doc, cap * sizeof *doc);
        if (doc)
            d->doc = doc;
        size_t *len = doc ? realloc(d->len, cap * sizeof *len) : NULL;
        if (!len) {
            free(ids);
            return -1;
        }
        d->len = len;
        d->cap = cap;
    }
    d->doc[d->n] = ids;
    d->len[d->n++] = n;
    return 0;
}

int kvedge_cli_read_chapters(const char *cmd, const char *dir, const char *path, size_t max_bytes,
                             uint32_t vocab, kvedge_cli_docs_t *d)
{
    char why[512] = "";
    kvedge_tokenizer_t *t = NULL;
    int rc = kvedge_tokenizer_load_path(dir, &t, why, sizeof why);
    /* A template's BOS goes before every chapter, as a Llama model was trained and as prefill
     * adds it (GPT-2's form and Qwen2's have none). */
    const unsigned flags = kvedge_tokenizer_bos_id(t) >= 0 ? KVEDGE_TOKENIZER_TEMPLATE : 0u;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: cannot load the tokenizer %s: %s", cmd, dir,
                         why[0] ? why : kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    char *text = NULL;
    size_t len = 0;
    int ex = kvedge_cli_slurp(cmd, "the text", path, max_bytes, &text, &len);
    char *piece = ex ? NULL : malloc(len + 3);
    if (!ex && !piece) {
        kvedge_cli_error("%s: out of memory reading %s", cmd, path);
        ex = KVEDGE_EXIT_FAILURE;
    }
    for (const char *p = text; !ex && p && p < text + len;) {
        const char *start = p;
        const char *e = strstr(p, "\n\n");
        size_t n = e ? (size_t)(e - p) : (size_t)(text + len - p);
        bool empty = true;
        for (size_t i = 0; i < n && empty; i++)
            empty = isspace((unsigned char)p[i]) != 0;
        p = e ? e + 2 : NULL;
        if (empty)
            continue;
        memcpy(piece, start, n);
        memcpy(piece + n, "\n\n", 3);
        int32_t *ids = NULL;
        size_t k = 0;
        rc = kvedge_tokenizer_encode_ex(t, piece, n + 2, flags, &ids, &k);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("%s: cannot tokenize chapter %zu of %s: %s", cmd, d->n + 1, path,
                             kvedge_strerror(rc));
            ex = KVEDGE_EXIT_FAILURE;
            break;
        }
        for (size_t i = 0; i < k && !ex; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) {
                kvedge_cli_error("%s: the tokenizer gave id %d, outside the vocabulary of %u", cmd,
                                 ids[i], vocab);
                ex = KVEDGE_EXIT_USAGE;
            }
        if (ex)
            free(ids);
        else if (kvedge_cli_docs_add(d, ids, k) != 0) {
            kvedge_cli_error("%s: out of memory reading %s", cmd, path);
            ex = KVEDGE_EXIT_FAILURE;
        }
    }
    free(piece);
    free(text);
    kvedge_tokenizer_destroy(&t);
    return ex;
}

const char *kvedge_cli_own_tokenizer(const char *weights, char *buf, size_t len)
{
    struct stat st;
    if (!weights || stat(weights, &st) != 0 || !S_ISDIR(st.st_mode) ||
        (size_t)snprintf(buf, len, "%s/tokenizer.json", weights) >= len || access(buf, F_OK) != 0)
        return NULL;
    return buf;
}

int kvedge_cli_load_model(const char *cmd, const char *path, const char *side,
                          kvedge_decoder_t **out)
{
    kvedge_decoder_t *md = kvedge_decoder_new();
    int rc = md ? kvedge_decoder_load(md, path, 0) : KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: cannot load the %s model %s: %s%s%s", cmd, side, path,
                         kvedge_strerror(rc), md && *kvedge_decoder_error(md) ? ": " : "",
                         md ? kvedge_decoder_error(md) : "");
        kvedge_decoder_destroy(&md);
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_USAGE;
    }
    *out = md;
    return KVEDGE_EXIT_OK;
}
