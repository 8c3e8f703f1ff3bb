/* Table-driven daemon settings: one table per daemon (store node, master, proxy) says, per
 * setting, its config key, its flags, its type, bounds, default and help, and where it lives
 * in the daemon's settings struct. From that one table come the defaults, the strict ZPL
 * config-file reader, the flag parser, the --help text and the --check-config listing, so
 * the three can never disagree. Resolution order: defaults, then the config file, then flags. */
#ifndef KVEDGE_ACCESS_SETTINGS_H
#define KVEDGE_ACCESS_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Hard limits of the config reader: a file larger than FILE_MAX_BYTES or a line longer than
 * LINE_MAX_BYTES (newline excluded) is refused, not truncated. A table has at most
 * MAX_SETTINGS entries; a list setting holds at most what its array does. */
#define KVEDGE_SETTINGS_FILE_MAX_BYTES (1u << 20)
#define KVEDGE_SETTINGS_LINE_MAX_BYTES 4096
#define KVEDGE_SETTINGS_MAX_SETTINGS   64
/* The largest size a SIZE setting may be bounded by (1 PiB): no product with a suffix
 * multiplier overflows below it. */
#define KVEDGE_SETTINGS_SIZE_MAX (1ull << 50)

typedef enum {
    KVEDGE_SETTING_STRING,  /* char[N]: at most N-1 bytes, no control characters */
    KVEDGE_SETTING_BOOL,    /* bool: yes/no/on/off/true/false/1/0, any case */
    KVEDGE_SETTING_UINT,    /* uint32_t or uint64_t: a decimal number in [min, max] */
    KVEDGE_SETTING_SIZE,    /* uint32_t or uint64_t bytes: "4096", "64K", "1.5G", "1TiB" */
    KVEDGE_SETTING_MS,      /* uint32_t or uint64_t milliseconds: "250", "250ms", "3s", "1m" */
    KVEDGE_SETTING_SECONDS, /* uint32_t or uint64_t seconds: "60", "60s", "5m", "1h" */
    KVEDGE_SETTING_ENUM,    /* an int-sized enum: one of the names in choices */
    KVEDGE_SETTING_LIST,    /* char[MAX][N] plus a size_t count: repeatable string */
} kvedge_setting_type_t;

/* One name of an ENUM setting and the value stored for it. Arrays end with name NULL. */
typedef struct {
    const char *name;
    int value;
} kvedge_setting_choice_t;

/* Extra validation of a STRING or LIST value (after the length check): returns 0, or -1 with
 * a reason (no key, no value: the caller names those) in why. */
typedef int(kvedge_setting_check_fn)(const char *value, char *why, size_t why_len);

/* One setting. Its config key is also its name (--check-config prints `key = value`). */
typedef struct {
    const char *key;  /* config key in the daemon's section, [a-z0-9_] */
    const char *flag; /* long flag without "--" */
    char letter;      /* short flag, or 0 */
    const char *arg;  /* what the value looks like in --help ("EP", "SIZE"); bools: NULL */
    kvedge_setting_type_t type;
    size_t offset;       /* of the field in the settings struct */
    size_t size;         /* of the field (LIST: of one item) */
    size_t count_offset; /* LIST: the size_t count field */
    size_t list_max;     /* LIST: items the array holds */
    uint64_t min, max;   /* numbers: bounds, in the field's unit */
    uint64_t def_num;    /* BOOL and numbers: the default */
    const char *def;     /* STRING and ENUM: the default (NULL = "" for STRING) */
    const kvedge_setting_choice_t *choices; /* ENUM */
    kvedge_setting_check_fn *check;         /* STRING, LIST: optional */
    const char *example; /* a valid non-default value; required with check (tests use it) */
    const char *help;    /* one phrase; --help adds the key and the default */
} kvedge_setting_t;

/* Field placement for table entries: `KVEDGE_SETTING_AT(kvedge_node_settings_t, bind)`. */
#define KVEDGE_SETTING_AT(type, member)                                                            \
    .offset = offsetof(type, member), .size = sizeof(((type *)0)->member)
/* For LIST entries: the array of strings and its count. */
#define KVEDGE_SETTING_LIST_AT(type, member, count_member)                                         \
    .offset = offsetof(type, member), .size = sizeof(((type *)0)->member[0]),                      \
    .count_offset = offsetof(type, count_member),                                                  \
    .list_max = sizeof(((type *)0)->member) / sizeof(((type *)0)->member[0])

/* A daemon's table. */
typedef struct {
    const char *daemon; /* the command ("store"): the section name and message prefix */
    size_t struct_size; /* sizeof the settings struct */
    const kvedge_setting_t *settings;
    size_t count;
} kvedge_settings_table_t;

/* What a command line asked for besides settings. */
typedef struct {
    const char *config; /* --config FILE / -c FILE (points into argv), or NULL */
    bool help;          /* --help / -h: print help, do nothing else */
    bool check;         /* --check-config: resolve and print, start nothing */
} kvedge_settings_args_t;

/* The log levels as ENUM choices (kvedge_log_level_t), for every daemon's `log` setting. */
extern const kvedge_setting_choice_t kvedge_settings_log_levels[];

