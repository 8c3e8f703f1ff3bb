/* The daemons' settings from the command line, table by table: every setting of `kvedge store`,
 * `kvedge master` and `kvedge proxy` set to a valid non-default value by config file and by
 * flag resolves to the same value (in the subprocess's --check-config output and in the
 * linked loader); the example configs in etc/ load; refusals exit 2 naming file, line and
 * key, and create nothing on disk; the daemons start from a config file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/settings.h"
#include "proxy/settings.h"
#include "access/codec/error.h"
#include "store/master/settings.h"
#include "store/node/node.h"
#include "tests/common/testutil.h"

#define S_RUN_TIMEOUT_MS 15000 /* a refused config exits at once; past this it is a hang */

/* One daemon: its command, its table, and the settings that make the whole valid (key, value
 * pairs): without them some single settings are refused on their own (a master without its
 * PUB endpoint, a proxy without sources). */
typedef struct {
    const char *cmd;
    const kvedge_settings_table_t *table;
    const char *const *base;
    const char *example; /* etc/ file */
} s_daemon_t;

static const char *const s_store_base[] = {"master_pub", "ipc:///tmp/kvedge-t-mpub.sock", "node_id",
                                           "base-node", NULL};
static const char *const s_master_base[] = {NULL};
static const char *const s_proxy_base[] = {
    "source", "cloud c0 ipc:///tmp/kvedge-t-c0.sock", "clients",    "/tmp/kvedge-t-clients",
    "master", "ipc:///tmp/kvedge-t-m.sock",           "master_pub", "ipc:///tmp/kvedge-t-mp.sock",
    NULL};

static const s_daemon_t s_daemons[] = {
    {"store", &kvedge_node_settings_table, s_store_base, "kvedge-store.conf"},
    {"master", &kvedge_master_settings_table, s_master_base, "kvedge-master.conf"},
    {"proxy", &kvedge_proxy_settings_table, s_proxy_base, "kvedge-proxy.conf"},
};

static char s_dir[256]; /* this test's scratch directory */
static char *s_out;     /* stdout of the last run */
static char *s_err;     /* stderr of the last run */

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("expected \"%s\" in:\n%s", (needle), (hay));                                  \
    } while (0)

static char *s_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = '\0';
    return buf;
}

static bool s_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

typedef struct {
    pid_t pid;
    int st;
} s_child_t;

/* Whether the child has exited (its status into st). */
static bool s_exited(void *arg)
{
    s_child_t *c = arg;
    return waitpid(c->pid, &c->st, WNOHANG) == c->pid;
}

typedef struct {
    const char *path;
    char *got; /* the file's text at the last look */
} s_file_ctx_t;

/* Whether the daemon's stdout file says it is listening. */
static bool s_says_listening(void *arg)
{
    s_file_ctx_t *x = arg;
    free(x->got);
    x->got = s_slurp(x->path);
    return x->got && strstr(x->got, "listening");
}

/* Runs KVEDGE_BIN with argv (argv[0] is "kvedge", NULL-terminated; no shell, so values with
 * blanks need no quoting) in s_dir. Returns its exit code (128 + signal, or 124 when it ran
 * past S_RUN_TIMEOUT_MS); stdout in s_out, stderr in s_err. */
