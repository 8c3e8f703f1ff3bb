/* Starting and stopping kvedge daemons from a benchmark: fork and exec of the kvedge binary with
 * its stdout on a pipe, read until the daemon's "listening" line (its ready signal). The child
 * is killed if the benchmark dies first (PR_SET_PDEATHSIG). */
#ifndef KVEDGE_BENCH_SPAWN_H
#define KVEDGE_BENCH_SPAWN_H

#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs bin with argv (argv[0] included, NULL-terminated) and waits for its ready line. Returns
 * the child's pid, or -1 when it could not be started or exited (or closed its stdout) before
 * saying it listens; such a child is reaped. */
static inline pid_t bench_spawn(const char *bin, char *const argv[])
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execv(bin, argv);
        _exit(127);
    }
    close(pfd[1]);
    char line[400];
    ssize_t got = read(pfd[0], line, sizeof line - 1);
    close(pfd[0]);
    if (got > 0)
        line[got] = '\0';
    if (got <= 0 || !strstr(line, "listening")) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

/* SIGTERM and wait; zeroes *pid. No-op for a pid <= 0. */
static inline void bench_stop(pid_t *pid)
{
    if (*pid > 0) {
        kill(*pid, SIGTERM);
        waitpid(*pid, NULL, 0);
    }
    *pid = 0;
}

#endif
