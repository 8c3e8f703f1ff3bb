/* Clocks: the one place the project reads time. Monotonic for deadlines and measurements,
 * wall time for what is stored or shown. */
#ifndef KVEDGE_STORE_CLOCK_H
#define KVEDGE_STORE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t kvedge_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t kvedge_mono_ms(void)
{
    return kvedge_mono_us() / 1000;
}

static inline uint64_t kvedge_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
