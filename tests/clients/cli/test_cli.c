/* The kvedge command end to end on a temporary store: every command, JSON output, exit codes,
 * bad input (unknown model, bad flags, missing, locked and damaged stores, corrupt blocks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "clients/cli/cli.h"
#include "tests/common/basis_fixture.h"
#include "tests/common/spawn.h"
#include "tests/common/testutil.h"
#include "store/engine/engine.h"

static char s_dir[256]; /* the store directory of the current test */
static char s_err[512]; /* where the last command's stderr went */
static char *s_out;     /* stdout of the last command */
static char *s_errtext; /* stderr of the last command */

static char *s_slurp(FILE *f)
{
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
    }
    if (buf)
        buf[len] = '\0';
    return buf;
}

/* Runs `kvedge [--data DIR] <args>`; returns its exit code, stdout in s_out, stderr in
 * s_errtext. */
static int s_vrun(bool with_data, const char *fmt, va_list ap)
{
    char args[1024], cmd[2048];
    vsnprintf(args, sizeof args, fmt, ap);
    if (with_data)
        snprintf(cmd, sizeof cmd, "%s --data %s %s 2>%s", KVEDGE_BIN, s_dir, args, s_err);
    else
        snprintf(cmd, sizeof cmd, "%s %s 2>%s", KVEDGE_BIN, args, s_err);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    free(s_out);
    s_out = s_slurp(p);
    int st = pclose(p);
    FILE *e = fopen(s_err, "r");
    free(s_errtext);
    s_errtext = e ? s_slurp(e) : strdup("");
    if (e)
        fclose(e);
    assert_non_null(s_out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Runs `kvedge --data DIR <args>`. */
static int s_run(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = s_vrun(true, fmt, ap);
    va_end(ap);
    return rc;
}

/* Runs `kvedge <args>`: no --data before the command. */
static int s_run_bare(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = s_vrun(false, fmt, ap);
    va_end(ap);
    return rc;
}

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("expected \"%s\" in:\n%s", (needle), (hay));                                  \
    } while (0)

/* How many times needle occurs in hay. */
static int s_count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-cli-XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    snprintf(s_err, sizeof s_err, "%s.stderr", s_dir);
    strncat(s_dir, "/data", sizeof s_dir - strlen(s_dir) - 1);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[600];
    s_dir[strlen(s_dir) - strlen("/data")] = '\0';
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", s_dir, s_err);
    free(s_out);
    free(s_errtext);
    s_out = s_errtext = NULL;
    return system(cmd) == 0 ? 0 : -1;
}

/* Extracts the 64-digit prefix id printed after "prefix":" in JSON output. */
static void s_json_prefix(const char *out, char hex[65])
{
    const char *p = strstr(out, "\"prefix\":\"");
    assert_non_null(p);
    memcpy(hex, p + 10, 64);
    hex[64] = '\0';
}

/* The number after "key": in JSON output (the first such key). */
static unsigned long long s_json_u64(const char *out, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(out, pat);
    if (!p)
        fail_msg("expected %s in:\n%s", pat, out);
    return strtoull(p + strlen(pat), NULL, 10);
}

static double s_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A mistyped command or flag gets the nearest name and exit code 2. */
static void test_did_you_mean(void **state)
{
    (void)state;
    assert_int_equal(s_run("stats"), 2);
    assert_contains(s_errtext, "unknown command 'stats'");
    assert_contains(s_errtext, "did you mean `kvedge stat`?");
    assert_int_equal(s_run("tokenise"), 2);
    assert_contains(s_errtext, "did you mean `kvedge tokenize`?");
    assert_int_equal(s_run("tokenize --fle x"), 2);
    assert_contains(s_errtext, "tokenize: unknown option '--fle' (did you mean --file?)");
    assert_int_equal(s_run("tokenize --decdoe"), 2);
    assert_contains(s_errtext, "did you mean --decode?");
    assert_int_equal(s_run("tokenize --tokenizer"), 2);
    assert_contains(s_errtext, "tokenize: --tokenizer: needs a value (PATH)");
    assert_int_equal(s_run_bare("--jsno inspect"), 2); /* a global option before the command */
    assert_contains(s_errtext, "unknown option '--jsno' (did you mean --json?)");
    assert_int_equal(s_run("ls --ful"), 2);
    assert_contains(s_errtext, "ls: unknown option '--ful' (did you mean --full?)");
    assert_int_equal(s_run("tokenize stray"), 2);
    assert_contains(s_errtext, "tokenize: unexpected argument 'stray'");
}

/* The environment variables the global options fall back on still work, and the line wins. */
static void test_env_vars(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 10"), 0);
    assert_int_equal(setenv("KVEDGE_DATA", s_dir, 1), 0);
    assert_int_equal(s_run_bare("--json inspect"), 0);
    assert_contains(s_out, "\"chunks\":1");
    assert_int_equal(s_run_bare("--data %s/none inspect", s_dir), 5); /* the line wins */
    assert_int_equal(unsetenv("KVEDGE_DATA"), 0);
    assert_int_equal(setenv("KVEDGE_HOST", "ipc:///nonexistent/kvedge-env.sock", 1), 0);
    assert_int_equal(s_run_bare("--deadline 200 stat"), 5); /* a node, not "give it -H" */
    assert_int_equal(unsetenv("KVEDGE_HOST"), 0);
    assert_int_equal(s_run_bare("stat"), 2);
    assert_contains(s_errtext, "give it -H");
}

/* Every command table, as main.c lists them. */
static const kvedge_cli_cmd_t *const s_all_tables[] = {
    kvedge_cli_local_cmds,    kvedge_cli_daemon_cmds,    kvedge_cli_master_cmds,
    kvedge_cli_proxy_cmds,    kvedge_cli_e2e_cmds,       kvedge_cli_eval_cmds,
    kvedge_cli_tokenize_cmds, kvedge_cli_block_cmds,     kvedge_cli_basis_cmds,
    kvedge_cli_layermap_cmds, kvedge_cli_lseval_cmds,    kvedge_cli_remote_cmds,
    kvedge_cli_top_cmds,      kvedge_cli_rebalance_cmds, NULL};

/* A value out of a table's bounds is refused with exit code 2, naming the flag and the bound. */
static void test_bounds_name_the_flag(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 0"), 2);
    assert_contains(s_errtext, "put-synthetic: --tokens: '0' is out of range (1 to 16777216)");
    assert_int_equal(s_run("put-synthetic --model opt-125m -k 2000"), 2);
    assert_contains(s_errtext, "put-synthetic: -k: '2000' is out of range (1 to 1024)");
    assert_int_equal(s_run("show --layer=99999 abcd"), 2);
    assert_contains(s_errtext, "show: --layer: '99999' is out of range (0 to ");
    assert_int_equal(s_run("put-synthetic --model opt-125m --scheme int3"), 2);
    assert_contains(s_errtext, "put-synthetic: --scheme: 'int3' is not one of lossless|int8|int4");
    assert_int_equal(s_run("evict"), 2);
    assert_contains(s_errtext, "evict: --to is required");
    assert_int_equal(s_run("pin"), 2);
    assert_contains(s_errtext, "pin: missing PREFIX");
    assert_int_equal(s_run("evict --to 1G extra"), 2);
    assert_contains(s_errtext, "evict: unexpected argument 'extra'");
}

/* Every deprecated alias in a table does what its option does: the same line with the alias
 * and with the option's name prints the same and exits the same. */
static void test_aliases_work(void **state)
{
    (void)state;
    for (int t = 0; s_all_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_all_tables[t]; c->name; c++)
            for (size_t i = 0; c->opts && i < c->opts->count; i++) {
                const kvedge_cmdopt_t *o = &c->opts->opts[i];
                if (!o->alias)
                    continue;
                const char *v = o->type == KVEDGE_CMDOPT_BOOL ? "" : "/nonexistent/kvedge-alias";
                int rc_new = s_run("%s --%s %s", c->name, o->name, v);
                char *out_new = strdup(s_out), *err_new = strdup(s_errtext);
                int rc_old = s_run("%s --%s %s", c->name, o->alias, v);
                assert_int_equal(rc_old, rc_new);
                assert_string_equal(s_out, out_new);
                assert_string_equal(s_errtext, err_new);
                free(out_new);
                free(err_new);
            }
}

/* Every command's table is consistent, `kvedge help` lists every command, and each table
 * command's --help lists every option, alias and argument of its table. */

static void test_help_lists_every_option(void **state)
{
    (void)state;
    assert_int_equal(s_run_bare("help"), 0);
    char *list = strdup(s_out);
    assert_non_null(list);
    size_t tables = 0;
    for (int t = 0; s_all_tables[t]; t++) {
        bool remote =
            s_all_tables[t] == kvedge_cli_remote_cmds || s_all_tables[t] == kvedge_cli_top_cmds;
        for (const kvedge_cli_cmd_t *c = s_all_tables[t]; c->name; c++) {
            char line[64];
            snprintf(line, sizeof line, "\n  %s ", c->name);
            assert_contains(list, line);
            if (!c->opts)
                continue;
            tables++;
            char why[300] = "";
            if (kvedge_cmdopts_check(c->opts, why, sizeof why) != 0)
                fail_msg("%s: %s", c->name, why);
            assert_int_equal(
                s_run_bare("%s %s --help", remote ? "-H tcp://127.0.0.1:1" : "", c->name), 0);
            /* Wrapped help lines read as one. */
            for (char *p = s_out; (p = strstr(p, "\n                            ")) != NULL;)
                memmove(p, p + 28, strlen(p + 28) + 1), *p = ' ';
            for (size_t i = 0; i < c->opts->count; i++) {
                const kvedge_cmdopt_t *o = &c->opts->opts[i];
                char want[96];
                snprintf(want, sizeof want, "%s%s", o->positional ? "  " : "--", o->name);
                assert_contains(s_out, want);
                if (o->alias) {
                    snprintf(want, sizeof want, "--%s", o->alias);
                    assert_contains(s_out, want);
                    snprintf(want, sizeof want,
                             "deprecated alias of --%s, removed in the next release", o->name);
                    assert_contains(s_out, want);
                }
            }
        }
    }
    assert_true(tables > 0);
    free(list);
}