static int s_exec(char *const *argv)
{
    char out[300], err[300];
    snprintf(out, sizeof out, "%s/run.out", s_dir);
    snprintf(err, sizeof err, "%s/run.err", s_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(out, "w", stdout) || !freopen(err, "w", stderr) || chdir(s_dir) != 0)
            _exit(126);
        unsetenv("KVEDGE_DATA");
        execv(KVEDGE_BIN, argv);
        _exit(127);
    }
    s_child_t child = {pid, 0};
    int st;
    if (kt_poll(s_exited, &child, S_RUN_TIMEOUT_MS)) {
        st = child.st;
    } else {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        st = 124 << 8;
    }
    free(s_out);
    free(s_err);
    s_out = s_slurp(out);
    s_err = s_slurp(err);
    assert_non_null(s_out);
    assert_non_null(s_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A command line under construction: kvedge --data DIR/global CMD ... */
typedef struct {
    char *argv[64];
    int argc;
    char store[64][600]; /* the words we made */
    int nstore;
} s_cmdline_t;

static void s_cmd_init(s_cmdline_t *c, const char *cmd)
{
    memset(c, 0, sizeof *c);
    c->argv[c->argc++] = "kvedge";
    c->argv[c->argc++] = "--data";
    snprintf(c->store[c->nstore], 600, "%s/global", s_dir);
    c->argv[c->argc++] = c->store[c->nstore++];
    c->argv[c->argc++] = (char *)cmd;
}

static void s_cmd_add(s_cmdline_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void s_cmd_add(s_cmdline_t *c, const char *fmt, ...)
{
    assert_true(c->argc < 62 && c->nstore < 64);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->store[c->nstore], 600, fmt, ap);
    va_end(ap);
    c->argv[c->argc++] = c->store[c->nstore++];
    c->argv[c->argc] = NULL;
}

/* A valid value for e other than its default, from its type and bounds (its example where it
 * has a check, which a made-up string may not pass). Sizes and durations carry a unit. */
static void s_generate(const kvedge_setting_t *e, char *buf, size_t len)
{
    if (e->example) {
        snprintf(buf, len, "%s", e->example);
        return;
    }
    uint64_t d = e->def_num;
    switch (e->type) {
    case KVEDGE_SETTING_STRING:
    case KVEDGE_SETTING_LIST:
        snprintf(buf, len, "/tmp/kvedge-t-%s", e->key);
        break;
    case KVEDGE_SETTING_BOOL:
        snprintf(buf, len, "%s", d ? "no" : "yes");
        break;
    case KVEDGE_SETTING_ENUM:
        for (const kvedge_setting_choice_t *c = e->choices; c->name; c++)
            if (strcmp(c->name, e->def) != 0) {
                snprintf(buf, len, "%s", c->name);
                break;
            }
        break;
    case KVEDGE_SETTING_SIZE:
        if (d + 1024 <= e->max)
            snprintf(buf, len, "%lluK", (unsigned long long)(d / 1024 + 1));
        else
            snprintf(buf, len, "%llu", (unsigned long long)(d - 1));
        break;
    case KVEDGE_SETTING_MS:
        if (d % 1000 == 0 && d + 1000 <= e->max)
            snprintf(buf, len, "%llus", (unsigned long long)(d / 1000 + 1));
        else
            snprintf(buf, len, "%llu", (unsigned long long)(d + 1 <= e->max ? d + 1 : d - 1));
        break;
    case KVEDGE_SETTING_SECONDS:
        if (d % 60 == 0 && d + 60 <= e->max)
            snprintf(buf, len, "%llum", (unsigned long long)(d / 60 + 1));
        else
            snprintf(buf, len, "%llu", (unsigned long long)(d + 1 <= e->max ? d + 1 : d - 1));
        break;
    default:
        snprintf(buf, len, "%llu", (unsigned long long)(d + 1 <= e->max ? d + 1 : d - 1));
        break;
    }
}

/* The line `    key = ...` of a --check-config listing (the first, for lists). */
static void s_line_of(const char *listing, const char *key, char *buf, size_t len)
{
    char want[128];
    snprintf(want, sizeof want, "\n    %s = ", key);
    const char *p = strstr(listing, want);
    if (!p)
        fail_msg("no line for %s in:\n%s", key, listing);
    else
        snprintf(buf, len, "%.*s", (int)strcspn(p + 1, "\n"), p + 1);
}

/* What kvedge_settings_print writes for *settings. Not inlined: GCC then takes the
 * memstream's buffer for a local that dangles (-Wdangling-pointer). */
static __attribute__((noinline)) char *s_print(const kvedge_settings_table_t *t,
                                               const void *settings)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvedge_settings_print(t, settings, f);
    fclose(f);
    return buf;
}

static void s_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-config-XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    free(s_out);
    free(s_err);
    s_out = s_err = NULL;
    return system(cmd) == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- tests */

static void test_tables_consistent(void **state)
{
    (void)state;
    char why[512] = "";
    for (size_t d = 0; d < sizeof s_daemons / sizeof s_daemons[0]; d++) {
        if (kvedge_settings_table_check(s_daemons[d].table, why, sizeof why) != KVEDGE_OK)
            fail_msg("%s table: %s", s_daemons[d].cmd, why);
        assert_string_equal(s_daemons[d].table->daemon, s_daemons[d].cmd);
    }
}

