/*
 * asan_contract: the C ABI used as kestrel.h's buffer contract says, built with
 * AddressSanitizer (driver/tests/capi.rs: asan_c_program_following_the_contract).
 *
 *   asan_contract TARGET CORES     e.g. emu:size=64M,latency=200us 0
 *
 * The contract: a buffer named by an iocb (buf, the iovecs' bases, md_buf) stays valid and
 * untouched from kestrel_io_submit() until its event is returned by
 * kestrel_io_getevents() or the context is destroyed (kestrel_io_destroy() waits for what
 * is in flight); a buffer from kestrel_dma_alloc() is freed only after that. Everything
 * else an iocb points to (the iocb array, the iovec array) is read during the submit call
 * only. The program keeps to it everywhere, and frees each piece of ordinary memory at the
 * earliest moment the contract allows, so that a library that touched it later (a bounced
 * read copied out after its event, a destroy that returned before its I/O finished) would
 * be a heap-use-after-free AddressSanitizer reports.
 *
 * It covers: open and info, DMA allocation, batches of writes and reads (run-to-completion
 * and cross-thread), vectored I/O, bounced ordinary memory, flush, getevents with min_nr,
 * nr and a timeout (zero, bounded, none), cancel, destroying contexts with I/O in flight,
 * stopping a reactor with I/O in flight, and freeing everything. Exits 0 after printing
 * "all checks passed", 1 at the first failed check.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kestrel.h"

#define QD 16

#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "FAIL line %d: %s (last error: %s)\n", __LINE__, #c,      \
                    kestrel_last_error());                                            \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static size_t bs;

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

/* A heap copy of n iocbs, freed by the caller right after the submit call. */
static struct kestrel_iocb *iocbs(size_t n)
{
    struct kestrel_iocb *cb = calloc(n, sizeof *cb);
    CHECK(cb != NULL);
    return cb;
}

/* Submits n heap iocbs in one call, then frees them (they are read during the call). */
static void submit_all(kestrel_ctx_t *ctx, struct kestrel_iocb *cb, size_t n)
{
    CHECK(kestrel_io_submit(ctx, n, cb) == (int)n);
    free(cb);
}

/* Reaps exactly n events into a heap array of n, a few at a time (min_nr 1, nr 4, a
 * bounded timeout), checking each user_data is one of [first, first + n) and comes once,
 * and each res is want (want < 0: any result). */
static void reap(kestrel_ctx_t *ctx, size_t n, uint64_t first, int64_t want)
{
    struct kestrel_event *ev = calloc(4, sizeof *ev);
    uint8_t *seen = calloc(n, 1);
    CHECK(ev != NULL && seen != NULL);
    size_t got = 0;
    while (got < n) {
        struct timespec limit = {10, 0};
        int r = kestrel_io_getevents(ctx, 1, 4, ev, &limit);
        CHECK(r >= 1 && r <= 4);
        for (int i = 0; i < r; i++) {
            CHECK(ev[i].user_data >= first && ev[i].user_data < first + n);
            CHECK(!seen[ev[i].user_data - first]);
            seen[ev[i].user_data - first] = 1;
            if (want >= 0)
                CHECK(ev[i].res == want);
        }
        got += (size_t)r;
    }
    free(seen);
    free(ev);
}

/* QD writes from wbuf then QD reads into rbuf at block offset base, verified. */
static void write_then_read(kestrel_ctx_t *ctx, uint8_t *wbuf, uint8_t *rbuf, uint64_t base,
                            uint64_t seed)
{
    const size_t io = 2 * bs;
    fill(wbuf, QD * io, seed);
    memset(rbuf, 0, QD * io);
    struct kestrel_iocb *cb = iocbs(QD);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = wbuf + i * io,
                                      .len = io, .offset = (base + 2 * i) * bs,
                                      .user_data = seed * 1000 + i};
    submit_all(ctx, cb, QD);
    reap(ctx, QD, seed * 1000, (int64_t)io);
    cb = iocbs(QD);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = rbuf + i * io,
                                      .len = io, .offset = (base + 2 * i) * bs,
                                      .user_data = seed * 1000 + QD + i};
    submit_all(ctx, cb, QD);
    reap(ctx, QD, seed * 1000 + QD, (int64_t)io);
    CHECK(memcmp(wbuf, rbuf, QD * io) == 0);
}

/* writev from two DMA pieces, readv into two others (iovec arrays on the heap, freed
 * after the submit call), plus a flush in the same batch. */
