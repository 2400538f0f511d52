/*
 * example_check.h: how the C examples check results and report errors through the
 * Kestrel C ABI (kestrel_strerror for a negative return, kestrel_last_error for the
 * library's message). Included by kestrel_example.c and kestrel_zoned.c.
 *
 *   CHECK(cond, fmt, ...)  counts a failed check in `failures` and goes on.
 *   MUST(call)             a call returning a negative errno: exit(1) with its message.
 */
#ifndef KESTREL_EXAMPLE_CHECK_H
#define KESTREL_EXAMPLE_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "kestrel.h"

static int failures;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                 \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, " (last error: %s)\n", kestrel_last_error());        \
            failures++;                                                          \
        }                                                                        \
    } while (0)

#define MUST(call)                                                               \
    do {                                                                         \
        int rc_ = (call);                                                        \
        if (rc_ < 0) {                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: %s: %s\n", __FILE__, __LINE__,      \
                    #call, kestrel_strerror(rc_), kestrel_last_error());         \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#endif
