/* Command options on the settings engine (cmdopts.h): numbers, sizes, durations, booleans and
 * enums parse and check their bounds through kvedge_setting_parse, so a command's flag and a
 * daemon's setting refuse the same values with the same words; strings stay pointers into the
 * line, and a mistyped flag gets the config reader's suggestion (kvedge_settings_nearest). */
#include "runtime/cmdopts.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"
#include "access/codec/why.h"

#define S_WORD_BYTES  64 /* how much of a mistyped flag a message repeats */
#define S_HELP_COLUMN 28
#define S_HELP_WIDTH  79

/* ---------------------------------------------------------------- fields */

static bool s_numeric(kvedge_cmdopt_type_t type)
{
    return type == KVEDGE_CMDOPT_UINT || type == KVEDGE_CMDOPT_SIZE || type == KVEDGE_CMDOPT_MS ||
           type == KVEDGE_CMDOPT_SECONDS;
}

/* The settings engine's view of o, for the types it parses. */
static void s_setting(const kvedge_cmdopt_t *o, kvedge_setting_t *e)
{
    static const kvedge_setting_type_t map[] = {
        [KVEDGE_CMDOPT_BOOL] = KVEDGE_SETTING_BOOL,
        [KVEDGE_CMDOPT_UINT] = KVEDGE_SETTING_UINT,
        [KVEDGE_CMDOPT_SIZE] = KVEDGE_SETTING_SIZE,
        [KVEDGE_CMDOPT_MS] = KVEDGE_SETTING_MS,
        [KVEDGE_CMDOPT_SECONDS] = KVEDGE_SETTING_SECONDS,
        [KVEDGE_CMDOPT_ENUM] = KVEDGE_SETTING_ENUM,
    };
    memset(e, 0, sizeof *e);
    e->key = o->name;
    e->flag = o->name;
    e->arg = o->arg;
    e->type = map[o->type];
    e->offset = o->offset;
    e->size = o->size;
    e->min = o->min;
    e->max = o->max;
    e->def_num = o->def_num;
    e->def = o->def;
    e->choices = o->choices;
}

static void s_put_ptr(const kvedge_cmdopt_t *o, void *opts, size_t item, const char *v)
{
    memcpy((char *)opts + o->offset + item * sizeof v, &v, sizeof v);
}

static size_t s_count(const kvedge_cmdopt_t *o, const void *opts)
{
    size_t n;
    memcpy(&n, (const char *)opts + o->count_offset, sizeof n);
    return n;
}

static void s_set_count(const kvedge_cmdopt_t *o, void *opts, size_t n)
{
    memcpy((char *)opts + o->count_offset, &n, sizeof n);
}

static void s_default(const kvedge_cmdopt_t *o, void *opts)
{
    kvedge_setting_t e;
    switch (o->type) {
    case KVEDGE_CMDOPT_STR:
        s_put_ptr(o, opts, 0, o->def);
        break;
    case KVEDGE_CMDOPT_STRS:
        s_set_count(o, opts, 0);
        break;
    case KVEDGE_CMDOPT_DOUBLE:
        memcpy((char *)opts + o->offset, &o->def_double, sizeof(double));
        break;
    default:
        s_setting(o, &e);
        kvedge_setting_default(&e, opts);
        break;
    }
}

void kvedge_cmdopts_defaults(const kvedge_cmdopts_t *t, void *opts)
{
    if (!t || !opts)
        return;
    memset(opts, 0, t->struct_size);
    for (size_t i = 0; i < t->count; i++)
        s_default(&t->opts[i], opts);
}

