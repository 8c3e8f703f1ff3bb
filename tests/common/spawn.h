/* Starting the kvedge binary as a daemon from a test: `kvedge --data DIR store --insecure
 * --bind EP`, in its own process that dies with the test. */
#ifndef KVEDGE_TESTS_SPAWN_H
#define KVEDGE_TESTS_SPAWN_H

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

/* Starts a plaintext store node on ep with its store in data and waits for its "listening"
 * line. Returns the pid (the read end of its stdout in *out_fd), or -1 when it did not start. */
static inline pid_t kt_spawn_store(const char *bin, const char *data, const char *ep, int *out_fd)
{
    *out_fd = -1;
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
        execl(bin, "kvedge", "--data", data, "store", "--insecure", "--bind", ep, "--log-level",
              "warn", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[700] = "";
    ssize_t got = read(pfd[0], line, sizeof line - 1);
    if (got <= 0 || !strstr(line, "listening ")) {
        kill(pid, SIGKILL);
        close(pfd[0]);
        return -1;
    }
    *out_fd = pfd[0];
    return pid;
}

/* Starts a plaintext cloud store node on ep (`kvedge --data ROOT/cloud-proc store --role cloud
 * --insecure`, log level error) and waits for the first line it prints. Returns the pid, or -1
 * when it did not start. */
static inline pid_t kt_spawn_cloud(const char *bin, const char *root, const char *ep)
{
    char data[400];
    snprintf(data, sizeof data, "%s/cloud-proc", root);
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        execl(bin, "kvedge", "--data", data, "store", "--role", "cloud", "--insecure", "--bind", ep,
              "--log-level", "error", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[300];
    ssize_t r = read(pfd[0], line, sizeof line);
    close(pfd[0]);
    if (r <= 0) {
        kill(pid, SIGKILL);
        return -1;
    }
    return pid;
}

#endif