/* Every setting of every daemon: by file and by flag, the same resolved value, different
 * from the default, in the subprocess and in the linked loader. */
static void test_every_setting_file_equals_flag(void **state)
{
    (void)state;
    char conf[300];
    snprintf(conf, sizeof conf, "%s/t.conf", s_dir);
    for (size_t d = 0; d < sizeof s_daemons / sizeof s_daemons[0]; d++) {
        const s_daemon_t *dm = &s_daemons[d];
        const kvedge_settings_table_t *t = dm->table;
        void *by_file = malloc(t->struct_size), *by_flag = malloc(t->struct_size);
        void *dflt = malloc(t->struct_size);
        assert_true(by_file && by_flag && dflt);
        kvedge_settings_defaults(t, dflt);
        for (size_t i = 0; i < t->count; i++) {
            const kvedge_setting_t *e = &t->settings[i];
            char value[600], text[4096];
            s_generate(e, value, sizeof value);
            /* The file: the base (less this key), then this key. */
            int at = snprintf(text, sizeof text, "# %s\n%s\n", e->key, dm->cmd);
            for (const char *const *b = dm->base; *b; b += 2)
                if (strcmp(b[0], e->key) != 0)
                    at += snprintf(text + at, sizeof text - (size_t)at, "    %s = \"%s\"\n", b[0],
                                   b[1]);
            snprintf(text + at, sizeof text - (size_t)at, "    %s = \"%s\"\n", e->key, value);
            s_write(conf, text);
            s_cmdline_t file, flag;
            s_cmd_init(&file, dm->cmd);
            s_cmd_add(&file, "--config");
            s_cmd_add(&file, "%s", conf);
            s_cmd_add(&file, "--check-config");
            /* The flags, in the forms the table allows, rotating. */
            s_cmd_init(&flag, dm->cmd);
            s_cmd_add(&flag, "--check-config");
            for (const char *const *b = dm->base; *b; b += 2)
                if (strcmp(b[0], e->key) != 0)
                    s_cmd_add(&flag, "--%s=%s", kvedge_settings_find(t, b[0])->flag, b[1]);
            if (e->type == KVEDGE_SETTING_BOOL && strcmp(value, "yes") == 0) {
                s_cmd_add(&flag, "--%s", e->flag);
            } else if (e->type == KVEDGE_SETTING_BOOL || i % 3 == 0) {
                s_cmd_add(&flag, "--%s=%s", e->flag, value);
            } else if (i % 3 == 1 && e->letter) {
                s_cmd_add(&flag, "-%c", e->letter);
                s_cmd_add(&flag, "%s", value);
            } else {
                s_cmd_add(&flag, "--%s", e->flag);
                s_cmd_add(&flag, "%s", value);
            }
            /* In the subprocess. */
            if (s_exec(file.argv) != 0)
                fail_msg("%s %s by file: %s", dm->cmd, e->key, s_err);
            char *from_file = strdup(s_out);
            assert_non_null(from_file);
            if (s_exec(flag.argv) != 0)
                fail_msg("%s %s by flag: %s", dm->cmd, e->key, s_err);
            if (strcmp(from_file, s_out) != 0)
                fail_msg("%s %s = %s: file and flag differ:\n%s\n---\n%s", dm->cmd, e->key, value,
                         from_file, s_out);
            /* In the linked loader: the same struct both ways, the value not the default. */
            char why[1024] = "";
            kvedge_settings_defaults(t, by_file);
            if (kvedge_settings_load_file(t, by_file, conf, why, sizeof why) != KVEDGE_OK)
                fail_msg("%s: %s", e->key, why);
            kvedge_settings_args_t args;
            if (kvedge_settings_resolve(t, by_flag, flag.argc - 3, flag.argv + 3, &args, why,
                                        sizeof why) != KVEDGE_OK)
                fail_msg("%s: %s", e->key, why);
            assert_true(args.check);
            assert_memory_equal(by_file, by_flag, t->struct_size);
            char got[600], was[600];
            assert_int_equal(kvedge_settings_value(e, by_file, 0, got, sizeof got), KVEDGE_OK);
            if (kvedge_settings_value(e, dflt, 0, was, sizeof was) == KVEDGE_OK &&
                strcmp(got, was) == 0)
                fail_msg("%s %s: %s is the default", dm->cmd, e->key, value);
            /* The subprocess printed what the loader holds. */
            char *mine = s_print(t, by_file);
            char want[700], have[700];
            s_line_of(mine, e->key, want, sizeof want);
            s_line_of(from_file, e->key, have, sizeof have);
            assert_string_equal(have, want);
            free(mine);
            free(from_file);
        }
        free(by_file);
        free(by_flag);
        free(dflt);
    }
}