/* Sets o from text v (a STRS appends); why gets the reason without the name. */
static int s_set(const kvedge_cmdopt_t *o, void *opts, const char *v, char *why, size_t len)
{
    if (o->type == KVEDGE_CMDOPT_STR) {
        s_put_ptr(o, opts, 0, v);
        return 0;
    }
    if (o->type == KVEDGE_CMDOPT_STRS) {
        size_t n = s_count(o, opts);
        if (n >= o->list_max)
            return kvedge_why(why, len, -1, "more than %zu values", o->list_max);
        s_put_ptr(o, opts, n, v);
        s_set_count(o, opts, n + 1);
        return 0;
    }
    if (o->type == KVEDGE_CMDOPT_DOUBLE) {
        char *end = NULL;
        double d = strtod(v, &end);
        if (!*v || isspace((unsigned char)*v) || *end || !isfinite(d))
            return kvedge_why(why, len, -1, "'%s' is not a number", v);
        if (d < o->dmin || d > o->dmax)
            return kvedge_why(why, len, -1, "'%s' is out of range (%g to %g)", v, o->dmin, o->dmax);
        memcpy((char *)opts + o->offset, &d, sizeof d);
        return 0;
    }
    kvedge_setting_t e;
    s_setting(o, &e);
    return kvedge_setting_parse(&e, opts, v, why, len) == KVEDGE_OK ? 0 : -1;
}

/* ---------------------------------------------------------------- the line */

typedef struct {
    const kvedge_cmdopts_t *t;
    void *opts;
    bool given[KVEDGE_CMDOPTS_MAX];
    size_t next_pos; /* index in t->opts of the next positional to fill */
    char *why;
    size_t why_len;
} s_parser_t;

static int s_apply(s_parser_t *p, const kvedge_cmdopt_t *o, const char *shown, const char *v)
{
    char reason[400];
    if (s_set(o, p->opts, v, reason, sizeof reason) != 0)
        return kvedge_why(p->why, p->why_len, KVEDGE_EINVAL, "%s: %s", shown, reason);
    p->given[o - p->t->opts] = true;
    return KVEDGE_OK;
}

static int s_positional(s_parser_t *p, const char *arg)
{
    const kvedge_cmdopts_t *t = p->t;
    while (p->next_pos < t->count && !t->opts[p->next_pos].positional)
        p->next_pos++;
    if (p->next_pos >= t->count)
        return kvedge_why(p->why, p->why_len, KVEDGE_EINVAL, "unexpected argument '%s'", arg);
    const kvedge_cmdopt_t *o = &t->opts[p->next_pos];
    if (o->type != KVEDGE_CMDOPT_STRS)
        p->next_pos++; /* a STRS positional is last and takes the rest */
    return s_apply(p, o, o->name, arg);
}

/* The option a long name (n bytes at nm) names, by name or alias. */
static const kvedge_cmdopt_t *s_find_long(const kvedge_cmdopts_t *t, const char *nm, size_t n)
{
    for (size_t k = 0; k < t->count; k++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        if (o->positional)
            continue;
        if ((strlen(o->name) == n && strncmp(o->name, nm, n) == 0) ||
            (o->alias && strlen(o->alias) == n && strncmp(o->alias, nm, n) == 0))
            return o;
    }
    return NULL;
}

static int s_unknown_long(const kvedge_cmdopts_t *t, const char *nm, size_t n, char *why,
                          size_t len)
{
    char word[S_WORD_BYTES];
    snprintf(word, sizeof word, "%.*s", (int)n, nm);
    const char *names[KVEDGE_CMDOPTS_MAX + 1];
    size_t k = 0;
    for (size_t i = 0; i < t->count; i++)
        if (!t->opts[i].positional)
            names[k++] = t->opts[i].name;
    names[k++] = "help";
    const char *near = kvedge_settings_nearest(word, names, k);
    if (near)
        return kvedge_why(why, len, KVEDGE_EINVAL, "unknown option '--%s' (did you mean --%s?)",
                          word, near);
    return kvedge_why(why, len, KVEDGE_EINVAL, "unknown option '--%s'", word);
}

