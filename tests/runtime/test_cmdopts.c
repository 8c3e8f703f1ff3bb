/* Tests of the command option tables (runtime/cmdopts.h): long and short flags in every form,
 * bounds that name the flag, "did you mean", required options and positionals, the environment,
 * deprecated aliases, --help from the table, and the table check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"
#include "runtime/cmdopts.h"

typedef struct {
    const char *file;
    bool quiet, force;
    uint32_t count;
    uint64_t size;
    int mode;
    double ratio;
    const char *tags[3];
    size_t n_tags;
    const char *prefix;
    const char *rest[4];
    size_t n_rest;
} s_opts_t;

static const kvedge_setting_choice_t s_modes[] = {{"fast", 1}, {"safe", 2}, {NULL, 0}};

static const kvedge_cmdopt_t s_list[] = {
    {.name = "file",
     .letter = 'f',
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, file),
     .alias = "text",
     .env = "TEST_CMDOPTS_FILE",
     .help = "the input"},
    {.name = "quiet",
     .letter = 'q',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, quiet),
     .help = "say less"},
    {.name = "force",
     .letter = 'F',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, force),
     .help = "do it anyway"},
    {.name = "count",
     .letter = 'c',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, count),
     .min = 1,
     .max = 100,
     .def_num = 10,
     .help = "how many"},
    {.name = "size",
     .arg = "SIZE",
     .type = KVEDGE_CMDOPT_SIZE,
     KVEDGE_CMDOPT_AT(s_opts_t, size),
     .max = 1ull << 40,
     .def_num = 4096,
     .required = true,
     .help = "how big"},
    {.name = "mode",
     .type = KVEDGE_CMDOPT_ENUM,
     KVEDGE_CMDOPT_AT(s_opts_t, mode),
     .choices = s_modes,
     .def = "safe",
     .help = "how"},
    {.name = "ratio",
     .arg = "R",
     .type = KVEDGE_CMDOPT_DOUBLE,
     KVEDGE_CMDOPT_AT(s_opts_t, ratio),
     .dmin = 0,
     .dmax = 1,
     .def_double = 0.5,
     .help = "a fraction"},
    {.name = "tag",
     .arg = "T",
     .type = KVEDGE_CMDOPT_STRS,
     KVEDGE_CMDOPT_LIST_AT(s_opts_t, tags, n_tags),
     .help = "a tag"},
    {.name = "PREFIX",
     .positional = true,
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, prefix),
     .required = true,
     .help = "the prefix"},
    {.name = "ID",
     .positional = true,
     .type = KVEDGE_CMDOPT_STRS,
     KVEDGE_CMDOPT_LIST_AT(s_opts_t, rest, n_rest),
     .help = "more ids"},
};

static const kvedge_cmdopts_t s_table = {.command = "demo",
                                         .summary = "A command for tests.",
                                         .about = "About the demo.\n",
                                         KVEDGE_CMDOPTS_OF(s_opts_t, s_list)};

static char s_why[600];

/* Parses a NULL-terminated list of words after "demo". */
static int s_parse(s_opts_t *o, bool *help, ...)
{
    char *argv[32] = {"demo"};
    int argc = 1;
    va_list ap;
    va_start(ap, help);
    for (char *w; argc < 31 && (w = va_arg(ap, char *)) != NULL;)
        argv[argc++] = w;
    va_end(ap);
    s_why[0] = '\0';
    return kvedge_cmdopts_parse(&s_table, o, argc, argv, help, s_why, sizeof s_why);
}

static void test_table_is_consistent(void **state)
{
    (void)state;
    char why[200] = "";
    assert_int_equal(kvedge_cmdopts_check(&s_table, why, sizeof why), KVEDGE_OK);
    /* A table that reuses a letter, and one whose list positional is not last, are refused. */
    kvedge_cmdopt_t bad[2] = {s_list[1], s_list[2]};
    bad[1].letter = 'q';
    kvedge_cmdopts_t t = {.command = "bad", .summary = "x", KVEDGE_CMDOPTS_OF(s_opts_t, bad)};
    assert_int_equal(kvedge_cmdopts_check(&t, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "used twice"));
    kvedge_cmdopt_t order[2] = {s_list[9], s_list[8]};
    kvedge_cmdopts_t t2 = {.command = "bad", .summary = "x", KVEDGE_CMDOPTS_OF(s_opts_t, order)};
    assert_int_equal(kvedge_cmdopts_check(&t2, why, sizeof why), KVEDGE_EINVAL);
    kvedge_cmdopt_t dflt[1] = {s_list[3]};
    dflt[0].def_num = 0; /* below min */
    kvedge_cmdopts_t t3 = {.command = "bad", .summary = "x", KVEDGE_CMDOPTS_OF(s_opts_t, dflt)};
    assert_int_equal(kvedge_cmdopts_check(&t3, why, sizeof why), KVEDGE_EINVAL);
    /* ... unless def_text says what the default outside the bounds stands for. */
    dflt[0].def_text = "unset";
    assert_int_equal(kvedge_cmdopts_check(&t3, why, sizeof why), KVEDGE_OK);
    s_opts_t o;
    bool help;
    char *argv[] = {"bad", NULL};
    assert_int_equal(kvedge_cmdopts_parse(&t3, &o, 1, argv, &help, why, sizeof why), KVEDGE_OK);
    assert_int_equal(o.count, 0); /* not given: the sentinel */
}

