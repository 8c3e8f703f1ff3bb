/* The kvedge manual page and bash completion, written from the command tables (cli_doc.h). */
#include "clients/cli/cli_doc.h"

#include <stdlib.h>
#include <string.h>

#include "store/node/node.h"

#define S_CMDS_MAX 128

/* One command as the page lists it: its form without -H and its form with -H (either may be
 * NULL, not both). */
typedef struct {
    const char *name;
    const kvedge_cli_cmd_t *local, *remote;
} s_cmd_t;

static const kvedge_cli_cmd_t *s_in(const kvedge_cli_cmd_t *const *tables, const char *name)
{
    for (int t = 0; tables && tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = tables[t]; c->name; c++)
            if (strcmp(c->name, name) == 0)
                return c;
    return NULL;
}

/* Every command once, in the order of `kvedge help`: the tables, then the node-only ones. */
static size_t s_commands(const kvedge_cli_doc_t *d, s_cmd_t *out)
{
    size_t n = 0;
    const kvedge_cli_cmd_t *const *lists[] = {d->tables, d->remote};
    for (size_t l = 0; l < 2; l++)
        for (int t = 0; lists[l] && lists[l][t]; t++)
            for (const kvedge_cli_cmd_t *c = lists[l][t]; c->name && n < S_CMDS_MAX; c++) {
                bool seen = false;
                for (size_t i = 0; i < n && !seen; i++)
                    seen = strcmp(out[i].name, c->name) == 0;
                if (!seen)
                    out[n++] =
                        (s_cmd_t){c->name, s_in(d->tables, c->name), s_in(d->remote, c->name)};
            }
    return n;
}

static bool s_same_text(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* Whether two tables take the same flags and arguments, with the same help. */
static bool s_same_opts(const kvedge_cmdopts_t *a, const kvedge_cmdopts_t *b)
{
    if (a == b)
        return true;
    if (!a || !b || a->count != b->count)
        return false;
    for (size_t k = 0; k < a->count; k++) {
        const kvedge_cmdopt_t *x = &a->opts[k], *y = &b->opts[k];
        if (!s_same_text(x->name, y->name) || x->letter != y->letter ||
            !s_same_text(x->arg, y->arg) || x->type != y->type || x->positional != y->positional ||
            !s_same_text(x->help, y->help) || !s_same_text(x->alias, y->alias) ||
            !s_same_text(x->env, y->env))
            return false;
    }
    return true;
}

/* c's form without -H (0) or with it (1); NULL when it has none, or when the form with -H
 * takes the same options as the one without. */
static const kvedge_cli_cmd_t *s_form(const s_cmd_t *c, int form)
{
    const kvedge_cli_cmd_t *cmd = form ? c->remote : c->local;
    if (form && cmd && c->local && c->local->opts && s_same_opts(c->local->opts, cmd->opts))
        return NULL;
    return cmd;
}

/* ---------------------------------------------------------------- roff */

/* Writes s as roff text: a backslash as \e, a dash that starts an option (or follows one) as
 * \-, a comma inside a word as a place to break the line (\:), and a line that would start
 * with a control character guarded with \&. */
static void s_roff(FILE *f, const char *s)
{
    char prev = ' ';
    bool bol = true;
    for (; s && *s; s++) {
        if (bol && (*s == '.' || *s == '\''))
            fputs("\\&", f);
        if (*s == '\\')
            fputs("\\e", f);
        else if (*s == ',' && s[1] && s[1] != ' ')
            fputs(",\\:", f); /* a list without spaces may break after its commas */
        else if (*s == '-' && strchr(" \n(`[|-\"'", prev))
            fputs("\\-", f);
        else
            fputc(*s, f);
        bol = *s == '\n';
        prev = *s;
    }
}

/* A flag's name: every dash as \- (so that it can be copied from the page). */
static void s_roff_name(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '-')
            fputs("\\-", f);
        else
            fputc(*s, f);
}

