/* The manual page and the bash completion (clients/cli/cli_doc.c) name every command of the
 * tables kvedge dispatches to, and in each command's part every flag (long, letter, alias),
 * argument and daemon setting flag of that command's tables; every global option too. */
#define _GNU_SOURCE /* asprintf */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/cli_doc.h"

static const kvedge_cli_doc_t s_doc = {kvedge_cli_tables, kvedge_cli_remote_tables,
                                       &kvedge_cli_globals, "0.0.0-test"};

/* The stream a writer prints into (file scope: GCC takes a local's address handed to
 * open_memstream for a dangling pointer). */
static char *s_buf;
static size_t s_len;

/* What a writer prints, as one string (caller frees). */
static char *s_write(void (*writer)(const kvedge_cli_doc_t *, FILE *))
{
    s_buf = NULL;
    s_len = 0;
    FILE *f = open_memstream(&s_buf, &s_len);
    assert_non_null(f);
    writer(&s_doc, f);
    assert_int_equal(fclose(f), 0);
    assert_true(s_len > 0);
    return s_buf;
}

/* word as the page writes a flag's name: each '-' as "\-". */
static void s_roff_dashes(const char *word, char *out, size_t cap)
{
    size_t n = 0;
    for (; *word && n + 3 < cap; word++) {
        if (*word == '-')
            out[n++] = '\\';
        out[n++] = *word;
    }
    out[n] = '\0';
}

/* The part of text from "start" up to the next "end" (or the end), NUL-terminated in a copy
 * (caller frees); fails when start is missing. */
static char *s_section(const char *text, const char *start, const char *end)
{
    const char *a = strstr(text, start);
    if (!a)
        fail_msg("missing \"%s\"", start);
    const char *b = strstr(a + strlen(start), end);
    size_t n = b ? (size_t)(b - a) : strlen(a);
    char *s = strndup(a, n);
    assert_non_null(s);
    return s;
}

/* Roff text as it reads: "\\-" as "-", without the "\\:" break points (caller frees). */
static char *s_unroff(const char *text)
{
    char *out = strdup(text), *o = out;
    assert_non_null(out);
    for (const char *p = text; *p; p++) {
        if (p[0] == '\\' && (p[1] == '-' || p[1] == ':')) {
            if (p[1] == '-')
                *o++ = '-';
            p++;
            continue;
        }
        *o++ = *p;
    }
    *o = '\0';
    return out;
}

#define assert_has(hay, fmt, ...)                                                                  \
    do {                                                                                           \
        char want_[256];                                                                           \
        snprintf(want_, sizeof want_, fmt, __VA_ARGS__);                                           \
        if (!strstr((hay), want_))                                                                 \
            fail_msg("expected \"%s\" in:\n%.3000s", want_, (hay));                                \
    } while (0)

/* Every option of t in part: the man page's (roff) or the completion's (plain words). */
static size_t s_check_opts(const char *part, const kvedge_cmdopts_t *t, bool roff)
{
    char name[160];
    size_t n = 0;
    for (size_t k = 0; t && k < t->count; k++, n++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        if (o->positional) {
            if (roff)
                assert_has(part, "\\fI%s\\fR", o->name);
            continue;
        }
        if (roff) {
            s_roff_dashes(o->name, name, sizeof name);
            assert_has(part, "\\fB\\-\\-%s\\fR", name);
            if (o->letter)
                assert_has(part, "\\fB\\-%c\\fR, \\fB\\-\\-%s\\fR", o->letter, name);
            if (o->arg && o->type != KVEDGE_CMDOPT_BOOL)
                assert_has(part, "\\-\\-%s\\fR \\fI%s\\fR", name, o->arg);
            if (o->alias) {
                s_roff_dashes(o->alias, name, sizeof name);
                assert_has(part, "\\fB\\-\\-%s\\fR", name);
            }
        } else {
            assert_has(part, " --%s ", o->name);
            if (o->letter)
                assert_has(part, " -%c ", o->letter);
            if (o->alias)
                assert_has(part, " --%s ", o->alias);
        }
    }
    return n;
}

static size_t s_check_settings(const char *part, const kvedge_settings_table_t *t, bool roff)
{
    char name[160];
    for (size_t i = 0; t && i < t->count; i++) {
        const kvedge_setting_t *e = &t->settings[i];
        if (roff) {
            s_roff_dashes(e->flag, name, sizeof name);
            assert_has(part, "\\fB\\-\\-%s\\fR", name);
            assert_has(part, "(config key \\fB%s\\fR", e->key);
        } else {
            assert_has(part, " --%s ", e->flag);
        }
        if (e->letter)
            assert_has(part, roff ? "\\fB\\-%c\\fR" : " -%c ", e->letter);
    }
    if (t)
        assert_has(part, "%s", roff ? "\\fB\\-\\-check\\-config\\fR" : " --check-config ");
    return t ? t->count : 0;
}

