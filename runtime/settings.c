/* The settings engine: defaults, a strict ZPL reader that knows line numbers, the flag
 * parser, --help and --check-config, all driven by one table per daemon (settings.h).
 *
 * Why our own reader and not zconfig: zconfig_load reports no line numbers, truncates long
 * lines silently at 1024 bytes, keeps duplicate keys and nested children it was never asked
 * about, and says only NULL on a syntax error. The subset daemons need (one section, `key =
 * value` children, quotes, comments) is small enough to read here line by line with every
 * length bounded and every refusal naming the file, the line and the key. It reads what
 * zconfig reads for that subset: 4-space indentation, name characters, bare values ending at
 * `#`, values in "double" or 'single' quotes. */
#include "runtime/settings.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/kvmsg.h"
#include "runtime/log.h"
#include "access/codec/error.h"
#include "access/codec/why.h"

#define S_FLAG_NAME_BYTES 64 /* how much of a mistyped flag a message repeats */

const kvedge_setting_choice_t kvedge_settings_log_levels[] = {{"error", KVEDGE_LOG_ERROR},
                                                              {"warn", KVEDGE_LOG_WARN},
                                                              {"info", KVEDGE_LOG_INFO},
                                                              {"debug", KVEDGE_LOG_DEBUG},
                                                              {NULL, 0}};

/* ---------------------------------------------------------------- fields */

static void *s_field(const kvedge_setting_t *e, void *settings)
{
    return (char *)settings + e->offset;
}

static const void *s_cfield(const kvedge_setting_t *e, const void *settings)
{
    return (const char *)settings + e->offset;
}

static size_t *s_count(const kvedge_setting_t *e, void *settings)
{
    return (size_t *)(void *)((char *)settings + e->count_offset);
}

static size_t s_ccount(const kvedge_setting_t *e, const void *settings)
{
    size_t n;
    memcpy(&n, (const char *)settings + e->count_offset, sizeof n);
    return n;
}

static uint64_t s_get_num(const kvedge_setting_t *e, const void *settings)
{
    if (e->size == sizeof(uint32_t)) {
        uint32_t v;
        memcpy(&v, s_cfield(e, settings), sizeof v);
        return v;
    }
    uint64_t v;
    memcpy(&v, s_cfield(e, settings), sizeof v);
    return v;
}

static void s_put_num(const kvedge_setting_t *e, void *settings, uint64_t v)
{
    if (e->size == sizeof(uint32_t)) {
        uint32_t w = (uint32_t)v; /* the table check keeps max within 32 bits */
        memcpy(s_field(e, settings), &w, sizeof w);
    } else {
        memcpy(s_field(e, settings), &v, sizeof v);
    }
}

/* Stores a string zero-filled, so two settings structs that were set alike compare equal. */
static void s_put_str(char *dst, size_t cap, const char *v)
{
    memset(dst, 0, cap);
    memcpy(dst, v, strlen(v));
}

/* ---------------------------------------------------------------- parsing values */

static bool s_ieq(const char *a, const char *b)
{
    return strcasecmp(a, b) == 0;
}

