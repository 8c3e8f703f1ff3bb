/* Command options: a command of the `kvedge` program declares its options as one table, on the
 * daemons' settings engine (runtime/settings.h), and gets from it the parser, the --help text,
 * bounds errors that name the flag, "did you mean --foo?" and required options.
 *
 * How to declare a command (clients/cli/cli_tokenize.c is the worked example):
 *
 *   typedef struct {                       // what the command runs on
 *       const char *file;                  //   STR: points into argv, env or the default
 *       bool decode;                       //   BOOL
 *       uint32_t count;                    //   UINT (uint32_t or uint64_t), SIZE, MS, SECONDS
 *       const char *ids[64]; size_t n_ids; //   STRS: a repeatable flag, or the rest of the line
 *   } s_opts_t;
 *
 *   static const kvedge_cmdopt_t s_opt_list[] = {
 *       {.name = "file", .arg = "FILE", .type = KVEDGE_CMDOPT_STR, KVEDGE_CMDOPT_AT(s_opts_t,
 * file), .alias = "text", .help = "read the text from FILE (default: stdin)"},
 *       {.name = "decode", .type = KVEDGE_CMDOPT_BOOL, KVEDGE_CMDOPT_AT(s_opts_t, decode),
 *        .help = "ids to text"},
 *       {.name = "count", .letter = 'c', .arg = "N", .type = KVEDGE_CMDOPT_UINT,
 *        KVEDGE_CMDOPT_AT(s_opts_t, count), .min = 1, .max = 1000, .def_num = 10,
 *        .help = "how many"},
 *       {.name = "ID", .positional = true, .type = KVEDGE_CMDOPT_STRS,
 *        KVEDGE_CMDOPT_LIST_AT(s_opts_t, ids, n_ids), .required = true, .help = "the ids"},
 *   };
 *   static const kvedge_cmdopts_t s_opts = {.command = "tokenize", .summary = "One line.",
 *       .about = "Longer text for --help (or NULL).", KVEDGE_CMDOPTS_OF(s_opts_t, s_opt_list)};
 *
 * A number that may be left unset takes a default outside its bounds and says in def_text what
 * that means (`.max = 63, .def_num = UINT32_MAX, .def_text = "all"`).
 *
 * Then kvedge_cmdopts_parse fills an s_opts_t: defaults, then $env for options that have one
 * and the line does not give, then the line. The CLI (clients/cli/cli.h) does that for a
 * command whose entry names its table, and calls its run with the parsed struct.
 *
 * The line: --name VALUE, --name=VALUE, -x VALUE, -xVALUE; a BOOL alone means yes and takes
 * --name=no; bool letters bundle (-qf); "--" ends the options; positionals may come anywhere.
 * An alias is an old name of the same option: it is taken as the name, and --help lists it as
 * a deprecated alias. -h and --help are the engine's. */
#ifndef KVEDGE_RUNTIME_CMDOPTS_H
#define KVEDGE_RUNTIME_CMDOPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/settings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most options (positionals included) one table may hold. */
#define KVEDGE_CMDOPTS_MAX 64

typedef enum {
    KVEDGE_CMDOPT_STR,     /* const char *: the value as given (points into argv or env) */
    KVEDGE_CMDOPT_STRS,    /* const char *[N] plus a size_t count: repeatable, or the rest */
    KVEDGE_CMDOPT_BOOL,    /* bool */
    KVEDGE_CMDOPT_UINT,    /* uint32_t or uint64_t in [min, max] */
    KVEDGE_CMDOPT_SIZE,    /* uint32_t or uint64_t bytes: "4096", "64K", "1.5G" */
    KVEDGE_CMDOPT_MS,      /* uint32_t or uint64_t milliseconds: "250", "3s", "1m" */
    KVEDGE_CMDOPT_SECONDS, /* uint32_t or uint64_t seconds: "60", "5m", "1h" */
    KVEDGE_CMDOPT_ENUM,    /* int: one of choices, by name */
    KVEDGE_CMDOPT_DOUBLE,  /* double in [dmin, dmax] */
} kvedge_cmdopt_type_t;

