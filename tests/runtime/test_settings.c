/* The settings engine on a test table with one setting of each type: defaults, every type's
 * parser and bounds, every bool spelling, the strict reader's refusals (each naming file, line
 * and key), the flag forms, file-then-flags order, --config anywhere, help and the printed
 * settings loading back to the same struct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/log.h"
#include "runtime/settings.h"
#include "access/codec/error.h"

typedef struct {
    char name[16];
    char ep[64];
    bool fast;
    bool safe;
    uint32_t count;
    uint64_t big;
    uint64_t size;
    uint32_t wait_ms;
    uint32_t every_s;
    int mode;
    kvedge_log_level_t log;
    char item[3][24];
    size_t nitem;
} t_settings_t;

enum { T_MODE_FAST = 7, T_MODE_SAFE = 9 };

static const kvedge_setting_choice_t s_modes[] = {
    {"fast", T_MODE_FAST}, {"safe", T_MODE_SAFE}, {NULL, 0}};

static const kvedge_setting_t s_entries[] = {
    {.key = "name",
     .flag = "name",
     .letter = 'n',
     .arg = "NAME",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(t_settings_t, name),
     .def = "node",
     .help = "a name"},
    {.key = "ep",
     .flag = "ep",
     .arg = "EP",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(t_settings_t, ep),
     .check = kvedge_settings_check_endpoint,
     .example = "ipc:///tmp/t.sock",
     .help = "an endpoint"},
    {.key = "fast",
     .flag = "fast",
     .letter = 'F',
     .type = KVEDGE_SETTING_BOOL,
     KVEDGE_SETTING_AT(t_settings_t, fast),
     .help = "go fast"},
    {.key = "safe",
     .flag = "safe",
     .type = KVEDGE_SETTING_BOOL,
     KVEDGE_SETTING_AT(t_settings_t, safe),
     .def_num = 1,
     .help = "stay safe"},
    {.key = "count",
     .flag = "count",
     .letter = 'k',
     .arg = "N",
     .type = KVEDGE_SETTING_UINT,
     KVEDGE_SETTING_AT(t_settings_t, count),
     .min = 1,
     .max = 100,
     .def_num = 10,
     .help = "how many"},
    {.key = "big",
     .flag = "big",
     .arg = "N",
     .type = KVEDGE_SETTING_UINT,
     KVEDGE_SETTING_AT(t_settings_t, big),
     .max = UINT64_MAX,
     .help = "a big number"},
    {.key = "size",
     .flag = "size",
     .arg = "SIZE",
     .type = KVEDGE_SETTING_SIZE,
     KVEDGE_SETTING_AT(t_settings_t, size),
     .min = 1024,
     .max = 1ull << 40,
     .def_num = 1ull << 20,
     .help = "a size"},
    {.key = "wait_ms",
     .flag = "wait-ms",
     .arg = "MS",
     .type = KVEDGE_SETTING_MS,
     KVEDGE_SETTING_AT(t_settings_t, wait_ms),
     .min = 10,
     .max = 3600000,
     .def_num = 500,
     .help = "a wait"},
    {.key = "every",
     .flag = "every",
     .arg = "S",
     .type = KVEDGE_SETTING_SECONDS,
     KVEDGE_SETTING_AT(t_settings_t, every_s),
     .min = 1,
     .max = 86400,
     .def_num = 60,
     .help = "a period"},
    {.key = "mode",
     .flag = "mode",
     .type = KVEDGE_SETTING_ENUM,
     KVEDGE_SETTING_AT(t_settings_t, mode),
     .choices = s_modes,
     .def = "safe",
     .help = "a mode"},
    {.key = "log",
     .flag = "log-level",
     .type = KVEDGE_SETTING_ENUM,
     KVEDGE_SETTING_AT(t_settings_t, log),
     .choices = kvedge_settings_log_levels,
     .def = "info",
     .help = "log level"},
    {.key = "item",
     .flag = "item",
     .letter = 'i',
     .arg = "ITEM",
     .type = KVEDGE_SETTING_LIST,
     KVEDGE_SETTING_LIST_AT(t_settings_t, item, nitem),
     .help = "an item, repeatable"},
};

static const kvedge_settings_table_t s_table = {"unit", sizeof(t_settings_t), s_entries,
                                                sizeof s_entries / sizeof s_entries[0]};

static char s_why[1024];

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("expected \"%s\" in:\n%s", (needle), (hay));                                  \
    } while (0)

/* Loads text as file "t.conf" over the defaults. */
static int s_load(t_settings_t *s, const char *text)
{
    kvedge_settings_defaults(&s_table, s);
    s_why[0] = '\0';
    return kvedge_settings_load_text(&s_table, s, "t.conf", text, strlen(text), s_why,
                                     sizeof s_why);
}