/* ".TP" and the tag line: -x, --name ARG (letter and arg optional). */
static void s_man_tag(FILE *f, char letter, const char *name, const char *arg)
{
    fputs(".TP\n", f);
    if (letter)
        fprintf(f, "\\fB\\-%c\\fR, ", letter);
    fputs("\\fB\\-\\-", f);
    s_roff_name(f, name);
    fputs("\\fR", f);
    if (arg) {
        fputs(" \\fI", f);
        s_roff(f, arg);
        fputs("\\fR", f);
    }
    fputc('\n', f);
}

/* "a|b|c" of an ENUM's choices into buf. */
static const char *s_choices(const kvedge_setting_choice_t *c, char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t at = 0; c && c->name && at < len; c++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? "|" : "", c->name);
    return buf;
}

/* The value name a table option shows: its arg, an ENUM's choices, nothing for a BOOL. */
static const char *s_opt_arg(const kvedge_cmdopt_t *o, char *buf, size_t len)
{
    if (o->type == KVEDGE_CMDOPT_BOOL)
        return NULL;
    return o->arg ? o->arg : s_choices(o->choices, buf, len);
}

static const char *s_setting_arg(const kvedge_setting_t *e, char *buf, size_t len)
{
    if (e->type == KVEDGE_SETTING_BOOL)
        return NULL;
    return e->arg ? e->arg : s_choices(e->choices, buf, len);
}

/* A table's arguments, then its options, as --help lists them, then -h. */
static void s_man_opts(FILE *f, const kvedge_cmdopts_t *t)
{
    char text[1400], arg[256];
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < t->count; k++) {
            const kvedge_cmdopt_t *o = &t->opts[k];
            if (o->positional != (pass == 0))
                continue;
            kvedge_cmdopts_opt_text(t, k, text, sizeof text);
            if (o->positional) {
                fputs(".TP\n\\fI", f);
                s_roff(f, o->name);
                fprintf(f, "\\fR%s\n", o->type == KVEDGE_CMDOPT_STRS ? "..." : "");
            } else {
                s_man_tag(f, o->letter, o->name, s_opt_arg(o, arg, sizeof arg));
            }
            s_roff(f, text);
            fputc('\n', f);
            if (o->alias) {
                s_man_tag(f, 0, o->alias, s_opt_arg(o, arg, sizeof arg));
                fputs("deprecated alias of \\fB\\-\\-", f);
                s_roff_name(f, o->name);
                fputs("\\fR, removed in the next release\n", f);
            }
        }
    s_man_tag(f, 'h', "help", NULL);
    fputs("print this command's help and exit\n", f);
}

/* A daemon's settings flags with their config keys and defaults, then --config,
 * --check-config and -h (kvedge_settings_help says the same). */
static void s_man_settings(FILE *f, const kvedge_settings_table_t *t)
{
    void *defaults = malloc(t->struct_size ? t->struct_size : 1);
    if (!defaults)
        return;
    kvedge_settings_defaults(t, defaults);
    char arg[256], value[KVEDGE_SETTINGS_LINE_MAX_BYTES];
    for (size_t i = 0; i < t->count; i++) {
        const kvedge_setting_t *e = &t->settings[i];
        s_man_tag(f, e->letter, e->flag, s_setting_arg(e, arg, sizeof arg));
        s_roff(f, e->help);
        fprintf(f, " (config key \\fB%s\\fR", e->key);
        value[0] = '\0';
        if (e->type == KVEDGE_SETTING_LIST) {
            fprintf(f, "; repeatable, at most %zu)\n", e->list_max);
            continue;
        }
        kvedge_settings_value(e, defaults, 0, value, sizeof value);
        fputs(", default ", f);
        s_roff(f, value[0] ? value : "\"\"");
        fputs(")\n", f);
    }
    s_man_tag(f, 'c', "config", "FILE");
    fprintf(f, "read the settings from FILE (ZPL, section \\fB%s\\fR) before the flags\n",
            t->daemon);
    s_man_tag(f, 0, "check-config", NULL);
    fputs("check the flags and the file, print the resolved settings as a config file, start "
          "nothing\n",
          f);
    s_man_tag(f, 'h', "help", NULL);
    fputs("print this command's help and exit\n", f);
    free(defaults);
}