static int s_long(s_parser_t *p, int argc, char *const *argv, int *i)
{
    const char *nm = argv[*i - 1] + 2, *eq = strchr(nm, '=');
    size_t n = eq ? (size_t)(eq - nm) : strlen(nm);
    const kvedge_cmdopt_t *o = s_find_long(p->t, nm, n);
    if (!o)
        return s_unknown_long(p->t, nm, n, p->why, p->why_len);
    /* Messages name the option, not the deprecated alias it was given by. */
    char shown[S_WORD_BYTES + 2];
    snprintf(shown, sizeof shown, "--%.*s", S_WORD_BYTES - 1, o->name);
    if (o->type == KVEDGE_CMDOPT_BOOL)
        return s_apply(p, o, shown, eq ? eq + 1 : "yes");
    if (eq)
        return s_apply(p, o, shown, eq + 1);
    if (*i >= argc)
        return kvedge_why(p->why, p->why_len, KVEDGE_EINVAL, "%s: needs a value (%s)", shown,
                          o->arg ? o->arg : "VALUE");
    return s_apply(p, o, shown, argv[(*i)++]);
}

static int s_short(s_parser_t *p, int argc, char *const *argv, int *i)
{
    const char *arg = argv[*i - 1];
    for (const char *c = arg + 1; *c; c++) {
        const kvedge_cmdopt_t *o = NULL;
        for (size_t k = 0; k < p->t->count && !o; k++)
            if (!p->t->opts[k].positional && p->t->opts[k].letter == *c)
                o = &p->t->opts[k];
        char shown[3] = {'-', *c, '\0'};
        if (!o)
            return kvedge_why(p->why, p->why_len, KVEDGE_EINVAL, "unknown option '%s'", shown);
        if (o->type == KVEDGE_CMDOPT_BOOL) {
            int rc = s_apply(p, o, shown, "yes");
            if (rc != KVEDGE_OK)
                return rc;
            continue; /* bool letters bundle: -qf */
        }
        if (c[1])
            return s_apply(p, o, shown, c + 1);
        if (*i >= argc)
            return kvedge_why(p->why, p->why_len, KVEDGE_EINVAL, "%s: needs a value (%s)", shown,
                              o->arg ? o->arg : "VALUE");
        return s_apply(p, o, shown, argv[(*i)++]);
    }
    return KVEDGE_OK;
}

/* Options the line did not give: their environment variable, then whether they were needed. */
static int s_finish(s_parser_t *p)
{
    const kvedge_cmdopts_t *t = p->t;
    for (size_t k = 0; k < t->count; k++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        const char *v = o->env && !p->given[k] ? getenv(o->env) : NULL;
        if (v && *v) {
            char shown[S_WORD_BYTES + 2];
            snprintf(shown, sizeof shown, "$%s", o->env);
            int rc = s_apply(p, o, shown, v);
            if (rc != KVEDGE_OK)
                return rc;
        }
        if (!o->required || p->given[k])
            continue;
        if (o->positional)
            return kvedge_why(p->why, p->why_len, KVEDGE_EINVAL, "missing %s", o->name);
        return kvedge_why(p->why, p->why_len, KVEDGE_EINVAL, "--%s is required", o->name);
    }
    return KVEDGE_OK;
}

int kvedge_cmdopts_parse(const kvedge_cmdopts_t *t, void *opts, int argc, char *const *argv,
                         bool *help, char *why, size_t why_len)
{
    if (!t || !opts || !help || argc < 0 || (argc && !argv) || t->count > KVEDGE_CMDOPTS_MAX)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "bad arguments");
    *help = false;
    kvedge_cmdopts_defaults(t, opts);
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *help = true; /* help asks for nothing else: not even a valid line */
            return KVEDGE_OK;
        }
    s_parser_t p = {.t = t, .opts = opts, .why = why, .why_len = why_len};
    bool dashdash = false;
    int i = 1, rc = KVEDGE_OK;
    while (i < argc && rc == KVEDGE_OK) {
        const char *arg = argv[i++];
        if (!dashdash && strcmp(arg, "--") == 0)
            dashdash = true;
        else if (dashdash || arg[0] != '-' || arg[1] == '\0')
            rc = s_positional(&p, arg);
        else if (arg[1] == '-')
            rc = s_long(&p, argc, argv, &i);
        else
            rc = s_short(&p, argc, argv, &i);
    }
    return rc == KVEDGE_OK ? s_finish(&p) : rc;
}

