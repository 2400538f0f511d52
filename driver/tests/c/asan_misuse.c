/*
 * asan_misuse: breaks kestrel.h's buffer contract on purpose, to show that the
 * AddressSanitizer build of driver/tests/capi.rs catches a program that does
 * (asan_catches_a_program_breaking_the_contract).
 *
 *   asan_misuse TARGET free-in-flight   a bounced read's buffer freed before its event is
 *                                       returned: the library copies the data into it when
 *                                       getevents returns the event (heap-use-after-free)
 *   asan_misuse TARGET past-the-end     a bounced write whose len is past the end of its
 *                                       buffer: the library copies len bytes out of it at
 *                                       submit (heap-buffer-overflow)
 *
 * Under AddressSanitizer it never reaches its end; without it, it prints "not caught" and
 * exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kestrel.h"

#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "FAIL line %d: %s (last error: %s)\n", __LINE__, #c,      \
                    kestrel_last_error());                                            \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s TARGET free-in-flight|past-the-end\n", argv[0]);
        return 2;
    }
    kestrel_t *k = NULL;
    CHECK(kestrel_open(argv[1], &k) == 0);
    const size_t bs = kestrel_block_size(k);
    struct kestrel_io_params p = {.nr_events = 4, .flags = KESTREL_IO_BOUNCE,
                                  .bounce_buffers = 4, .bounce_buf_size = (uint32_t)(4 * bs)};
    kestrel_ctx_t *ctx = NULL;
    CHECK(kestrel_io_setup_params(k, &p, &ctx) == 0);
    struct kestrel_iocb cb;
    struct kestrel_event ev;
    if (strcmp(argv[2], "free-in-flight") == 0) {
        uint8_t *buf = malloc(bs);
        CHECK(buf != NULL);
        cb = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = buf, .len = bs};
        CHECK(kestrel_io_submit(ctx, 1, &cb) == 1);
        free(buf); /* wrong: its event has not been returned */
        CHECK(kestrel_io_getevents(ctx, 1, 1, &ev, NULL) == 1);
    } else if (strcmp(argv[2], "past-the-end") == 0) {
        uint8_t *buf = calloc(1, bs);
        CHECK(buf != NULL);
        /* wrong: two blocks from a one-block buffer */
        cb = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = buf, .len = 2 * bs};
        CHECK(kestrel_io_submit(ctx, 1, &cb) == 1);
        CHECK(kestrel_io_getevents(ctx, 1, 1, &ev, NULL) == 1);
        free(buf);
    } else {
        fprintf(stderr, "unknown misuse %s\n", argv[2]);
        return 2;
    }
    CHECK(kestrel_io_destroy(ctx) == 0);
    CHECK(kestrel_close(k) == 0);
    puts("asan_misuse: not caught");
    return 0;
}