/* "kvedge [-H EP] NAME SYNOPSIS" for one form of a command. */
static void s_man_synopsis(FILE *f, const kvedge_cli_cmd_t *c, bool remote)
{
    char syn[512] = "";
    if (c->opts)
        kvedge_cmdopts_synopsis(c->opts, syn, sizeof syn);
    fputs(".PP\n\\fBkvedge\\fR ", f);
    if (remote)
        fputs("\\fB\\-H\\fR \\fIENDPOINT\\fR ", f);
    fputs("\\fB", f);
    s_roff_name(f, c->name);
    fputs("\\fR ", f);
    s_roff(f, c->opts ? syn : c->args);
    fputc('\n', f);
}

/* A command's --help epilogue, kept as laid out for the terminal. */
static void s_man_about(FILE *f, const char *about)
{
    if (!about)
        return;
    fputs(".PP\n.nf\n", f);
    s_roff(f, about);
    if (about[0] && about[strlen(about) - 1] != '\n')
        fputc('\n', f);
    fputs(".fi\n", f);
}

static void s_man_command(FILE *f, const s_cmd_t *c)
{
    fputs(".SS ", f);
    s_roff_name(f, c->name);
    fputc('\n', f);
    const kvedge_cli_cmd_t *first = c->local ? c->local : c->remote;
    if (c->local)
        s_man_synopsis(f, c->local, false);
    if (c->remote)
        s_man_synopsis(f, c->remote, true);
    fputs(".PP\n", f);
    s_roff(f, kvedge_cli_summary(first));
    if (!c->local)
        fputs(" Talks to a node: needs \\fB\\-H\\fR.", f);
    fputc('\n', f);
    if (c->local && c->remote &&
        !s_same_text(kvedge_cli_summary(c->local), kvedge_cli_summary(c->remote))) {
        fputs(".PP\nWith \\fB\\-H\\fR: ", f);
        s_roff(f, kvedge_cli_summary(c->remote));
        fputc('\n', f);
    }
    if (first->settings)
        s_man_settings(f, first->settings);
    else if (first->opts)
        s_man_opts(f, first->opts);
    if (c->local && s_form(c, 1) && c->remote->opts) {
        fputs(".PP\nWith \\fB\\-H\\fR:\n", f);
        s_man_opts(f, c->remote->opts);
    }
    s_man_about(f, first->opts ? first->opts->about : NULL);
}

static const struct {
    int code;
    const char *what;
} s_exits[] = {
    {KVEDGE_EXIT_OK, "success"},
    {KVEDGE_EXIT_FAILURE, "the operation failed"},
    {KVEDGE_EXIT_USAGE, "bad command line (the message names the flag or argument)"},
    {KVEDGE_EXIT_NOTFOUND, "prefix or model not found"},
    {KVEDGE_EXIT_CORRUPT, "verify found corrupt blocks"},
    {KVEDGE_EXIT_UNAVAILABLE, "store missing, locked, unreadable or too new"},
    {KVEDGE_EXIT_DENIED, "the key may not do that (evict needs an admin key)"},
};

/* Every environment variable a table reads, with the flags it stands for. */
static void s_man_env_one(FILE *f, const char *env, const kvedge_cli_doc_t *d, const s_cmd_t *c,
                          size_t n)
{
    fprintf(f, ".TP\n\\fB%s\\fR\nthe value of", env);
    const char *sep = " ";
    for (size_t g = 0; g < d->globals->count; g++)
        if (d->globals->opts[g].env && strcmp(d->globals->opts[g].env, env) == 0) {
            fprintf(f, "%sthe global \\fB\\-\\-", sep);
            s_roff_name(f, d->globals->opts[g].name);
            fputs("\\fR", f);
            sep = ", ";
        }
    for (size_t i = 0; i < n; i++)
        for (int form = 0; form < 2; form++) {
            const kvedge_cli_cmd_t *cmd = s_form(&c[i], form);
            if (!cmd || !cmd->opts)
                continue;
            for (size_t k = 0; k < cmd->opts->count; k++)
                if (cmd->opts->opts[k].env && strcmp(cmd->opts->opts[k].env, env) == 0) {
                    fprintf(f, "%s\\fB\\-\\-", sep);
                    s_roff_name(f, cmd->opts->opts[k].name);
                    fprintf(f, "\\fR of \\fB%s\\fR", cmd->name);
                    sep = ", ";
                }
        }
    fputs(" when the line does not give it\n", f);
}