/* Resolves a command line given as a NULL-terminated list of words after "unit". */
static int s_resolve(t_settings_t *s, kvedge_settings_args_t *a, ...)
{
    char *argv[32] = {"unit"};
    int argc = 1;
    va_list ap;
    va_start(ap, a);
    for (char *w; argc < 31 && (w = va_arg(ap, char *)) != NULL;)
        argv[argc++] = w;
    va_end(ap);
    s_why[0] = '\0';
    return kvedge_settings_resolve(&s_table, s, argc, argv, a, s_why, sizeof s_why);
}

static void s_value(const t_settings_t *s, const char *key, char *buf, size_t len)
{
    const kvedge_setting_t *e = kvedge_settings_find(&s_table, key);
    assert_non_null(e);
    assert_int_equal(kvedge_settings_value(e, s, 0, buf, len), KVEDGE_OK);
}

/* ---------------------------------------------------------------- the table */

static void test_table_check(void **state)
{
    (void)state;
    assert_int_equal(kvedge_settings_table_check(&s_table, s_why, sizeof s_why), KVEDGE_OK);
    /* Broken tables: each mistake found. */
    kvedge_setting_t bad[2];
    kvedge_settings_table_t t = {"bad", sizeof(t_settings_t), bad, 2};
    memcpy(bad, &s_entries[4], sizeof bad[0]);
    memcpy(&bad[1], &s_entries[0], sizeof bad[1]);
    assert_int_equal(kvedge_settings_table_check(&t, s_why, sizeof s_why), KVEDGE_OK);
    bad[1].key = "count"; /* key twice */
    assert_int_equal(kvedge_settings_table_check(&t, s_why, sizeof s_why), KVEDGE_EINVAL);
    memcpy(&bad[1], &s_entries[0], sizeof bad[1]);
    bad[1].letter = 'c'; /* --config's letter */
    assert_int_equal(kvedge_settings_table_check(&t, s_why, sizeof s_why), KVEDGE_EINVAL);
    memcpy(&bad[1], &s_entries[0], sizeof bad[1]);
    bad[0].def_num = 1000; /* default out of bounds */
    assert_int_equal(kvedge_settings_table_check(&t, s_why, sizeof s_why), KVEDGE_EINVAL);
    assert_contains(s_why, "count");
    memcpy(bad, &s_entries[1], sizeof bad[0]);
    bad[0].example = NULL; /* a check without an example */
    assert_int_equal(kvedge_settings_table_check(&t, s_why, sizeof s_why), KVEDGE_EINVAL);
    bad[0].example = "ipc:///tmp/t.sock";
    bad[0].def = "not-an-endpoint"; /* a default its own check refuses */
    assert_int_equal(kvedge_settings_table_check(&t, s_why, sizeof s_why), KVEDGE_EINVAL);
    memcpy(bad, &s_entries[4], sizeof bad[0]);
    bad[0].size = 2; /* no such integer width */
    assert_int_equal(kvedge_settings_table_check(&t, s_why, sizeof s_why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_settings_table_check(NULL, s_why, sizeof s_why), KVEDGE_EINVAL);
}

static void test_defaults(void **state)
{
    (void)state;
    t_settings_t s;
    memset(&s, 0xa5, sizeof s);
    kvedge_settings_defaults(&s_table, &s);
    assert_string_equal(s.name, "node");
    assert_string_equal(s.ep, "");
    assert_false(s.fast);
    assert_true(s.safe);
    assert_int_equal(s.count, 10);
    assert_int_equal(s.big, 0);
    assert_int_equal(s.size, 1u << 20);
    assert_int_equal(s.wait_ms, 500);
    assert_int_equal(s.every_s, 60);
    assert_int_equal(s.mode, T_MODE_SAFE);
    assert_int_equal(s.log, KVEDGE_LOG_INFO);
    assert_int_equal(s.nitem, 0);
    char buf[64];
    s_value(&s, "size", buf, sizeof buf);
    assert_string_equal(buf, "1M");
    s_value(&s, "safe", buf, sizeof buf);
    assert_string_equal(buf, "yes");
    s_value(&s, "mode", buf, sizeof buf);
    assert_string_equal(buf, "safe");
    assert_int_equal(kvedge_settings_value(&s_entries[0], &s, 1, buf, sizeof buf),
                     KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_settings_value(&s_entries[0], &s, 0, buf, 3), KVEDGE_ENOSPACE);
    assert_null(kvedge_settings_find(&s_table, "nope"));
}

/* ---------------------------------------------------------------- each type */

/* Sets key to v: 0 on success, else KVEDGE_EINVAL with the reason in s_why. */
static int s_set(t_settings_t *s, const char *key, const char *v)
{
    s_why[0] = '\0';
    return kvedge_settings_set(&s_table, s, key, v, s_why, sizeof s_why);
}

static void test_types(void **state)
{
    (void)state;
    t_settings_t s;
    kvedge_settings_defaults(&s_table, &s);
    /* STRING: up to capacity - 1 bytes, no control characters. */
    assert_int_equal(s_set(&s, "name", "123456789012345"), 0);
    assert_string_equal(s.name, "123456789012345");
    assert_int_equal(s_set(&s, "name", "1234567890123456"), KVEDGE_EINVAL);
    assert_contains(s_why, "name: value too long (16 bytes, at most 15)");
    assert_string_equal(s.name, "123456789012345"); /* unchanged */
    assert_int_equal(s_set(&s, "name", "a\tb"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "name", ""), 0);
    /* STRING with a check: endpoints. */
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:7400"), 0);
    assert_int_equal(s_set(&s, "ep", "tcp://*:7400"), 0);
    assert_int_equal(s_set(&s, "ep", "ipc:///run/x.sock"), 0);
    assert_int_equal(s_set(&s, "ep", "inproc://x"), 0);
    assert_int_equal(s_set(&s, "ep", ""), 0);
    assert_int_equal(s_set(&s, "ep", "tcp:/127.0.0.1:7400"), KVEDGE_EINVAL);
    assert_contains(s_why, "ep: 'tcp:/127.0.0.1:7400' is not an endpoint");
    assert_int_equal(s_set(&s, "ep", "tcp://host"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "ep", "ipc://"), KVEDGE_EINVAL);
    /* Ports: 1 to 65535, or * (libzmq would wrap 99999 to another port). */
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:1"), 0);
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:65535"), 0);
    assert_int_equal(s_set(&s, "ep", "tcp://[::1]:7400"), 0);
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:99999"), KVEDGE_EINVAL);
    assert_contains(s_why, "port '99999' is not 1 to 65535");
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:65536"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:0"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:-1"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:74x"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "ep", "tcp://127.0.0.1:0000080"), KVEDGE_EINVAL);
    /* UINT: decimal only, bounds. */
    assert_int_equal(s_set(&s, "count", "1"), 0);
    assert_int_equal(s.count, 1);
    assert_int_equal(s_set(&s, "count", "100"), 0);
    assert_int_equal(s_set(&s, "count", "0"), KVEDGE_EINVAL);
    assert_contains(s_why, "count: '0' is out of range (1 to 100)");
    assert_int_equal(s_set(&s, "count", "101"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "count", "-1"), KVEDGE_EINVAL);
    assert_contains(s_why, "count: '-1' is not a whole number");
    assert_int_equal(s_set(&s, "count", "1.5"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "count", "0x10"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "count", " 5"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "count", ""), KVEDGE_EINVAL);
    assert_int_equal(s.count, 100);
    assert_int_equal(s_set(&s, "big", "18446744073709551615"), 0);
    assert_true(s.big == UINT64_MAX);
    assert_int_equal(s_set(&s, "big", "18446744073709551616"), KVEDGE_EINVAL);
    assert_contains(s_why, "out of range");
    /* SIZE: suffixes in powers of 1024, fractions round down, bounds. */
    static const struct {
        const char *in;
        uint64_t out;
    } sizes[] = {{"4096", 4096},     {"64K", 65536},          {"64k", 65536},   {"2KB", 2048},
                 {"2KiB", 2048},     {"1.5G", 3ull << 29},    {"1M", 1u << 20}, {"3mib", 3u << 20},
                 {"1T", 1ull << 40}, {"1.0009765625K", 1025}, {"1024b", 1024}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        assert_int_equal(s_set(&s, "size", sizes[i].in), 0);
        assert_true(s.size == sizes[i].out);
    }
    assert_int_equal(s_set(&s, "size", "1023"), KVEDGE_EINVAL); /* below min */
    assert_int_equal(s_set(&s, "size", "2T"), KVEDGE_EINVAL);   /* above max */
    assert_int_equal(s_set(&s, "size", "12X"), KVEDGE_EINVAL);
    assert_contains(s_why, "size: '12X' is not a size");
    assert_int_equal(s_set(&s, "size", "G"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "size", "1.G"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "size", "99999999999999999999T"), KVEDGE_EINVAL);
    char buf[64];
    assert_int_equal(s_set(&s, "size", "1536K"), 0);
    s_value(&s, "size", buf, sizeof buf);
    assert_string_equal(buf, "1536K");
    assert_int_equal(s_set(&s, "size", "1025"), 0);
    s_value(&s, "size", buf, sizeof buf);
    assert_string_equal(buf, "1025");
    /* MS and SECONDS: a bare number in the field's unit, or a unit. */
    static const struct {
        const char *in;
        uint32_t out;
    } ms[] = {{"250", 250},   {"250ms", 250},  {"3s", 3000}, {"1.5s", 1500},
              {"2m", 120000}, {"1h", 3600000}, {"10MS", 10}};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        assert_int_equal(s_set(&s, "wait_ms", ms[i].in), 0);
        assert_int_equal(s.wait_ms, ms[i].out);
    }
    assert_int_equal(s_set(&s, "wait_ms", "5"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "wait_ms", "2h"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "wait_ms", "3d"), KVEDGE_EINVAL);
    assert_contains(s_why, "is not a duration");
    assert_int_equal(s_set(&s, "every", "90"), 0);
    assert_int_equal(s.every_s, 90);
    assert_int_equal(s_set(&s, "every", "5m"), 0);
    assert_int_equal(s.every_s, 300);
    assert_int_equal(s_set(&s, "every", "1h"), 0);
    assert_int_equal(s.every_s, 3600);
    assert_int_equal(s_set(&s, "every", "500ms"), KVEDGE_EINVAL);
    assert_int_equal(s_set(&s, "every", "0"), KVEDGE_EINVAL);
    /* ENUM: any case, named in messages. */
    assert_int_equal(s_set(&s, "mode", "FAST"), 0);
    assert_int_equal(s.mode, T_MODE_FAST);
    assert_int_equal(s_set(&s, "mode", "slow"), KVEDGE_EINVAL);
    assert_contains(s_why, "mode: 'slow' is not one of fast|safe");
    assert_int_equal(s_set(&s, "log", "debug"), 0);
    assert_int_equal(s.log, KVEDGE_LOG_DEBUG);
    /* LIST: appends up to its size. */
    assert_int_equal(s_set(&s, "item", "a"), 0);
    assert_int_equal(s_set(&s, "item", "b b"), 0);
    assert_int_equal(s_set(&s, "item", "c"), 0);
    assert_int_equal(s.nitem, 3);
    assert_string_equal(s.item[1], "b b");
    assert_int_equal(s_set(&s, "item", "d"), KVEDGE_EINVAL);
    assert_contains(s_why, "item: more than 3 values");
    assert_int_equal(kvedge_settings_value(&s_entries[11], &s, 2, buf, sizeof buf), KVEDGE_OK);
    assert_string_equal(buf, "c");
    assert_int_equal(kvedge_settings_value(&s_entries[11], &s, 3, buf, sizeof buf),
                     KVEDGE_ENOTFOUND);
    /* Unknown key. */
    assert_int_equal(s_set(&s, "nope", "1"), KVEDGE_EINVAL);
    assert_contains(s_why, "nope: unknown setting");
}