static int s_parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"yes", "on", "true", "1"};
    static const char *const no[] = {"no", "off", "false", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (s_ieq(v, yes[i])) {
            *out = true;
            return 0;
        }
        if (s_ieq(v, no[i])) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

typedef struct {
    const char *suffix; /* lower case */
    uint64_t mul;
} s_unit_t;

static const s_unit_t s_size_units[] = {{"", 1},
                                        {"b", 1},
                                        {"k", 1ull << 10},
                                        {"kb", 1ull << 10},
                                        {"kib", 1ull << 10},
                                        {"m", 1ull << 20},
                                        {"mb", 1ull << 20},
                                        {"mib", 1ull << 20},
                                        {"g", 1ull << 30},
                                        {"gb", 1ull << 30},
                                        {"gib", 1ull << 30},
                                        {"t", 1ull << 40},
                                        {"tb", 1ull << 40},
                                        {"tib", 1ull << 40},
                                        {NULL, 0}};
static const s_unit_t s_ms_units[] = {{"", 1},      {"ms", 1},      {"s", 1000},
                                      {"m", 60000}, {"h", 3600000}, {NULL, 0}};
static const s_unit_t s_sec_units[] = {{"", 1}, {"s", 1}, {"m", 60}, {"h", 3600}, {NULL, 0}};

/* A decimal number, optionally with a fraction (when units scale it), then an optional unit
 * from units. Fractions round down to the field's unit ("1.5K" = 1536, "0.5ms" = 0). Returns
 * 0, -1 when it is not such a number, -2 when it overflows. */
static int s_parse_scaled(const char *v, const s_unit_t *units, bool fraction, uint64_t *out)
{
    const char *p = v;
    if (!isdigit((unsigned char)*p))
        return -1;
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    for (; isdigit((unsigned char)*p); p++) {
        whole = whole * 10 + (unsigned)(*p - '0');
        if (whole > UINT64_MAX)
            return -2;
    }
    if (*p == '.' && fraction) {
        p++;
        if (!isdigit((unsigned char)*p))
            return -1;
        for (; isdigit((unsigned char)*p); p++)
            if (scale < 1000000000000000000ull) { /* digits past 18 cannot change the result */
                frac = frac * 10 + (unsigned)(*p - '0');
                scale *= 10;
            }
    }
    char unit[8];
    size_t n = strlen(p);
    if (n >= sizeof unit)
        return -1;
    for (size_t i = 0; i < n && i < sizeof unit - 1; i++)
        unit[i] = (char)tolower((unsigned char)p[i]);
    unit[n] = '\0';
    for (const s_unit_t *u = units; u->suffix; u++)
        if (strcmp(unit, u->suffix) == 0) {
            unsigned __int128 r = whole * u->mul + frac * u->mul / scale;
            if (r > UINT64_MAX)
                return -2;
            *out = (uint64_t)r;
            return 0;
        }
    return -1;
}

static const s_unit_t *s_units(kvedge_setting_type_t type)
{
    switch (type) {
    case KVEDGE_SETTING_SIZE:
        return s_size_units;
    case KVEDGE_SETTING_MS:
        return s_ms_units;
    case KVEDGE_SETTING_SECONDS:
        return s_sec_units;
    default:
        return NULL;
    }
}

static const char *s_number_form(kvedge_setting_type_t type)
{
    switch (type) {
    case KVEDGE_SETTING_SIZE:
        return "a size (bytes, or with K, M, G, T)";
    case KVEDGE_SETTING_MS:
        return "a duration (milliseconds, or with ms, s, m, h)";
    case KVEDGE_SETTING_SECONDS:
        return "a duration (seconds, or with s, m, h)";
    default:
        return "a whole number";
    }
}

/* The choices of an ENUM as "a|b|c". */
static void s_choices(const kvedge_setting_t *e, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (const kvedge_setting_choice_t *c = e->choices; c && c->name && at < len; c++) {
        int n = snprintf(buf + at, len - at, "%s%s", at ? "|" : "", c->name);
        if (n < 0)
            break;
        at += (size_t)n;
    }
}

/* Checks a STRING or LIST value: length, control characters, the entry's own check. */
static int s_check_string(const kvedge_setting_t *e, const char *v, char *why, size_t len)
{
    size_t n = strlen(v);
    if (n >= e->size)
        return kvedge_why(why, len, -1, "value too long (%zu bytes, at most %zu)", n, e->size - 1);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return kvedge_why(why, len, -1, "control character in the value");
    if (e->check && v[0]) {
        char reason[200] = "";
        if (e->check(v, reason, sizeof reason) != 0)
            return kvedge_why(why, len, -1, "'%s' %s", v, reason);
    }
    return 0;
}

/* Sets e from text v. For a LIST, v is appended. On failure settings is unchanged and why
 * holds the reason (without the key). */
static int s_set_value(const kvedge_setting_t *e, void *settings, const char *v, char *why,
                       size_t len)
{
    switch (e->type) {
    case KVEDGE_SETTING_STRING:
        if (s_check_string(e, v, why, len) != 0)
            return -1;
        s_put_str(s_field(e, settings), e->size, v);
        return 0;
    case KVEDGE_SETTING_LIST: {
        size_t *n = s_count(e, settings);
        if (*n >= e->list_max)
            return kvedge_why(why, len, -1, "more than %zu values", e->list_max);
        if (s_check_string(e, v, why, len) != 0)
            return -1;
        s_put_str((char *)s_field(e, settings) + *n * e->size, e->size, v);
        (*n)++;
        return 0;
    }
    case KVEDGE_SETTING_BOOL: {
        bool b;
        if (s_parse_bool(v, &b) != 0)
            return kvedge_why(why, len, -1, "'%s' is not a boolean (yes/no/on/off/true/false/1/0)",
                              v);
        memcpy(s_field(e, settings), &b, sizeof b);
        return 0;
    }
    case KVEDGE_SETTING_ENUM:
        for (const kvedge_setting_choice_t *c = e->choices; c && c->name; c++)
            if (s_ieq(v, c->name)) {
                memcpy(s_field(e, settings), &c->value, sizeof c->value);
                return 0;
            }
        char names[200];
        s_choices(e, names, sizeof names);
        return kvedge_why(why, len, -1, "'%s' is not one of %s", v, names);
    case KVEDGE_SETTING_UINT:
    case KVEDGE_SETTING_SIZE:
    case KVEDGE_SETTING_MS:
    case KVEDGE_SETTING_SECONDS: {
        uint64_t x = 0;
        const s_unit_t plain[] = {{"", 1}, {NULL, 0}};
        const s_unit_t *units = s_units(e->type);
        int rc = s_parse_scaled(v, units ? units : plain, units != NULL, &x);
        if (rc == -1)
            return kvedge_why(why, len, -1, "'%s' is not %s", v, s_number_form(e->type));
        if (rc == -2 || x < e->min || x > e->max)
            return kvedge_why(why, len, -1, "'%s' is out of range (%llu to %llu)", v,
                              (unsigned long long)e->min, (unsigned long long)e->max);
        s_put_num(e, settings, x);
        return 0;
    }
    }
    return kvedge_why(why, len, -1, "unknown setting type");
}

/* ---------------------------------------------------------------- formatting values */

static int s_format_num(const kvedge_setting_t *e, uint64_t v, char *buf, size_t len)
{
    static const struct {
        char suffix;
        unsigned shift;
    } sizes[] = {{'T', 40}, {'G', 30}, {'M', 20}, {'K', 10}};
    if (e->type == KVEDGE_SETTING_SIZE && v)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            if (v % (1ull << sizes[i].shift) == 0) {
                int n = snprintf(buf, len, "%llu%c", (unsigned long long)(v >> sizes[i].shift),
                                 sizes[i].suffix);
                return n >= 0 && (size_t)n < len ? 0 : KVEDGE_ENOSPACE;
            }
    int n = snprintf(buf, len, "%llu", (unsigned long long)v);
    return n >= 0 && (size_t)n < len ? 0 : KVEDGE_ENOSPACE;
}

static int s_copy_out(const char *v, char *buf, size_t len)
{
    if (strlen(v) >= len)
        return KVEDGE_ENOSPACE;
    memcpy(buf, v, strlen(v) + 1);
    return KVEDGE_OK;
}

int kvedge_settings_value(const kvedge_setting_t *e, const void *settings, size_t item, char *buf,
                          size_t len)
{
    if (!e || !settings || !buf || !len)
        return KVEDGE_EINVAL;
    if (e->type == KVEDGE_SETTING_LIST) {
        if (item >= s_ccount(e, settings))
            return KVEDGE_ENOTFOUND;
        const char *v = (const char *)s_cfield(e, settings) + item * e->size;
        return s_copy_out(v, buf, len);
    }
    if (item != 0)
        return KVEDGE_ENOTFOUND;
    switch (e->type) {
    case KVEDGE_SETTING_STRING:
        return s_copy_out(s_cfield(e, settings), buf, len);
    case KVEDGE_SETTING_BOOL: {
        bool b;
        memcpy(&b, s_cfield(e, settings), sizeof b);
        return s_copy_out(b ? "yes" : "no", buf, len);
    }
    case KVEDGE_SETTING_ENUM: {
        int v;
        memcpy(&v, s_cfield(e, settings), sizeof v);
        for (const kvedge_setting_choice_t *c = e->choices; c && c->name; c++)
            if (c->value == v)
                return s_copy_out(c->name, buf, len);
        int n = snprintf(buf, len, "%d", v); /* not a choice: only a caller can put it there */
        return n >= 0 && (size_t)n < len ? KVEDGE_OK : KVEDGE_ENOSPACE;
    }
    default:
        return s_format_num(e, s_get_num(e, settings), buf, len);
    }
}

/* Writes v as a ZPL value: bare when the reader gives it back as is, else quoted. */
static void s_print_value(FILE *f, const char *v)
{
    size_t n = strlen(v);
    bool bare = n > 0 && !strchr(v, '#') && v[0] != '"' && v[0] != '\'' &&
                !isspace((unsigned char)v[0]) && !isspace((unsigned char)v[n - 1]);
    if (bare)
        fputs(v, f);
    else if (!strchr(v, '"'))
        fprintf(f, "\"%s\"", v);
    else
        fprintf(f, "'%s'", v); /* a value with both quote kinds and a '#' cannot be written */
}

void kvedge_settings_print(const kvedge_settings_table_t *t, const void *settings, FILE *f)
{
    char buf[KVEDGE_SETTINGS_LINE_MAX_BYTES];
    fprintf(f, "%s\n", t->daemon);
    for (size_t i = 0; i < t->count; i++) {
        const kvedge_setting_t *e = &t->settings[i];
        size_t items = e->type == KVEDGE_SETTING_LIST ? s_ccount(e, settings) : 1;
        if (items == 0)
            fprintf(f, "    # %s: none\n", e->key);
        for (size_t k = 0; k < items; k++) {
            if (kvedge_settings_value(e, settings, k, buf, sizeof buf) != KVEDGE_OK)
                continue;
            fprintf(f, "    %s = ", e->key);
            s_print_value(f, buf);
            fputc('\n', f);
        }
    }
}

/* ---------------------------------------------------------------- defaults */

const kvedge_setting_t *kvedge_settings_find(const kvedge_settings_table_t *t, const char *key)
{
    for (size_t i = 0; t && key && i < t->count; i++)
        if (strcmp(t->settings[i].key, key) == 0)
            return &t->settings[i];
    return NULL;
}

static void s_default(const kvedge_setting_t *e, void *settings)
{
    switch (e->type) {
    case KVEDGE_SETTING_STRING:
        s_put_str(s_field(e, settings), e->size, e->def ? e->def : "");
        break;
    case KVEDGE_SETTING_LIST:
        memset(s_field(e, settings), 0, e->size * e->list_max);
        *s_count(e, settings) = 0;
        break;
    case KVEDGE_SETTING_BOOL: {
        bool b = e->def_num != 0;
        memcpy(s_field(e, settings), &b, sizeof b);
        break;
    }
    case KVEDGE_SETTING_ENUM:
        for (const kvedge_setting_choice_t *c = e->choices; c && c->name; c++)
            if (e->def && strcmp(c->name, e->def) == 0)
                memcpy(s_field(e, settings), &c->value, sizeof c->value);
        break;
    default:
        s_put_num(e, settings, e->def_num);
        break;
    }
}

void kvedge_settings_defaults(const kvedge_settings_table_t *t, void *settings)
{
    if (!t || !settings)
        return;
    memset(settings, 0, t->struct_size);
    for (size_t i = 0; i < t->count; i++)
        s_default(&t->settings[i], settings);
}

int kvedge_settings_set(const kvedge_settings_table_t *t, void *settings, const char *key,
                        const char *value, char *why, size_t why_len)
{
    const kvedge_setting_t *e = kvedge_settings_find(t, key);
    if (!e || !settings || !value)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: unknown setting", key ? key : "(null)");
    char reason[400];
    if (s_set_value(e, settings, value, reason, sizeof reason) != 0)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: %s", key, reason);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- suggestions */

/* Edit distance of two short words (longer ones get no suggestion). */
static size_t s_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return SIZE_MAX;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best =
                diag + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The setting a mistyped word most likely meant: its key or flag spelled the other way
 * ("log-level" in a file, "--sync_interval" on a line), else the nearest within 2 edits. */
static const kvedge_setting_t *s_suggest(const kvedge_settings_table_t *t, const char *word,
                                         bool as_flag)
{
    const kvedge_setting_t *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < t->count; i++) {
        const kvedge_setting_t *e = &t->settings[i];
        const char *mine = as_flag ? e->flag : e->key, *other = as_flag ? e->key : e->flag;
        if (strcmp(word, other) == 0)
            return e;
        size_t d = s_distance(word, mine);
        if (d < best_d) {
            best_d = d;
            best = e;
        }
    }
    return best;
}

const char *kvedge_settings_nearest(const char *word, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; word && names && i < n; i++) {
        if (!names[i])
            continue;
        char other[S_FLAG_NAME_BYTES];
        snprintf(other, sizeof other, "%s", names[i]);
        for (char *p = other; *p; p++)
            *p = *p == '-' ? '_' : *p == '_' ? '-' : *p;
        if (strcmp(word, other) == 0)
            return names[i];
        size_t d = s_distance(word, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}

int kvedge_setting_parse(const kvedge_setting_t *e, void *settings, const char *value, char *why,
                         size_t why_len)
{
    if (!e || !settings || !value)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "bad arguments");
    return s_set_value(e, settings, value, why, why_len) == 0 ? KVEDGE_OK : KVEDGE_EINVAL;
}

void kvedge_setting_default(const kvedge_setting_t *e, void *settings)
{
    if (e && settings)
        s_default(e, settings);
}

/* ---------------------------------------------------------------- the config reader */

static bool s_is_namechar(char c)
{
    return isalnum((unsigned char)c) || c == '$' || c == '-' || c == '_' || c == '@' || c == '.' ||
           c == '&' || c == '+' || c == '/';
}

/* After a value: only blanks and a comment may follow. */
static bool s_rest_is_comment(const char *p)
{
    while (*p == ' ' || *p == '\t')
        p++;
    return *p == '\0' || *p == '#';
}

typedef struct {
    const kvedge_settings_table_t *t;
    void *settings; /* the scratch copy being filled */
    const char *name;
    char *why;
    size_t why_len;
    unsigned lineno;
    unsigned section_line;                       /* 0 until the section */
    unsigned seen[KVEDGE_SETTINGS_MAX_SETTINGS]; /* line each key was set on, 0 = not yet */
} s_reader_t;

static int s_fail(s_reader_t *r, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Refuses the file: "NAME:LINE: KEY: reason" (no "KEY: " when the line has none). */
static int s_fail(s_reader_t *r, const char *key, const char *fmt, ...)
{
    char reason[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (key && *key)
        return kvedge_why(r->why, r->why_len, KVEDGE_EINVAL, "%s:%u: %.80s: %s", r->name, r->lineno,
                          key, reason);
    return kvedge_why(r->why, r->why_len, KVEDGE_EINVAL, "%s:%u: %s", r->name, r->lineno, reason);
}

/* One line, without its newline, NUL-terminated, at most LINE_MAX_BYTES. */
static int s_read_line(s_reader_t *r, char *line)
{
    size_t n = strlen(line);
    while (n && isspace((unsigned char)line[n - 1])) /* \r of CRLF files too */
        line[--n] = '\0';
    size_t ind = 0;
    while (line[ind] == ' ')
        ind++;
    const char *p = line + ind;
    if (*p == '\t')
        return s_fail(r, NULL, "tab in the indentation (ZPL indents with 4 spaces per level)");
    if (*p == '\0' || *p == '#')
        return 0;
    char key[KVEDGE_SETTINGS_LINE_MAX_BYTES + 1];
    size_t kn = 0;
    while (s_is_namechar(p[kn]))
        kn++;
    memcpy(key, p, kn);
    key[kn] = '\0';
    p += kn;
    if (kn == 0)
        return s_fail(r, NULL, "malformed line: expected `key = value` or a section name");
    if (ind % 4 != 0)
        return s_fail(r, key, "indented by %zu spaces: ZPL indents with 4 spaces per level", ind);
    while (*p == ' ' || *p == '\t')
        p++;
    bool has_value = *p == '=';
    if (!has_value && *p != '\0' && *p != '#')
        return s_fail(r, key, "malformed line: expected `%s = value`", key);
    if (ind == 0) {
        if (has_value)
            return s_fail(r, key, "setting outside a section: indent it by 4 spaces under `%s`",
                          r->t->daemon);
        if (strcmp(key, r->t->daemon) != 0)
            return s_fail(r, key,
                          "unknown section (this file is read by `kvedge %s`: its section is "
                          "`%s`)",
                          r->t->daemon, r->t->daemon);
        if (r->section_line)
            return s_fail(r, key, "section given twice (first at line %u)", r->section_line);
        r->section_line = r->lineno;
        return 0;
    }
    if (ind > 4)
        return s_fail(r, key, "indented too deep: settings are one level (4 spaces) under `%s`",
                      r->t->daemon);
    if (!r->section_line)
        return s_fail(r, key, "setting before the section: start the file with a line `%s`",
                      r->t->daemon);
    const kvedge_setting_t *e = kvedge_settings_find(r->t, key);
    if (!e) {
        const kvedge_setting_t *s = s_suggest(r->t, key, false);
        if (s)
            return s_fail(r, key, "unknown setting in section `%s` (did you mean `%s`?)",
                          r->t->daemon, s->key);
        return s_fail(r, key, "unknown setting in section `%s`", r->t->daemon);
    }
    if (!has_value)
        return s_fail(r, key, "no value: write `%s = VALUE`", key);
    size_t idx = (size_t)(e - r->t->settings);
    if (r->seen[idx] && e->type != KVEDGE_SETTING_LIST)
        return s_fail(r, key, "set twice (first at line %u)", r->seen[idx]);
    /* The value: quoted up to the same quote, or bare up to a comment, blanks trimmed. */
    p++;
    while (*p == ' ' || *p == '\t')
        p++;
    char value[KVEDGE_SETTINGS_LINE_MAX_BYTES + 1];
    if (*p == '"' || *p == '\'') {
        const char *end = strchr(p + 1, *p);
        if (!end)
            return s_fail(r, key, "missing closing %c", *p);
        if (!s_rest_is_comment(end + 1))
            return s_fail(r, key, "text after the closing quote");
        memcpy(value, p + 1, (size_t)(end - p - 1));
        value[end - p - 1] = '\0';
    } else {
        const char *end = strchr(p, '#');
        size_t vn = end ? (size_t)(end - p) : strlen(p);
        while (vn && isspace((unsigned char)p[vn - 1]))
            vn--;
        memcpy(value, p, vn);
        value[vn] = '\0';
    }
    if (e->type == KVEDGE_SETTING_LIST && !r->seen[idx])
        *s_count(e, r->settings) = 0; /* the file's list replaces what was there */
    char reason[600];
    if (s_set_value(e, r->settings, value, reason, sizeof reason) != 0)
        return s_fail(r, key, "%s", reason);
    if (!r->seen[idx])
        r->seen[idx] = r->lineno;
    return 0;
}

int kvedge_settings_load_text(const kvedge_settings_table_t *t, void *settings, const char *name,
                              const char *text, size_t len, char *why, size_t why_len)
{
    if (!t || !settings || (!text && len) || t->count > KVEDGE_SETTINGS_MAX_SETTINGS)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "bad arguments");
    if (!name)
        name = "(config)";
    s_reader_t r = {t, NULL, name, why, why_len, 0, 0, {0}};
    if (len > KVEDGE_SETTINGS_FILE_MAX_BYTES)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: larger than %u bytes", name,
                          KVEDGE_SETTINGS_FILE_MAX_BYTES);
    const char *nul = len ? memchr(text, '\0', len) : NULL;
    if (nul) {
        r.lineno = 1;
        for (const char *q = text; q < nul; q++)
            r.lineno += *q == '\n';
        return s_fail(&r, NULL, "NUL byte: not a text file");
    }
    r.settings = malloc(t->struct_size);
    char *line = malloc(KVEDGE_SETTINGS_LINE_MAX_BYTES + 1);
    if (!r.settings || !line) {
        free(r.settings);
        free(line);
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", name);
    }
    memcpy(r.settings, settings, t->struct_size);
    int rc = KVEDGE_OK;
    size_t at = 0;
    while (at < len && rc == KVEDGE_OK) {
        const char *eol = memchr(text + at, '\n', len - at);
        size_t n = eol ? (size_t)(eol - (text + at)) : len - at;
        r.lineno++;
        if (n > KVEDGE_SETTINGS_LINE_MAX_BYTES) {
            /* Name the key when the line starts like a setting, so the message says which. */
            size_t i = 0, k;
            while (i < n && text[at + i] == ' ')
                i++;
            for (k = i; k < n && k - i < 64 && s_is_namechar(text[at + k]); k++)
                ;
            char key[65];
            memcpy(key, text + at + i, k - i);
            key[k - i] = '\0';
            rc = s_fail(&r, key, "line longer than %d bytes", KVEDGE_SETTINGS_LINE_MAX_BYTES);
            break;
        }
        memcpy(line, text + at, n);
        line[n] = '\0';
        rc = s_read_line(&r, line);
        at += n + (eol ? 1 : 0);
    }
    if (rc == KVEDGE_OK)
        memcpy(settings, r.settings, t->struct_size);
    free(line);
    free(r.settings);
    return rc;
}

int kvedge_settings_load_file(const kvedge_settings_table_t *t, void *settings, const char *path,
                              char *why, size_t why_len)
{
    if (!path)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no config file named");
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: cannot read the config file: %s", path,
                          strerror(errno));
    /* One byte more than the limit tells a file at the limit from one past it. */
    char *buf = malloc(KVEDGE_SETTINGS_FILE_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, KVEDGE_SETTINGS_FILE_MAX_BYTES + 1, f);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    int rc;
    if (err)
        rc = kvedge_why(why, why_len, KVEDGE_EIO, "%s: cannot read the config file: %s", path,
                        strerror(err ? err : EIO));
    else if (n > KVEDGE_SETTINGS_FILE_MAX_BYTES)
        rc = kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: config file larger than %u bytes", path,
                        KVEDGE_SETTINGS_FILE_MAX_BYTES);
    else
        rc = kvedge_settings_load_text(t, settings, path, buf, n, why, why_len);
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------- the command line */