/* env's entry, the first time it is seen. */
static void s_man_env_add(FILE *f, const char *env, const char **seen, size_t *n_seen,
                          const kvedge_cli_doc_t *d, const s_cmd_t *c, size_t n)
{
    for (size_t s = 0; env && s < *n_seen; s++)
        if (strcmp(seen[s], env) == 0)
            return;
    if (!env || *n_seen == 64)
        return;
    seen[(*n_seen)++] = env;
    s_man_env_one(f, env, d, c, n);
}

static void s_man_env(FILE *f, const kvedge_cli_doc_t *d, const s_cmd_t *c, size_t n)
{
    const char *seen[64];
    size_t n_seen = 0;
    fputs(".SH ENVIRONMENT\n", f);
    for (size_t k = 0; k < d->globals->count; k++)
        s_man_env_add(f, d->globals->opts[k].env, seen, &n_seen, d, c, n);
    for (size_t i = 0; i < n; i++)
        for (int form = 0; form < 2; form++) {
            const kvedge_cli_cmd_t *cmd = s_form(&c[i], form);
            for (size_t k = 0; cmd && cmd->opts && k < cmd->opts->count; k++)
                s_man_env_add(f, cmd->opts->opts[k].env, seen, &n_seen, d, c, n);
        }
}

static void s_man_head(FILE *f, const kvedge_cli_doc_t *d)
{
    fprintf(f,
            ".\\\" The manual page of kvedge %s, written by `kvedge help --man` from its command\n"
            ".\\\" tables (clients/cli/cli_doc.c): regenerate it, never edit it.\n"
            ".TH KVEDGE 1 \"\" \"kvedge %s\" \"User Commands\"\n"
            ".SH NAME\nkvedge \\- ",
            d->version, d->version);
    s_roff(f, d->globals->summary);
    fputs("\n.SH SYNOPSIS\n"
          "\\fBkvedge\\fR [\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR] "
          "[\\fIGLOBAL OPTIONS\\fR]\n.br\n"
          "\\fBkvedge help\\fR [\\fICOMMAND\\fR | \\fB\\-\\-man\\fR | "
          "\\fB\\-\\-completion bash\\fR]\n"
          ".SH DESCRIPTION\n"
          "One program for the store node (\\fBstore\\fR), the Storage Master (\\fBmaster\\fR), "
          "the edge proxy (\\fBproxy\\fR), the administration of a store (on its data directory, "
          "or against a running node with \\fB\\-H\\fR), and the cloud and edge roles of "
          "inference (\\fBprefill\\fR, \\fBdecode\\fR).\n"
          ".PP\n"
          "Global options go before or after the command. After it they are given in full "
          "(\\fB\\-\\-opt\\fR \\fIVALUE\\fR, \\fB\\-\\-opt=\\fR\\fIVALUE\\fR), up to a "
          "\\fB\\-\\-\\fR, and not the names that \\fBstore\\fR, \\fBmaster\\fR, "
          "\\fBmaster\\-dump\\fR, \\fBproxy\\fR and \\fBsync\\fR define for themselves; "
          "\\fB\\-h\\fR and \\fB\\-\\-help\\fR there are the command's. "
          "\\fBkvedge help \\-\\-man\\fR prints this page and \\fBkvedge help \\-\\-completion "
          "bash\\fR the bash completion, both from the same tables as the parser.\n"
          ".SH GLOBAL OPTIONS\n",
          f);
    char text[1400], arg[256];
    for (size_t k = 0; k < d->globals->count; k++) {
        const kvedge_cmdopt_t *o = &d->globals->opts[k];
        s_man_tag(f, o->letter, o->name, s_opt_arg(o, arg, sizeof arg));
        kvedge_cmdopts_opt_text(d->globals, k, text, sizeof text);
        s_roff(f, text);
        fputc('\n', f);
    }
    s_man_tag(f, 'h', "help", NULL);
    fputs("the list of commands; \\fBkvedge\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR for one\n", f);
}

