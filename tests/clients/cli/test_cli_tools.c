/* The option tables of the model and lab commands (model-synth, prefill, decode, eval,
 * layermap, lseval, top, sources): --help lists every option and deprecated alias, an old
 * flag name reaches the same option as the new one, a value out of bounds is refused naming
 * the flag, and a mistyped flag gets the nearest one. Runs the kvedge binary; nothing here
 * needs a network peer (-H names nothing that listens, and every line is refused or fails
 * before a connection). The global --basis loads coding bases, or stops the line naming the
 * file that does not load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clients/cli/cli.h"
#include "tests/common/basis_fixture.h"

#define S_TINY    KVEDGE_FIXTURES "/opt_tiny.safetensors"
#define S_NOWHERE "-H ipc:///nonexistent/kvedge-cli-tools.sock --deadline 300"

static char s_errpath[64];
static char *s_out, *s_err;

static char *s_slurp(FILE *f)
{
    size_t len = 0, cap = 4096, n;
    char *buf = malloc(cap);
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

/* Runs `kvedge <args>`: its exit code; stdout in s_out, stderr in s_err. */
static int s_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int s_run(const char *fmt, ...)
{
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", KVEDGE_BIN, args, s_errpath);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    free(s_out);
    s_out = s_slurp(p);
    int st = pclose(p);
    FILE *e = fopen(s_errpath, "r");
    free(s_err);
    s_err = e ? s_slurp(e) : strdup("");
    if (e)
        fclose(e);
    assert_non_null(s_out);
    assert_non_null(s_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("expected \"%s\" in:\n%s", (needle), (hay));                                  \
    } while (0)

/* The tables these commands live in; remote ones need -H even for --help. */
static const struct {
    const kvedge_cli_cmd_t *cmds;
    bool remote;
} s_tables[] = {
    {kvedge_cli_e2e_cmds, false},      {kvedge_cli_eval_cmds, false},
    {kvedge_cli_layermap_cmds, false}, {kvedge_cli_lseval_cmds, false},
    {kvedge_cli_top_cmds, true},
};

/* Every command of these tables has a consistent table, and its --help names every option
 * (with its letter), every positional, every alias as a deprecated alias. */
static void test_help_lists_every_option(void **state)
{
    (void)state;
    size_t n_cmds = 0;
    for (size_t t = 0; t < sizeof s_tables / sizeof s_tables[0]; t++)
        for (const kvedge_cli_cmd_t *c = s_tables[t].cmds; c->name; c++) {
            assert_non_null(c->opts); /* every command here is on a table */
            assert_non_null(c->exec);
            char why[300] = "";
            if (kvedge_cmdopts_check(c->opts, why, sizeof why) != 0)
                fail_msg("%s: %s", c->name, why);
            assert_int_equal(
                s_run("%s %s --help", s_tables[t].remote ? "-H tcp://127.0.0.1:1" : "", c->name),
                0);
            /* Wrapped help lines read as one. */
            for (char *p = s_out; (p = strstr(p, "\n                            ")) != NULL;)
                memmove(p, p + 28, strlen(p + 28) + 1), *p = ' ';
            for (size_t i = 0; i < c->opts->count; i++) {
                const kvedge_cmdopt_t *o = &c->opts->opts[i];
                char want[128];
                if (o->positional)
                    snprintf(want, sizeof want, "  %s", o->name);
                else if (o->letter)
                    snprintf(want, sizeof want, "-%c, --%s", o->letter, o->name);
                else
                    snprintf(want, sizeof want, "--%s", o->name);
                assert_contains(s_out, want);
                assert_contains(s_out, o->help);
                if (o->alias) {
                    snprintf(want, sizeof want, "--%s", o->alias);
                    assert_contains(s_out, want);
                    snprintf(want, sizeof want,
                             "deprecated alias of --%s, removed in the next release", o->name);
                    assert_contains(s_out, want);
                }
            }
            n_cmds++;
        }
    assert_int_equal(n_cmds, 8); /* model-synth prefill decode eval layermap lseval top sources */
}

/* Runs the same line with an option's new name and its old one: both exit the same and
 * print the same; returns the exit code (stderr of the new name in s_err). */
static int s_both(const char *fmt_new, const char *fmt_old)
{
    int rc_old = s_run("%s", fmt_old);
    char *err_old = strdup(s_err), *out_old = strdup(s_out);
    int rc_new = s_run("%s", fmt_new);
    assert_int_equal(rc_new, rc_old);
    assert_string_equal(s_err, err_old);
    assert_string_equal(s_out, out_old);
    free(err_old);
    free(out_old);
    return rc_new;
}

/* The old names of the file inputs still reach the option: --context-file (prefill, decode),
 * --text (eval, lseval), --calib (layermap) go as far as --file does. */
static void test_old_names_still_work(void **state)
{
    (void)state;
    /* prefill and decode: past the weights, to reading the context file. */
    assert_int_equal(s_both(S_NOWHERE " prefill --weights " S_TINY " --file /nonexistent/ctx.txt",
                            S_NOWHERE " prefill --weights " S_TINY
                                      " --context-file /nonexistent/ctx.txt"),
                     1);
    assert_contains(s_err, "prefill: cannot read the context file /nonexistent/ctx.txt");
    assert_int_equal(s_both(S_NOWHERE " decode --weights " S_TINY
                                      " --file /nonexistent/ctx.txt --prompt-ids 7",
                            S_NOWHERE " decode --weights " S_TINY
                                      " --context-file=/nonexistent/ctx.txt --prompt-ids 7"),
                     1);
    assert_contains(s_err, "decode: cannot read the context file /nonexistent/ctx.txt");
    /* eval: the text counts as the documents, so with --ids too it is refused. */
    assert_int_equal(s_both("eval --weights " S_TINY " --ids /dev/null --file /nonexistent/t",
                            "eval --weights " S_TINY " --ids /dev/null --text /nonexistent/t"),
                     2);
    assert_contains(s_err, "eval: give the documents once");
    /* lseval: the required text is given by either name. */
    assert_int_equal(s_run("lseval --cloud " S_TINY " --edge " S_TINY " --tokenizer /nonexistent"),
                     2);
    assert_contains(s_err, "lseval: --file is required");
    assert_int_equal(s_both("lseval --cloud " S_TINY " --edge " S_TINY
                            " --tokenizer /nonexistent --file /nonexistent/t --ctx 100 --cont 8",
                            "lseval --cloud " S_TINY " --edge " S_TINY
                            " --tokenizer /nonexistent --text /nonexistent/t --ctx 100 --cont 8"),
                     1);
    assert_contains(s_err, "lseval: cannot load the tokenizer");
    /* layermap: the calibration text is a measurement's flag, refused with --show-adapter. */
    assert_int_equal(s_both("layermap --show-adapter /nonexistent/a --file /nonexistent/c",
                            "layermap --show-adapter /nonexistent/a --calib /nonexistent/c"),
                     2);
    assert_contains(s_err, "layermap: --show-adapter takes no other flag");
}

/* A value out of its table's bounds: exit 2, naming the command, the flag and the bound,
 * before anything loads or connects. */
static void test_bounds_name_the_flag(void **state)
{
    (void)state;
    static const struct {
        const char *line, *said;
    } cases[] = {
        {S_NOWHERE " prefill --weights " S_TINY " --context-ids 5 --chunk-tokens 0",
         "prefill: --chunk-tokens: '0' is out of range (1 to 65536)"},
        {S_NOWHERE " prefill --weights " S_TINY " --context-ids 5 --group 70000",
         "prefill: --group: '70000' is out of range (0 to 65535)"},
        {S_NOWHERE " decode --weights " S_TINY " --context-ids 5 --prompt-ids 7 --max-new 0",
         "decode: --max-new: '0' is out of range (1 to 4294967295)"},
        {S_NOWHERE " decode --weights " S_TINY " --context-ids 5 --prompt-ids 7 "
                   "--repetition-penalty 11",
         "decode: --repetition-penalty: '11' is out of range (1 to 10)"},
        {"model-synth --shape opt-tiny --out /nonexistent/w --seed -3",
         "model-synth: --seed: '-3' is not a whole number"},
        {"eval --weights " S_TINY " --ids /dev/null --context 0",
         "eval: --context: '0' is out of range (1 to 4294967295)"},
        {"eval --weights " S_TINY " --ids /dev/null --wait 2h",
         "eval: --wait: '2h' is out of range"},
        {"lseval --cloud a --edge b --tokenizer c --file d --cont 70000",
         "lseval: --continuation: '70000' is out of range (1 to 65536)"},
        {"layermap --cloud a --edge b --tokenizer c --file d --cka-min 2",
         "layermap: --cka-min: '2' is out of range (0 to 1)"},
        {"layermap --cloud a --edge b --tokenizer c --file d --samples 2",
         "layermap: --samples: '2' is out of range (3 to 16384)"},
        {"layermap --cloud a --edge b --tokenizer c --file d --adapter x --adapt cubic",
         "layermap: --adapt: 'cubic' is not one of linear|heads"},
        {"-H tcp://127.0.0.1:1 top --interval 0.01",
         "top: --interval: '0.01' is out of range (0.1 to 3600)"},
        {"-H tcp://127.0.0.1:1 top -k 65", "top: -k: '65' is out of range (0 to 64)"},
        {"-H tcp://127.0.0.1:1 sources --json extra", "sources: unexpected argument 'extra'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = s_run("%s", cases[i].line);
        if (rc != 2)
            fail_msg("`kvedge %s` exited %d, not 2: %s", cases[i].line, rc, s_err);
        assert_contains(s_err, cases[i].said);
    }
}

/* A mistyped flag of these commands gets the nearest one. */
static void test_did_you_mean(void **state)
{
    (void)state;
    assert_int_equal(s_run("prefill --contxt x"), 2);
    assert_contains(s_err, "prefill: unknown option '--contxt' (did you mean --context?)");
    assert_int_equal(s_run("decode --max-nwe 3"), 2);
    assert_contains(s_err, "did you mean --max-new?");
    assert_int_equal(s_run("lseval --tokeniser x"), 2);
    assert_contains(s_err, "did you mean --tokenizer?");
    assert_int_equal(s_run("-H tcp://127.0.0.1:1 top --intervall 1"), 2);
    assert_contains(s_err, "did you mean --interval?");
}

/* --basis DIR (global): the coding bases are loaded before the command runs, after its name
 * too; a file that does not load stops the line with the loader's reason. `store --basis` is
 * the node's own setting, refused the same way before anything is started. */
static void test_basis_option(void **state)
{
    (void)state;
    char dir[64], good[128], bad[128], path[192];
    snprintf(dir, sizeof dir, "/tmp/kvedge-cli-basis-%ld", (long)getpid());
    snprintf(good, sizeof good, "%s/good", dir);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(mkdir(good, 0700), 0);
    assert_int_equal(mkdir(bad, 0700), 0);
    snprintf(path, sizeof path, "%s/m.kvb", good);
    assert_int_equal(kt_basis_write(path, "cli-basis-model", 1, 2, 16, 0.125f, 3), 0);
    uint8_t *b = NULL;
    size_t len = 0;
    assert_int_equal(kt_basis_file("cli-basis-model", 1, 2, 16, 0.125f, 3, &b, &len), 0);
    b[len / 2] ^= 0x40;
    snprintf(path, sizeof path, "%s/m.kvb", bad);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(b);

    assert_int_equal(s_run("--basis %s --version", good), 0);
    assert_int_equal(s_run("--basis %s --version", bad), KVEDGE_EXIT_CORRUPT);
    assert_contains(s_err, "--basis");
    assert_contains(s_err, "m.kvb: digest mismatch");
    assert_int_equal(s_run("decode --basis %s/none --help", dir), KVEDGE_EXIT_FAILURE);
    assert_contains(s_err, "none");
    assert_int_not_equal(s_run("store --basis %s --data %s/store --insecure --metrics off "
                               "--bind 'tcp://127.0.0.1:*'",
                               bad, dir),
                         KVEDGE_EXIT_OK);
    assert_contains(s_err, "cannot load the coding bases of");
    assert_contains(s_err, "m.kvb: digest mismatch");
    char store[128];
    snprintf(store, sizeof store, "%s/store", dir);
    assert_int_equal(access(store, F_OK), -1); /* nothing was started */
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    snprintf(s_errpath, sizeof s_errpath, "/tmp/kvedge-cli-tools-%ld.err", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_lists_every_option),
        cmocka_unit_test(test_old_names_still_work),
        cmocka_unit_test(test_bounds_name_the_flag),
        cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_basis_option),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(s_out);
    free(s_err);
    unlink(s_errpath);
    return rc;
}