/* The example configs: every key present (set, or commented where it stays empty), every
 * value the default, and --check-config accepts them. */
static void test_example_configs(void **state)
{
    (void)state;
    for (size_t d = 0; d < sizeof s_daemons / sizeof s_daemons[0]; d++) {
        const s_daemon_t *dm = &s_daemons[d];
        const kvedge_settings_table_t *t = dm->table;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", KVEDGE_ETC, dm->example);
        char *text = s_slurp(path);
        assert_non_null(text);
        void *loaded = malloc(t->struct_size), *dflt = malloc(t->struct_size);
        assert_true(loaded && dflt);
        kvedge_settings_defaults(t, dflt);
        kvedge_settings_defaults(t, loaded);
        char why[1024] = "";
        if (kvedge_settings_load_file(t, loaded, path, why, sizeof why) != KVEDGE_OK)
            fail_msg("%s", why);
        for (size_t i = 0; i < t->count; i++) {
            const kvedge_setting_t *e = &t->settings[i];
            char set[128], commented[128];
            snprintf(set, sizeof set, "\n    %s = ", e->key);
            snprintf(commented, sizeof commented, "\n    # %s = ", e->key);
            if (!strstr(text, set) && !strstr(text, commented))
                fail_msg("%s: no line for %s", dm->example, e->key);
        }
        assert_memory_equal(loaded, dflt, t->struct_size);
        s_cmdline_t c;
        s_cmd_init(&c, dm->cmd);
        s_cmd_add(&c, "--config");
        s_cmd_add(&c, "%s", path);
        s_cmd_add(&c, "--check-config");
        if (strcmp(dm->cmd, "proxy") == 0) { /* it documents that a proxy needs sources */
            s_cmd_add(&c, "--insecure");
            s_cmd_add(&c, "--source=cloud c1 ipc:///tmp/kvedge-t-c1.sock");
        }
        if (s_exec(c.argv) != 0)
            fail_msg("%s: %s", dm->example, s_err);
        assert_contains(s_out, dm->cmd);
        free(text);
        free(loaded);
        free(dflt);
    }
}

/* Runs `kvedge CMD --config FILE [extra]` (no --check-config: a refusal must come before
 * the start) on text and expects exit 2 with want in stderr, the data directory (and the
 * proxy's certificate) not created. */
static void s_refused(const char *cmd, const char *text, const char *want, const char *extra)
{
    char conf[300], data[300], msg[400];
    snprintf(conf, sizeof conf, "%s/bad.conf", s_dir);
    snprintf(data, sizeof data, "%s/newdata", s_dir);
    s_write(conf, text);
    s_cmdline_t c;
    s_cmd_init(&c, cmd);
    s_cmd_add(&c, "--config");
    s_cmd_add(&c, "%s", conf);
    if (extra)
        s_cmd_add(&c, "%s", extra);
    int rc = s_exec(c.argv);
    if (rc != 2)
        fail_msg("%s exited %d on:\n%s\nstderr: %s", cmd, rc, text, s_err);
    snprintf(msg, sizeof msg, "kvedge: %s: ", cmd);
    assert_contains(s_err, msg);
    assert_contains(s_err, want);
    assert_false(s_exists(data));
    assert_false(s_exists(c.store[0])); /* the global data directory */
    char cert[300];
    snprintf(cert, sizeof cert, "%s/proxy.cert", s_dir);
    assert_false(s_exists(cert));
}