void kvedge_cli_doc_man(const kvedge_cli_doc_t *d, FILE *f)
{
    static s_cmd_t cmds[S_CMDS_MAX];
    size_t n = s_commands(d, cmds);
    s_man_head(f, d);
    fputs(".SH COMMANDS\n", f);
    for (size_t i = 0; i < n; i++)
        s_man_command(f, &cmds[i]);
    fputs(".SH EXIT STATUS\n", f);
    for (size_t i = 0; i < sizeof s_exits / sizeof s_exits[0]; i++)
        fprintf(f, ".TP\n\\fB%d\\fR\n%s\n", s_exits[i].code, s_exits[i].what);
    s_man_env(f, d, cmds, n);
    fprintf(
        f,
        ".SH FILES\n"
        ".TP\n\\fI%s\\fR\n"
        "the store directory when neither \\fB\\-\\-data\\fR nor \\fBKVEDGE_DATA\\fR gives one\n"
        ".TP\n\\fIDATA\\fB/%s\\fR, \\fIDATA\\fB/%s_secret\\fR\n"
        "a store node's CURVE certificate (\\fIDATA\\fR: its store directory), made on its first "
        "start: clients give the public "
        "one as \\fB\\-\\-server\\-key\\fR\n"
        ".TP\n\\fIDATA\\fB/%s/\\fR\n"
        "the public certificates of the clients a node or master accepts "
        "(\\fBkvedge keygen\\fR makes them)\n"
        ".TP\n\\fIFILE\\fR of \\fB\\-\\-config\\fR\n"
        "a daemon's settings (ZPL): one section named after the daemon (\\fBstore\\fR, "
        "\\fBmaster\\fR, \\fBproxy\\fR) with the config keys listed above; "
        "\\fB\\-\\-check\\-config\\fR prints one\n"
        ".SH SEE ALSO\n"
        "\\fBkvedge\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR; docs/operations.md in the "
        "kvedge sources\n",
        KVEDGE_DATA_DIR_DEFAULT, KVEDGE_NODE_CERT_NAME, KVEDGE_NODE_CERT_NAME,
        KVEDGE_NODE_CLIENTS_NAME);
}

/* ---------------------------------------------------------------- bash */

/* What a flag's value completes as: a file name, a directory, its choices or nothing. */
static const char *s_kind(const char *arg, const kvedge_setting_choice_t *choices, char *buf,
                          size_t len)
{
    static const char *const files[] = {"FILE", "FILES", "PATH", "KEY", "MAP"};
    for (size_t i = 0; arg && i < sizeof files / sizeof files[0]; i++)
        if (strcmp(arg, files[i]) == 0)
            return "file";
    if (arg && strcmp(arg, "DIR") == 0)
        return "dir";
    if (!arg && choices) {
        snprintf(buf, len, "choices ");
        s_choices(choices, buf + 8, len - 8);
        for (char *p = buf; *p; p++)
            *p = *p == '|' ? ' ' : *p;
        return buf;
    }
    return "value";
}

static void s_bash_opts_words(FILE *f, const kvedge_cmdopts_t *t)
{
    for (size_t k = 0; t && k < t->count; k++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        if (o->positional)
            continue;
        fprintf(f, " --%s", o->name);
        if (o->letter)
            fprintf(f, " -%c", o->letter);
        if (o->alias)
            fprintf(f, " --%s", o->alias);
    }
}

static void s_bash_settings_words(FILE *f, const kvedge_settings_table_t *t)
{
    for (size_t i = 0; t && i < t->count; i++) {
        fprintf(f, " --%s", t->settings[i].flag);
        if (t->settings[i].letter)
            fprintf(f, " -%c", t->settings[i].letter);
    }
    if (t)
        fputs(" --config -c --check-config", f);
}

