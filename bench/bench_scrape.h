/* For the monitoring benchmarks: a free loopback port to give a daemon's --metrics, and a
 * thread that GETs /metrics once a second over a fresh connection, as Prometheus would, so
 * "monitoring on" is measured with its scrapes. Header-only: the benchmarks are programs. */
#ifndef KVEDGE_BENCH_SCRAPE_H
#define KVEDGE_BENCH_SCRAPE_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bench/bench_common.h"

#define BENCH_SCRAPE_MS        1000 /* Prometheus' usual interval is longer: this is the worst */
#define BENCH_SCRAPE_TIMEOUT_S 2
#define BENCH_SCRAPE_MAX       (4 << 20)

typedef struct {
    int port;
    const char *family; /* a scrape counts when its body holds this metric family */
    atomic_bool stop;
    pthread_t thread;
    bool started;
    int scrapes;  /* answered 200 with the family in the body */
    int failures; /* anything else */
    size_t bytes; /* of the last good answer, headers included */
    double secs;  /* summed time of the good scrapes */
} bench_scraper_t;

/* A TCP port on 127.0.0.1 that was free a moment ago. */
static inline int bench_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        fprintf(stderr, "bench: cannot find a free port\n");
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* One GET /metrics; the answer's length, or 0 when it was not a 200 holding family. */
static inline size_t bench_scrape_once(int port, const char *family, char *buf, size_t cap)
{
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n"
                              "Connection: close\r\n\r\n";
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {BENCH_SCRAPE_TIMEOUT_S, 0};
    size_t n = 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1)) {
        ssize_t r;
        while (n + 1 < cap && (r = recv(fd, buf + n, cap - 1 - n, 0)) > 0)
            n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    return strncmp(buf, "HTTP/1.1 200", 12) == 0 && strstr(buf, family) ? n : 0;
}

static inline void *bench_scraper_main(void *arg)
{
    bench_scraper_t *sc = arg;
    char *buf = bench_alloc(BENCH_SCRAPE_MAX);
    double next = bench_now_s();
    while (!atomic_load(&sc->stop)) {
        double t0 = bench_now_s();
        if (t0 >= next) {
            next += BENCH_SCRAPE_MS / 1e3;
            size_t n = bench_scrape_once(sc->port, sc->family, buf, BENCH_SCRAPE_MAX);
            if (n) {
                sc->scrapes++;
                sc->bytes = n;
                sc->secs += bench_now_s() - t0;
            } else {
                sc->failures++;
            }
        }
        usleep(20 * 1000);
    }
    free(buf);
    return NULL;
}

/* Starts scraping sc->port (set by the caller) for family; counters keep adding up. */
static inline void bench_scraper_start(bench_scraper_t *sc, const char *family)
{
    sc->family = family;
    atomic_init(&sc->stop, false);
    sc->started = pthread_create(&sc->thread, NULL, bench_scraper_main, sc) == 0;
    if (!sc->started) {
        fprintf(stderr, "bench: cannot start the scraper thread\n");
        exit(1);
    }
}

static inline void bench_scraper_stop(bench_scraper_t *sc)
{
    atomic_store(&sc->stop, true);
    if (sc->started)
        pthread_join(sc->thread, NULL);
    sc->started = false;
}

#endif
