/* Shared pieces of the kvedge command: exit codes, the command table, output helpers. */
#ifndef KVEDGE_CLIENTS_CLI_CLI_H
#define KVEDGE_CLIENTS_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/cmdopts.h"
#include "runtime/settings.h"
#include "store/engine/engine.h"

/* Exit codes, documented in `kvedge --help` and README. */
enum {
    KVEDGE_EXIT_OK = 0,
    KVEDGE_EXIT_FAILURE = 1,     /* the operation failed */
    KVEDGE_EXIT_USAGE = 2,       /* bad command line */
    KVEDGE_EXIT_NOTFOUND = 3,    /* prefix or model not found */
    KVEDGE_EXIT_CORRUPT = 4,     /* verify found corrupt blocks */
    KVEDGE_EXIT_UNAVAILABLE = 5, /* store missing, locked, unreadable or too new */
    KVEDGE_EXIT_DENIED = 6,      /* the key may not do that (evict needs an admin key) */
};

#define KVEDGE_DATA_DIR_DEFAULT "./data"

typedef struct {
    const char *data_dir;   /* --data, else $KVEDGE_DATA, else ./data */
    bool json;              /* --json: machine-readable output on stdout */
    const char *host;       /* -H: remote mode against a node at this endpoint */
    const char *server_key; /* --server-key: the node's public key or certificate */
    const char *cert;       /* --cert: this client's secret certificate */
    int deadline_ms;        /* --deadline: per call (0 = library default) */
    const char *link;       /* --link: emulated link to the node ("100mbit,20ms") */
    bool no_pack;           /* --no-pack: one head per GET_LAYER data message */
} kvedge_cli_t;

/* One command. A command declares its options as a table (runtime/cmdopts.h, which says how)
 * and an exec that runs on the parsed struct:
 *
 *   static int s_tokenize(kvedge_cli_t *cli, const void *opts);   // run, then print
 *   const kvedge_cli_cmd_t kvedge_cli_tokenize_cmds[] = {
 *       {.name = "tokenize", .opts = &s_tokenize_opts, .exec = s_tokenize},
 *       {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
 *   };
 *
 * The CLI then parses the line from the table, prints --help from it, refuses a bad line with
 * exit code 2 (naming the flag, and the nearest flag for a mistyped one) and calls exec. Keep
 * exec short: a run(opts) -> result that does the work and returns an exit code, then a
 * printer for text and one for --json (cli->json). A command without a table (opts NULL)
 * parses its own argv in run and gives args and summary here. */
typedef struct {
    const char *name;
    int (*run)(kvedge_cli_t *cli, int argc, char **argv); /* argv[0] is the command name */
    const char *args;    /* usage after the name; NULL with a table (it comes from there) */
    const char *summary; /* one line; NULL with a table (its summary) */
    const kvedge_cmdopts_t *opts;                     /* the options table, or NULL */
    int (*exec)(kvedge_cli_t *cli, const void *opts); /* with a table: returns an exit code */
    /* A daemon (run parses its own line): its settings table, whose flags the man page and
     * the shell completion list (`kvedge help --man`); NULL otherwise. */
    const kvedge_settings_table_t *settings;
} kvedge_cli_cmd_t;

/* A command's one-line summary (its table's, or its own). */
const char *kvedge_cli_summary(const kvedge_cli_cmd_t *cmd);

/* Runs cmd on its line (argv[0] is its name): a table command's options parsed, its --help
 * printed, a bad line refused ("kvedge: CMD: WHY (see kvedge CMD --help)", exit code 2), then
 * its exec; else its run. Returns the exit code. */
int kvedge_cli_dispatch(kvedge_cli_t *cli, const kvedge_cli_cmd_t *cmd, int argc, char **argv);

/* The local-mode commands (clients/cli_local.c), the daemons (clients/cli_daemon.c). Each
 * table ends with an entry whose name is NULL. */