/* The case arms of _kvedge_arg for one table: "CMD --flag"|"CMD -x") echo KIND ;; */
static void s_bash_opts_kinds(FILE *f, const char *cmd, const kvedge_cmdopts_t *t)
{
    char buf[300];
    for (size_t k = 0; t && k < t->count; k++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        if (o->type == KVEDGE_CMDOPT_BOOL)
            continue;
        const char *kind =
            s_kind(o->arg ? o->arg : (o->positional ? o->name : NULL), o->choices, buf, sizeof buf);
        if (o->positional) {
            if (strcmp(kind, "file") == 0)
                fprintf(f, "    '%s ') echo file ;;\n", cmd);
            continue;
        }
        fprintf(f, "    '%s --%s'", cmd, o->name);
        if (o->letter)
            fprintf(f, " | '%s -%c'", cmd, o->letter);
        if (o->alias)
            fprintf(f, " | '%s --%s'", cmd, o->alias);
        fprintf(f, ") echo '%s' ;;\n", kind);
    }
}

static void s_bash_settings_kinds(FILE *f, const char *cmd, const kvedge_settings_table_t *t)
{
    char buf[300];
    for (size_t i = 0; t && i < t->count; i++) {
        const kvedge_setting_t *e = &t->settings[i];
        if (e->type == KVEDGE_SETTING_BOOL)
            continue;
        fprintf(f, "    '%s --%s'", cmd, e->flag);
        if (e->letter)
            fprintf(f, " | '%s -%c'", cmd, e->letter);
        fprintf(f, ") echo '%s' ;;\n", s_kind(e->arg, e->choices, buf, sizeof buf));
    }
    if (t)
        fprintf(f, "    '%s --config' | '%s -c') echo file ;;\n", cmd, cmd);
}

static const char s_bash_main[] =
    "_kvedge() {\n"
    "    local cur=${COMP_WORDS[COMP_CWORD]} prev='' cmd='' kind w i\n"
    "    ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}\n"
    "    # --flag=VALUE: bash splits at '=' (COMP_WORDBREAKS)\n"
    "    if [[ $prev == = ]] && ((COMP_CWORD > 1)); then\n"
    "        prev=${COMP_WORDS[COMP_CWORD - 2]}\n"
    "    elif [[ $cur == --*=* ]]; then\n"
    "        prev=${cur%%=*} cur=${cur#*=}\n"
    "    fi\n"
    "    # The command: the first word that is neither a global option nor its value.\n"
    "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
    "        w=${COMP_WORDS[i]}\n"
    "        if [[ \" $_kvedge_global_values \" == *\" $w \"* ]]; then\n"
    "            ((i++))\n"
    "        elif [[ $w != -* && $w != = ]]; then\n"
    "            cmd=$w\n"
    "            break\n"
    "        fi\n"
    "    done\n"
    "    COMPREPLY=()\n"
    "    if [[ $prev == -* ]]; then\n"
    "        kind=$(_kvedge_arg \"${cmd:-kvedge}\" \"$prev\")\n"
    "        case $kind in\n"
    "        file) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- \"$cur\")); "
    "return ;;\n"
    "        dir) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- \"$cur\")); "
    "return ;;\n"
    "        choices*) COMPREPLY=($(compgen -W \"${kind#choices }\" -- \"$cur\")); return ;;\n"
    "        value) return ;;\n"
    "        esac\n"
    "    fi\n"
    "    if [[ -z $cmd ]]; then\n"
    "        if [[ $cur == -* ]]; then\n"
    "            COMPREPLY=($(compgen -W \"$_kvedge_globals\" -- \"$cur\"))\n"
    "        else\n"
    "            COMPREPLY=($(compgen -W \"$_kvedge_commands\" -- \"$cur\"))\n"
    "        fi\n"
    "    elif [[ $cmd == help ]]; then\n"
    "        if [[ $prev == --completion ]]; then\n"
    "            COMPREPLY=($(compgen -W bash -- \"$cur\"))\n"
    "        else\n"
    "            COMPREPLY=($(compgen -W \"$_kvedge_commands --man --completion\" -- \"$cur\"))\n"
    "        fi\n"
    "    elif [[ $cur == -* ]]; then\n"
    "        COMPREPLY=($(compgen -W \"$(_kvedge_flags \"$cmd\") $_kvedge_globals\" -- "
    "\"$cur\"))\n"
    "    elif [[ $(_kvedge_arg \"$cmd\" '') == file ]]; then\n"
    "        compopt -o filenames 2>/dev/null\n"
    "        COMPREPLY=($(compgen -f -- \"$cur\"))\n"
    "    fi\n"
    "}\n"
    "complete -F _kvedge kvedge\n";