/* One option, or one positional argument. */
typedef struct {
    const char *name; /* long flag without "--" ([a-z0-9-]); positional: its name ("PREFIX") */
    char letter;      /* short flag, or 0 */
    const char *arg;  /* the value's name in --help ("FILE"); NULL for BOOL (and ENUM: choices) */
    kvedge_cmdopt_type_t type;
    size_t offset;                 /* of the field in the command's options struct */
    size_t size;                   /* of the field (STRS: of one item) */
    size_t count_offset;           /* STRS: the size_t count field */
    size_t list_max;               /* STRS: items the array holds */
    uint64_t min, max;             /* UINT, SIZE, MS, SECONDS: bounds, in the field's unit */
    uint64_t def_num;              /* BOOL and those numbers: the default */
    double dmin, dmax, def_double; /* DOUBLE */
    const char *def;               /* STR: the default (NULL: none); ENUM: its name */
    const kvedge_setting_choice_t *choices; /* ENUM, ending with name NULL */
    const char *env;   /* environment variable read when the line does not give it, or NULL */
    const char *alias; /* an old flag name (without "--"), still taken: deprecated, or NULL */
    bool required;     /* the line (or env) must give it */
    bool positional;   /* an argument, not a flag: in table order; a STRS one takes the rest */
    const char *help;  /* one phrase; --help adds the default, env and alias */
    /* Numbers: what --help calls the default; with it, def_num may lie outside [min, max]
     * and stands for "not given" ("all layers"). */
    const char *def_text;
} kvedge_cmdopt_t;

#define KVEDGE_CMDOPT_AT(type, member)                                                             \
    .offset = offsetof(type, member), .size = sizeof(((type *)0)->member)
#define KVEDGE_CMDOPT_LIST_AT(type, member, count_member)                                          \
    .offset = offsetof(type, member), .size = sizeof(((type *)0)->member[0]),                      \
    .count_offset = offsetof(type, count_member),                                                  \
    .list_max = sizeof(((type *)0)->member) / sizeof(((type *)0)->member[0])

/* A command's table. */
typedef struct kvedge_cmdopts_s {
    const char *command; /* "tokenize": messages and usage say it */
    const char *summary; /* one line, for `kvedge help` and the top of --help */
    const char *about;   /* what --help prints after the options, or NULL */
    size_t struct_size;  /* sizeof the options struct */
    const kvedge_cmdopt_t *opts;
    size_t count;
} kvedge_cmdopts_t;

#define KVEDGE_CMDOPTS_OF(type, list)                                                              \
    .struct_size = sizeof(type), .opts = list, .count = sizeof(list) / sizeof((list)[0])

/* Checks a table's own consistency: names, letters and aliases unique and well formed, fields
 * inside the struct and of the type's size, defaults within bounds (or def_text), help for every
 * entry, a STRS positional only last. For tests. Returns 0 or KVEDGE_EINVAL. */
int kvedge_cmdopts_check(const kvedge_cmdopts_t *t, char *why, size_t why_len);

/* Zeroes *opts (t->struct_size bytes) and stores every default. */
void kvedge_cmdopts_defaults(const kvedge_cmdopts_t *t, void *opts);

/* Parses a command line (argv[0] is the command's name) into *opts: the defaults, then the
 * environment for options the line does not give, then the line. *help is set when -h or
 * --help is on it (then nothing else is checked). On failure why names the flag or argument
 * and the reason: "--count: '0' is out of range (1 to 1000)", "unknown option '--fle' (did you
 * mean --file?)", "--model is required", "missing PREFIX", "unexpected argument 'x'"; the
 * environment as "$KVEDGE_X: ...". Returns 0 or KVEDGE_EINVAL. */
int kvedge_cmdopts_parse(const kvedge_cmdopts_t *t, void *opts, int argc, char *const *argv,
                         bool *help, char *why, size_t why_len);

/* The usage line's arguments after the command's name: "[OPTIONS] PREFIX [ID...]". */
void kvedge_cmdopts_synopsis(const kvedge_cmdopts_t *t, char *buf, size_t len);

/* Prints --help: "usage: PROG COMMAND SYNOPSIS", the summary, the positionals and options
 * (each with its default, environment variable and deprecated alias), then about. */
void kvedge_cmdopts_help(const kvedge_cmdopts_t *t, const char *prog, FILE *f);

/* Prints only the option lines of --help (flags, value, help, default, env, alias). */
void kvedge_cmdopts_options_help(const kvedge_cmdopts_t *t, FILE *f);

/* The text --help shows for t->opts[k] into text: its help phrase, then "(required)" or
 * "(default X; MIN to MAX)", "(repeatable)", "(env $VAR)". For generated documentation (the
 * man page of `kvedge help --man`). */
void kvedge_cmdopts_opt_text(const kvedge_cmdopts_t *t, size_t k, char *text, size_t len);

#ifdef __cplusplus
}
#endif
#endif
