/* A real etcd cluster for a test: N members (1 or 3) on free loopback ports, their data and
 * logs in the test's directory, each in its own process that dies with the test. A test calls
 * kt_etcd_start and skips (77) when etcd is not installed. Health is polled (a put through the
 * whole endpoint list holds only with a quorum), never slept for. Needs kvedge_master (its etcd
 * client); usable from a bench (no cmocka). */
#ifndef KVEDGE_TESTS_ETCD_H
#define KVEDGE_TESTS_ETCD_H

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/master/etcd.h"
#include "access/codec/error.h"
#include "tests/common/poll.h"

#define KT_ETCD_MAX     3
#define KT_ETCD_BIN     "/usr/bin/etcd"
#define KT_ETCD_WAIT_MS 30000 /* a cluster's first leader on a loaded runner */

typedef struct {
    int n;
    char dir[256];
    pid_t pid[KT_ETCD_MAX];
    int client_port[KT_ETCD_MAX];
    int peer_port[KT_ETCD_MAX];
    char client[KT_ETCD_MAX][64]; /* http://127.0.0.1:PORT */
    char endpoints[KT_ETCD_MAX * 64];
} kt_etcd_t;

/* True when an etcd binary is installed (else the test skips with 77). */
static inline bool kt_etcd_installed(void)
{
    return access(KT_ETCD_BIN, X_OK) == 0;
}

/* A port that was free a moment ago (the kernel's ephemeral choice). */
static inline int kt_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static inline pid_t kt_etcd_spawn(kt_etcd_t *e, int i)
{
    char name[16], data[300], log[300], cu[64], pu[64], cluster[KT_ETCD_MAX * 80] = "";
    snprintf(name, sizeof name, "e%d", i);
    snprintf(data, sizeof data, "%s/etcd%d", e->dir, i);
    snprintf(log, sizeof log, "%s/etcd%d.log", e->dir, i);
    snprintf(cu, sizeof cu, "http://127.0.0.1:%d", e->client_port[i]);
    snprintf(pu, sizeof pu, "http://127.0.0.1:%d", e->peer_port[i]);
    for (int j = 0; j < e->n; j++) {
        size_t l = strlen(cluster);
        snprintf(cluster + l, sizeof cluster - l, "%se%d=http://127.0.0.1:%d", j ? "," : "", j,
                 e->peer_port[j]);
    }
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execl(KT_ETCD_BIN, "etcd", "--name", name, "--data-dir", data, "--listen-client-urls", cu,
              "--advertise-client-urls", cu, "--listen-peer-urls", pu,
              "--initial-advertise-peer-urls", pu, "--initial-cluster", cluster,
              "--initial-cluster-state", "new", "--initial-cluster-token", e->dir, "--log-level",
              "warn", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Whether a put through the whole endpoint list holds: a quorum (ctx: a kvedge_etcd_t). */
static inline bool kt_etcd_quorum(void *ctx)
{
    return kvedge_etcd_put(ctx, "/kt/health", "1", 1, 0, NULL, 0) == KVEDGE_OK;
}

/* Starts n members in dir/etcdI and waits for a quorum. Returns 0, or -1 (the log files in dir
 * say why). */
static inline int kt_etcd_start(kt_etcd_t *e, const char *dir, int n)
{
    memset(e, 0, sizeof *e);
    e->n = n < 1 ? 1 : n > KT_ETCD_MAX ? KT_ETCD_MAX : n;
    snprintf(e->dir, sizeof e->dir, "%s", dir);
    for (int i = 0; i < e->n; i++) {
        e->client_port[i] = kt_free_port();
        e->peer_port[i] = kt_free_port();
        snprintf(e->client[i], sizeof e->client[i], "http://127.0.0.1:%d", e->client_port[i]);
        size_t l = strlen(e->endpoints);
        snprintf(e->endpoints + l, sizeof e->endpoints - l, "%s%s", i ? "," : "", e->client[i]);
    }
    for (int i = 0; i < e->n; i++)
        e->pid[i] = kt_etcd_spawn(e, i);
    kvedge_etcd_t *c = NULL;
    if (kvedge_etcd_new(e->endpoints, 1000, &c, NULL, 0) != KVEDGE_OK)
        return -1;
    bool up = kt_poll(kt_etcd_quorum, c, KT_ETCD_WAIT_MS);
    kvedge_etcd_destroy(&c);
    return up ? 0 : -1;
}

/* SIGKILLs member i and reaps it. */
static inline void kt_etcd_kill(kt_etcd_t *e, int i)
{
    if (e->pid[i] > 0) {
        kill(e->pid[i], SIGKILL);
        waitpid(e->pid[i], NULL, 0);
    }
    e->pid[i] = 0;
}

/* Starts member i again on its data directory (it rejoins the cluster). */
static inline void kt_etcd_restart(kt_etcd_t *e, int i)
{
    if (e->pid[i] <= 0)
        e->pid[i] = kt_etcd_spawn(e, i);
}

static inline void kt_etcd_stop(kt_etcd_t *e)
{
    for (int i = 0; i < e->n; i++)
        kt_etcd_kill(e, i);
}

#endif