/* _kvedge_flags CMD: the words of CMD's flags, both forms (each word starts with a space). */
static void s_bash_flags(FILE *f, const s_cmd_t *c, size_t n)
{
    fputs("_kvedge_flags() {\n    case $1 in\n", f);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "    %s) echo '", c[i].name); /* -h, --help: in $_kvedge_globals */
        for (int form = 0; form < 2; form++) {
            const kvedge_cli_cmd_t *cmd = s_form(&c[i], form);
            if (!cmd)
                continue;
            s_bash_opts_words(f, cmd->opts);
            s_bash_settings_words(f, cmd->settings);
        }
        fputs("' ;;\n", f);
    }
    fputs("    esac\n}\n\n", f);
}

/* _kvedge_arg CMD FLAG: what FLAG's value completes as (CMD "kvedge": before the command;
 * FLAG '': the command's arguments); nothing for a flag that takes no value. */
static void s_bash_kinds(FILE *f, const kvedge_cli_doc_t *d, const s_cmd_t *c, size_t n)
{
    fputs("_kvedge_arg() {\n    case \"$1 $2\" in\n", f);
    for (size_t i = 0; i < n; i++)
        for (int form = 0; form < 2; form++) {
            const kvedge_cli_cmd_t *cmd = s_form(&c[i], form);
            if (!cmd)
                continue;
            s_bash_opts_kinds(f, c[i].name, cmd->opts);
            s_bash_settings_kinds(f, c[i].name, cmd->settings);
        }
    char buf[300];
    for (size_t k = 0; k < d->globals->count; k++) {
        const kvedge_cmdopt_t *o = &d->globals->opts[k];
        if (o->type == KVEDGE_CMDOPT_BOOL)
            continue;
        fprintf(f, "    *' --%s'", o->name);
        if (o->letter)
            fprintf(f, " | *' -%c'", o->letter);
        fprintf(f, ") echo '%s' ;;\n", s_kind(o->arg, o->choices, buf, sizeof buf));
    }
    fputs("    esac\n}\n\n", f);
}

void kvedge_cli_doc_bash(const kvedge_cli_doc_t *d, FILE *f)
{
    static s_cmd_t cmds[S_CMDS_MAX];
    size_t n = s_commands(d, cmds);
    fprintf(f,
            "# bash completion for kvedge %s, written by `kvedge help --completion bash` from its\n"
            "# command tables (clients/cli/cli_doc.c): regenerate it, never edit it.\n\n"
            "_kvedge_globals='--help -h",
            d->version);
    s_bash_opts_words(f, d->globals);
    fputs("'\n# The global options that take a value (the next word is not the command).\n"
          "_kvedge_global_values='",
          f);
    const char *sep = "";
    for (size_t k = 0; k < d->globals->count; k++) {
        const kvedge_cmdopt_t *o = &d->globals->opts[k];
        if (o->type == KVEDGE_CMDOPT_BOOL)
            continue;
        fprintf(f, "%s--%s", sep, o->name);
        sep = " ";
        if (o->letter)
            fprintf(f, " -%c", o->letter);
    }
    fputs("'\n_kvedge_commands='help", f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %s", cmds[i].name);
    fputs("'\n\n", f);
    s_bash_flags(f, cmds, n);
    s_bash_kinds(f, d, cmds, n);
    fputs(s_bash_main, f);
}