typedef enum { S_ARG_SETTING, S_ARG_CONFIG, S_ARG_CHECK, S_ARG_HELP } s_arg_kind_t;

typedef struct {
    s_arg_kind_t kind;
    const kvedge_setting_t *e;    /* S_ARG_SETTING */
    const char *value;            /* NULL: a bool flag given alone */
    char name[S_FLAG_NAME_BYTES]; /* as spelled, for messages ("--sync", "-w") */
} s_arg_t;

/* The next option of argv from *i on. Returns 1 with *a filled, 0 at the end, or an error. */
static int s_next_arg(const kvedge_settings_table_t *t, int argc, char *const *argv, int *i,
                      s_arg_t *a, char *why, size_t why_len)
{
    if (*i >= argc)
        return 0;
    const char *arg = argv[(*i)++];
    memset(a, 0, sizeof *a);
    const char *attached = NULL;
    if (strcmp(arg, "--") == 0) {
        if (*i < argc)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "unexpected argument '%s'", argv[*i]);
        return 0;
    }
    if (arg[0] != '-' || arg[1] == '\0')
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "unexpected argument '%s'", arg);
    if (arg[1] == '-') {
        const char *nm = arg + 2, *eq = strchr(nm, '=');
        size_t n = eq ? (size_t)(eq - nm) : strlen(nm);
        snprintf(a->name, sizeof a->name, "--%.*s", (int)n, nm);
        attached = eq ? eq + 1 : NULL;
        bool special = true;
        if (n == 6 && strncmp(nm, "config", 6) == 0)
            a->kind = S_ARG_CONFIG;
        else if (n == 12 && strncmp(nm, "check-config", 12) == 0)
            a->kind = S_ARG_CHECK;
        else if (n == 4 && strncmp(nm, "help", 4) == 0)
            a->kind = S_ARG_HELP;
        else
            special = false;
        for (size_t k = 0; !special && k < t->count; k++)
            if (strlen(t->settings[k].flag) == n && strncmp(t->settings[k].flag, nm, n) == 0)
                a->e = &t->settings[k];
        if (!special && !a->e) {
            char word[S_FLAG_NAME_BYTES];
            snprintf(word, sizeof word, "%.*s", (int)n, nm);
            const kvedge_setting_t *s = s_suggest(t, word, true);
            if (s)
                return kvedge_why(why, why_len, KVEDGE_EINVAL,
                                  "%s: unknown option (did you mean --%s?)", a->name, s->flag);
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: unknown option", a->name);
        }
    } else {
        snprintf(a->name, sizeof a->name, "-%c", arg[1]);
        attached = arg[2] ? arg + 2 : NULL;
        if (arg[1] == 'c')
            a->kind = S_ARG_CONFIG;
        else if (arg[1] == 'h')
            a->kind = S_ARG_HELP;
        for (size_t k = 0; a->kind == S_ARG_SETTING && k < t->count; k++)
            if (t->settings[k].letter == arg[1])
                a->e = &t->settings[k];
        if (a->kind == S_ARG_SETTING && !a->e)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: unknown option", a->name);
    }
    bool takes = a->kind == S_ARG_CONFIG || (a->e && a->e->type != KVEDGE_SETTING_BOOL);
    if (a->kind == S_ARG_HELP || a->kind == S_ARG_CHECK || (a->e && !takes)) {
        /* Only a long bool takes an attached value: "-Ifoo" would be ambiguous. */
        if (attached && !(a->e && arg[1] == '-'))
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: takes no value", a->name);
        a->value = attached;
        return 1;
    }
    if (!attached) {
        if (*i >= argc)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: needs a value (%s)", a->name,
                              a->e && a->e->arg ? a->e->arg : "FILE");
        attached = argv[(*i)++];
    }
    a->value = attached;
    return 1;
}