static void test_help_and_usage_errors(void **state)
{
    (void)state;
    assert_int_equal(s_run("--help"), 0);
    assert_contains(s_out, "put-synthetic");
    assert_contains(s_out, "exit codes");
    assert_int_equal(s_run("show --help"), 0);
    assert_contains(s_out, "usage: kvedge");
    assert_int_equal(s_run("help verify"), 0);
    assert_contains(s_out, "quarantine");
    assert_int_equal(s_run("frobnicate"), 2);
    assert_contains(s_errtext, "unknown command 'frobnicate'");
    assert_int_equal(s_run("--bogus inspect"), 2);
    assert_int_equal(s_run("ls --bogus"), 2);
    assert_int_equal(s_run("put-synthetic --tokens 10"), 2);
    assert_contains(s_errtext, "--model is required");
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 0"), 2);
    assert_int_equal(s_run("put-synthetic --model opt-125m --scheme int3"), 2);
    assert_int_equal(s_run("put-synthetic --model opt-125m --keep-channels 65"), 2);
    assert_int_equal(s_run("evict"), 2);
    assert_int_equal(s_run("evict --to lots"), 2);
    assert_int_equal(s_run("show"), 2);
    assert_int_equal(s_run("models"), 0);
    assert_contains(s_out, "llama-2-7b");
    /* The commands that talk to a node show their help without one. */
    assert_int_equal(s_run("stat --help"), 0);
    assert_contains(s_out, "usage: kvedge -H");
    assert_int_equal(s_run("ping --help"), 0);
    assert_contains(s_out, "--count");
    assert_int_equal(s_run("ping --count 3"), 2);
    assert_contains(s_errtext, "give it -H");
}

static void test_missing_store(void **state)
{
    (void)state;
    assert_int_equal(s_run("inspect"), 5);
    assert_contains(s_errtext, "no kvedge store at");
    assert_int_equal(s_run("ls"), 5);
    assert_int_equal(s_run("verify"), 5);
    struct stat st;
    assert_int_not_equal(stat(s_dir, &st), 0); /* reading commands create nothing */
    /* Nor do the admin commands that modify a store: a mistyped --data is no new store. */
    assert_int_equal(s_run("evict --to 0"), 5);
    assert_contains(s_errtext, "no kvedge store at");
    assert_int_equal(s_run("pin abcd"), 5);
    assert_int_equal(s_run("unpin abcd"), 5);
    assert_int_equal(s_run("delete abcd"), 5);
    assert_int_not_equal(stat(s_dir, &st), 0);
    /* put-synthetic creates one, but past a sane size only when forced. */
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 10000000"), 2);
    assert_contains(s_errtext, "--force");
    assert_int_not_equal(stat(s_dir, &st), 0);
    struct statvfs fs; /* 1M tokens of opt-13b, lossless: 800 GiB */
    assert_int_equal(statvfs("/tmp", &fs), 0);
    if ((double)fs.f_bavail * (double)fs.f_frsize < 800.0 * 1073741824.0) {
        assert_int_equal(s_run("put-synthetic --model opt-13b --tokens 1048576 --scheme lossless"),
                         2);
        assert_contains(s_errtext, "free: pass --force");
    }
}

static void test_unknown_model(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model gpt-9"), 3);
    assert_contains(s_errtext, "unknown model 'gpt-9'");
    assert_contains(s_errtext, "opt-1.3b");
}

static void test_put_inspect_show_verify(void **state)
{
    (void)state;
    /* 300 tokens = 2 chunks (256 + 44) x 12 layers x 12 heads. */
    assert_int_equal(s_run("--json put-synthetic --model opt-125m --tokens 300 --scheme int4"), 0);
    assert_contains(s_out, "\"blocks\":288");
    assert_contains(s_out, "\"chunks\":2");
    char prefix[65];
    s_json_prefix(s_out, prefix);

    assert_int_equal(s_run("--json inspect"), 0);
    assert_contains(s_out, "\"blocks\":288");
    assert_contains(s_out, "\"model\":\"opt-125m\"");
    assert_contains(s_out, "\"tokens\":300");
    assert_contains(s_out, "\"schemes\":\"int4\"");
    assert_int_equal(s_run("inspect"), 0);
    assert_contains(s_out, "opt-125m");

    assert_int_equal(s_run("--json ls"), 0);
    assert_contains(s_out, prefix);
    assert_contains(s_out, "\"tokens\":44");
    assert_int_equal(s_run("ls --model nothing"), 0);
    assert_true(strstr(s_out, "opt-125m") == NULL);

    char shortid[9];
    memcpy(shortid, prefix, 8);
    shortid[8] = '\0';
    assert_int_equal(s_run("show %s", shortid), 0);
    assert_contains(s_out, "144 blocks shown, 0 failed verification");
    assert_int_equal(s_run("--json show %s --layer 3", shortid), 0);
    assert_contains(s_out, "\"layer\":3,\"head\":11");
    assert_true(strstr(s_out, "\"layer\":4") == NULL);
    assert_int_equal(s_run("show 0000000000000000000000000000000000000000000000000000000000000000"),
                     3);
    assert_int_equal(s_run("show xyz"), 2);
    assert_int_equal(s_run("show %s --layer 99", shortid), 2); /* past the model: no table */
    assert_contains(s_errtext, "past the 12 layers of opt-125m");
    assert_int_equal(s_run("show %s --layer 11", shortid), 0);
    assert_contains(s_out, "12 blocks shown");

    assert_int_equal(s_run("verify"), 0);
    assert_contains(s_out, "verified 288 blocks: 288 ok, 0 corrupt");

    /* Writing the same context again overwrites: nothing doubles. */
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 300 --scheme int4"), 0);
    assert_int_equal(s_run("--json inspect"), 0);
    assert_contains(s_out, "\"blocks\":288");
}

static void test_pin_evict_delete(void **state)
{
    (void)state;
    assert_int_equal(s_run("--json put-synthetic --model opt-125m --tokens 512 --scheme int8"), 0);
    char prefix[65];
    s_json_prefix(s_out, prefix); /* the second chunk: pinning it pins its parent too */
    assert_int_equal(s_run("--json put-synthetic --model opt-125m --tokens 256 --seed 9"), 0);

    assert_int_equal(s_run("--json pin %.10s", prefix), 0);
    assert_contains(s_out, "\"pinned\":288,\"chunks\":2");
    assert_int_equal(s_run("--json evict --to 0"), 1); /* pinned blocks remain */
    assert_contains(s_out, "\"evicted_blocks\":144");
    assert_contains(s_errtext, "pinned blocks alone");
    assert_int_equal(s_run("--json inspect"), 0);
    assert_contains(s_out, "\"blocks\":288,");
    assert_contains(s_out, "\"pinned_blocks\":288");

    assert_int_equal(s_run("unpin %.10s", prefix), 0);
    assert_contains(s_out, "unpinned 288 blocks in 2 chunks");
    assert_int_equal(s_run("evict --to 1M"), 0);
    assert_int_equal(s_run("--json inspect"), 0);
    assert_int_equal(s_run("--json delete %s", prefix), 0);
    assert_int_equal(s_run("show %s", prefix), 3);
}

/* `kvedge models` lists node-wide records as registered and a tenant's own as tenant:TAG. */
static void test_models_per_tenant(void **state)
{
    (void)state;
    kvedge_engine_t *e;
    assert_int_equal(kvedge_engine_open(s_dir, NULL, &e, NULL, 0), 0);
    kvedge_model_t wide = {"wide-m", 2, 2, 64, KVEDGE_DTYPE_FP16}, mine = wide;
    snprintf(mine.id, sizeof mine.id, "mine-m");
    mine.layers = 5;
    const uint8_t tag[16] = {0xab, 0x01};
    assert_int_equal(kvedge_engine_put_model(e, &wide), 0);
    assert_int_equal(kvedge_engine_put_tenant_model(e, tag, &mine), 0);
    kvedge_engine_destroy(&e);
    assert_int_equal(s_run("models"), 0);
    assert_contains(s_out, "llama-2-7b");
    assert_contains(s_out, "registered");
    assert_contains(s_out, "tenant:ab010000000000000000000000000000");
    assert_int_equal(s_count(s_out, "wide-m"), 1);
    assert_int_equal(s_count(s_out, "mine-m"), 1);
    assert_int_equal(s_run("--json models"), 0);
    assert_contains(s_out, "\"model\":\"mine-m\",\"layers\":5");
    assert_contains(s_out, "\"source\":\"tenant:ab010000000000000000000000000000\"");
    assert_contains(s_out, "\"model\":\"wide-m\",\"layers\":2");
}

