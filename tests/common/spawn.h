/* Starting the kvedge binary as a daemon from a test: `kvedge --data DIR store --insecure
 * --bind EP`, in its own process that dies with the test. */
#ifndef KVEDGE_TESTS_SPAWN_H
#define KVEDGE_TESTS_SPAWN_H

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

/* Runs bin with argv in its own process that dies with the test, its stdout on a pipe, and
 * reads the first it prints into line (cap bytes, terminated). Returns the pid with the read
 * end of the pipe in *fd, or -1 when it did not start or printed nothing (then killed). */
static inline pid_t kt_spawn_argv(const char *bin, char *const argv[], char *line, size_t cap,
                                  int *fd)
{
    *fd = -1;
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
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execv(bin, argv);
        _exit(127);
    }
    close(pfd[1]);
    ssize_t got = read(pfd[0], line, cap - 1);
    line[got > 0 ? got : 0] = '\0';
    if (got <= 0) {
        kill(pid, SIGKILL);
        close(pfd[0]);
        return -1;
    }
    *fd = pfd[0];
    return pid;
}

/* Starts a plaintext store node on ep with its store in data and waits for its "listening"
 * line. Returns the pid (the read end of its stdout in *out_fd), or -1 when it did not start. */
static inline pid_t kt_spawn_store(const char *bin, const char *data, const char *ep, int *out_fd)
{
    char *const argv[] = {"kvedge",     "--data",    (char *)data, "store",
                          "--insecure", "--bind",    (char *)ep,   "--log-level",
                          "warn",       "--metrics", "off",        NULL};
    char line[700];
    pid_t pid = kt_spawn_argv(bin, argv, line, sizeof line, out_fd);
    if (pid > 0 && !strstr(line, "listening ")) {
        kill(pid, SIGKILL);
        close(*out_fd);
        *out_fd = -1;
        return -1;
    }
    return pid;
}

/* Starts a plaintext cloud store node on ep (`kvedge --data ROOT/cloud-proc store --role cloud
 * --insecure`, log level error) and waits for the first line it prints. Returns the pid, or -1
 * when it did not start. */
static inline pid_t kt_spawn_cloud(const char *bin, const char *root, const char *ep)
{
    char data[400];
    snprintf(data, sizeof data, "%s/cloud-proc", root);
    char *const argv[] = {"kvedge", "--data",     data,     "store",    "--role",
                          "cloud",  "--insecure", "--bind", (char *)ep, "--log-level",
                          "error",  "--metrics",  "off",    NULL};
    char line[300];
    int fd;
    pid_t pid = kt_spawn_argv(bin, argv, line, sizeof line, &fd);
    if (pid > 0)
        close(fd);
    return pid;
}

#endif