static void test_bool_spellings(void **state)
{
    (void)state;
    static const struct {
        const char *word;
        bool value;
    } words[] = {{"yes", true},  {"no", false},    {"on", true},   {"off", false},
                 {"true", true}, {"false", false}, {"1", true},    {"0", false},
                 {"YES", true},  {"No", false},    {"TRUE", true}, {"Off", false}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        t_settings_t s;
        char text[128];
        /* In a file, for a bool that defaults to no and one that defaults to yes. */
        snprintf(text, sizeof text, "unit\n    fast = %s\n    safe = %s\n", words[i].word,
                 words[i].word);
        assert_int_equal(s_load(&s, text), 0);
        assert_true(s.fast == words[i].value);
        assert_true(s.safe == words[i].value);
        /* As a flag value. */
        char flag[64];
        snprintf(flag, sizeof flag, "--safe=%s", words[i].word);
        kvedge_settings_args_t a;
        assert_int_equal(s_resolve(&s, &a, "--fast", flag, NULL), 0);
        assert_true(s.fast);
        assert_true(s.safe == words[i].value);
    }
    t_settings_t s;
    assert_int_equal(s_load(&s, "unit\n    fast = yes\n    safe = maybe\n"), KVEDGE_EINVAL);
    assert_string_equal(s_why,
                        "t.conf:3: safe: 'maybe' is not a boolean (yes/no/on/off/true/false/1/0)");
    assert_true(s.safe && !s.fast); /* all or nothing: fast = yes was not applied */
    assert_int_equal(s_load(&s, "unit\n    fast = y\n"), KVEDGE_EINVAL);
    assert_int_equal(s_load(&s, "unit\n    fast =\n"), KVEDGE_EINVAL);
    kvedge_settings_args_t a;
    assert_int_equal(s_resolve(&s, &a, "--safe=maybe", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--safe: 'maybe' is not a boolean (yes/no/on/off/true/false/1/0)");
    /* A bool flag takes no separate value: the next word is a stray argument. */
    assert_int_equal(s_resolve(&s, &a, "--safe", "no", NULL), KVEDGE_EINVAL);
    assert_contains(s_why, "unexpected argument 'no'");
    assert_int_equal(s_resolve(&s, &a, "-F", NULL), 0);
    assert_true(s.fast);
    assert_int_equal(s_resolve(&s, &a, "-Fno", NULL), KVEDGE_EINVAL);
    assert_contains(s_why, "-F: takes no value");
}

/* ---------------------------------------------------------------- the reader */

static void test_file_syntax(void **state)
{
    (void)state;
    t_settings_t s;
    const char *text = "# a comment\n"
                       "\n"
                       "unit   # the section\n"
                       "    name = \"a # b\"   # quoted keeps the hash\n"
                       "    ep = 'ipc:///tmp/x y.sock'\n"
                       "    # an indented comment\n"
                       "    count=42\r\n"
                       "    size = 64K    # a trailing comment\n"
                       "    mode = fast\n"
                       "    item = first one\n"
                       "    item = \"second\"\n"
                       "\n";
    assert_int_equal(s_load(&s, text), 0);
    assert_string_equal(s.name, "a # b");
    assert_string_equal(s.ep, "ipc:///tmp/x y.sock");
    assert_int_equal(s.count, 42);
    assert_int_equal(s.size, 65536);
    assert_int_equal(s.mode, T_MODE_FAST);
    assert_int_equal(s.nitem, 2);
    assert_string_equal(s.item[0], "first one");
    assert_string_equal(s.item[1], "second");
    /* An empty string value, an empty file, a section alone, no final newline. */
    assert_int_equal(s_load(&s, "unit\n    name = \"\""), 0);
    assert_string_equal(s.name, "");
    assert_int_equal(s_load(&s, ""), 0);
    assert_string_equal(s.name, "node");
    assert_int_equal(s_load(&s, "unit\n"), 0);
    assert_int_equal(s_load(&s, "# only comments\n\n"), 0);
}

/* Each refusal: the exact "t.conf:LINE: KEY: " prefix, and the reason. */
static void test_file_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *prefix;
        const char *reason;
    } cases[] = {
        {"unti\n    count = 1\n", "t.conf:1: unti: ", "unknown section"},
        {"master\n", "t.conf:1: master: ", "its section is `unit`"},
        {"unit\n    count = 1\nunit\n",
         "t.conf:3: unit: ", "section given twice (first at line 1)"},
        {"unit\n    cuont = 1\n", "t.conf:2: cuont: ",
         "unknown setting in section `unit` (did "
         "you mean `count`?)"},
        {"unit\n    log-level = info\n", "t.conf:2: log-level: ", "did you mean `log`?"},
        {"unit\n    zzzzzz = 1\n", "t.conf:2: zzzzzz: ", "unknown setting in section `unit`"},
        {"unit\n    count = many\n", "t.conf:2: count: ", "'many' is not a whole number"},
        {"unit\n    count = 1000\n", "t.conf:2: count: ", "'1000' is out of range (1 to 100)"},
        {"unit\n    count = 1\n    name = x\n    count = 2\n",
         "t.conf:4: count: ", "set twice (first at line 2)"},
        {"unit\n\tcount = 1\n", "t.conf:2: ", "tab in the indentation"},
        {"unit\n   count = 1\n", "t.conf:2: count: ", "indented by 3 spaces"},
        {"unit\n        count = 1\n", "t.conf:2: count: ", "indented too deep"},
        {"    count = 1\nunit\n", "t.conf:1: count: ", "setting before the section"},
        {"unit\ncount = 1\n", "t.conf:2: count: ", "setting outside a section"},
        {"unit\n    count\n", "t.conf:2: count: ", "no value"},
        {"unit\n    count 5\n", "t.conf:2: count: ", "malformed line"},
        {"unit\n    = 5\n", "t.conf:2: ", "malformed line"},
        {"unit\n    name = \"abc\n", "t.conf:2: name: ", "missing closing \""},
        {"unit\n    name = \"abc\" def\n", "t.conf:2: name: ", "text after the closing quote"},
        {"unit\n    name = abcdefghijklmnopq\n", "t.conf:2: name: ", "value too long"},
        {"unit\n    mode = slow\n", "t.conf:2: mode: ", "'slow' is not one of fast|safe"},
        {"unit\n    item = 1\n    item = 2\n    item = 3\n    item = 4\n",
         "t.conf:5: item: ", "more than 3 values"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        t_settings_t s;
        if (s_load(&s, cases[i].text) != KVEDGE_EINVAL)
            fail_msg("case %zu loaded:\n%s", i, cases[i].text);
        if (strncmp(s_why, cases[i].prefix, strlen(cases[i].prefix)) != 0)
            fail_msg("case %zu: expected prefix \"%s\" in \"%s\"", i, cases[i].prefix, s_why);
        assert_contains(s_why, cases[i].reason);
        assert_int_equal(s.count, 10); /* nothing applied */
    }
    /* An overlong line names its key; a NUL byte refuses the file. */
    size_t n = KVEDGE_SETTINGS_LINE_MAX_BYTES + 64;
    char *text = malloc(n + 32);
    assert_non_null(text);
    int at = snprintf(text, n + 32, "unit\n    count = 1\n    name = ");
    memset(text + at, 'x', n - (size_t)at);
    text[n] = '\0';
    t_settings_t s;
    assert_int_equal(s_load(&s, text), KVEDGE_EINVAL);
    assert_contains(s_why, "t.conf:3: name: line longer than 4096 bytes");
    free(text);
    static const char nul[] = "unit\n    count = 1\n    name = a\0b\n";
    kvedge_settings_defaults(&s_table, &s);
    assert_int_equal(
        kvedge_settings_load_text(&s_table, &s, "t.conf", nul, sizeof nul - 1, s_why, sizeof s_why),
        KVEDGE_EINVAL);
    assert_contains(s_why, "t.conf:3: NUL byte");
}

static void test_load_file(void **state)
{
    (void)state;
    char path[] = "/tmp/kvedge-settings-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs("unit\n    count = 33\n    wait_ms = 2s\n", f);
    fclose(f);
    t_settings_t s;
    kvedge_settings_defaults(&s_table, &s);
    assert_int_equal(kvedge_settings_load_file(&s_table, &s, path, s_why, sizeof s_why), 0);
    assert_int_equal(s.count, 33);
    assert_int_equal(s.wait_ms, 2000);
    /* Past the size limit: refused, not truncated. */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("unit\n", f);
    for (size_t i = 0; i < KVEDGE_SETTINGS_FILE_MAX_BYTES / 64 + 1; i++)
        fprintf(f, "    # %-57s\n", "padding");
    fclose(f);
    assert_int_equal(kvedge_settings_load_file(&s_table, &s, path, s_why, sizeof s_why),
                     KVEDGE_ETOOBIG);
    assert_contains(s_why, path);
    unlink(path);
    assert_int_equal(kvedge_settings_load_file(&s_table, &s, path, s_why, sizeof s_why),
                     KVEDGE_EIO);
    assert_contains(s_why, "cannot read the config file");
    assert_int_equal(kvedge_settings_load_file(&s_table, &s, "/tmp", s_why, sizeof s_why),
                     KVEDGE_EIO);
    assert_int_equal(s.count, 33);
}

/* ---------------------------------------------------------------- the command line */

static void test_flag_forms(void **state)
{
    (void)state;
    t_settings_t s;
    kvedge_settings_args_t a;
    assert_int_equal(s_resolve(&s, &a, NULL), 0);
    assert_false(a.help || a.check || a.config);
    assert_int_equal(s.count, 10);
    assert_int_equal(s_resolve(&s, &a, "--count", "11", NULL), 0);
    assert_int_equal(s.count, 11);
    assert_int_equal(s_resolve(&s, &a, "--count=12", NULL), 0);
    assert_int_equal(s.count, 12);
    assert_int_equal(s_resolve(&s, &a, "-k", "13", NULL), 0);
    assert_int_equal(s.count, 13);
    assert_int_equal(s_resolve(&s, &a, "-k14", NULL), 0);
    assert_int_equal(s.count, 14);
    assert_int_equal(s_resolve(&s, &a, "--count", "1", "--count", "2", NULL), 0);
    assert_int_equal(s.count, 2); /* the last one wins */
    assert_int_equal(s_resolve(&s, &a, "--name", "--count", NULL), 0);
    assert_string_equal(s.name, "--count"); /* a value may look like a flag */
    assert_int_equal(s_resolve(&s, &a, "--log-level", "warn", "--mode=FAST", NULL), 0);
    assert_int_equal(s.log, KVEDGE_LOG_WARN);
    assert_int_equal(s.mode, T_MODE_FAST);
    assert_int_equal(s_resolve(&s, &a, "-i", "a", "--item", "b", "--item=c", NULL), 0);
    assert_int_equal(s.nitem, 3);
    assert_string_equal(s.item[2], "c");
    assert_int_equal(s_resolve(&s, &a, "--check-config", NULL), 0);
    assert_true(a.check);
    /* Refusals name the flag as typed. */
    assert_int_equal(s_resolve(&s, &a, "--cuont", "1", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--cuont: unknown option (did you mean --count?)");
    assert_int_equal(s_resolve(&s, &a, "--wait_ms", "1", NULL), KVEDGE_EINVAL);
    assert_contains(s_why, "did you mean --wait-ms?");
    assert_int_equal(s_resolve(&s, &a, "-z", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "-z: unknown option");
    assert_int_equal(s_resolve(&s, &a, "--count", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "--count: needs a value (N)");
    assert_int_equal(s_resolve(&s, &a, "-k", "0", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "-k: '0' is out of range (1 to 100)");
    assert_int_equal(s_resolve(&s, &a, "stray", NULL), KVEDGE_EINVAL);
    assert_string_equal(s_why, "unexpected argument 'stray'");
    assert_int_equal(s_resolve(&s, &a, "--", "stray", NULL), KVEDGE_EINVAL);
    assert_int_equal(s_resolve(&s, &a, "--check-config=yes", NULL), KVEDGE_EINVAL);
    /* --help wins over everything after it and reads nothing. */
    assert_int_equal(s_resolve(&s, &a, "--count", "1000", "--help", NULL), 0);
    assert_true(a.help);
    assert_int_equal(s_resolve(&s, &a, "-h", "--config", "/nonexistent", NULL), 0);
    assert_true(a.help);
    assert_int_equal(s.count, 10); /* defaults only */
}

/* Writes text to a temporary file; path receives its name. */
static void s_file(char path[64], const char *text)
{
    snprintf(path, 64, "/tmp/kvedge-settings-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void test_override_order(void **state)
{
    (void)state;
    char path[64];
    s_file(path, "unit\n    count = 20\n    name = file\n    item = f1\n    item = f2\n"
                 "    fast = yes\n");
    t_settings_t s;
    kvedge_settings_args_t a;
    /* The file over the defaults, the flags over the file, wherever --config is. */
    assert_int_equal(s_resolve(&s, &a, "--config", path, NULL), 0);
    assert_string_equal(a.config, path);
    assert_int_equal(s.count, 20);
    assert_string_equal(s.name, "file");
    assert_int_equal(s.nitem, 2);
    assert_true(s.fast);
    assert_int_equal(s_resolve(&s, &a, "--count", "30", "--config", path, "--fast=no", NULL), 0);
    assert_int_equal(s.count, 30);
    assert_string_equal(s.name, "file");
    assert_false(s.fast);
    assert_int_equal(s_resolve(&s, &a, "-c", path, "-k", "31", NULL), 0);
    assert_int_equal(s.count, 31);
    char eq[128];
    snprintf(eq, sizeof eq, "--config=%s", path);
    assert_int_equal(s_resolve(&s, &a, "-n", "flag", eq, NULL), 0);
    assert_string_equal(s.name, "flag");
    assert_int_equal(s.count, 20);
    /* A list on the command line replaces the file's; repeats append. */
    assert_int_equal(s_resolve(&s, &a, "--item", "x1", "--config", path, "-i", "x2", NULL), 0);
    assert_int_equal(s.nitem, 2);
    assert_string_equal(s.item[0], "x1");
    assert_string_equal(s.item[1], "x2");
    /* --config twice, a missing file, a bad file. */
    assert_int_equal(s_resolve(&s, &a, "--config", path, "-c", path, NULL), KVEDGE_EINVAL);
    assert_contains(s_why, "config file given twice");
    assert_int_equal(s_resolve(&s, &a, "--config", "/nonexistent/x.conf", NULL), KVEDGE_EIO);
    assert_contains(s_why, "/nonexistent/x.conf: cannot read the config file");
    assert_int_equal(s_resolve(&s, &a, "--config", NULL), KVEDGE_EINVAL);
    assert_contains(s_why, "--config: needs a value");
    s_file(path, "unit\n    count = 20\n    fast = maybe\n");
    assert_int_equal(s_resolve(&s, &a, "--count", "5", "--config", path, NULL), KVEDGE_EINVAL);
    char want[128];
    snprintf(want, sizeof want, "%s:3: fast: 'maybe' is not a boolean", path);
    assert_contains(s_why, want);
    unlink(path);
}

/* ---------------------------------------------------------------- output */

/* What kvedge_settings_print (s given) or kvedge_settings_help (s NULL) writes. */
static char *s_capture(const t_settings_t *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    if (s)
        kvedge_settings_print(&s_table, s, f);
    else
        kvedge_settings_help(&s_table, f);
    fclose(f);
    return buf;
}

static void test_help(void **state)
{
    (void)state;
    char *help = s_capture(NULL);
    t_settings_t d;
    kvedge_settings_defaults(&s_table, &d);
    for (size_t i = 0; i < s_table.count; i++) {
        const kvedge_setting_t *e = &s_entries[i];
        char want[128], value[64];
        snprintf(want, sizeof want, "--%s", e->flag);
        assert_contains(help, want);
        if (e->letter) {
            snprintf(want, sizeof want, "-%c, --%s", e->letter, e->flag);
            assert_contains(help, want);
        }
        if (e->type == KVEDGE_SETTING_LIST) {
            snprintf(want, sizeof want, "[%s = none; repeatable", e->key);
        } else {
            assert_int_equal(kvedge_settings_value(e, &d, 0, value, sizeof value), 0);
            snprintf(want, sizeof want, "[%s = %s%s%s]", e->key, value[0] ? "" : "\"", value,
                     value[0] ? "" : "\"");
        }
        assert_contains(help, want);
        assert_contains(help, e->help);
    }
    assert_contains(help, "[size = 1M]");
    assert_contains(help, "[ep = \"\"]");
    assert_contains(help, "--mode fast|safe");
    assert_contains(help, "-c, --config FILE");
    assert_contains(help, "--check-config");
    assert_contains(help, "yes/no/on/off/true/false/1/0");
    for (char *line = help; line && *line;) { /* every line fits a terminal */
        char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if (n > 90)
            fail_msg("help line of %zu columns: %.*s", n, (int)n, line);
        line = nl ? nl + 1 : NULL;
    }
    free(help);
}

/* What --check-config prints is a config file that loads back to the same settings, strings
 * that need quotes included. */
static void test_print_roundtrip(void **state)
{
    (void)state;
    static const char *const names[] = {"a # b", " lead", "trail ", "", "\"q\"", "it's", "x=y"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        t_settings_t s, back;
        kvedge_settings_defaults(&s_table, &s);
        assert_int_equal(s_set(&s, "name", names[i]), 0);
        assert_int_equal(s_set(&s, "size", "1536K"), 0);
        assert_int_equal(s_set(&s, "big", "12345678901234"), 0);
        assert_int_equal(s_set(&s, "fast", "on"), 0);
        assert_int_equal(s_set(&s, "item", "one two"), 0);
        assert_int_equal(s_set(&s, "item", "#three"), 0);
        assert_int_equal(s_set(&s, "log", "error"), 0);
        char *text = s_capture(&s);
        assert_contains(text, "unit\n    name = ");
        assert_contains(text, "    size = 1536K\n");
        assert_contains(text, "    fast = yes\n");
        assert_contains(text, "    item = \"#three\"\n");
        assert_int_equal(s_load(&back, text), 0);
        assert_memory_equal(&s, &back, sizeof s);
        free(text);
    }
    t_settings_t s;
    kvedge_settings_defaults(&s_table, &s);
    char *text = s_capture(&s);
    assert_contains(text, "    # item: none\n");
    free(text);
}

static void test_degenerate(void **state)
{
    (void)state;
    t_settings_t s;
    kvedge_settings_args_t a;
    char *argv[] = {"unit", NULL};
    assert_int_equal(kvedge_settings_resolve(NULL, &s, 1, argv, &a, s_why, sizeof s_why),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_settings_resolve(&s_table, &s, 0, NULL, &a, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_settings_load_text(&s_table, &s, NULL, NULL, 0, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_settings_load_text(&s_table, NULL, "x", "", 0, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_settings_load_file(&s_table, &s, NULL, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_settings_set(&s_table, &s, NULL, "1", s_why, sizeof s_why),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_settings_value(NULL, &s, 0, s_why, sizeof s_why), KVEDGE_EINVAL);
    kvedge_settings_defaults(NULL, &s); /* no-op */
    assert_null(kvedge_settings_find(NULL, "count"));
    assert_int_equal(kvedge_settings_check_id("", s_why, sizeof s_why), 0);
    assert_int_equal(kvedge_settings_check_id("edge-1", s_why, sizeof s_why), 0);
    assert_int_equal(kvedge_settings_check_id("bad/id", s_why, sizeof s_why), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_check),     cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_types),           cmocka_unit_test(test_bool_spellings),
        cmocka_unit_test(test_file_syntax),     cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_load_file),       cmocka_unit_test(test_flag_forms),
        cmocka_unit_test(test_override_order),  cmocka_unit_test(test_help),
        cmocka_unit_test(test_print_roundtrip), cmocka_unit_test(test_degenerate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