int kvedge_settings_resolve(const kvedge_settings_table_t *t, void *settings, int argc,
                            char *const *argv, kvedge_settings_args_t *args, char *why,
                            size_t why_len)
{
    if (!t || !settings || !args || argc < 0 || (argc && !argv) ||
        t->count > KVEDGE_SETTINGS_MAX_SETTINGS)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "bad arguments");
    memset(args, 0, sizeof *args);
    kvedge_settings_defaults(t, settings);
    /* Pass 1: the shape of the line, --config, --help, --check-config. */
    s_arg_t a;
    int i = 1, rc;
    while ((rc = s_next_arg(t, argc, argv, &i, &a, why, why_len)) == 1) {
        if (a.kind == S_ARG_HELP)
            args->help = true;
        else if (a.kind == S_ARG_CHECK)
            args->check = true;
        else if (a.kind == S_ARG_CONFIG && args->config)
            return kvedge_why(why, why_len, KVEDGE_EINVAL,
                              "%s: config file given twice ('%s' and "
                              "'%s')",
                              a.name, args->config, a.value);
        else if (a.kind == S_ARG_CONFIG)
            args->config = a.value;
    }
    if (args->help)
        return KVEDGE_OK; /* help asks for nothing else: not even a valid line */
    if (rc != 0)
        return rc;
    if (args->config) {
        rc = kvedge_settings_load_file(t, settings, args->config, why, why_len);
        if (rc != KVEDGE_OK)
            return rc;
    }
    /* Pass 2: the flags over the file, in order. */
    bool listed[KVEDGE_SETTINGS_MAX_SETTINGS] = {false};
    i = 1;
    while (s_next_arg(t, argc, argv, &i, &a, why, why_len) == 1) {
        if (a.kind != S_ARG_SETTING)
            continue;
        size_t idx = (size_t)(a.e - t->settings);
        if (a.e->type == KVEDGE_SETTING_LIST && !listed[idx]) {
            *s_count(a.e, settings) = 0; /* flags replace the file's list */
            listed[idx] = true;
        }
        char reason[600];
        if (s_set_value(a.e, settings, a.value ? a.value : "yes", reason, sizeof reason) != 0)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: %s", a.name, reason);
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- help */

#define S_HELP_COLUMN 28
#define S_HELP_WIDTH  79

/* Writes text word-wrapped from column `at` (where the cursor is) to S_HELP_WIDTH, continuation
 * lines indented to S_HELP_COLUMN; \001 joins words that stay on one line. */
static void s_wrap(FILE *f, size_t at, const char *text)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t w = strcspn(p, " ");
        if (at > S_HELP_COLUMN && at + 1 + w > S_HELP_WIDTH) {
            fprintf(f, "\n%*s", S_HELP_COLUMN, "");
            at = S_HELP_COLUMN;
        } else if (at > S_HELP_COLUMN) {
            fputc(' ', f);
            at++;
        }
        for (size_t k = 0; k < w; k++) /* \001 is a space that does not break */
            fputc(p[k] == '\001' ? ' ' : p[k], f);
        at += w;
        p += w;
    }
    fputc('\n', f);
}