static void test_locked_store(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 64"), 0);
    kvedge_engine_t *e;
    assert_int_equal(kvedge_engine_open(s_dir, NULL, &e, NULL, 0), 0);
    /* A writer is refused with a clear reason; readers still work. */
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 64 --seed 5"), 5);
    assert_contains(s_errtext, "in use by another process");
    assert_int_equal(s_count(s_errtext, "in use by another process"), 1); /* said once */
    assert_int_equal(s_run("inspect"), 0);
    assert_int_equal(s_run("verify"), 0);
    kvedge_engine_destroy(&e);
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 64 --seed 5"), 0);
}

static void test_damaged_store(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 64 --scheme lossless"), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/CURRENT", s_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("MANIFEST-999999\n", f);
    fclose(f);
    assert_int_equal(s_run("inspect"), 5);
    assert_contains(s_errtext, s_dir);
    char named[600]; /* the store is named once, not once more by the engine's own reason */
    snprintf(named, sizeof named, "store %s", s_dir);
    assert_int_equal(s_count(s_errtext, named), 1);

    /* A store path that is a file. */
    size_t n = strlen(s_dir);
    strcat(s_dir, "/CURRENT");
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 64"), 5);
    s_dir[n] = '\0';
}

/* The store's CURRENT is lost: nothing opens it (and nothing writes over it), repair keeps
 * every block and says how many it found; a second repair has nothing to do. */
static void test_repair_lost_current(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 256 --scheme lossless"), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/CURRENT", s_dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(s_run("inspect"), 5);
    assert_contains(s_errtext, "CURRENT file is missing");
    assert_contains(s_errtext, "kvedge repair --data");
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0); /* the failed open wrote no new CURRENT */
    assert_int_equal(s_run("--json repair"), 0);
    assert_contains(s_out, "\"ok\":true,\"changed\":true");
    assert_contains(s_out, "\"found\":144,\"kept\":144,\"lost\":0");
    assert_int_equal(s_run("--json inspect"), 0);
    assert_contains(s_out, "\"blocks\":144");
    assert_int_equal(s_run("repair"), 0);
    assert_contains(s_out, "nothing to repair");
}

/* Flips the byte at off of an open file. */
static void s_flip_at(int fd, off_t off, uint8_t mask)
{
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= mask;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
}

/* Calls damage(fd, size) on every file of the store whose name ends with suffix; asserts there
 * was one. */
static void s_damage_files(const char *suffix, void (*damage)(int fd, off_t size))
{
    DIR *d = opendir(s_dir);
    assert_non_null(d);
    struct dirent *de;
    int damaged = 0;
    size_t sl = strlen(suffix);
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n <= sl || strcmp(de->d_name + n - sl, suffix) != 0)
            continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", s_dir, de->d_name);
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        damage(fd, st.st_size);
        close(fd);
        damaged++;
    }
    closedir(d);
    assert_true(damaged > 0);
}

/* Past the middle record's header, inside its value: the block itself is damaged (a damaged
 * record header around an intact block is served, and verify says so). */
static void s_flip_blob_middle(int fd, off_t size)
{
    s_flip_at(fd, size / 2 + 128, 0xff);
}

/* Five flips spread over a table file, clear of its footer. */
static void s_flip_table_5(int fd, off_t size)
{
    for (int i = 1; i <= 5; i++)
        s_flip_at(fd, (size - 64) * i / 6, 0x5a);
}

/* Flips one byte inside the middle record's value of every blob file. */
static void s_damage_blobs(void)
{
    s_damage_files(".blob", s_flip_blob_middle);
}

/* Five flipped bytes in every table file of a store of a built-in model: every block is kept
 * from the blob files and every chunk record rebuilt from its blocks, so ls lists them all;
 * a second repair has nothing to do. */
static void test_repair_flips_in_every_sst(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 2560 --scheme int8"), 0);
    s_damage_files(".sst", s_flip_table_5);
    assert_int_equal(s_run("--json repair"), 0);
    assert_contains(s_out, "\"found\":1440,\"kept\":1440,\"lost\":0");
    assert_contains(s_out, "\"chunks_lost\":0");
    assert_int_equal(s_run("--json ls"), 0);
    assert_int_equal(s_count(s_out, "\"model\":\"opt-125m\""), 10);
    assert_int_equal(s_run("verify"), 0);
    assert_int_equal(s_run("repair"), 0);
    assert_contains(s_out, "nothing to repair");
}

/* RocksDB aborts reading a damaged store (librocksdb's assertions; forced here through the
 * test-only KVEDGE_DEBUG_REPAIR_FAULT): the repair's child dies, the caller does not, and the
 * second try takes every block from the blob files and rebuilds the chunk records. */
static void test_repair_survives_rocksdb_abort(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 512 --scheme int8"), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/CURRENT", s_dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(setenv("KVEDGE_DEBUG_REPAIR_FAULT", "abort", 1), 0);
    int rc = s_run("--json repair");
    unsetenv("KVEDGE_DEBUG_REPAIR_FAULT");
    assert_int_equal(rc, 0);
    assert_contains(s_out, "\"found\":288,\"kept\":288,\"lost\":0");
    assert_contains(s_out, "\"chunks_rebuilt\":2,\"chunks_lost\":0");
    assert_contains(s_out, "\"rocksdb_aborted\":true");
    assert_int_equal(s_run("--json ls"), 0);
    assert_int_equal(s_count(s_out, "\"model\":\"opt-125m\""), 2);
    assert_int_equal(s_run("repair"), 0);
    assert_contains(s_out, "nothing to repair");
}

/* Blocks damaged in the blob files: repair loses them, lists them and exits 4; the store it
 * leaves is sound, and a second repair has nothing to do. */
static void test_repair_lost_blocks(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 256 --scheme lossless"), 0);
    s_damage_blobs();
    assert_int_equal(s_run("repair"), 4);
    assert_contains(s_out, "lost: prefix");
    assert_int_equal(s_run("verify"), 0);
    assert_int_equal(s_run("repair"), 0);
    assert_contains(s_out, "nothing to repair");
}

/* Flips one byte in the middle of every blob file: verify must find corrupt blocks and say
 * so with exit code 4, and quarantine them on request. */
static void test_corrupt_blob_detected(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 256 --scheme lossless"), 0);
    assert_int_equal(s_run("verify"), 0);
    s_damage_blobs();
    assert_int_equal(s_run("verify"), 4);
    assert_contains(s_out, "corrupt: prefix");
    assert_int_equal(s_run("--json verify --quarantine"), 4);
    assert_contains(s_out, "\"quarantined\":true");
    assert_int_equal(s_run("verify"), 0); /* what is left is sound */
    assert_int_equal(s_run("--json inspect"), 0);
    assert_true(strstr(s_out, "\"quarantined\":0") == NULL);
}

static void test_plan(void **state)
{
    (void)state;
    /* A fast cloud beats recomputing: every layer comes from it. */
    assert_int_equal(s_run("--json plan --model opt-125m --tokens 512 --source "
                           "cloud:c1:10gbit,100us:int8 --recompute-us 50000"),
                     0);
    assert_contains(s_out, "\"layer\":11,\"source\":\"c1\"");
    assert_true(strstr(s_out, "recompute\"") == NULL);
    /* With it down, everything is recomputed. */
    assert_int_equal(s_run("--json plan --model opt-125m --tokens 512 --source "
                           "cloud:c1:10gbit,100us:int8 --down c1"),
                     0);
    assert_contains(s_out, "\"layer\":0,\"source\":\"recompute\"");
    /* A slow cloud and a peer holding the shallow layers: the peer serves those. */
    assert_int_equal(s_run("plan --model opt-125m --tokens 512 --source cloud:c1:10mbit,40ms:int4 "
                           "--source peer:p1:1gbit,1ms:lossless:0-5 --recompute-us 100000"),
                     0);
    assert_contains(s_out, "p1");
    assert_contains(s_out, "bound");
    assert_int_equal(s_run("plan --model opt-125m --source cloud:c1:fast:int8"), 2);
    assert_int_equal(s_run("plan --model opt-125m --source moon:c1:1gbit:int8"), 2);
    assert_int_equal(s_run("plan --model opt-125m --source peer:p:1gbit,1ms:int8:3-99"), 2);
    assert_int_equal(s_run("plan --model nope --source cloud:c1:1gbit:int8"), 3);
}

/* Writes len bytes to name beside the test's store directory; returns the path (static
 * storage of one call). */