static void vectored(kestrel_ctx_t *ctx, uint8_t *a, uint8_t *b, uint8_t *c, uint8_t *d)
{
    fill(a, bs, 11);
    fill(b, 3 * bs, 12);
    struct kestrel_iovec *wv = calloc(2, sizeof *wv);
    CHECK(wv != NULL);
    wv[0] = (struct kestrel_iovec){a, bs};
    wv[1] = (struct kestrel_iovec){b, 3 * bs};
    struct kestrel_iocb *cb = iocbs(2);
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITEV, .iov = wv, .iovcnt = 2,
                                  .len = 4 * bs, .offset = 100 * bs, .user_data = 1};
    cb[1] = (struct kestrel_iocb){.opcode = KESTREL_OP_FLUSH, .user_data = 2};
    submit_all(ctx, cb, 2);
    free(wv);
    reap(ctx, 2, 1, -1);
    struct kestrel_iovec *rv = calloc(2, sizeof *rv);
    CHECK(rv != NULL);
    rv[0] = (struct kestrel_iovec){c, 2 * bs};
    rv[1] = (struct kestrel_iovec){d, 2 * bs};
    cb = iocbs(1);
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_READV, .iov = rv, .iovcnt = 2,
                                  .len = 4 * bs, .offset = 100 * bs, .user_data = 3};
    submit_all(ctx, cb, 1);
    free(rv);
    reap(ctx, 1, 3, (int64_t)(4 * bs));
    CHECK(memcmp(c, a, bs) == 0 && memcmp(c + bs, b, bs) == 0);
    CHECK(memcmp(d, b + bs, 2 * bs) == 0);
}

/* Bounced ordinary memory: QD writes from malloc'd buffers, each freed as soon as its
 * event is back; QD reads into malloc'd buffers, verified and freed as their events come;
 * then reads left in flight at kestrel_io_destroy, whose buffers are freed after it. */
static void bounced(kestrel_t *k)
{
    const size_t io = 2 * bs;
    struct kestrel_io_params p = {.nr_events = QD, .flags = KESTREL_IO_BOUNCE,
                                  .bounce_buffers = QD, .bounce_buf_size = (uint32_t)io};
    kestrel_ctx_t *ctx = NULL;
    CHECK(kestrel_io_setup_params(k, &p, &ctx) == 0);
    uint8_t *buf[QD];
    struct kestrel_iocb *cb = iocbs(QD);
    for (int i = 0; i < QD; i++) {
        buf[i] = malloc(io);
        CHECK(buf[i] != NULL);
        fill(buf[i], io, 200 + i);
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = buf[i], .len = io,
                                      .offset = (300 + 2 * i) * bs, .user_data = i};
    }
    submit_all(ctx, cb, QD);
    for (int left = QD; left > 0; left--) {
        struct kestrel_event ev;
        CHECK(kestrel_io_getevents(ctx, 1, 1, &ev, NULL) == 1);
        CHECK(ev.user_data < QD && buf[ev.user_data] != NULL && ev.res == (int64_t)io);
        free(buf[ev.user_data]); /* returned: ours again */
        buf[ev.user_data] = NULL;
    }
    cb = iocbs(QD);
    for (int i = 0; i < QD; i++) {
        buf[i] = malloc(io);
        CHECK(buf[i] != NULL);
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = buf[i], .len = io,
                                      .offset = (300 + 2 * i) * bs, .user_data = i};
    }
    submit_all(ctx, cb, QD);
    uint8_t *want = malloc(io);
    CHECK(want != NULL);
    for (int left = QD; left > 0; left--) {
        struct kestrel_event ev;
        CHECK(kestrel_io_getevents(ctx, 1, 1, &ev, NULL) == 1);
        CHECK(ev.user_data < QD && buf[ev.user_data] != NULL && ev.res == (int64_t)io);
        fill(want, io, 200 + ev.user_data);
        CHECK(memcmp(buf[ev.user_data], want, io) == 0);
        free(buf[ev.user_data]);
        buf[ev.user_data] = NULL;
    }
    free(want);
    /* In flight at destroy: it waits for them, so the buffers are ours after it. */
    cb = iocbs(QD);
    for (int i = 0; i < QD; i++) {
        buf[i] = malloc(io);
        CHECK(buf[i] != NULL);
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = buf[i], .len = io,
                                      .offset = (300 + 2 * i) * bs, .user_data = i};
    }
    submit_all(ctx, cb, QD);
    CHECK(kestrel_io_destroy(ctx) == 0);
    for (int i = 0; i < QD; i++)
        free(buf[i]);
}

/* Cancels: QD reads, every other one cancelled; every iocb still gives one event, and a
 * cancelled one says what became of it. getevents with a zero timeout only looks. */