/* ---------------------------------------------------------------- help */

static void s_append(char *buf, size_t len, const char *fmt, const char *a, const char *b)
{
    size_t at = strlen(buf);
    if (at < len)
        snprintf(buf + at, len - at, fmt, a, b);
}

void kvedge_cmdopts_synopsis(const kvedge_cmdopts_t *t, char *buf, size_t len)
{
    if (!buf || !len)
        return;
    buf[0] = '\0';
    bool optional = false;
    for (size_t k = 0; t && k < t->count; k++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        if (!o->positional && o->required)
            s_append(buf, len, "%s--%s", buf[0] ? " " : "", o->name);
        if (!o->positional && o->required && o->arg)
            s_append(buf, len, " %s%s", o->arg, "");
        optional = optional || (!o->positional && !o->required);
    }
    if (optional)
        s_append(buf, len, "%s%s", buf[0] ? " " : "", "[OPTIONS]");
    for (size_t k = 0; t && k < t->count; k++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        if (!o->positional)
            continue;
        const char *more = o->type == KVEDGE_CMDOPT_STRS ? "..." : "";
        s_append(buf, len, "%s%s", buf[0] ? " " : "", "");
        if (o->required)
            s_append(buf, len, "%s%s", o->name, more);
        else
            s_append(buf, len, "[%s%s]", o->name, more);
    }
}

/* Writes text word-wrapped from column at (where the cursor is) to S_HELP_WIDTH, continuation
 * lines indented to S_HELP_COLUMN. */
static void s_wrap(FILE *f, size_t at, const char *text)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t w = strcspn(p, " ");
        if (!w)
            break;
        if (at > S_HELP_COLUMN && at + 1 + w > S_HELP_WIDTH) {
            fprintf(f, "\n%*s", S_HELP_COLUMN, "");
            at = S_HELP_COLUMN;
        } else if (at > S_HELP_COLUMN) {
            fputc(' ', f);
            at++;
        }
        fwrite(p, 1, w, f);
        at += w;
        p += w;
    }
    fputc('\n', f);
}

static void s_line(FILE *f, const char *left, const char *text)
{
    size_t n = strlen(left);
    fputs(left, f);
    if (n + 1 >= S_HELP_COLUMN)
        fprintf(f, "\n%*s", S_HELP_COLUMN, "");
    else
        fprintf(f, "%*s", (int)(S_HELP_COLUMN - n), "");
    s_wrap(f, S_HELP_COLUMN, text);
}

/* The help of o: its phrase, then what it is when not given (default, environment). */
static void s_opt_text(const kvedge_cmdopt_t *o, const void *defaults, char *text, size_t len)
{
    char value[128] = "", choices[200] = "";
    if (s_numeric(o->type) || o->type == KVEDGE_CMDOPT_ENUM) {
        kvedge_setting_t e;
        s_setting(o, &e);
        kvedge_settings_value(&e, defaults, 0, value, sizeof value);
    } else if (o->type == KVEDGE_CMDOPT_DOUBLE) {
        snprintf(value, sizeof value, "%g", o->def_double);
    } else if (o->type == KVEDGE_CMDOPT_STR && o->def) {
        snprintf(value, sizeof value, "%s", o->def);
    }
    if (o->def_text) {
        snprintf(value, sizeof value, "%s", o->def_text);
    }
    if (s_numeric(o->type) && (o->min > 0 || o->max < UINT64_MAX))
        snprintf(choices, sizeof choices, "; %llu to %llu", (unsigned long long)o->min,
                 (unsigned long long)o->max);
    snprintf(text, len, "%s", o->help);
    if (o->required && !o->positional)
        s_append(text, len, "%s%s", " (required)", "");
    else if (value[0] && !o->positional)
        s_append(text, len, " (default %s%s)", value, choices);
    if (o->type == KVEDGE_CMDOPT_STRS && !o->positional)
        s_append(text, len, "%s%s", " (repeatable)", "");
    if (o->env)
        s_append(text, len, " (env $%s)%s", o->env, "");
}

