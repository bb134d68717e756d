/* CLOCK_MONOTONIC in nanoseconds: the clock of Python's time.monotonic_ns on Linux, so stamps
 * taken in C and in Python lie on one time line. Shared by realrun's C modules. */
#ifndef REALRUN_MONOTONIC_H
#define REALRUN_MONOTONIC_H

#include <stdint.h>
#include <time.h>

static inline int64_t
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

#endif