static void s_help_line(FILE *f, char letter, const char *flag, const char *arg, const char *text)
{
    char left[128];
    if (letter)
        snprintf(left, sizeof left, "  -%c, --%s%s%s", letter, flag, arg ? " " : "",
                 arg ? arg : "");
    else
        snprintf(left, sizeof left, "      --%s%s%s", flag, arg ? " " : "", arg ? arg : "");
    size_t n = strlen(left);
    fputs(left, f);
    if (n + 1 >= S_HELP_COLUMN) {
        fprintf(f, "\n%*s", S_HELP_COLUMN, "");
    } else {
        fprintf(f, "%*s", (int)(S_HELP_COLUMN - n), "");
    }
    s_wrap(f, S_HELP_COLUMN, text);
}

void kvedge_settings_help(const kvedge_settings_table_t *t, FILE *f)
{
    void *defaults = t ? malloc(t->struct_size) : NULL;
    if (!defaults)
        return;
    kvedge_settings_defaults(t, defaults);
    fprintf(f,
            "options (in brackets: the key in section `%s` of a --config file, and the "
            "default):\n",
            t->daemon);
    for (size_t i = 0; i < t->count; i++) {
        const kvedge_setting_t *e = &t->settings[i];
        char text[1200], value[KVEDGE_SETTINGS_LINE_MAX_BYTES] = "";
        if (e->type == KVEDGE_SETTING_LIST) {
            snprintf(text, sizeof text, "%s [%s\001=\001none;\001repeatable,\001at\001most\001%zu]",
                     e->help, e->key, e->list_max);
        } else {
            kvedge_settings_value(e, defaults, 0, value, sizeof value);
            snprintf(text, sizeof text, "%s [%s\001=\001%s%s%s]", e->help, e->key,
                     value[0] ? "" : "\"", value, value[0] ? "" : "\"");
        }
        char arg[200];
        const char *shown = e->arg;
        if (e->type == KVEDGE_SETTING_ENUM && !e->arg) {
            s_choices(e, arg, sizeof arg);
            shown = arg;
        }
        s_help_line(f, e->letter, e->flag, e->type == KVEDGE_SETTING_BOOL ? NULL : shown, text);
    }
    char text[200];
    snprintf(text, sizeof text, "read the settings from FILE (ZPL, section `%s`) before the flags",
             t->daemon);
    s_help_line(f, 'c', "config", "FILE", text);
    s_help_line(f, 0, "check-config", NULL,
                "check the flags and the file, print the resolved settings as a config file, "
                "start nothing");
    s_help_line(f, 'h', "help", NULL, "this help");
    fputs("\nFlags override the file; --config may come anywhere on the line. A boolean flag\n"
          "alone means yes, --flag=no turns it off; in the file a boolean is one of\n"
          "yes/no/on/off/true/false/1/0. Sizes take K, M, G, T (powers of 1024), durations\n"
          "ms, s, m, h. An unknown section or key, a bad value, a key set twice or a malformed\n"
          "line stops the daemon with the file, the line and the key (exit code 2).\n",
          f);
    free(defaults);
}