void kvedge_cmdopts_help(const kvedge_cmdopts_t *t, const char *prog, FILE *f)
{
    void *defaults = t ? calloc(1, t->struct_size ? t->struct_size : 1) : NULL;
    if (!defaults)
        return;
    kvedge_cmdopts_defaults(t, defaults);
    char syn[512], left[160], text[1200];
    kvedge_cmdopts_synopsis(t, syn, sizeof syn);
    fprintf(f, "usage: %s %s %s\n\n%s\n", prog ? prog : "kvedge", t->command, syn,
            t->summary ? t->summary : "");
    bool any_pos = false;
    for (size_t k = 0; k < t->count; k++)
        any_pos = any_pos || t->opts[k].positional;
    if (any_pos)
        fputs("\narguments:\n", f);
    for (size_t k = 0; k < t->count; k++)
        if (t->opts[k].positional) {
            snprintf(left, sizeof left, "  %s", t->opts[k].name);
            s_opt_text(&t->opts[k], defaults, text, sizeof text);
            s_line(f, left, text);
        }
    fputs("\noptions:\n", f);
    kvedge_cmdopts_options_help(t, f);
    s_line(f, "  -h, --help", "this help");
    if (t->about)
        fprintf(f, "\n%s", t->about);
    free(defaults);
}

void kvedge_cmdopts_opt_text(const kvedge_cmdopts_t *t, size_t k, char *text, size_t len)
{
    if (!text || !len)
        return;
    text[0] = '\0';
    void *defaults = t && k < t->count ? calloc(1, t->struct_size ? t->struct_size : 1) : NULL;
    if (!defaults)
        return;
    kvedge_cmdopts_defaults(t, defaults);
    s_opt_text(&t->opts[k], defaults, text, len);
    free(defaults);
}

void kvedge_cmdopts_options_help(const kvedge_cmdopts_t *t, FILE *f)
{
    void *defaults = t ? calloc(1, t->struct_size ? t->struct_size : 1) : NULL;
    if (!defaults)
        return;
    kvedge_cmdopts_defaults(t, defaults);
    char left[160], text[1200];
    for (size_t k = 0; k < t->count; k++) {
        const kvedge_cmdopt_t *o = &t->opts[k];
        if (o->positional)
            continue;
        char choices[200] = "";
        const char *arg = o->arg;
        for (const kvedge_setting_choice_t *c = o->choices; !arg && c && c->name; c++)
            s_append(choices, sizeof choices, "%s%s", c == o->choices ? "" : "|", c->name);
        if (!arg && choices[0])
            arg = choices;
        if (o->type == KVEDGE_CMDOPT_BOOL)
            arg = NULL;
        if (o->letter)
            snprintf(left, sizeof left, "  -%c, --%s%s%s", o->letter, o->name, arg ? " " : "",
                     arg ? arg : "");
        else
            snprintf(left, sizeof left, "      --%s%s%s", o->name, arg ? " " : "", arg ? arg : "");
        s_opt_text(o, defaults, text, sizeof text);
        s_line(f, left, text);
        if (o->alias) {
            snprintf(left, sizeof left, "      --%s%s%s", o->alias, arg ? " " : "", arg ? arg : "");
            snprintf(text, sizeof text, "deprecated alias of --%s, removed in the next release",
                     o->name);
            s_line(f, left, text);
        }
    }
    free(defaults);
}

/* ---------------------------------------------------------------- checks */