static void test_rejections(void **state)
{
    (void)state;
    char text[8192], want[600];
    const char *data_line = "    data = newdata\n";
    for (size_t d = 0; d < sizeof s_daemons / sizeof s_daemons[0]; d++) {
        const char *cmd = s_daemons[d].cmd;
        bool has_data = kvedge_settings_find(s_daemons[d].table, "data") != NULL;
        const char *dl = has_data ? data_line : "    bind = ipc:///tmp/kvedge-t-x.sock\n";
        char conf[300];
        snprintf(conf, sizeof conf, "%s/bad.conf", s_dir);
        /* An unknown section. */
        snprintf(text, sizeof text, "%s\n%s    insecure = yes\n%sx\n    log = info\n", cmd, dl,
                 cmd);
        snprintf(want, sizeof want, "%s:4: %sx: unknown section", conf, cmd);
        s_refused(cmd, text, want, NULL);
        /* An unknown key, with a suggestion. */
        snprintf(text, sizeof text, "%s\n%s    insecure = yes\n    lgo = info\n", cmd, dl);
        snprintf(want, sizeof want,
                 "%s:4: lgo: unknown setting in section `%s` (did you mean "
                 "`log`?)",
                 conf, cmd);
        s_refused(cmd, text, want, NULL);
        /* A value that is not a boolean. */
        snprintf(text, sizeof text, "%s\n%s    insecure = maybe\n", cmd, dl);
        snprintf(want, sizeof want,
                 "%s:3: insecure: 'maybe' is not a boolean (yes/no/on/off/true/false/1/0)", conf);
        s_refused(cmd, text, want, NULL);
        /* A value that is not one of the choices. */
        snprintf(text, sizeof text, "%s\n%s    log = loud\n", cmd, dl);
        snprintf(want, sizeof want, "%s:3: log: 'loud' is not one of error|warn|info|debug", conf);
        s_refused(cmd, text, want, NULL);
        /* A key set twice. */
        snprintf(text, sizeof text, "%s\n    log = info\n%s    log = warn\n", cmd, dl);
        snprintf(want, sizeof want, "%s:4: log: set twice (first at line 2)", conf);
        s_refused(cmd, text, want, NULL);
        /* A malformed line. */
        snprintf(text, sizeof text, "%s\n%s    log info\n", cmd, dl);
        snprintf(want, sizeof want, "%s:3: log: malformed line", conf);
        s_refused(cmd, text, want, NULL);
        /* An overlong line. */
        int at = snprintf(text, sizeof text, "%s\n%s    bind = ", cmd, dl);
        memset(text + at, 'x', 5000);
        snprintf(text + at + 5000, sizeof text - (size_t)at - 5000, "\n");
        snprintf(want, sizeof want, "%s:3: bind: line longer than 4096 bytes", conf);
        s_refused(cmd, text, want, NULL);
        /* A bad flag over a good file: named as typed. */
        snprintf(text, sizeof text, "%s\n%s", cmd, dl);
        s_refused(cmd, text, "--log-level: 'loud' is not one of", "--log-level=loud");
        s_refused(cmd, text, "--bogus: unknown option", "--bogus");
    }
    /* Numbers out of bounds; the whole refused by the cross-setting checks. */
    s_refused("store", "store\n    data = newdata\n    workers = 257\n",
              "bad.conf:3: workers: '257' is out of range (0 to 256)", NULL);
    s_refused("store", "store\n    data = newdata\n    cache = 1.5Q\n",
              "bad.conf:3: cache: '1.5Q' is not a size", NULL);
    s_refused("store", "store\n    data = newdata\n    bind = tcp:/127.0.0.1:7400\n",
              "bad.conf:3: bind: 'tcp:/127.0.0.1:7400' is not an endpoint", NULL);
    s_refused("store",
              "store\n    data = newdata\n    insecure = yes\n    bind = tcp://0.0.0.0:7400\n",
              "refusing plaintext on tcp://0.0.0.0:7400", NULL);
    s_refused("store", "store\n    data = newdata\n    master = ipc:///tmp/m.sock\n",
              "a master needs its PUB endpoint", NULL);
    s_refused("master", "master\n    data = newdata\n    suspect_ms = 5\n",
              "bad.conf:3: suspect_ms: '5' is out of range (10 to 3600000)", NULL);
    s_refused("master", "master\n    data = newdata\n    suspect_ms = 20s\n    down_ms = 10s\n",
              "down_ms (10000) is below suspect_ms (20000)", NULL);
    s_refused("master",
              "master\n    data = newdata\n    insecure = on\n    pub = tcp://0.0.0.0:7411\n",
              "refusing plaintext", NULL);
    s_refused("proxy", "proxy\n    insecure = yes\n    source = \"satellite c ipc:///tmp/x\"\n",
              "bad.conf:3: source: 'satellite c ipc:///tmp/x' is a bad source", NULL);
    s_refused("proxy", "proxy\n    insecure = yes\n", "no sources", NULL);
    s_refused("proxy", "proxy\n    source = \"cloud c ipc:///tmp/x\"\n",
              "needs a clients directory", NULL);
    s_refused("proxy", "proxy\n    insecure = yes\n    master = ipc:///tmp/m.sock\n",
              "master and master_pub go together", NULL);
    /* The config file itself: missing, given twice. */
    s_cmdline_t c;
    s_cmd_init(&c, "store");
    s_cmd_add(&c, "--config");
    s_cmd_add(&c, "%s/none.conf", s_dir);
    assert_int_equal(s_exec(c.argv), 2);
    assert_contains(s_err, "none.conf: cannot read the config file");
    s_cmd_add(&c, "-c");
    s_cmd_add(&c, "%s/none.conf", s_dir);
    assert_int_equal(s_exec(c.argv), 2);
    assert_contains(s_err, "config file given twice");
    assert_false(s_exists(c.store[0]));
}