static void cancels(kestrel_ctx_t *ctx, uint8_t *rbuf, int cross_thread)
{
    const size_t io = 2 * bs;
    struct kestrel_iocb *cb = iocbs(QD);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = rbuf + i * io,
                                      .len = io, .offset = (uint64_t)i * io,
                                      .user_data = 700 + i};
    submit_all(ctx, cb, QD);
    for (int i = 0; i < QD; i += 2) {
        int r = kestrel_io_cancel(ctx, 700 + i);
        /* -ENOENT: its event is already waiting to be collected. */
        CHECK(r == -ENOENT || (r >= KESTREL_CANCEL_STATUS_CANCELLED &&
                               r <= KESTREL_CANCEL_STATUS_REQUESTED));
        CHECK(cross_thread || r != KESTREL_CANCEL_STATUS_REQUESTED);
    }
    struct kestrel_event *ev = calloc(QD, sizeof *ev);
    CHECK(ev != NULL);
    struct timespec zero = {0, 0};
    int n = kestrel_io_getevents(ctx, 0, QD, ev, &zero);
    CHECK(n >= 0 && n <= QD);
    while (n < QD) {
        int r = kestrel_io_getevents(ctx, (size_t)(QD - n), (size_t)(QD - n), ev + n, NULL);
        CHECK(r > 0);
        n += r;
    }
    int once[QD] = {0};
    for (int i = 0; i < QD; i++) {
        uint64_t j = ev[i].user_data - 700;
        CHECK(j < QD && !once[j]++);
        if (ev[i].cancel == KESTREL_CANCEL_NONE)
            CHECK(ev[i].res == (int64_t)io);
        else if (ev[i].cancel == KESTREL_CANCEL_TOO_LATE)
            CHECK(j % 2 == 0 && ev[i].res == (int64_t)io);
        else
            CHECK(j % 2 == 0 && ev[i].res == -ECANCELED);
    }
    free(ev);
    CHECK(kestrel_io_getevents(ctx, 1, 1, &(struct kestrel_event){0}, &zero) == 0);
}

/* DMA reads left in flight at kestrel_io_destroy; the buffers are freed after it. */
static void destroy_in_flight(kestrel_ctx_t *ctx, uint8_t *rbuf)
{
    struct kestrel_iocb *cb = iocbs(QD);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = rbuf + i * 2 * bs,
                                      .len = 2 * bs, .offset = (uint64_t)i * 2 * bs,
                                      .user_data = 800 + i};
    submit_all(ctx, cb, QD);
    CHECK(kestrel_io_destroy(ctx) == 0);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s TARGET CORES\n", argv[0]);
        return 2;
    }
    kestrel_t *k = NULL;
    CHECK(kestrel_open(argv[1], &k) == 0);
    struct kestrel_info *info = malloc(sizeof *info);
    CHECK(info != NULL && kestrel_get_info(k, info) == 0);
    bs = info->block_size;
    free(info);
    const size_t io = 2 * bs;
    uint8_t *wbuf = NULL, *rbuf = NULL, *v[4];
    CHECK(kestrel_dma_alloc(k, QD * io, (void **)&wbuf) == 0);
    CHECK(kestrel_dma_alloc(k, QD * io, (void **)&rbuf) == 0);
    for (int i = 0; i < 4; i++)
        CHECK(kestrel_dma_alloc(k, 4 * bs, (void **)&v[i]) == 0);

    /* Run-to-completion. */
    kestrel_ctx_t *ctx = NULL;
    CHECK(kestrel_io_setup(k, QD, &ctx) == 0);
    write_then_read(ctx, wbuf, rbuf, 0, 1);
    vectored(ctx, v[0], v[1], v[2], v[3]);
    cancels(ctx, rbuf, 0);
    destroy_in_flight(ctx, rbuf);
    bounced(k);

    /* Cross-thread: the same, through a poller; then I/O in flight when the reactor
     * stops (its events still come) and when the context is destroyed. */
    kestrel_reactor_t *r = NULL;
    CHECK(kestrel_reactor_start(k, argv[2], KESTREL_REACTOR_HYBRID, &r) == 0);
    struct kestrel_io_params rp = {.nr_events = QD};
    CHECK(kestrel_reactor_io_setup(r, &rp, &ctx) == 0);
    write_then_read(ctx, wbuf, rbuf, 1000, 2);
    vectored(ctx, v[0], v[1], v[2], v[3]);
    cancels(ctx, rbuf, 1);
    struct kestrel_iocb *cb = iocbs(QD);
    for (int i = 0; i < QD; i++)
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_READ, .buf = rbuf + i * io,
                                      .len = io, .offset = (uint64_t)i * io,
                                      .user_data = 900 + i};
    submit_all(ctx, cb, QD);
    CHECK(kestrel_reactor_stop(r) == 0);
    reap(ctx, QD, 900, (int64_t)io);
    CHECK(kestrel_io_destroy(ctx) == 0);

    CHECK(kestrel_reactor_start(k, argv[2], 0, &r) == 0);
    CHECK(kestrel_reactor_io_setup(r, &rp, &ctx) == 0);
    destroy_in_flight(ctx, rbuf);
    CHECK(kestrel_reactor_stop(r) == 0);

    CHECK(kestrel_dma_free(k, wbuf) == 0);
    CHECK(kestrel_dma_free(k, rbuf) == 0);
    for (int i = 0; i < 4; i++)
        CHECK(kestrel_dma_free(k, v[i]) == 0);
    CHECK(kestrel_close(k) == 0);
    puts("asan_contract: all checks passed");
    return 0;
}