static bool s_name_ok(const char *w)
{
    if (!w || !*w || !islower((unsigned char)w[0]))
        return false;
    for (const char *p = w; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '-'))
            return false;
    return true;
}

static bool s_size_ok(const kvedge_cmdopt_t *o)
{
    switch (o->type) {
    case KVEDGE_CMDOPT_STR:
        return o->size == sizeof(const char *);
    case KVEDGE_CMDOPT_STRS:
        return o->size == sizeof(const char *) && o->list_max >= 1;
    case KVEDGE_CMDOPT_BOOL:
        return o->size == sizeof(bool);
    case KVEDGE_CMDOPT_ENUM:
        return o->size == sizeof(int) && o->choices && o->choices[0].name;
    case KVEDGE_CMDOPT_DOUBLE:
        return o->size == sizeof(double) && o->dmin <= o->def_double && o->def_double <= o->dmax;
    default:
        return ((o->size == 4 && o->max <= UINT32_MAX && o->def_num <= UINT32_MAX) ||
                o->size == 8) &&
               o->min <= o->max && (o->def_text || (o->def_num >= o->min && o->def_num <= o->max));
    }
}

static int s_check_one(const kvedge_cmdopts_t *t, size_t i, char *why, size_t len)
{
    const kvedge_cmdopt_t *o = &t->opts[i];
    const char *nm = o->name ? o->name : "(null)";
    if (!o->help || !*o->help)
        return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: no help", t->command, nm);
    if (!o->positional && (!s_name_ok(o->name) || (o->alias && !s_name_ok(o->alias))))
        return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: bad flag or alias", t->command, nm);
    if (!o->positional && (strcmp(o->name, "help") == 0 || o->letter == 'h'))
        return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: -h/--help is the engine's", t->command,
                          nm);
    if (o->positional && (!o->name || !*o->name || o->letter || o->alias || o->env))
        return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: a positional has a name only",
                          t->command, nm);
    if (o->positional && o->type == KVEDGE_CMDOPT_STRS)
        for (size_t j = i + 1; j < t->count; j++)
            if (t->opts[j].positional)
                return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: a list positional is last",
                                  t->command, nm);
    if (o->letter && !isalnum((unsigned char)o->letter))
        return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: bad short flag", t->command, nm);
    for (size_t j = 0; j < i && !o->positional; j++) {
        const kvedge_cmdopt_t *q = &t->opts[j];
        if (q->positional)
            continue;
        bool same =
            !strcmp(q->name, o->name) || (o->letter && q->letter == o->letter) ||
            (q->alias && !strcmp(q->alias, o->name)) ||
            (o->alias && (!strcmp(o->alias, q->name) || (q->alias && !strcmp(o->alias, q->alias))));
        if (same)
            return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: name, alias or letter used twice",
                              t->command, nm);
    }
    size_t end = o->offset + o->size * (o->type == KVEDGE_CMDOPT_STRS ? o->list_max : 1);
    if (end > t->struct_size || !s_size_ok(o) ||
        (o->type == KVEDGE_CMDOPT_STRS && o->count_offset + sizeof(size_t) > t->struct_size))
        return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: field, size, bounds or default",
                          t->command, nm);
    if (!o->positional && o->type != KVEDGE_CMDOPT_BOOL && o->type != KVEDGE_CMDOPT_ENUM && !o->arg)
        return kvedge_why(why, len, KVEDGE_EINVAL, "%s: %s: no argument name for --help",
                          t->command, nm);
    return KVEDGE_OK;
}

int kvedge_cmdopts_check(const kvedge_cmdopts_t *t, char *why, size_t why_len)
{
    if (!t || !t->command || !t->summary || !t->struct_size || (t->count && !t->opts))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "incomplete table");
    if (t->count > KVEDGE_CMDOPTS_MAX)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: more than %d options", t->command,
                          KVEDGE_CMDOPTS_MAX);
    for (size_t i = 0; i < t->count; i++) {
        int rc = s_check_one(t, i, why, why_len);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}