/* Flags override the file wherever --config stands; what --check-config prints loads back. */
static void test_override_and_roundtrip(void **state)
{
    (void)state;
    char conf[300], back[300];
    snprintf(conf, sizeof conf, "%s/o.conf", s_dir);
    snprintf(back, sizeof back, "%s/back.conf", s_dir);
    s_write(conf, "store\n    workers = 3\n    name = \"from # file\"\n    sync = on\n");
    s_cmdline_t a, b;
    s_cmd_init(&a, "store");
    s_cmd_add(&a, "--workers");
    s_cmd_add(&a, "5");
    s_cmd_add(&a, "--config");
    s_cmd_add(&a, "%s", conf);
    s_cmd_add(&a, "--check-config");
    assert_int_equal(s_exec(a.argv), 0);
    assert_contains(s_out, "\n    workers = 5\n");
    assert_contains(s_out, "\n    name = \"from # file\"\n");
    assert_contains(s_out, "\n    sync = yes\n");
    char *first = strdup(s_out);
    s_cmd_init(&b, "store");
    s_cmd_add(&b, "--check-config");
    s_cmd_add(&b, "--config=%s", conf);
    s_cmd_add(&b, "-w5");
    assert_int_equal(s_exec(b.argv), 0);
    assert_string_equal(s_out, first);
    /* The listing is a config file that gives the same listing. */
    s_write(back, first);
    s_cmd_init(&b, "store");
    s_cmd_add(&b, "--config");
    s_cmd_add(&b, "%s", back);
    s_cmd_add(&b, "--check-config");
    assert_int_equal(s_exec(b.argv), 0);
    assert_string_equal(s_out, first);
    free(first);
    /* The store's data: the global --data unless set. */
    s_cmd_init(&b, "store");
    s_cmd_add(&b, "--check-config");
    assert_int_equal(s_exec(b.argv), 0);
    char want[400];
    snprintf(want, sizeof want, "\n    data = %s/global\n", s_dir);
    assert_contains(s_out, want);
    /* A proxy's sources: the flags' list replaces the file's. */
    s_write(conf, "proxy\n    insecure = yes\n    source = \"cloud a ipc:///tmp/a\"\n"
                  "    source = \"peer b ipc:///tmp/b\"\n");
    s_cmd_init(&b, "proxy");
    s_cmd_add(&b, "--config");
    s_cmd_add(&b, "%s", conf);
    s_cmd_add(&b, "--check-config");
    assert_int_equal(s_exec(b.argv), 0);
    assert_contains(s_out, "    source = cloud a ipc:///tmp/a\n    source = peer b ipc:///tmp/b\n");
    s_cmd_add(&b, "-s");
    s_cmd_add(&b, "local c ipc:///tmp/c");
    assert_int_equal(s_exec(b.argv), 0);
    assert_contains(s_out, "    source = local c ipc:///tmp/c\n");
    assert_null(strstr(s_out, "cloud a"));
}