/* ---------------------------------------------------------------- checks */

int kvedge_settings_check_endpoint(const char *v, char *why, size_t why_len)
{
    if (!v || !*v)
        return 0;
    if (strncmp(v, "ipc://", 6) == 0 || strncmp(v, "inproc://", 9) == 0) {
        if (!v[strncmp(v, "ipc://", 6) == 0 ? 6 : 9])
            return kvedge_why(why, why_len, -1, "is not an endpoint: no path or name");
        return 0;
    }
    if (strncmp(v, "tcp://", 6) == 0) {
        const char *colon = strrchr(v + 6, ':');
        if (!colon || colon == v + 6 || !colon[1])
            return kvedge_why(why, why_len, -1, "is not an endpoint: want tcp://HOST:PORT");
        /* libzmq would take "99999" modulo 2^16 (or refuse it late): a port is 1-65535, or *
         * for any free one. */
        const char *port = colon + 1;
        size_t digits = strspn(port, "0123456789");
        if (strcmp(port, "*") != 0 &&
            (digits == 0 || port[digits] || digits > 5 || atol(port) < 1 || atol(port) > 65535))
            return kvedge_why(why, why_len, -1,
                              "is not an endpoint: port '%s' is not 1 to 65535 (or * for any "
                              "free port)",
                              port);
        return 0;
    }
    return kvedge_why(why, why_len, -1,
                      "is not an endpoint (tcp://HOST:PORT, ipc://PATH or inproc://NAME)");
}

