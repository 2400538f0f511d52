/*
 * kestrel_example: write, read back and verify through the Kestrel C ABI.
 *
 *   kestrel_example TARGET [CORES]   e.g. emu:size=64M   file:/tmp/disk.img,size=16M
 *
 * Runs the checks in run-to-completion mode, then in cross-thread mode with poller
 * threads pinned to CORES (default "0"), which sleep on completion interrupts when
 * idle (KESTREL_REACTOR_HYBRID).
 *
 * Exits 0 when every check passes, 1 (with a message) otherwise.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kestrel.h"
#include "example_check.h"

#define QD 16
#define BLOCKS_PER_IO 2

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Collects exactly n events, checking each succeeded with the expected size. */
static void reap(kestrel_ctx_t *ctx, int n, int64_t want_res)
{
    struct kestrel_event ev[QD];
    int got = 0;
    while (got < n) {
        int want = n - got > QD ? QD : n - got;
        int r = kestrel_io_getevents(ctx, (size_t)want, (size_t)want, ev, NULL);
        MUST(r);
        for (int i = 0; i < r; i++) {
            CHECK(ev[i].res == want_res,
                  "event %" PRIu64 ": res %" PRId64 " (%s, nvme status %s sct %u sc 0x%02x), want %" PRId64,
                  ev[i].user_data, ev[i].res, ev[i].res < 0 ? kestrel_strerror((int)ev[i].res) : "ok",
                  ev[i].has_status ? "given:" : "none:", ev[i].sct, ev[i].sc, want_res);
        }
        got += r;
    }
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s TARGET [CORES] (e.g. emu:size=64M or file:/tmp/x.img,size=16M; cores 0)\n",
                argv[0]);
        return 2;
    }
    CHECK(kestrel_abi_version() == KESTREL_ABI_VERSION, "abi version %u", kestrel_abi_version());

    kestrel_t *k = NULL;
    MUST(kestrel_open(argv[1], &k));
    struct kestrel_info info;
    MUST(kestrel_get_info(k, &info));
    const size_t bs = info.block_size;
    CHECK(bs == kestrel_block_size(k), "block size getter");
    CHECK(info.capacity_bytes == kestrel_capacity(k), "capacity getter");
    CHECK(info.capacity_bytes == info.num_blocks * bs, "capacity = blocks x block size");
    printf("target %s: %" PRIu64 " blocks of %zu bytes\n", info.name, info.num_blocks, bs);

    const size_t io = BLOCKS_PER_IO * bs;
    uint8_t *wbuf = NULL, *rbuf = NULL;
    MUST(kestrel_dma_alloc(k, QD * io, (void **)&wbuf));
    MUST(kestrel_dma_alloc(k, QD * io, (void **)&rbuf));
    fill(wbuf, QD * io, 42);

    kestrel_ctx_t *ctx = NULL;
    MUST(kestrel_io_setup(k, QD, &ctx));

    /* Argument checks. */
    struct kestrel_iocb cb[QD];
    memset(cb, 0, sizeof cb);
    CHECK(kestrel_io_submit(ctx, 0, cb) == -EINVAL, "nr = 0");
    CHECK(kestrel_io_submit(ctx, 1, NULL) == -EINVAL, "iocbs = NULL");
    CHECK(kestrel_io_submit(NULL, 1, cb) == -EINVAL, "ctx = NULL");
    uint8_t *plain = malloc(io);
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = plain, .len = io};
    CHECK(kestrel_io_submit(ctx, 1, cb) == -EINVAL, "foreign buffer without bounce");
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = wbuf, .len = io, .offset = 1};
    CHECK(kestrel_io_submit(ctx, 1, cb) == -EINVAL, "misaligned offset");
    CHECK(strstr(kestrel_last_error(), "multiple") != NULL, "message names the rule: %s", kestrel_last_error());
    cb[0] = (struct kestrel_iocb){.opcode = 99, .buf = wbuf, .len = io};
    CHECK(kestrel_io_submit(ctx, 1, cb) == -EINVAL, "bad opcode");
    CHECK(kestrel_dma_free(k, plain) == -EINVAL, "free of a foreign buffer");
    CHECK(kestrel_io_cancel(ctx, 12345) == -ENOENT, "cancel of nothing");
    struct kestrel_event ev[QD];
    struct timespec zero = {0, 0};
    CHECK(kestrel_io_getevents(ctx, 1, QD, ev, &zero) == 0, "nothing outstanding");
    CHECK(kestrel_io_getevents(ctx, 1, QD, ev, NULL) == -EDEADLK, "waiting forever");

    /* QD writes in one submit call, then QD reads, verified. */
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){
            .opcode = KESTREL_OP_WRITE, .buf = wbuf + i * io, .len = io,
            .offset = (uint64_t)i * io, .user_data = (uint64_t)i};
    CHECK(kestrel_io_submit(ctx, QD, cb) == QD, "submit %d writes", QD);
    CHECK(kestrel_io_submit(ctx, 1, cb) == -EAGAIN, "full context is -EAGAIN");
    reap(ctx, QD, (int64_t)io);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){
            .opcode = KESTREL_OP_READ, .buf = rbuf + i * io, .len = io,
            .offset = (uint64_t)i * io, .user_data = 100 + (uint64_t)i};
    CHECK(kestrel_io_submit(ctx, QD, cb) == QD, "submit %d reads", QD);
    reap(ctx, QD, (int64_t)io);
    CHECK(memcmp(wbuf, rbuf, QD * io) == 0, "data read back differs");

    /* Vectored read of the first two ios into two separate places. */
    memset(rbuf, 0, QD * io);
    struct kestrel_iovec iov[2] = {{rbuf + 3 * io, io}, {rbuf, io}};
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_READV, .iov = iov, .iovcnt = 2,
                                  .len = 2 * io, .offset = 0, .user_data = 200};
    CHECK(kestrel_io_submit(ctx, 1, cb) == 1, "readv");
    reap(ctx, 1, (int64_t)(2 * io));
    CHECK(memcmp(rbuf + 3 * io, wbuf, io) == 0 && memcmp(rbuf, wbuf + io, io) == 0, "readv data");

    /* Write zeroes (where supported), flush. */
    int n = 0;
    cb[n++] = (struct kestrel_iocb){.opcode = KESTREL_OP_FLUSH, .user_data = 300};
    if (info.flags & KESTREL_INFO_WRITE_ZEROES)
        cb[n++] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE_ZEROES, .offset = 0, .len = io,
                                        .user_data = 301};
    CHECK(kestrel_io_submit(ctx, (size_t)n, cb) == n, "flush + write zeroes");
    int got = 0;
    while (got < n) {
        int r = kestrel_io_getevents(ctx, 1, QD, ev, NULL);
        MUST(r);
        for (int i = 0; i < r; i++)
            CHECK(ev[i].res == (ev[i].user_data == 300 ? 0 : (int64_t)io), "event %" PRIu64 " res %" PRId64,
                  ev[i].user_data, ev[i].res);
        got += r;
    }
    if (info.flags & KESTREL_INFO_WRITE_ZEROES) {
        cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = rbuf, .len = io, .user_data = 302};
        CHECK(kestrel_io_submit(ctx, 1, cb) == 1, "read zeroes");
        reap(ctx, 1, (int64_t)io);
        for (size_t i = 0; i < io; i++)
            if (rbuf[i] != 0) {
                CHECK(0, "write zeroes left data at byte %zu", i);
                break;
            }
    }
    MUST(kestrel_io_destroy(ctx));

    /* The bounce path: ordinary (malloc) memory, copied through DMA bounce buffers. */
    struct kestrel_io_params p = {.nr_events = 4, .flags = KESTREL_IO_BOUNCE, .bounce_buffers = 2,
                                  .bounce_buf_size = (uint32_t)io};
    MUST(kestrel_io_setup_params(k, &p, &ctx));
    fill(plain, io, 7);
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = plain, .len = io,
                                  .offset = 5 * io, .user_data = 400};
    CHECK(kestrel_io_submit(ctx, 1, cb) == 1, "bounced write");
    reap(ctx, 1, (int64_t)io);
    uint8_t *back = calloc(1, io);
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = back, .len = io,
                                  .offset = 5 * io, .user_data = 401};
    CHECK(kestrel_io_submit(ctx, 1, cb) == 1, "bounced read");
    reap(ctx, 1, (int64_t)io);
    CHECK(memcmp(plain, back, io) == 0, "bounced data read back differs");
    MUST(kestrel_io_destroy(ctx));
    free(back);
    free(plain);

    /* Cross-thread: a poller pinned to each of CORES; same calls, getevents waits. */
    kestrel_reactor_t *r = NULL;
    CHECK(kestrel_reactor_start(k, "0", KESTREL_REACTOR_BACKOFF | KESTREL_REACTOR_HYBRID, &r) ==
              -EINVAL,
          "two idle policies at once are refused");
    MUST(kestrel_reactor_start(k, argc > 2 ? argv[2] : "0", KESTREL_REACTOR_HYBRID, &r));
    struct kestrel_io_params rp = {.nr_events = QD};
    MUST(kestrel_reactor_io_setup(r, &rp, &ctx));
    memset(rbuf, 0, QD * io);
    fill(wbuf, QD * io, 99);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){
            .opcode = KESTREL_OP_WRITE, .buf = wbuf + i * io, .len = io,
            .offset = (uint64_t)(QD + i) * io, .user_data = 500 + (uint64_t)i};
    CHECK(kestrel_io_submit(ctx, QD, cb) == QD, "cross-thread writes");
    reap(ctx, QD, (int64_t)io);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){
            .opcode = KESTREL_OP_READ, .buf = rbuf + i * io, .len = io,
            .offset = (uint64_t)(QD + i) * io, .user_data = 600 + (uint64_t)i};
    CHECK(kestrel_io_submit(ctx, QD, cb) == QD, "cross-thread reads");
    reap(ctx, QD, (int64_t)io);
    CHECK(memcmp(wbuf, rbuf, QD * io) == 0, "cross-thread data read back differs");
    /* In flight at the stop: every event still comes, and later submits are refused. */
    CHECK(kestrel_io_submit(ctx, QD, cb) == QD, "reads before the stop");
    MUST(kestrel_reactor_stop(r));
    reap(ctx, QD, (int64_t)io);
    CHECK(kestrel_io_submit(ctx, 1, cb) == -ESHUTDOWN, "submit after the stop");
    MUST(kestrel_io_destroy(ctx));

    MUST(kestrel_dma_free(k, wbuf));
    MUST(kestrel_dma_free(k, rbuf));
    CHECK(kestrel_dma_free(k, wbuf) == -EINVAL, "double free is refused");
    MUST(kestrel_close(k));

    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("kestrel_example: all checks passed, %d x %zu bytes verified\n", QD, io);
    return 0;
}