/* --help comes from the table: every flag, key and default. */
static void test_help_generated(void **state)
{
    (void)state;
    for (size_t d = 0; d < sizeof s_daemons / sizeof s_daemons[0]; d++) {
        const kvedge_settings_table_t *t = s_daemons[d].table;
        char *argv[] = {"kvedge", "help", (char *)s_daemons[d].cmd, NULL};
        assert_int_equal(s_exec(argv), 0);
        void *dflt = malloc(t->struct_size);
        assert_non_null(dflt);
        kvedge_settings_defaults(t, dflt);
        for (size_t i = 0; i < t->count; i++) {
            const kvedge_setting_t *e = &t->settings[i];
            char want[700], value[600];
            snprintf(want, sizeof want, "--%s", e->flag);
            assert_contains(s_out, want);
            if (e->type == KVEDGE_SETTING_LIST) {
                snprintf(want, sizeof want, "[%s = none", e->key);
            } else {
                assert_int_equal(kvedge_settings_value(e, dflt, 0, value, sizeof value), 0);
                snprintf(want, sizeof want, "[%s = %s%s%s]", e->key, value[0] ? "" : "\"", value,
                         value[0] ? "" : "\"");
            }
            assert_contains(s_out, want);
        }
        assert_contains(s_out, "--check-config");
        free(dflt);
    }
}

/* Each daemon starts from a config file and stops cleanly on SIGTERM. */
static void test_daemons_start_from_file(void **state)
{
    (void)state;
    for (size_t d = 0; d < sizeof s_daemons / sizeof s_daemons[0]; d++) {
        const char *cmd = s_daemons[d].cmd;
        char conf[300], text[2000], out[300];
        snprintf(conf, sizeof conf, "%s/%s.conf", s_dir, cmd);
        snprintf(out, sizeof out, "%s/%s.out", s_dir, cmd);
        if (strcmp(cmd, "store") == 0)
            snprintf(text, sizeof text,
                     "store\n    data = %s/node\n    bind = ipc://%s/node.sock\n"
                     "    insecure = yes\n    log = warn\n    workers = 2\n    cache = 8M\n"
                     "    metrics = off\n",
                     s_dir, s_dir);
        else if (strcmp(cmd, "master") == 0)
            snprintf(text, sizeof text,
                     "master\n    data = %s/master\n    bind = ipc://%s/m.sock\n"
                     "    pub = ipc://%s/mp.sock\n    insecure = true\n    log = warn\n"
                     "    suspect_ms = 2s\n    metrics = off\n",
                     s_dir, s_dir, s_dir);
        else
            snprintf(text, sizeof text,
                     "proxy\n    bind = ipc://%s/p.sock\n    insecure = 1\n    log = error\n"
                     "    source = \"cloud c1 ipc://%s/nobody.sock\"\n    metrics = off\n",
                     s_dir, s_dir);
        s_write(conf, text);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (!freopen(out, "w", stdout) || chdir(s_dir) != 0)
                _exit(126);
            execl(KVEDGE_BIN, "kvedge", cmd, "--config", conf, (char *)NULL);
            _exit(127);
        }
        s_file_ctx_t fc = {out, NULL};
        kt_poll(s_says_listening, &fc, KT_WAIT_MS);
        char *got = fc.got;
        assert_non_null(got);
        if (!strstr(got, "listening ipc://"))
            fail_msg("%s did not start from %s", cmd, conf);
        free(got);
        kill(pid, SIGTERM);
        int st = 0;
        waitpid(pid, &st, 0);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    char path[300];
    snprintf(path, sizeof path, "%s/node", s_dir);
    assert_true(s_exists(path));
    snprintf(path, sizeof path, "%s/master", s_dir);
    assert_true(s_exists(path));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_consistent),
        cmocka_unit_test_setup_teardown(test_every_setting_file_equals_flag, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_example_configs, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_rejections, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_override_and_roundtrip, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_help_generated, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_daemons_start_from_file, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
