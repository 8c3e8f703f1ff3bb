/* Crash consistency of a synced node: a `kvedge store --sync` process is SIGKILLed at random
 * points under a writer that puts one block at a time and records which PUTs were
 * acknowledged; after each restart every acknowledged block is present and bit-identical.
 * At least S_KILLS kills, bounded in time (a ctest TIMEOUT too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "access/client.h"
#include "access/codec/block.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/synth.h"
#include "tests/common/testutil.h"

#define S_KILLS       12    /* kills (and restarts) at least */
#define S_BUDGET_MS   50000 /* the whole test, kills included */
#define S_KILL_MIN_MS 20    /* a kill comes this long after the writer starts, at least */
#define S_KILL_MAX_MS 300   /* and at most */
#define S_MAX_BLOCKS  20000 /* blocks written in all, at most */
#define S_TOKENS      16
#define S_HEAD_DIM    64
#define S_DEADLINE_MS 700 /* a PUT to a killed node fails after this */

/* Starts `kvedge --data data store --insecure --bind ep --sync` and waits for its "listening"
 * line. Returns the pid, or -1. */
static pid_t s_spawn(const char *data, const char *ep)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execl(KVEDGE_BIN, "kvedge", "--data", data, "store", "--insecure", "--bind", ep, "--sync",
              "--log-level", "warn", "--metrics", "off", "--workers", "2", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[700] = "";
    ssize_t got = read(pfd[0], line, sizeof line - 1);
    close(pfd[0]); /* the node writes nothing more to stdout */
    if (got <= 0 || !strstr(line, "listening ")) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

/* Block i: its own chunk id, layer 0, head 0, seeded by i. */
static void s_key(uint32_t i, kvedge_block_key_t *k)
{
    memset(k, 0, sizeof *k);
    for (size_t b = 0; b < KVEDGE_CHUNK_ID_BYTES; b++)
        k->chunk.bytes[b] = (uint8_t)((i * 2654435761u) >> (8 * (b % 4))) ^ (uint8_t)b;
    memcpy(k->chunk.bytes, &i, sizeof i); /* unique */
}

static uint8_t *s_block(uint32_t i, size_t *len)
{
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, S_TOKENS, S_HEAD_DIM, 0, NULL, false};
    static uint16_t k[S_TOKENS * S_HEAD_DIM], v[S_TOKENS * S_HEAD_DIM];
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *out = malloc(cap);
    if (!out || kvedge_synth_head(1000 + i, 0, S_TOKENS, S_HEAD_DIM, KVEDGE_DTYPE_FP16, k, v) ||
        kvedge_block_encode(&spec, k, v, out, cap, len)) {
        free(out);
        return NULL;
    }
    return out;
}

typedef struct {
    pid_t pid;
    int delay_ms;
} s_killer_t;

static void *s_killer(void *arg)
{
    s_killer_t *k = arg;
    kt_pause_ms(k->delay_ms); /* the point: a kill at a random time into the writes */
    kill(k->pid, SIGKILL);
    return NULL;
}

static kvedge_client_t *s_connect(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE_MS;
    kvedge_client_t *c = NULL;
    return kvedge_client_connect(&o, &c) == KVEDGE_OK ? c : NULL;
}

typedef struct {
    const char *ep;
    kvedge_client_t *c;
} s_conn_ctx_t;

/* Whether a client could connect to the node just started (into c). */
static bool s_connected(void *arg)
{
    s_conn_ctx_t *x = arg;
    return (x->c = s_connect(x->ep)) != NULL;
}

/* Every acknowledged block is there, bit for bit. Returns how many were checked. */
static uint32_t s_verify(const char *ep, const bool *acked, uint32_t n)
{
    s_conn_ctx_t cc = {ep, NULL};
    kt_wait_until(s_connected, &cc, KT_WAIT_MS);
    kvedge_client_t *c = cc.c;
    uint32_t checked = 0;
    uint8_t buf[64 << 10];
    for (uint32_t i = 0; i < n; i++) {
        if (!acked[i])
            continue;
        kvedge_block_key_t k;
        s_key(i, &k);
        kvedge_fetched_t out;
        int rc = kvedge_client_get(c, &k, 1, buf, sizeof buf, &out);
        if (rc != KVEDGE_OK || out.status != KVEDGE_OK)
            fail_msg("acknowledged block %u: get %s, status %s", i, kvedge_strerror(rc),
                     kvedge_strerror(out.status));
        size_t len = 0;
        uint8_t *want = s_block(i, &len);
        assert_non_null(want);
        if (out.len != len || memcmp(buf + out.offset, want, len) != 0)
            fail_msg("acknowledged block %u differs after the restart", i);
        free(want);
        checked++;
    }
    kvedge_client_destroy(&c);
    return checked;
}

static void test_kill_under_writes(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-crash-XXXXXX";
    assert_non_null(mkdtemp(root));
    char data[64], ep[96];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(ep, sizeof ep, "ipc://%s/node.sock", root);
    bool *acked = calloc(S_MAX_BLOCKS, sizeof *acked);
    assert_non_null(acked);
    srand((unsigned)time(NULL));
    int64_t t0 = kvedge_mono_ms();
    uint32_t next = 0, kills = 0, total_acked = 0;
    while (kills < S_KILLS && next < S_MAX_BLOCKS && kvedge_mono_ms() - t0 < S_BUDGET_MS) {
        pid_t pid = s_spawn(data, ep);
        assert_true(pid > 0);
        uint32_t checked = s_verify(ep, acked, next);
        assert_int_equal(checked, total_acked);
        kvedge_client_t *c = s_connect(ep);
        assert_non_null(c);
        s_killer_t k = {pid, S_KILL_MIN_MS + rand() % (S_KILL_MAX_MS - S_KILL_MIN_MS)};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, s_killer, &k), 0);
        while (next < S_MAX_BLOCKS) {
            size_t len = 0;
            uint8_t *block = s_block(next, &len);
            assert_non_null(block);
            kvedge_block_key_t key;
            s_key(next, &key);
            kvedge_put_item_t item = {.layer = 0, .head = 0, .block = block, .len = len};
            item.chunk.id = key.chunk;
            snprintf(item.chunk.model_id, sizeof item.chunk.model_id, "opt-125m");
            item.chunk.tokens = S_TOKENS;
            int rc = kvedge_client_put(c, &item, 1, NULL);
            free(block);
            next++; /* a PUT that failed may or may not be stored: never checked */
            if (rc != KVEDGE_OK)
                break;
            acked[next - 1] = true;
            total_acked++;
        }
        pthread_join(th, NULL);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        kvedge_client_destroy(&c);
        kills++;
    }
    /* The last restart, checked too. */
    pid_t pid = s_spawn(data, ep);
    assert_true(pid > 0);
    assert_int_equal(s_verify(ep, acked, next), total_acked);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    printf("# %u kills in %.1f s: %u of %u PUTs acknowledged, all present after each restart\n",
           kills, (double)(kvedge_mono_ms() - t0) / 1e3, total_acked, next);
    assert_true(kills >= S_KILLS);
    assert_true(total_acked > 0);
    free(acked);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_under_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
