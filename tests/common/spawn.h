/* Starting the kvedge binary as a daemon from a test: `kvedge --data DIR store --insecure
 * --bind EP`, in its own process that dies with the test, its stdout on a pipe. */
#ifndef KVEDGE_TESTS_SPAWN_H
#define KVEDGE_TESTS_SPAWN_H

#include <signal.h>
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

#endif