static void test_every_form(void **state)
{
    (void)state;
    s_opts_t o;
    bool help;
    assert_int_equal(s_parse(&o, &help, "--size=64K", "-qF", "--count", "7", "p1", "--file=a.txt",
                             "--mode", "fast", "--ratio=0.25", "--tag", "x", "--tag=y", "i1", "i2",
                             NULL),
                     KVEDGE_OK);
    assert_false(help);
    assert_int_equal(o.size, 65536);
    assert_true(o.quiet);
    assert_true(o.force);
    assert_int_equal(o.count, 7);
    assert_string_equal(o.file, "a.txt");
    assert_int_equal(o.mode, 1);
    assert_true(o.ratio == 0.25);
    assert_int_equal(o.n_tags, 2);
    assert_string_equal(o.tags[1], "y");
    assert_string_equal(o.prefix, "p1");
    assert_int_equal(o.n_rest, 2);
    assert_string_equal(o.rest[1], "i2");
    /* Short forms with attached and separate values; --quiet=no; "--" ends the options. */
    assert_int_equal(s_parse(&o, &help, "--size", "1", "-c3", "-f", "b", "--quiet=no", "--",
                             "--not-a-flag", NULL),
                     KVEDGE_OK);
    assert_int_equal(o.count, 3);
    assert_string_equal(o.file, "b");
    assert_false(o.quiet);
    assert_string_equal(o.prefix, "--not-a-flag");
    /* Defaults of what the line does not give. */
    assert_int_equal(s_parse(&o, &help, "--size", "1", "p", NULL), KVEDGE_OK);
    assert_int_equal(o.count, 10);
    assert_int_equal(o.mode, 2);
    assert_true(o.ratio == 0.5);
    assert_null(o.file);
    assert_int_equal(o.n_rest, 0);
}