static const char *s_write_file(const char *name, const uint8_t *data, size_t len)
{
    static char path[512];
    snprintf(path, sizeof path, "%.*s/%s", (int)(strlen(s_dir) - strlen("/data")), s_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    return path;
}

/* `kvedge block`: a plain and an entropy-coded block are verified and described (coding, rung,
 * each section's stream), in text and JSON; a damaged block is exit 4, a missing file 1. */
static void test_block_file(void **state)
{
    (void)state;
    enum { T = 64, D = 32 };
    static uint16_t k[T * D], v[T * D];
    for (size_t i = 0; i < T * D; i++) {
        k[i] = (uint16_t)(0x3C00 + (i * 37) % 1024); /* fp16 in [1, 2) */
        v[i] = (uint16_t)(0xBC00 + (i * 91) % 1024);
    }
    kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                .scheme = KVEDGE_SCHEME_INT4,
                                .tokens = T,
                                .head_dim = D,
                                .group_size = 32};
    size_t cap = kvedge_block_encoded_bound(&spec), len = 0, clen = 0;
    uint8_t *plain = malloc(cap), *coded = NULL;
    assert_non_null(plain);
    assert_int_equal(kvedge_block_encode(&spec, k, v, plain, cap, &len), 0);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(plain, len, &info), 0);
    assert_int_equal(kvedge_block_recode(&info, true, false, &coded, &clen), 0);

    assert_int_equal(s_run("block --file %s", s_write_file("plain.kveb", plain, len)), 0);
    assert_contains(s_out, "block version 1, fp16 int4 group 32");
    assert_contains(s_out, "rung int4-g32\n");
    assert_contains(s_out, "body: plain");
    assert_int_equal(s_run("block --file %s", s_write_file("coded.kveb", coded, clen)), 0);
    assert_contains(s_out, "block version 2");
    assert_contains(s_out, "rung int4-g32+ec");
    assert_contains(s_out, "body: ec");
    assert_contains(s_out, "V codes");
    assert_int_equal(s_run("--json block --file %s", s_write_file("coded.kveb", coded, clen)), 0);
    assert_contains(s_out, "\"version\":2");
    assert_contains(s_out, "\"rung\":\"int4-g32+ec\",\"coding\":\"ec\"");
    assert_contains(s_out, "{\"section\":\"k_params\",\"raw\":");
    coded[clen / 2] ^= 0x10;
    assert_int_equal(s_run("block --file %s", s_write_file("bad.kveb", coded, clen)), 4);
    assert_contains(s_errtext, "is not a valid block: data is corrupt");
    assert_int_equal(s_run("block --file %s/none.kveb", s_dir), 1); /* no such directory */
    assert_int_equal(s_run("block"), 2);
    free(coded);
    free(plain);
}

/* `kvedge basis --show`: a basis file is loaded and described (model, basis id as the loader
 * computes it, shape, size, K and V step ranges), in text and JSON; a damaged or truncated file
 * is exit 4 with the loader's reason, a missing one 1, no --show or no --file 2. */
static void test_basis_file(void **state)
{
    (void)state;
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kt_basis_file("tiny-basis@rope-0123abcd", 3, 2, 16, 0.125f, 7, &buf, &len), 0);
    /* The first section (layer 0, head 0, K) gets a step of its own: 0.25, exact in fp16. */
    const float step = 0.25f;
    memcpy(buf + KVEDGE_BASIS_HEADER_BYTES, &step, sizeof step);
    kt_basis_reseal(buf, len);
    kvedge_basis_t *b = NULL;
    assert_int_equal(kvedge_basis_parse(buf, len, &b, NULL, 0), 0);
    char id[64], jid[64], size[64];
    snprintf(id, sizeof id, "coding basis %016llx of", (unsigned long long)kvedge_basis_id(b));
    snprintf(jid, sizeof jid, "\"basis_id\":\"%016llx\"", (unsigned long long)kvedge_basis_id(b));
    snprintf(size, sizeof size, "%zu bytes", len);
    kvedge_basis_free(&b);

    const char *path = s_write_file("tiny.kvb", buf, len);
    assert_int_equal(s_run("basis --show --file %s", path), 0);
    assert_contains(s_out, id);
    assert_contains(s_out, "of model tiny-basis@rope-0123abcd\n");
    assert_contains(s_out, "3 layers x 2 KV heads, head dim 16: 12 sections");
    assert_contains(s_out, size);
    assert_contains(s_out, "K steps 0.125 .. 0.25\n");
    assert_contains(s_out, "V steps 0.125 .. 0.125\n");
    assert_int_equal(s_run("--json basis --show --file %s", path), 0);
    assert_contains(s_out, "\"model\":\"tiny-basis@rope-0123abcd\"");
    assert_contains(s_out, "\"layers\":3,\"kv_heads\":2,\"head_dim\":16");
    assert_contains(s_out, "\"k_step_min\":0.125,\"k_step_max\":0.25,");
    assert_contains(s_out, "\"v_step_min\":0.125,\"v_step_max\":0.125}");
    assert_contains(s_out, jid);

    buf[len / 2] ^= 0x40;
    assert_int_equal(s_run("basis --show --file %s", s_write_file("bad.kvb", buf, len)), 4);
    assert_contains(s_errtext, "digest mismatch");
    assert_int_equal(s_run("basis --show --file %s", s_write_file("short.kvb", buf, 200)), 4);
    assert_contains(s_errtext, "truncated");
    assert_int_equal(s_run("basis --show --file %s/none.kvb", s_dir), 1);
    assert_contains(s_errtext, "none.kvb");
    assert_int_equal(s_run("basis --file %s", path), 2);
    assert_contains(s_errtext, "--show");
    assert_int_equal(s_run("basis --show"), 2);
    free(buf);
}

/* The Storage Master from the command line: it starts with no configuration (plaintext on
 * ipc here), master-dump reads its registry, and SIGTERM stops it cleanly. */
