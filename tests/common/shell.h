/* For tests that run the kvedge command through a shell: run a command line (or capture what
 * it prints), and look for a text in the file its output went to. Header-only: tests are
 * programs. Include after <cmocka.h>. */
#ifndef KVEDGE_TESTS_SHELL_H
#define KVEDGE_TESTS_SHELL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Runs a shell command line (at most 4 KiB); its exit code, or -1 when it did not exit. */
static inline int kt_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int kt_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs a shell command line; its stdout (at most cap - 1 bytes) into out. Returns its exit
 * code, or -1 when it did not exit. */
static inline int kt_capture(const char *cmd, char *out, size_t cap)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Whether the first 16 KiB of the file at path contain needle. */
static inline bool kt_file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, needle) != NULL;
}

#endif