static void test_man_names_every_command_and_flag(void **state)
{
    (void)state;
    char *man = s_write(kvedge_cli_doc_man);
    size_t commands = 0, flags = 0;
    const kvedge_cli_cmd_t *const *lists[] = {kvedge_cli_tables, kvedge_cli_remote_tables};
    for (size_t l = 0; l < 2; l++)
        for (int t = 0; lists[l][t]; t++)
            for (const kvedge_cli_cmd_t *c = lists[l][t]; c->name; c++, commands++) {
                char head[96], name[80];
                s_roff_dashes(c->name, name, sizeof name);
                snprintf(head, sizeof head, "\n.SS %s\n", name);
                char *part = s_section(man, head, "\n.S");
                char *plain = s_unroff(part);
                assert_has(plain, "%s", kvedge_cli_summary(c));
                free(plain);
                flags += s_check_opts(part, c->opts, true);
                flags += s_check_settings(part, c->settings, true);
                free(part);
            }
    char *globals = s_section(man, ".SH GLOBAL OPTIONS\n", "\n.SH ");
    flags += s_check_opts(globals, &kvedge_cli_globals, true);
    free(globals);
    for (const char *sh = ".SH NAME\n.SH SYNOPSIS\n.SH DESCRIPTION\n.SH COMMANDS\n"
                          ".SH EXIT STATUS\n.SH ENVIRONMENT\n.SH FILES\n";
         *sh; sh = strchr(sh, '\n') + 1) {
        char line[40];
        snprintf(line, sizeof line, "%.*s", (int)(strchr(sh, '\n') - sh + 1), sh);
        assert_has(man, "%s", line);
    }
    assert_has(man, "%s", ".TH KVEDGE 1 \"\" \"kvedge 0.0.0-test\"");
    assert_has(man, "%s", ".TP\n\\fB4\\fR\nverify found corrupt blocks\n");
    assert_has(man, "%s", ".TP\n\\fBKVEDGE_HOST\\fR\nthe value of the global \\fB\\-\\-host\\fR");
    print_message("man page: %zu commands, %zu flags and arguments\n", commands, flags);
    assert_true(commands > 20 && flags > 100);
    free(man);
}

static void test_completion_names_every_command_and_flag(void **state)
{
    (void)state;
    char *sh = s_write(kvedge_cli_doc_bash);
    char *cmds = s_section(sh, "_kvedge_commands='", "'\n");
    char *globals = s_section(sh, "_kvedge_globals='", "'\n");
    /* Words end in a space in the checks: make the lists end so too. */
    char *words = NULL;
    assert_true(asprintf(&words, "%s %s ", cmds, globals) > 0);
    s_check_opts(words, &kvedge_cli_globals, false);
    const kvedge_cli_cmd_t *const *lists[] = {kvedge_cli_tables, kvedge_cli_remote_tables};
    for (size_t l = 0; l < 2; l++)
        for (int t = 0; lists[l][t]; t++)
            for (const kvedge_cli_cmd_t *c = lists[l][t]; c->name; c++) {
                assert_has(words, " %s ", c->name);
                char head[96];
                snprintf(head, sizeof head, "\n    %s) echo '", c->name);
                char *part = s_section(sh, head, "' ;;\n");
                char *line = NULL;
                assert_true(asprintf(&line, "%s ", part) > 0);
                s_check_opts(line, c->opts, false);
                s_check_settings(line, c->settings, false);
                free(line);
                free(part);
            }
    for (int t = 0; kvedge_cli_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = kvedge_cli_tables[t]; c->name; c++)
            for (size_t k = 0; c->opts && k < c->opts->count; k++)
                if (c->opts->opts[k].arg && strcmp(c->opts->opts[k].arg, "FILE") == 0 &&
                    !c->opts->opts[k].positional)
                    assert_has(sh, "'%s --%s'", c->name, c->opts->opts[k].name);
    assert_has(sh, "%s", "'prefill --weights' | 'prefill -w') echo 'file' ;;");
    assert_has(sh, "%s", "    'store --role' | 'store -r') echo 'choices cloud edge' ;;");
    assert_has(sh, "%s", "*' --data' | *' -d') echo 'dir' ;;");
    assert_has(sh, "%s", "complete -F _kvedge kvedge\n");
    free(words);
    free(globals);
    free(cmds);
    free(sh);
}

/* roff's control characters in help text cannot start a line or leave a backslash raw. */
static void test_man_escapes(void **state)
{
    (void)state;
    char *man = s_write(kvedge_cli_doc_man);
    for (const char *p = man; (p = strchr(p, '\n')) != NULL; p++) {
        if (p[1] == '.' || p[1] == '\'') {
            /* a request: only the ones the writer emits */
            static const char *const ok[] = {".\\\"", ".TH ",  ".SH ",  ".SS ", ".TP\n",
                                             ".PP\n", ".br\n", ".nf\n", ".fi\n"};
            bool known = false;
            for (size_t i = 0; i < sizeof ok / sizeof ok[0] && !known; i++)
                known = strncmp(p + 1, ok[i], strlen(ok[i])) == 0;
            if (!known)
                fail_msg("line starts a request: %.60s", p + 1);
        }
    }
    free(man);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_man_names_every_command_and_flag),
        cmocka_unit_test(test_completion_names_every_command_and_flag),
        cmocka_unit_test(test_man_escapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