int kvedge_settings_check_id(const char *v, char *why, size_t why_len)
{
    if (!v || !*v || kvedge_master_id_ok(v))
        return 0;
    return kvedge_why(why, why_len, -1, "is not an id (1-64 of A-Z a-z 0-9 . _ : @ + -)");
}

static bool s_word_ok(const char *w, const char *extra)
{
    if (!w || !*w)
        return false;
    for (const char *p = w; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || strchr(extra, *p)))
            return false;
    return true;
}

static int s_check_entry(const kvedge_settings_table_t *t, size_t i, void *scratch, char *why,
                         size_t why_len)
{
    const kvedge_setting_t *e = &t->settings[i];
    const char *k = e->key ? e->key : "(null)";
    if (!s_word_ok(e->key, "_") || !s_word_ok(e->flag, "-"))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: bad key or flag", k);
    if (!e->help || !*e->help)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: no help", k);
    if (!strcmp(e->flag, "config") || !strcmp(e->flag, "check-config") ||
        !strcmp(e->flag, "help") || e->letter == 'c' || e->letter == 'h')
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: flag reserved for the engine", k);
    if (e->letter && !isalnum((unsigned char)e->letter))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: bad short flag", k);
    for (size_t j = 0; j < i; j++) {
        const kvedge_setting_t *o = &t->settings[j];
        if (!strcmp(o->key, e->key) || !strcmp(o->flag, e->flag) ||
            (e->letter && o->letter == e->letter))
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: key, flag or letter used twice", k);
    }
    size_t end = e->offset + e->size * (e->type == KVEDGE_SETTING_LIST ? e->list_max : 1);
    if (end > t->struct_size)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: field outside the struct", k);
    bool size_ok;
    switch (e->type) {
    case KVEDGE_SETTING_STRING:
        size_ok = e->size >= 2;
        break;
    case KVEDGE_SETTING_LIST:
        size_ok =
            e->size >= 2 && e->list_max >= 1 && e->count_offset + sizeof(size_t) <= t->struct_size;
        break;
    case KVEDGE_SETTING_BOOL:
        size_ok = e->size == sizeof(bool);
        break;
    case KVEDGE_SETTING_ENUM:
        size_ok = e->size == sizeof(int) && e->choices && e->choices[0].name;
        break;
    default:
        size_ok = (e->size == 4 && e->max <= UINT32_MAX) || e->size == 8;
        size_ok = size_ok && e->min <= e->max && e->def_num >= e->min && e->def_num <= e->max;
        if (e->type == KVEDGE_SETTING_SIZE)
            size_ok = size_ok && e->max <= KVEDGE_SETTINGS_SIZE_MAX;
        break;
    }
    if (!size_ok)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: field size, bounds or default", k);
    if (e->type != KVEDGE_SETTING_BOOL && !e->arg && e->type != KVEDGE_SETTING_ENUM)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: no argument name for --help", k);
    if (e->check && !e->example)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: a checked setting needs an example", k);
    char reason[400], dflt[KVEDGE_SETTINGS_LINE_MAX_BYTES], now[KVEDGE_SETTINGS_LINE_MAX_BYTES];
    kvedge_settings_defaults(t, scratch);
    if (e->type == KVEDGE_SETTING_STRING &&
        s_check_string(e, e->def ? e->def : "", reason, sizeof reason) != 0)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: default: %s", k, reason);
    if (e->type == KVEDGE_SETTING_ENUM) {
        bool found = false;
        for (const kvedge_setting_choice_t *c = e->choices; c->name; c++)
            found = found || (e->def && strcmp(c->name, e->def) == 0);
        if (!found)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: default is not a choice", k);
    }
    if (e->example) {
        kvedge_settings_value(e, scratch, 0, dflt, sizeof dflt);
        if (s_set_value(e, scratch, e->example, reason, sizeof reason) != 0)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: example: %s", k, reason);
        kvedge_settings_value(e, scratch, 0, now, sizeof now);
        if (e->type != KVEDGE_SETTING_LIST && strcmp(dflt, now) == 0)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: example is the default", k);
    }
    return KVEDGE_OK;
}

int kvedge_settings_table_check(const kvedge_settings_table_t *t, char *why, size_t why_len)
{
    if (!t || !t->daemon || !t->settings || !t->struct_size)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "incomplete table");
    if (t->count > KVEDGE_SETTINGS_MAX_SETTINGS)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: more than %d settings", t->daemon,
                          KVEDGE_SETTINGS_MAX_SETTINGS);
    void *scratch = malloc(t->struct_size);
    if (!scratch)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    int rc = KVEDGE_OK;
    for (size_t i = 0; i < t->count && rc == KVEDGE_OK; i++)
        rc = s_check_entry(t, i, scratch, why, why_len);
    free(scratch);
    return rc;
}