static void test_bounds_name_the_flag(void **state)
{
    (void)state;
    s_opts_t o;
    bool help;
    assert_int_equal(s_parse(&o, &help, "--size", "1", "--count", "0", "p", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--count: '0' is out of range (1 to 100)");
    assert_int_equal(s_parse(&o, &help, "--size", "1", "-c", "101", "p", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "-c: '101' is out of range (1 to 100)");
    assert_int_equal(s_parse(&o, &help, "--size", "1", "--ratio", "2", "p", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--ratio: '2' is out of range (0 to 1)");
    assert_int_equal(s_parse(&o, &help, "--size", "lots", "p", NULL), KVEDGE_EINVAL);
    assert_non_null(strstr(s_why, "--size: 'lots' is not a size"));
    assert_int_equal(s_parse(&o, &help, "--size", "1", "--mode", "slow", "p", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--mode: 'slow' is not one of fast|safe");
    assert_int_equal(s_parse(&o, &help, "--size", "1", "--count", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--count: needs a value (N)");
    assert_int_equal(s_parse(&o, &help, "--size", "1", "--tag", "a", "--tag", "b", "--tag", "c",
                             "--tag", "d", "p", NULL),
                     KVEDGE_EINVAL);
    assert_string_equal(s_why, "--tag: more than 3 values");
}

static void test_did_you_mean(void **state)
{
    (void)state;
    s_opts_t o;
    bool help;
    assert_int_equal(s_parse(&o, &help, "--cuont", "3", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "unknown option '--cuont' (did you mean --count?)");
    assert_int_equal(s_parse(&o, &help, "--xyzzy-plugh", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "unknown option '--xyzzy-plugh'");
    assert_int_equal(s_parse(&o, &help, "-z", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "unknown option '-z'");
}

static void test_required_and_positionals(void **state)
{
    (void)state;
    s_opts_t o;
    bool help;
    assert_int_equal(s_parse(&o, &help, "p", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--size is required");
    assert_int_equal(s_parse(&o, &help, "--size", "1", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "missing PREFIX");
    /* -h anywhere before "--" asks for help, even on a line that is otherwise wrong. */
    assert_int_equal(s_parse(&o, &help, "--bogus", "-h", NULL), KVEDGE_OK);
    assert_true(help);
    /* A table without a list positional refuses a stray argument. */
    kvedge_cmdopts_t t = {.command = "one",
                          .summary = "x",
                          .struct_size = sizeof(s_opts_t),
                          .opts = s_list,
                          .count = 9};
    char *argv[] = {"one", "--size", "1", "p", "extra", NULL};
    assert_int_equal(kvedge_cmdopts_parse(&t, &o, 5, argv, &help, s_why, sizeof s_why),
                     KVEDGE_EINVAL);
    assert_string_equal(s_why, "unexpected argument 'extra'");
}

static void test_env_and_alias(void **state)
{
    (void)state;
    s_opts_t o;
    bool help;
    setenv("TEST_CMDOPTS_FILE", "from-env", 1);
    assert_int_equal(s_parse(&o, &help, "--size", "1", "p", NULL), KVEDGE_OK);
    assert_string_equal(o.file, "from-env");
    assert_int_equal(s_parse(&o, &help, "--size", "1", "--file", "line", "p", NULL), KVEDGE_OK);
    assert_string_equal(o.file, "line"); /* the line wins */
    unsetenv("TEST_CMDOPTS_FILE");
    /* The deprecated alias sets the same field. */
    assert_int_equal(s_parse(&o, &help, "--size", "1", "--text=old", "p", NULL), KVEDGE_OK);
    assert_string_equal(o.file, "old");
}

static void test_help_lists_the_table(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    kvedge_cmdopts_help(&s_table, "kvedge", f);
    fclose(f);
    /* Wrapped lines read as one: a newline and the 28 spaces of a continuation are a space. */
    char *w = text;
    for (const char *r = text; *r; r++)
        if (*r == '\n' && strspn(r + 1, " ") == 28) {
            r += 28;
            *w++ = ' ';
        } else {
            *w++ = *r;
        }
    *w = '\0';
    assert_non_null(strstr(text, "usage: kvedge demo --size SIZE [OPTIONS] PREFIX [ID...]"));
    assert_non_null(strstr(text, "A command for tests."));
    for (size_t i = 0; i < s_table.count; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s%s", s_list[i].positional ? "  " : "--", s_list[i].name);
        assert_non_null(strstr(text, want));
    }
    assert_non_null(strstr(text, "-c, --count N"));
    assert_non_null(strstr(text, "(default 10; 1 to 100)"));
    assert_non_null(strstr(text, "(env $TEST_CMDOPTS_FILE)"));
    assert_non_null(strstr(text, "--text FILE"));
    assert_non_null(strstr(text, "deprecated alias of --file, removed in the next release"));
    assert_non_null(strstr(text, "--mode fast|safe"));
    assert_non_null(strstr(text, "About the demo."));
    free(text);
}

/* One option's help text as --help shows it (what the man page prints); "" for a k past the
 * table. */
static void test_opt_text(void **state)
{
    (void)state;
    char text[300];
    kvedge_cmdopts_opt_text(&s_table, 3, text, sizeof text); /* count */
    assert_string_equal(text, "how many (default 10; 1 to 100)");
    kvedge_cmdopts_opt_text(&s_table, 0, text, sizeof text); /* file */
    assert_string_equal(text, "the input (env $TEST_CMDOPTS_FILE)");
    kvedge_cmdopts_opt_text(&s_table, 4, text, sizeof text); /* size */
    assert_string_equal(text, "how big (required)");
    kvedge_cmdopts_opt_text(&s_table, 5, text, sizeof text); /* mode */
    assert_string_equal(text, "how (default safe)");
    kvedge_cmdopts_opt_text(&s_table, 7, text, sizeof text); /* tag */
    assert_string_equal(text, "a tag (repeatable)");
    kvedge_cmdopts_opt_text(&s_table, 8, text, sizeof text); /* PREFIX */
    assert_string_equal(text, "the prefix");
    strcpy(text, "stale");
    kvedge_cmdopts_opt_text(&s_table, s_table.count, text, sizeof text);
    assert_string_equal(text, "");
    kvedge_cmdopts_opt_text(&s_table, 3, text, 8); /* truncated, terminated */
    assert_string_equal(text, "how man");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_is_consistent),      cmocka_unit_test(test_every_form),
        cmocka_unit_test(test_bounds_name_the_flag),     cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_required_and_positionals), cmocka_unit_test(test_env_and_alias),
        cmocka_unit_test(test_help_lists_the_table),     cmocka_unit_test(test_opt_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