extern const kvedge_cli_cmd_t kvedge_cli_local_cmds[];
extern const kvedge_cli_cmd_t kvedge_cli_daemon_cmds[];
extern const kvedge_cli_cmd_t kvedge_cli_remote_cmds[];  /* clients/cli_remote.c, with -H */
extern const kvedge_cli_cmd_t kvedge_cli_top_cmds[];     /* clients/cli_top.c, with -H */
extern const kvedge_cli_cmd_t kvedge_cli_cluster_cmds[]; /* clients/cli_cluster.c, -H */
extern const kvedge_cli_cmd_t kvedge_cli_master_cmds[];  /* clients/cli_master.c */
extern const kvedge_cli_cmd_t kvedge_cli_block_cmds[];   /* clients/cli_block.c */
extern const kvedge_cli_cmd_t kvedge_cli_basis_cmds[];   /* clients/cli_basis.c */
extern const kvedge_cli_cmd_t kvedge_cli_proxy_cmds[];   /* clients/cli_proxy.c */
extern const kvedge_cli_cmd_t kvedge_cli_e2e_cmds[];     /* clients/cli_e2e.c */
extern const kvedge_cli_cmd_t kvedge_cli_eval_cmds[];    /* clients/cli_eval.c */
extern const kvedge_cli_cmd_t kvedge_cli_tokenize_cmds[];
extern const kvedge_cli_cmd_t kvedge_cli_layermap_cmds[];  /* clients/cli_layermap.c */
extern const kvedge_cli_cmd_t kvedge_cli_lseval_cmds[];    /* clients/cli_lseval.c */
extern const kvedge_cli_cmd_t kvedge_cli_rebalance_cmds[]; /* clients/cli_rebalance.c */

/* The tables main.c dispatches to (clients/cli/cli_tables.c), each list ending with NULL:
 * every command, and the forms found first in remote mode (-H): the admin commands against a
 * node and the node-only ones. The manual page and the completion list the same. */
extern const kvedge_cli_cmd_t *const kvedge_cli_tables[];
extern const kvedge_cli_cmd_t *const kvedge_cli_remote_tables[];

/* The global options, before the command or after it: their struct and table. */
typedef struct {
    const char *data, *host, *server_key, *cert, *link;
    const char *basis; /* coding bases to register (kvedge_basis_load_dir) */
    bool json, version, no_pack;
    uint32_t deadline_ms; /* 0: the library's default */
} kvedge_cli_globals_t;
extern const kvedge_cmdopts_t kvedge_cli_globals;

/* The block encodings by name (kvedge_scheme_t), for ENUM options. */
extern const kvedge_setting_choice_t kvedge_cli_schemes[];

/* Prints "kvedge: <message>" to stderr. */
void kvedge_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Opens the existing store of cli->data_dir, printing a clear reason and returning an exit
 * code on failure (0 on success). writable opens it for writing; neither form creates a store:
 * a mistyped --data is refused rather than made an empty store. */
int kvedge_cli_open(kvedge_cli_t *cli, bool writable, kvedge_engine_t **out);

/* kvedge_cli_open for writing that creates the store when there is none: for the commands
 * that fill a store (put-synthetic, sync --once). */
int kvedge_cli_open_create(kvedge_cli_t *cli, kvedge_engine_t **out);

/* Maps an engine error to an exit code. */
int kvedge_cli_exit_code(int err);

/* "1.5 MiB" style; returns buf (at least 16 bytes). */
const char *kvedge_cli_bytes(uint64_t n, char *buf, size_t len);

/* Parses "4096", "64K", "1.5G" (powers of 1024). Returns 0 or -1. */
int kvedge_cli_parse_size(const char *s, uint64_t *out);

/* Parses a decimal integer in [min, max]. Returns 0 or -1. */
int kvedge_cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* The PUB endpoint next to a master's ROUTER endpoint tcp://HOST:PORT: tcp://HOST:PORT+1 into
 * out; for a list of masters "EP[,EP...]", the list of theirs. -1 when an entry is not
 * tcp://HOST:PORT with PORT in 1 .. 65534, or out is too small. */
int kvedge_cli_default_pub(const char *master, char *out, size_t cap);

/* The PUB list for a list of masters "EP[,EP...]" (given by --MASTER_FLAG): pub (--PUB_FLAG)
 * when given, else the default (PORT+1 per tcp entry) written into buf. Every entry of both is
 * checked and their counts must match; otherwise the error names the entry at fault (prefixed
 * with cmd) and NULL is returned: a usage error. */
const char *kvedge_cli_master_pubs(const char *cmd, const char *master_flag, const char *master,
                                   const char *pub_flag, const char *pub, char *buf, size_t cap);

/* Writes s as a JSON string literal (quoted, escaped). */
void kvedge_cli_json_str(FILE *f, const char *s);