/* Checks a table's own consistency: keys, flags and letters unique and well formed, field
 * sizes that fit the types, defaults that parse and lie within bounds, examples that parse
 * and differ from the default. For tests. Returns 0, KVEDGE_EINVAL or KVEDGE_ENOMEM. */
int kvedge_settings_table_check(const kvedge_settings_table_t *t, char *why, size_t why_len);

/* Finds a setting by config key. NULL when unknown. */
const kvedge_setting_t *kvedge_settings_find(const kvedge_settings_table_t *t, const char *key);

/* Zeroes *settings (t->struct_size bytes) and applies every default. */
void kvedge_settings_defaults(const kvedge_settings_table_t *t, void *settings);

/* Sets one setting by config key from text (a LIST appends). On failure why says
 * "KEY: reason" and *settings is unchanged. Returns 0 or KVEDGE_EINVAL. */
int kvedge_settings_set(const kvedge_settings_table_t *t, void *settings, const char *key,
                        const char *value, char *why, size_t why_len);

/* Reads the ZPL text of a config file (name only labels messages): one section named
 * t->daemon, settings indented 4 spaces under it as `key = value` (value bare, "quoted" or
 * 'quoted'), `#` comments. Strict: an unknown or repeated section, an unknown key, a key set
 * twice (LIST keys may repeat), a value that does not parse or is out of bounds, a line longer
 * than KVEDGE_SETTINGS_LINE_MAX_BYTES, a tab in the indentation, a NUL byte or any other
 * malformed line is refused with why = "NAME:LINE: KEY: reason". All or nothing: on failure
 * *settings is unchanged. Returns 0, KVEDGE_EINVAL, KVEDGE_ETOOBIG or KVEDGE_ENOMEM. */
int kvedge_settings_load_text(const kvedge_settings_table_t *t, void *settings, const char *name,
                              const char *text, size_t len, char *why, size_t why_len);

/* The same from a file of at most KVEDGE_SETTINGS_FILE_MAX_BYTES. Errors as load_text, and
 * KVEDGE_EIO (unreadable: why says so) or KVEDGE_ETOOBIG. */
int kvedge_settings_load_file(const kvedge_settings_table_t *t, void *settings, const char *path,
                              char *why, size_t why_len);

/* Resolves a daemon's settings from its command line (argv[0] is the command's name): the
 * defaults, then the file of --config FILE (anywhere on the line), then every flag in order
 * (a LIST flag replaces the file's list, repeats append). Flags: --flag VALUE, --flag=VALUE,
 * -x VALUE, -xVALUE; a BOOL flag alone means yes, --flag=no (any bool spelling) sets it.
 * With --help, *args says so and nothing is read. On failure why says what and where
 * ("--sync: ..." or "FILE:LINE: KEY: ..."). Returns 0, or the error of load_file, or
 * KVEDGE_EINVAL (unknown flag, missing or bad value, a stray argument, --config twice). */
int kvedge_settings_resolve(const kvedge_settings_table_t *t, void *settings, int argc,
                            char *const *argv, kvedge_settings_args_t *args, char *why,
                            size_t why_len);

/* The value of setting e in settings as text, in the form the reader takes (sizes with the
 * largest exact suffix, enums by name, bools yes/no; strings raw). item picks a LIST item;
 * scalars have one item, 0. Returns 0, KVEDGE_ENOTFOUND (no such item) or KVEDGE_ENOSPACE. */
int kvedge_settings_value(const kvedge_setting_t *e, const void *settings, size_t item, char *buf,
                          size_t len);

/* Prints the settings as a config file of the daemon's section (strings quoted where the
 * reader needs it): what --check-config shows; it loads back to the same settings. */
void kvedge_settings_print(const kvedge_settings_table_t *t, const void *settings, FILE *f);

/* Prints the option list of --help: every setting's flags, help, config key and default, then
 * --config, --check-config and --help. */
void kvedge_settings_help(const kvedge_settings_table_t *t, FILE *f);

/* One setting on its own, for tables other than a daemon's (runtime/cmdopts.h): parses value
 * into e's field of settings (a LIST appends) with e's type and bounds; on failure why holds
 * the reason without the key ("'0' is out of range (1 to 64)") and settings is unchanged.
 * Returns 0 or KVEDGE_EINVAL. kvedge_setting_default stores e's default. */
int kvedge_setting_parse(const kvedge_setting_t *e, void *settings, const char *value, char *why,
                         size_t why_len);
void kvedge_setting_default(const kvedge_setting_t *e, void *settings);

/* The name a mistyped word most likely meant, among names[0..n): one spelled with '-' and '_'
 * swapped, else the nearest within 2 edits (case-insensitive); NULL when none is that near. */
const char *kvedge_settings_nearest(const char *word, const char *const *names, size_t n);

/* Checks for STRING settings: an endpoint (tcp://HOST:PORT, ipc://PATH, inproc://NAME) or "";
 * a registry id (1-64 of [A-Za-z0-9._:@+-]) or "". */
int kvedge_settings_check_endpoint(const char *value, char *why, size_t why_len);
int kvedge_settings_check_id(const char *value, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