static void test_master_cli(void **state)
{
    (void)state;
    char bind[600], pub[600], data[600];
    snprintf(bind, sizeof bind, "ipc://%s.m", s_dir);
    snprintf(pub, sizeof pub, "ipc://%s.p", s_dir);
    snprintf(data, sizeof data, "%s-master", s_dir);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execl(KVEDGE_BIN, "kvedge", "master", "--insecure", "--bind", bind, "--pub", pub, "--data",
              data, "--log-level", "warn", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[1400] = "";
    assert_true(read(pfd[0], line, sizeof line - 1) > 0);
    assert_non_null(strstr(line, "listening"));
    assert_int_equal(s_run("--json master-dump --master %s --pub %s", bind, pub), 0);
    assert_contains(s_out, "seq");
    assert_int_equal(s_run("master --insecure --bind tcp://0.0.0.0:7499 --data %s", data), 2);
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(pfd[0]);
    assert_int_equal(s_run("master-dump --master %s --pub %s --deadline 300", bind, pub), 5);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.m' '%s.p'", data, s_dir, s_dir);
    assert_int_equal(system(cmd), 0);
}

/* Starts `kvedge store` in its own process on an ipc endpoint next to the test's store (no
 * tcp port another test could take over) and waits for its "listening" line. */
static pid_t s_spawn_node(char node_dir[600], char ep[600], int *out_fd)
{
    snprintf(node_dir, 600, "%s-node", s_dir);
    snprintf(ep, 600, "ipc://%s.sock", s_dir);
    pid_t pid = kt_spawn_store(KVEDGE_BIN, node_dir, ep, out_fd);
    assert_true(pid > 0);
    return pid;
}

/* The historical cache from the command line: an edge store copies a context from a cloud
 * node with `kvedge sync --once`, pinned, and `kvedge sync` reports it. */
static void test_sync_once(void **state)
{
    (void)state;
    char ep[600], node_dir[600];
    int out_fd;
    pid_t pid = s_spawn_node(node_dir, ep, &out_fd);
    assert_int_equal(s_run("-H %s --json put-synthetic --model opt-125m --tokens 300", ep), 0);
    char prefix[65];
    s_json_prefix(s_out, prefix);
    assert_int_equal(s_run("sync"), 3); /* no status yet */
    assert_int_equal(s_run("models"), 0);
    char subs[700];
    snprintf(subs, sizeof subs, "%s.subs", s_dir);
    FILE *f = fopen(subs, "w");
    assert_non_null(f);
    fprintf(f, "subscription\n    name = bot\n    cloud = %s\n    prefix = %s\n", ep, prefix);
    fclose(f);
    assert_int_equal(s_run("sync --once --subscriptions %s", subs), 0);
    assert_contains(s_out, "2/2 chunks, 288 blocks copied");
    assert_int_equal(s_run("sync"), 0); /* text, in --once's words */
    assert_contains(s_out, "bot");
    assert_contains(s_out, " ok ");
    assert_null(strchr(s_out, '{'));
    assert_int_equal(s_run("sync --json"), 0);
    assert_contains(s_out, "\"state\":\"ok\"");
    assert_int_equal(s_run("--json inspect"), 0);
    assert_contains(s_out, "\"pinned_blocks\":288");
    assert_int_equal(s_run("sync --once --subscriptions %s", subs), 0);
    assert_contains(s_out, "0 blocks copied");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    close(out_fd);
    /* With the cloud gone the pass fails (exit code says so); the copy stays. */
    assert_int_equal(s_run("sync --once --deadline 300 --subscriptions %s", subs), 1);
    assert_contains(s_out, "failed");
    assert_int_equal(s_run("--json inspect"), 0);
    assert_contains(s_out, "\"pinned_blocks\":288");
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock' '%s'", node_dir, s_dir, subs);
    assert_int_equal(system(cmd), 0);
}

/* Remote mode: a node in its own process (plaintext on an ipc endpoint, so no port can be
 * taken over by another test), and the admin commands against it with -H. */
static void test_remote_mode(void **state)
{
    (void)state;
    char ep[600], node_dir[600];
    int out_fd;
    pid_t pid = s_spawn_node(node_dir, ep, &out_fd);
    assert_int_equal(s_run("stat"), 2); /* needs -H */
    assert_contains(s_errtext, "-H");
    assert_int_equal(s_run("-H %s --json put-synthetic --model opt-125m --tokens 300 --scheme "
                           "int8",
                           ep),
                     0);
    assert_contains(s_out, "\"blocks\":288");
    char prefix[65];
    s_json_prefix(s_out, prefix);
    assert_int_equal(s_run("-H %s --json ls", ep), 0);
    assert_contains(s_out, prefix);
    assert_int_equal(s_run("-H %s show %.8s --layer 1", ep, prefix), 0);
    assert_contains(s_out, "12 blocks shown, 0 failed verification");
    assert_int_equal(s_run("-H %s verify", ep), 0);
    assert_contains(s_out, "verified 288 blocks over the network: 288 ok, 0 corrupt");
    /* --no-pack: one head per GET_LAYER data message, the same blocks. */
    assert_int_equal(s_run("-H %s --no-pack verify", ep), 0);
    assert_contains(s_out, "verified 288 blocks over the network: 288 ok, 0 corrupt");
    assert_int_equal(s_run("--no-pack -H %s show %.8s --layer 1", ep, prefix), 0);
    assert_contains(s_out, "12 blocks shown, 0 failed verification");
    assert_int_equal(s_run("-H %s --json stat", ep), 0);
    assert_contains(s_out, "\"blocks\":288");
    assert_int_equal(s_run("-H %s ping --count 3 --size 64K", ep), 0);
    assert_contains(s_out, "rtt p50");
    assert_int_equal(s_run("-H %s --json inspect", ep), 0);
    assert_contains(s_out, "\"tenant_blocks\":288");

    assert_int_equal(s_run("-H %s pin %.8s", ep, prefix), 0);
    assert_contains(s_out, "pinned 288 blocks in 2 chunks");
    assert_int_equal(s_run("-H %s evict --to 0", ep), 1); /* pinned blocks stay */
    assert_contains(s_errtext, "pinned");
    assert_int_equal(s_run("-H %s unpin %.8s", ep, prefix), 0);
    assert_int_equal(s_run("-H %s --json evict --to 0", ep), 0);
    assert_contains(s_out, "\"evicted_blocks\":288");
    assert_int_equal(s_run("-H %s --json stat", ep), 0);
    assert_contains(s_out, "\"blocks\":0");
    assert_int_equal(s_run("-H %s show %.8s", ep, prefix), 0); /* the chunk record stays */
    assert_int_equal(s_run("-H %s delete %.8s", ep, prefix), 0);
    assert_int_equal(s_run("-H %s show %.8s", ep, prefix), 3);

    /* A clean stop on SIGTERM. */
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(out_fd);
    /* The node is gone: a call returns by its deadline with exit code 5. */
    assert_int_equal(s_run("-H %s --deadline 300 stat", ep), 5);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock'", node_dir, s_dir);
    assert_int_equal(system(cmd), 0);
}

/* Global options after the command's name: the same result as before it, in both forms
 * (--opt VALUE, --opt=VALUE), the later one winning; errors still name the option; `--` ends
 * them; a command's own option of a global name stays its own. */
static void test_global_options_after_command(void **state)
{
    (void)state;
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 300 --scheme int4 --json"), 0);
    assert_contains(s_out, "\"blocks\":288");
    char prefix[65];
    s_json_prefix(s_out, prefix);

    assert_int_equal(s_run("--json inspect"), 0);
    char *want = strdup(s_out);
    assert_non_null(want);
    assert_int_equal(s_run("inspect --json"), 0);
    assert_string_equal(s_out, want);
    free(want);

    assert_int_equal(s_run_bare("--data %s --json ls", s_dir), 0);
    assert_contains(s_out, prefix);
    want = strdup(s_out);
    assert_non_null(want);
    assert_int_equal(s_run_bare("ls --data %s --json", s_dir), 0);
    assert_string_equal(s_out, want);
    assert_int_equal(s_run_bare("ls --json --data=%s", s_dir), 0);
    assert_string_equal(s_out, want);
    assert_int_equal(s_run_bare("ls -d %s --model opt-125m --json", s_dir), 0);
    assert_string_equal(s_out, want);
    assert_int_equal(s_run_bare("--data %s.nowhere ls --json --data %s", s_dir, s_dir), 0);
    assert_string_equal(s_out, want);
    free(want);
    assert_int_equal(s_run("inspect --data %s.nowhere", s_dir), 5); /* after wins */
    assert_contains(s_errtext, ".nowhere");

    assert_int_equal(s_run("show %.8s --layer 3 --json", prefix), 0);
    assert_contains(s_out, "\"layer\":3,\"head\":11");
    assert_int_equal(s_run("verify --json"), 0);
    assert_contains(s_out, "\"checked\":288");

    /* Help still works, with global options around it. */
    assert_int_equal(s_run("ls --help --json"), 0);
    assert_contains(s_out, "--full");
    assert_int_equal(s_run("help ls --json"), 0);
    assert_contains(s_out, "--full");
    assert_int_equal(s_run("--help"), 0);
    assert_contains(s_out, "before or after the command");

    /* Errors: exit 2, naming the option. */
    assert_int_equal(s_run("inspect --bogus"), 2);
    assert_contains(s_errtext, "--bogus");
    assert_int_equal(s_run("ls --json=yes"), 2);
    assert_contains(s_errtext, "'--json' takes no value");
    assert_int_equal(s_run("ls --data"), 2);
    assert_contains(s_errtext, "'--data' needs a value");
    assert_int_equal(s_run("ls --deadline soon"), 2);
    assert_contains(s_errtext, "--deadline: 'soon' is not a duration");

    /* `--` ends the global options: what follows is the command's (inspect has no --json). */
    assert_int_equal(s_run("inspect -- --json"), 2);
    assert_null(strstr(s_out, "{"));
    assert_int_equal(s_run("-- inspect --json"), 2);
    assert_contains(s_errtext, "unknown option '--json'");

    /* Names a command keeps for itself: its own parser answers, not the global one. */
    assert_int_equal(s_run("sync --once --deadline soon"), 2);
    assert_contains(s_errtext, "sync: --deadline: 'soon' is not a duration");
    assert_int_equal(s_run("master-dump --deadline soon"), 2);
    assert_contains(s_errtext, "master-dump: --deadline: 'soon' is not a duration");
}

/* put-synthetic is one command: with -H (here after the command's name) it takes every
 * option of the local form and writes the same blocks, --keep-channels included. */
static void test_put_synthetic_local_and_remote(void **state)
{
    (void)state;
    char ep[600], node_dir[600];
    int out_fd;
    pid_t pid = s_spawn_node(node_dir, ep, &out_fd);
    const char *args = "put-synthetic --model opt-125m --tokens 300 --scheme int4 "
                       "--keep-channels 40 --seed 3 --json";
    assert_int_equal(s_run("%s -H %s", args, ep), 0);
    unsigned long long blocks = s_json_u64(s_out, "blocks"), bytes = s_json_u64(s_out, "bytes");
    unsigned long long fp16 = s_json_u64(s_out, "fp16_bytes");
    assert_int_equal(blocks, 288);
    assert_int_equal(s_json_u64(s_out, "chunks"), 2);
    char remote[65];
    s_json_prefix(s_out, remote);
    assert_int_equal(s_run("%s", args), 0);
    assert_int_equal(s_json_u64(s_out, "blocks"), blocks);
    assert_int_equal(s_json_u64(s_out, "bytes"), bytes);
    assert_int_equal(s_json_u64(s_out, "fp16_bytes"), fp16);
    char local[65];
    s_json_prefix(s_out, local);
    /* The node holds them as sent; each side shows the pruned keys. */
    assert_int_equal(s_run("stat --host=%s --json", ep), 0);
    assert_int_equal(s_json_u64(s_out, "bytes"), bytes);
    assert_int_equal(s_run("show %.8s --layer 0 -H %s --json", remote, ep), 0);
    assert_contains(s_out, "\"key_channels\":40,\"head_dim\":64");
    assert_null(strstr(s_out, "\"key_channels\":64"));
    assert_int_equal(s_run("--json show %.8s --layer 0", local), 0);
    assert_contains(s_out, "\"key_channels\":40,\"head_dim\":64");
    assert_int_equal(s_run("ls -H %s --json", ep), 0);
    assert_contains(s_out, remote);

    /* The other options work remotely too, with the same bytes as locally. */
    const char *more = "put-synthetic --model opt-125m --tokens 64 --chunk-tokens 32 --scheme "
                       "int8 --group 16 --no-lz4 --pin --ttl 3600 --json";
    assert_int_equal(s_run("-H %s %s", ep, more), 0);
    assert_int_equal(s_json_u64(s_out, "chunks"), 2);
    bytes = s_json_u64(s_out, "bytes");
    assert_int_equal(s_run("%s", more), 0);
    assert_int_equal(s_json_u64(s_out, "bytes"), bytes);
    assert_int_equal(s_run("-H %s --json stat", ep), 0);
    assert_int_equal(s_json_u64(s_out, "pinned_blocks"), 288);

    /* One help text; --salt is refused on a node, with the reason. */
    assert_int_equal(s_run("put-synthetic --help"), 0);
    char *help = strdup(s_out);
    assert_non_null(help);
    assert_contains(help, "--keep-channels");
    assert_int_equal(s_run("-H %s put-synthetic --help", ep), 0);
    assert_string_equal(s_out, help);
    free(help);
    assert_int_equal(s_run("-H %s put-synthetic --model opt-125m --salt t1", ep), 2);
    assert_contains(s_errtext, "--salt");
    assert_contains(s_errtext, "tenant");
    assert_int_equal(s_run("put-synthetic --model gpt-9 -H %s", ep), 3);
    assert_contains(s_errtext, "unknown model 'gpt-9'");
    assert_int_equal(s_run("-H %s put-synthetic --model opt-125m --keep-channels 65", ep), 2);

    /* --server-key and --link after the command reach the connection. */
    assert_int_equal(s_run("stat -H %s --server-key %s.none", ep, s_dir), 2);
    assert_contains(s_errtext, "--server-key needs --cert");
    assert_int_equal(s_run("stat -H %s --link=fast", ep), 5);
    assert_contains(s_errtext, "--link 'fast'");

    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    close(out_fd);
    /* --deadline after the command: the call gives up by it (the default is 5 s). */
    double t0 = s_now();
    assert_int_equal(s_run("stat -H %s --deadline 300", ep), 5);
    assert_true(s_now() - t0 < 3.0);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock'", node_dir, s_dir);
    assert_int_equal(system(cmd), 0);
}

/* The chunk ids of `--json ls` output, in chain order ("chunk": index), comma-separated. */
static void s_chain_ids(const char *out, char *ids, size_t len)
{
    char by_index[8][65] = {{0}};
    int n = 0;
    for (const char *p = strstr(out, "\"prefix\":\""); p; p = strstr(p + 1, "\"prefix\":\"")) {
        const char *c = strstr(p, "\"chunk\":");
        assert_non_null(c);
        int idx = atoi(c + 8);
        assert_true(idx >= 0 && idx < 8);
        memcpy(by_index[idx], p + 10, 64);
        n = idx + 1 > n ? idx + 1 : n;
    }
    size_t at = 0;
    ids[0] = '\0';
    for (int i = 0; i < n && at + 66 <= len; i++) {
        if (i)
            ids[at++] = ',';
        memcpy(ids + at, by_index[i], 65);
        at += 64;
    }
}

/* `kvedge proxy` and `kvedge fetch`: usage errors, then a fetch through a proxy in its own
 * process that prints each layer's source and reason. */
static void test_proxy_cli(void **state)
{
    (void)state;
    assert_int_equal(s_run("proxy --insecure --bind ipc:///tmp/x.sock"), 2); /* no sources */
    assert_contains(s_errtext, "no sources");
    assert_int_equal(s_run("proxy --insecure --bind tcp://0.0.0.0:7498 --source 'cloud c "
                           "ipc:///tmp/x'"),
                     2);
    assert_int_equal(s_run("proxy --insecure --source 'satellite c ipc:///tmp/x'"), 2);
    assert_contains(s_errtext, "bad source");
    assert_int_equal(s_run("fetch --model opt-125m --chunks 00"), 2); /* needs -H */
    char ep[600], node_dir[600];
    int out_fd;
    pid_t node = s_spawn_node(node_dir, ep, &out_fd);
    assert_int_equal(s_run("-H %s --json put-synthetic --model opt-125m --tokens 512", ep), 0);
    assert_int_equal(s_run("-H %s --json ls", ep), 0);
    char ids[200];
    s_chain_ids(s_out, ids, sizeof ids);
    assert_int_equal(strlen(ids), 129);
    char pep[700], source[800];
    snprintf(pep, sizeof pep, "ipc://%s.proxy", s_dir);
    snprintf(source, sizeof source, "cloud cloud1 %s", ep);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t proxy = fork();
    if (proxy == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execl(KVEDGE_BIN, "kvedge", "proxy", "--insecure", "--bind", pep, "--source", source,
              "--log-level", "warn", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[700] = "";
    assert_true(read(pfd[0], line, sizeof line - 1) > 0);
    assert_non_null(strstr(line, "listening ipc://"));
    /* The plan takes the sources the proxy has heard: wait for its first probe of the node. */
    kt_wait_for(s_run("-H %s stat", pep) == 0 && strstr(s_out, "sources: 1 up of 1"), KT_WAIT_MS);
    assert_int_equal(s_run("-H %s fetch --model opt-125m --chunks %s", pep, ids), 0);
    assert_contains(s_out, "12 layers delivered, 0 to compute locally");
    assert_contains(s_out, "cloud1");
    assert_int_equal(
        s_run("-H %s --json fetch --model opt-125m --chunks %s --layers 2:5", pep, ids), 0);
    assert_contains(s_out, "{\"layer\":4,\"source\":\"cloud1\",\"reason\":\"planned\"");
    assert_int_equal(s_run("-H %s fetch --model opt-125m --chunks %s --layers 2:50", pep, ids),
                     1); /* past the model's 12 layers */
    assert_contains(s_errtext, "shape");
    assert_int_equal(s_run("-H %s fetch --model opt-125m --chunks 12zz", pep), 2);
    kill(proxy, SIGTERM);
    int st = 0;
    waitpid(proxy, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(pfd[0]);
    kill(node, SIGTERM);
    waitpid(node, NULL, 0);
    close(out_fd);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock' '%s.proxy'", node_dir, s_dir, s_dir);
    assert_int_equal(system(cmd), 0);
}

/* ---------------------------------------------------------------- cloud prefill, edge decode */

#define S_TINY KVEDGE_FIXTURES "/opt_tiny.safetensors"

/* n context token ids of the tiny model (vocab 256), comma-separated, from seed. */
static void s_ids(char *out, size_t len, int n, int seed)
{
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; i < n && at + 8 < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%d", i ? "," : "",
                               (seed + 37 * i + (i * i) % 11) % 250 + 4);
}

/* The JSON array after "key":[ that follows from in out, copied to buf ("" when absent). */
static void s_json_array(const char *from, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":[", key);
    const char *p = strstr(from, pat);
    buf[0] = '\0';
    if (!p)
        return;
    p += strlen(pat);
    const char *e = strchr(p, ']');
    assert_non_null(e);
    assert_true((size_t)(e - p) < len);
    memcpy(buf, p, (size_t)(e - p));
    buf[e - p] = '\0';
}

/* Counts the comma-separated numbers of a JSON array's body. */
static int s_count_items(const char *body)
{
    if (!*body)
        return 0;
    int n = 1;
    for (const char *p = body; *p; p++)
        n += *p == ',';
    return n;
}

/* Starts `kvedge proxy` with one cloud source in its own process; waits for "listening". */
static pid_t s_spawn_proxy(const char *pep, const char *node_ep, int *out_fd)
{
    char source[800];
    snprintf(source, sizeof source, "cloud cloud1 %s", node_ep);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execl(KVEDGE_BIN, "kvedge", "proxy", "--insecure", "--bind", pep, "--source", source,
              "--log-level", "warn", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[700] = "";
    assert_true(read(pfd[0], line, sizeof line - 1) > 0);
    assert_non_null(strstr(line, "listening ipc://"));
    *out_fd = pfd[0];
    return pid;
}

/* model-synth, prefill and decode: bad command lines fail with exit 2 (or 1 for weights that
 * do not load) and say why, before any network call (-H names nothing that listens). */
static void test_e2e_usage(void **state)
{
    (void)state;
    const char *nowhere = "-H ipc:///nonexistent/kvedge-e2e.sock --deadline 300";
    assert_int_equal(s_run("--help"), 0);
    assert_contains(s_out, "model-synth");
    assert_contains(s_out, "prefill");
    assert_contains(s_out, "decode");
    assert_int_equal(s_run("help decode"), 0);
    assert_contains(s_out, "--compare");
    assert_int_equal(s_run("prefill --help"), 0);
    assert_contains(s_out, "--scheme");
    assert_int_equal(s_run("model-synth --help"), 0);
    assert_contains(s_out, "opt-tiny");

    assert_int_equal(s_run("model-synth --shape opt-9b --out %s.w", s_dir), 2);
    assert_contains(s_errtext, "unknown shape 'opt-9b'");
    assert_int_equal(s_run("model-synth --shape opt-tiny"), 2);
    assert_contains(s_errtext, "--out");
    assert_int_equal(s_run("model-synth --shape opt-tiny --out %s.w --seed -3", s_dir), 2);

    assert_int_equal(s_run("prefill --weights %s --context-ids 5,6", S_TINY), 2);
    assert_contains(s_errtext, "needs -H");
    assert_int_equal(s_run("%s prefill --context-ids 5,6", nowhere), 2);
    assert_contains(s_errtext, "--weights FILE is required");
    assert_int_equal(
        s_run("%s prefill --weights %s --context-ids 5 --scheme int9", nowhere, S_TINY), 2);
    assert_contains(s_errtext, "bad value 'int9' for --scheme");
    assert_int_equal(s_run("%s prefill --weights %s --context-ids 5 --dtype bf16", nowhere, S_TINY),
                     2);
    assert_int_equal(s_run("%s prefill --weights %s", nowhere, S_TINY), 2);
    assert_contains(s_errtext, "give the shared context once");
    assert_int_equal(s_run("%s prefill --weights %s --context-ids 5 --context x", nowhere, S_TINY),
                     2);
    assert_int_equal(s_run("%s prefill --weights %s.missing --context-ids 5", nowhere, s_dir), 1);
    assert_contains(s_errtext, "cannot load the weights");
    /* Out of the tiny model's vocabulary (256) and positions (160). */
    assert_int_equal(s_run("%s prefill --weights %s --context-ids 5,256", nowhere, S_TINY), 2);
    assert_contains(s_errtext, "--context-ids wants token ids 0..255");
    assert_int_equal(s_run("%s prefill --weights %s --context-ids 5 --tokens 161", nowhere, S_TINY),
                     2);
    assert_contains(s_errtext, "160 positions");
    /* 256 ids: the byte tokenizer does not fit, and says what to do. */
    assert_int_equal(s_run("%s prefill --weights %s --context hello", nowhere, S_TINY), 2);
    assert_contains(s_errtext, "--context-ids");
    assert_int_equal(
        s_run("%s prefill --weights %s --context-file %s.none", nowhere, S_TINY, s_dir), 1);
    assert_contains(s_errtext, "cannot read the context file");

    assert_int_equal(s_run("%s decode --weights %s --context-ids 5,6", nowhere, S_TINY), 2);
    assert_contains(s_errtext, "give the prompt once");
    assert_int_equal(s_run("%s decode --weights %s --context-ids 5,6 --prompt-ids 7 "
                           "--cloud-link fast",
                           nowhere, S_TINY),
                     2);
    assert_contains(s_errtext, "--cloud-link");
    assert_int_equal(s_run("%s decode --weights %s --context-ids 5 --tokens 100 --prompt-ids 7 "
                           "--max-new 60",
                           nowhere, S_TINY),
                     2);
    assert_contains(s_errtext, "exceed the model's 160 positions");
    assert_int_equal(
        s_run("%s decode --weights %s --context-ids 5 --prompt-ids 7 --max-new 0", nowhere, S_TINY),
        2);
    /* The cache optimizer's flags: a bad list or budget, a budget without a list. */
    const char *bad_accept[] = {"int8,int8", "int9", "", "stored", "int8,,int4"};
    for (size_t i = 0; i < sizeof bad_accept / sizeof *bad_accept; i++) {
        assert_int_equal(s_run("%s decode --weights %s --context-ids 5 --prompt-ids 7 "
                               "--accept '%s'",
                               nowhere, S_TINY, bad_accept[i]),
                         2);
        assert_contains(s_errtext, "--accept");
    }
    const char *bad_budget[] = {"ppl:101", "kl:-1", "mse:1", "kl:nan", "ppl"};
    for (size_t i = 0; i < sizeof bad_budget / sizeof *bad_budget; i++) {
        assert_int_equal(s_run("%s decode --weights %s --context-ids 5 --prompt-ids 7 "
                               "--accept int8 --budget '%s'",
                               nowhere, S_TINY, bad_budget[i]),
                         2);
        assert_contains(s_errtext, "--budget");
    }
    assert_int_equal(s_run("%s decode --weights %s --context-ids 5 --prompt-ids 7 --budget kl:1e-4",
                           nowhere, S_TINY),
                     2);
    assert_contains(s_errtext, "--budget needs --accept");
    /* Everything in order: only then the network, which is not there. */
    assert_int_equal(
        s_run("%s decode --weights %s --context-ids 5 --prompt-ids 7", nowhere, S_TINY), 5);
    assert_contains(s_errtext, "no answer from");
}

/* model-synth writes weights of the tiny shape that load (same seed, same bytes); prefill
 * puts a context to a node, and decode on that node fetches it, with the edge-only and
 * cloud-only baselines agreeing on every token when the K/V is stored lossless in fp32. */
static void test_e2e_node(void **state)
{
    (void)state;
    char w1[300], w2[300], cmd[2600];
    snprintf(w1, sizeof w1, "%s.synth1", s_dir);
    snprintf(w2, sizeof w2, "%s.synth2", s_dir);
    assert_int_equal(s_run("--json model-synth --shape opt-tiny --out %s --seed 7", w1), 0);
    assert_contains(s_out, "\"shape\":\"opt-tiny\"");
    assert_contains(s_out, "\"layers\":3");
    assert_null(strstr(s_out, "\"parameters\":0,"));
    assert_int_equal(s_run("model-synth --shape opt-tiny --out %s --seed 7", w2), 0);
    assert_contains(s_out, "M parameters");
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", w1, w2);
    assert_int_equal(system(cmd), 0);

    char ep[600], node_dir[600];
    int out_fd;
    pid_t node = s_spawn_node(node_dir, ep, &out_fd);
    char ctx[400];
    s_ids(ctx, sizeof ctx, 40, 3);
    /* 40 tokens in chunks of 16: 3 chunks x 3 layers x 4 heads. */
    assert_int_equal(s_run("-H %s --json prefill --weights %s --context-ids %s --chunk-tokens 16 "
                           "--scheme lossless --dtype fp32",
                           ep, S_TINY, ctx),
                     0);
    assert_contains(s_out, "\"model\":\"opt-tiny\""); /* the fixture has the tiny shape */
    assert_contains(s_out, "\"tokens\":40");
    assert_contains(s_out, "\"blocks\":36");
    char chunks[400];
    s_json_array(s_out, "chunks", chunks, sizeof chunks);
    assert_int_equal(s_count_items(chunks), 3);
    /* The synthesized weights load and prefill too, under their own id; --tokens repeats. */
    assert_int_equal(s_run("-H %s prefill --weights %s --model-id synth-tiny --context-ids 9,8,7 "
                           "--tokens 20",
                           ep, w1),
                     0);
    assert_contains(s_out, "prefilled 20 context tokens of synth-tiny");
    assert_contains(s_out, "chunks: 1 of 256 tokens");

    assert_int_equal(s_run("-H %s --json decode --weights %s --context-ids %s --chunk-tokens 16 "
                           "--prompt-ids 10,20,30 --max-new 8 --compare --cloud-link "
                           "10gbit,1ms",
                           ep, S_TINY, ctx),
                     0);
    assert_contains(s_out, "\"kvedge\":{");
    assert_contains(s_out, "\"edge_only\":{");
    assert_contains(s_out, "\"cloud_only\":{");
    const char *tokens = strstr(s_out, "\"tokens\":{");
    assert_non_null(tokens);
    char a[200], b[200], c[200];
    s_json_array(tokens, "kvedge", a, sizeof a);
    s_json_array(tokens, "edge_only", b, sizeof b);
    s_json_array(tokens, "cloud_only", c, sizeof c);
    assert_int_equal(s_count_items(a), 8);
    assert_string_equal(a, b);
    assert_string_equal(a, c);
    assert_contains(s_out, "\"tokens_agree\":true");

    /* The same context at int8, as the node derives it from the lossless blocks: the run
     * completes (int8 K/V may change a greedy pick, so the tokens are not compared). */
    assert_int_equal(s_run("-H %s --json decode --weights %s --context-ids %s --chunk-tokens 16 "
                           "--prompt-ids 10,20,30 --max-new 8 --accept int8",
                           ep, S_TINY, ctx),
                     0);
    assert_contains(s_out, "\"fetched\":3");

    /* People's output: the table, and the same tokens. */
    assert_int_equal(s_run("-H %s decode --weights %s --context-ids %s --chunk-tokens 16 "
                           "--prompt-ids 10,20,30 --max-new 8 --compare --quiet",
                           ep, S_TINY, ctx),
                     0);
    assert_contains(s_out, "TTFT edge-only / kvedge");
    assert_contains(s_out, "tokens agree: yes");
    for (char *p = a; *p; p++)
        *p = *p == ',' ? ' ' : *p;
    char line[300];
    snprintf(line, sizeof line, "generated 8 tokens: %s\n", a);
    assert_contains(s_out, line);

    /* A context nobody prefilled: every layer is computed here, and the output says so. */
    assert_int_equal(s_run("-H %s --json decode --weights %s --context-ids 1,2,3,4 --prompt-ids 5 "
                           "--max-new 2 --plan-recompute",
                           ep, S_TINY),
                     0);
    assert_contains(s_out, "\"fetched\":0,\"computed\":3");
    assert_int_equal(s_run("-H %s decode --weights %s --context-ids 1,2,3,4 --prompt-ids 5 "
                           "--max-new 2",
                           ep, S_TINY),
                     0);
    assert_contains(s_out, "note: no layer came from");
    assert_contains(s_out, "generated 2 tokens: ");
    /* A model the node does not know is an error (exit 3), not a decode of missed layers. */
    assert_int_equal(s_run("-H %s decode --weights %s --model-id nobody-knows --context-ids %s "
                           "--chunk-tokens 16 --prompt-ids 5 --max-new 2",
                           ep, S_TINY, ctx),
                     3);
    assert_contains(s_errtext, "does not know model 'nobody-knows'");
    kill(node, SIGTERM);
    waitpid(node, NULL, 0);
    close(out_fd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock' '%s' '%s'", node_dir, s_dir, w1, w2);
    assert_int_equal(system(cmd), 0);
}

/* The edge role through a proxy in its own process. A proxy knows a model's shape when it is
 * built in or registered with its master; the tiny model is neither, so the proxy refuses the
 * FETCH and decode says so (a successful fetch through a proxy needs an opt-125m-sized model,
 * too slow for this test). Then the proxy goes away: decode ends by the deadline. */
static void test_e2e_proxy(void **state)
{
    (void)state;
    char ep[600], node_dir[600], pep[700];
    int node_fd, proxy_fd;
    pid_t node = s_spawn_node(node_dir, ep, &node_fd);
    snprintf(pep, sizeof pep, "ipc://%s.proxy", s_dir);
    pid_t proxy = s_spawn_proxy(pep, ep, &proxy_fd);
    char ctx[400];
    s_ids(ctx, sizeof ctx, 48, 11);
    assert_int_equal(s_run("-H %s prefill --weights %s --context-ids %s --chunk-tokens 32 "
                           "--scheme int4 --pin",
                           ep, S_TINY, ctx),
                     0);
    assert_contains(s_out, "chunks: 2 of 32 tokens");
    assert_contains(s_out, "blocks: 24 (int4 fp16)");
    assert_contains(s_out, "pinned");
    assert_int_equal(s_run("-H %s decode --weights %s --context-ids %s --chunk-tokens 32 "
                           "--prompt-ids 40,41,42,43 --max-new 6",
                           pep, S_TINY, ctx),
                     3);
    assert_contains(s_errtext, "does not know model 'opt-tiny'");
    assert_contains(s_errtext, "built-in");
    /* prefill to the proxy rather than to a node: said as such. */
    assert_int_equal(s_run("-H %s prefill --weights %s --context-ids %s", pep, S_TINY, ctx), 2);
    assert_contains(s_errtext, "is an edge proxy");
    assert_null(strstr(s_errtext, "refused these settings"));
    kill(proxy, SIGTERM);
    int st = 0;
    waitpid(proxy, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(proxy_fd);
    assert_int_equal(s_run("-H %s --deadline 300 decode --weights %s --context-ids %s "
                           "--prompt-ids 40 --max-new 2",
                           pep, S_TINY, ctx),
                     5);
    assert_contains(s_errtext, "no answer from");
    kill(node, SIGTERM);
    waitpid(node, NULL, 0);
    close(node_fd);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock' '%s.proxy'", node_dir, s_dir, s_dir);
    assert_int_equal(system(cmd), 0);
}

static void test_keygen(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s-key", s_dir);
    assert_int_equal(s_run("keygen %s --tenant acme --admin", path), 0);
    assert_contains(s_out, "public key ");
    struct stat st;
    char secret[700];
    snprintf(secret, sizeof secret, "%s_secret", path);
    assert_int_equal(stat(secret, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *pub = s_slurp(f);
    fclose(f);
    assert_non_null(strstr(pub, "tenant = \"acme\""));
    assert_non_null(strstr(pub, "admin = \"true\""));
    assert_null(strstr(pub, "secret-key"));
    free(pub);
    assert_int_equal(s_run("keygen %s", path), 1); /* no silent overwrite */
    assert_contains(s_errtext, "--force");
    assert_int_equal(s_run("keygen %s --force", path), 0);
    assert_int_equal(s_run("keygen %s --force --json", path), 0); /* --json is heard */
    assert_contains(s_out, "{\"public\":\"");
    assert_contains(s_out, "_secret\",\"public_key\":\"");
    unlink(path);
    unlink(secret);
}

/* Every daemon refuses a port out of 1-65535 (or *) before it starts; a proxy's source must
 * name its port. */
static void test_endpoint_ports(void **state)
{
    (void)state;
    assert_int_equal(s_run("store --insecure --bind tcp://127.0.0.1:99999 --check-config"), 2);
    assert_contains(s_errtext, "port '99999' is not 1 to 65535");
    assert_int_equal(s_run("store --insecure --bind tcp://127.0.0.1:0 --check-config"), 2);
    assert_int_equal(s_run("store --insecure --bind 'tcp://127.0.0.1:*' --check-config"), 0);
    assert_int_equal(s_run("master --insecure --bind tcp://127.0.0.1:65536 --pub "
                           "tcp://127.0.0.1:7411 --data %s.m --check-config",
                           s_dir),
                     2);
    assert_contains(s_errtext, "65536");
    assert_int_equal(s_run("proxy --insecure --bind tcp://127.0.0.1:74x --source 'cloud c1 "
                           "ipc:///tmp/x' --check-config"),
                     2);
    assert_int_equal(s_run("proxy --insecure --bind ipc:///tmp/x.sock --source 'cloud c1 "
                           "tcp://nohost' --check-config"),
                     2);
    assert_contains(s_errtext, "bad source");
    assert_int_equal(s_run("proxy --insecure --bind ipc:///tmp/x.sock --source 'cloud c1 "
                           "tcp://nohost:7400' --check-config"),
                     0);
    /* A remote command's endpoint without its transport: the form it takes, not "invalid
     * argument" alone. */
    assert_int_equal(s_run_bare("-H 127.0.0.1:17400 stat"), 5);
    assert_contains(s_errtext, "tcp://HOST:PORT");
    assert_contains(s_errtext, "tcp://127.0.0.1:17400");
    /* A server key file that is not there is named. */
    assert_int_equal(s_run_bare("-H tcp://127.0.0.1:1 --server-key %s.gone.cert --cert %s.x "
                                "stat",
                                s_dir, s_dir),
                     5);
    assert_contains(s_errtext, ".gone.cert: no such file");
}

/* --data on the command line with the node in KVEDGE_HOST: refused, not silently ignored. */
static void test_host_env_and_data(void **state)
{
    (void)state;
    assert_int_equal(setenv("KVEDGE_HOST", "ipc:///nonexistent/kvedge-env.sock", 1), 0);
    assert_int_equal(s_run("ls"), 2);
    assert_contains(s_errtext, "KVEDGE_HOST");
    assert_int_equal(s_run("put-synthetic --model opt-125m --tokens 10"), 2);
    assert_int_equal(s_run("models"), 0);                 /* local only: no doubt */
    assert_int_equal(s_run_bare("--deadline 300 ls"), 5); /* the node, as the variable says */
    assert_int_equal(s_run("-H ipc:///nonexistent/kvedge-env.sock --deadline 300 ls"), 5);
    assert_int_equal(unsetenv("KVEDGE_HOST"), 0);
}

/* Remote ls in chain order with full ids on request; show refuses a layer past the model. */
static void test_remote_ls_show(void **state)
{
    (void)state;
    char ep[600], node_dir[600];
    int out_fd;
    pid_t pid = s_spawn_node(node_dir, ep, &out_fd);
    assert_int_equal(s_run("-H %s --json put-synthetic --model opt-125m --tokens 1024", ep), 0);
    char prefix[65];
    s_json_prefix(s_out, prefix); /* the last of 4 chunks */
    assert_int_equal(s_run("-H %s put-synthetic --model opt-125m --tokens 600 --seed 4", ep), 0);
    assert_int_equal(s_run("-H %s ls --full", ep), 0);
    assert_contains(s_out, prefix);
    assert_int_equal(s_run("-H %s ls", ep), 0);
    assert_null(strstr(s_out, prefix));
    assert_int_equal(s_run("-H %s ls --help", ep), 0);
    assert_contains(s_out, "--full");
    /* Each chain's chunks together, by index: 0 1 2 3 and 0 1 2, in some order. */
    assert_int_equal(s_run("-H %s --json ls", ep), 0);
    int prev = -1, rows = 0;
    for (const char *p = strstr(s_out, "\"chunk\":"); p; p = strstr(p + 1, "\"chunk\":")) {
        int idx = atoi(p + 8);
        assert_true(idx == 0 || idx == prev + 1);
        prev = idx;
        rows++;
    }
    assert_int_equal(rows, 7);
    assert_int_equal(s_run("-H %s show %.8s --layer 99", ep, prefix), 2);
    assert_contains(s_errtext, "past the 12 layers of opt-125m");
    assert_int_equal(s_run("-H %s show %.8s --layer 11", ep, prefix), 0);
    assert_contains(s_out, "12 blocks shown");
    assert_int_equal(s_run("-H %s show --help", ep), 0);
    assert_contains(s_out, "--layer");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    close(out_fd);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock'", node_dir, s_dir);
    assert_int_equal(system(cmd), 0);
}

/* A CURVE node (its default) in its own process; waits for "listening" (after the line with
 * its new key). */
static pid_t s_spawn_curve_node(const char *node_dir, const char *ep, int *out_fd)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execl(KVEDGE_BIN, "kvedge", "--data", node_dir, "store", "--bind", ep, "--log-level",
              "warn", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char out[2000] = "";
    size_t len = 0;
    while (!strstr(out, "listening") && len < sizeof out - 1) {
        ssize_t got = read(pfd[0], out + len, sizeof out - 1 - len);
        assert_true(got > 0);
        len += (size_t)got;
        out[len] = '\0';
    }
    *out_fd = pfd[0];
    return pid;
}

/* A key without admin rights asking for evict: a permission error, with what to do. */
static void test_remote_evict_denied(void **state)
{
    (void)state;
    char ep[600], node_dir[600], key[600], cmd[3000];
    snprintf(node_dir, sizeof node_dir, "%s-node", s_dir);
    snprintf(ep, sizeof ep, "ipc://%s.sock", s_dir);
    snprintf(key, sizeof key, "%s-user", s_dir);
    int out_fd;
    pid_t pid = s_spawn_curve_node(node_dir, ep, &out_fd);
    assert_int_equal(s_run("keygen %s --tenant acme", key), 0);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/clients/'", key, node_dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(
        s_run("-H %s --server-key %s/node.cert --cert %s_secret stat", ep, node_dir, key), 0);
    assert_int_equal(
        s_run("-H %s --server-key %s/node.cert --cert %s_secret evict --to 0", ep, node_dir, key),
        6);
    assert_contains(s_errtext, "needs an admin key (kvedge keygen --admin");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    close(out_fd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.sock' '%s' '%s_secret'", node_dir, s_dir, key, key);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_help_and_usage_errors, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_did_you_mean, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_help_lists_every_option, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bounds_name_the_flag, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_aliases_work, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_env_vars, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_missing_store, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_model, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_put_inspect_show_verify, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_pin_evict_delete, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_locked_store, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_models_per_tenant, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_damaged_store, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_repair_lost_current, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_repair_lost_blocks, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_repair_flips_in_every_sst, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_repair_survives_rocksdb_abort, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_blob_detected, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_remote_mode, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_global_options_after_command, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_put_synthetic_local_and_remote, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_keygen, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sync_once, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_plan, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_block_file, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_basis_file, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_master_cli, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_proxy_cli, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_e2e_usage, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_e2e_node, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_e2e_proxy, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_ports, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_host_env_and_data, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_remote_ls_show, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_remote_evict_denied, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