/* Daemons: replaces czmq's signal handlers with ours and blocks SIGINT/SIGTERM in every
 * thread started after it (call it before any); wait_signal takes the first, which starts a
 * clean stop, and from then a second one exits at once (exit 1). */
void kvedge_cli_trap_signals(void);
void kvedge_cli_wait_signal(void);

/* Connects to cli->host with the global options (--server-key, --cert, --deadline, --link),
 * naming itself `name` in HELLO. On failure says why on stderr (no answer, bad --link, ...).
 * Returns an exit code: KVEDGE_EXIT_OK, KVEDGE_EXIT_USAGE (--server-key without --cert) or
 * KVEDGE_EXIT_UNAVAILABLE. */
struct kvedge_client_t;
int kvedge_cli_connect(kvedge_cli_t *cli, const char *name, struct kvedge_client_t **out);

/* A daemon's own check of its resolved settings (kvedge_node_settings_check and the like). */
typedef int(kvedge_cli_check_fn)(const void *settings, char *why, size_t why_len);

/* The first half of a daemon's main: its settings from the table t (defaults, --config FILE,
 * flags; an empty `data` setting takes the global --data), --help, the daemon's own check,
 * --check-config; then the log level of its `log` setting and the signal trap. Returns -1
 * when the daemon should start now, else the exit code to return after printing the help,
 * the settings, or why they were refused (KVEDGE_EXIT_USAGE). */
int kvedge_cli_daemon_settings(kvedge_cli_t *cli, const kvedge_cli_cmd_t *cmd, const char *about,
                               const kvedge_settings_table_t *t, void *settings,
                               kvedge_cli_check_fn *check, int argc, char **argv);

/* Prints usage of one command to f. */
void kvedge_cli_usage(FILE *f, const kvedge_cli_cmd_t *cmd, const char *details);

/* ---- files, documents and models, for the commands that read text and weights ---- */

struct option;
struct _kvedge_decoder_t;

/* The long name of option ch in opts (getopt_long's table), for messages; "?" when none. */
const char *kvedge_cli_flag_name(const struct option *opts, int ch);

/* Reads the whole file at path into *out (NUL-terminated; caller frees), *len bytes. Errors
 * are printed as "CMD: cannot read WHAT PATH: reason" and returned as an exit code:
 * KVEDGE_EXIT_FAILURE (cannot open or read, out of memory), KVEDGE_EXIT_USAGE (over
 * max_bytes). */
int kvedge_cli_slurp(const char *cmd, const char *what, const char *path, size_t max_bytes,
                     char **out, size_t *len);

/* Documents of token ids, as `kvedge eval` and `kvedge lseval` read them. */
typedef struct {
    int32_t **doc; /* [n], each owned */
    size_t *len;   /* [n] tokens */
    size_t n, cap;
} kvedge_cli_docs_t;

/* Frees every document and zeroes d. */
void kvedge_cli_docs_free(kvedge_cli_docs_t *d);

/* Appends a document, taking ownership of ids (freed on failure). Returns 0 or -1 (out of
 * memory). */
int kvedge_cli_docs_add(kvedge_cli_docs_t *d, int32_t *ids, size_t n);

/* Chapters of a text: the pieces between blank lines ("\n\n"), each encoded with "\n\n" after
 * it (as scripts/train_models.py splits and encodes chapters) by the tokenizer at dir (a folder
 * with vocab.json + merges.txt or tokenizer.json, or a tokenizer.json), its template's BOS
 * first when it has one, one document each, appended to d; every id must lie below vocab
 * (else KVEDGE_EXIT_USAGE). Errors printed with CMD, returned as an exit code. */
int kvedge_cli_read_chapters(const char *cmd, const char *dir, const char *path, size_t max_bytes,
                             uint32_t vocab, kvedge_cli_docs_t *d);

/* The tokenizer.json of a Hugging Face model folder, written into buf: weights when it is a
 * folder that holds a tokenizer.json (one that cannot be read is the loader's error to give),
 * else NULL. */
const char *kvedge_cli_own_tokenizer(const char *weights, char *buf, size_t len);

/* Loads OPT weights (clients/decoder/decoder.h) into a new model in *out; errors printed as
 * "CMD: cannot load the SIDE model PATH: reason" and returned as an exit code (failure for
 * I/O and memory, usage for a file that is not such weights). */
int kvedge_cli_load_model(const char *cmd, const char *path, const char *side,
                          struct _kvedge_decoder_t **out);

#endif
