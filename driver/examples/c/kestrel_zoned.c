/*
 * kestrel_zoned: a zoned namespace through the Kestrel C ABI: zone geometry, reset,
 * zone append (each event names the LBA written), a write that is not at the write
 * pointer (Zone Invalid Write), report zones, finish (Zone Is Full), reset again.
 *
 *   kestrel_zoned TARGET        e.g. emu:ns=16M+4096+zoned+zone1M
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

#define APPENDS 8

/* Submits one iocb and returns its event. */
static struct kestrel_event one(kestrel_ctx_t *ctx, struct kestrel_iocb cb)
{
    struct kestrel_event ev;
    MUST(kestrel_io_submit(ctx, 1, &cb));
    int r = kestrel_io_getevents(ctx, 1, 1, &ev, NULL);
    MUST(r);
    return ev;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s TARGET (a zoned namespace, e.g. emu:ns=16M+4096+zoned+zone1M)\n",
                argv[0]);
        return 2;
    }
    kestrel_t *k = NULL;
    MUST(kestrel_open(argv[1], &k));
    struct kestrel_info info;
    MUST(kestrel_get_info(k, &info));
    CHECK(info.flags & KESTREL_INFO_ZONED, "KESTREL_INFO_ZONED");
    struct kestrel_zone_info zi;
    MUST(kestrel_get_zone_info(k, &zi));
    const uint64_t bs = info.block_size, zsze = zi.zone_size_blocks;
    printf("target %s: %" PRIu64 " zones of %" PRIu64 " blocks, zone append up to %" PRIu64
           " bytes, max open %u, max active %u (0: no limit)\n",
           info.name, zi.zones, zsze, zi.zasl_bytes, zi.max_open, zi.max_active);
    CHECK(zi.zones * zsze <= info.num_blocks && zi.zones > 2, "zone geometry");

    uint8_t *buf = NULL, *rep = NULL;
    MUST(kestrel_dma_alloc(k, APPENDS * bs, (void **)&buf));
    MUST(kestrel_dma_alloc(k, 4096, (void **)&rep));
    memset(buf, 0x5A, APPENDS * bs);
    kestrel_ctx_t *ctx = NULL;
    MUST(kestrel_io_setup(k, APPENDS, &ctx));

    /* Reset every zone, then append to zone 2 from several iocbs at once. */
    struct kestrel_event ev = one(ctx, (struct kestrel_iocb){
        .opcode = KESTREL_OP_ZONE_RESET, .flags = KESTREL_IOCB_ZONE_ALL});
    CHECK(ev.res == 0, "reset all: res %" PRId64, ev.res);
    const uint64_t z2 = 2 * zsze;
    struct kestrel_iocb cb[APPENDS];
    for (int i = 0; i < APPENDS; i++)
        cb[i] = (struct kestrel_iocb){.opcode = KESTREL_OP_ZONE_APPEND, .buf = buf + i * bs,
                                      .len = bs, .offset = z2 * bs, .user_data = (uint64_t)i};
    CHECK(kestrel_io_submit(ctx, APPENDS, cb) == APPENDS, "submit appends");
    struct kestrel_event evs[APPENDS];
    int got = 0;
    while (got < APPENDS) {
        int r = kestrel_io_getevents(ctx, 1, APPENDS - got, evs + got, NULL);
        MUST(r);
        got += r;
    }
    uint64_t seen = 0; /* bit per block of the zone's first APPENDS */
    for (int i = 0; i < APPENDS; i++) {
        CHECK(evs[i].res == (int64_t)bs, "append %" PRIu64 ": res %" PRId64, evs[i].user_data, evs[i].res);
        uint64_t lba = evs[i].value;
        CHECK(lba >= z2 && lba < z2 + APPENDS, "append landed at lba %" PRIu64, lba);
        if (lba >= z2 && lba < z2 + APPENDS) {
            CHECK(!(seen & (1ull << (lba - z2))), "lba %" PRIu64 " returned twice", lba);
            seen |= 1ull << (lba - z2);
        }
    }
    /* The write pointer is at z2 + APPENDS: a write elsewhere is Zone Invalid Write. */
    ev = one(ctx, (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = buf, .len = bs,
                                        .offset = (z2 + 1) * bs});
    CHECK(ev.res == -EIO && ev.has_status && ev.sct == 1 && ev.sc == 0xBC,
          "write not at the write pointer: res %" PRId64 " sct %u sc 0x%02x", ev.res, ev.sct, ev.sc);
    ev = one(ctx, (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = buf, .len = bs,
                                        .offset = (z2 + APPENDS) * bs});
    CHECK(ev.res == (int64_t)bs, "write at the write pointer: res %" PRId64, ev.res);
    /* Report zones from zone 2: its write pointer and state (implicitly opened). */
    ev = one(ctx, (struct kestrel_iocb){.opcode = KESTREL_OP_REPORT_ZONES, .buf = rep,
                                        .len = 4096, .offset = z2 * bs});
    CHECK(ev.res == 4096, "report zones: res %" PRId64, ev.res);
    CHECK(le64(rep) >= 1, "report: %" PRIu64 " zones", le64(rep));
    const uint8_t *d = rep + 64;
    CHECK(le64(d + 16) == z2, "zslba %" PRIu64, le64(d + 16));
    CHECK(le64(d + 24) == z2 + APPENDS + 1, "wp %" PRIu64, le64(d + 24));
    CHECK(d[1] >> 4 == 0x2, "state 0x%x, want implicitly opened", d[1] >> 4);
    /* Finish it: an append is then Zone Is Full; reset makes it writable again. */
    ev = one(ctx, (struct kestrel_iocb){.opcode = KESTREL_OP_ZONE_FINISH, .offset = z2 * bs});
    CHECK(ev.res == 0, "finish: res %" PRId64, ev.res);
    ev = one(ctx, (struct kestrel_iocb){.opcode = KESTREL_OP_ZONE_APPEND, .buf = buf, .len = bs,
                                        .offset = z2 * bs});
    CHECK(ev.res == -EIO && ev.sct == 1 && ev.sc == 0xB9, "append to a full zone: sc 0x%02x", ev.sc);
    ev = one(ctx, (struct kestrel_iocb){.opcode = KESTREL_OP_ZONE_RESET, .offset = z2 * bs});
    CHECK(ev.res == 0, "reset: res %" PRId64, ev.res);
    ev = one(ctx, (struct kestrel_iocb){.opcode = KESTREL_OP_ZONE_APPEND, .buf = buf, .len = bs,
                                        .offset = z2 * bs});
    CHECK(ev.res == (int64_t)bs && ev.value == z2, "append after reset: lba %" PRIu64, ev.value);
    /* Argument checks: a zone action takes no buffer; flags only on zone actions. */
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_ZONE_OPEN, .buf = buf, .offset = 0};
    CHECK(kestrel_io_submit(ctx, 1, cb) == -EINVAL, "zone open with a buffer");
    cb[0] = (struct kestrel_iocb){.opcode = KESTREL_OP_WRITE, .buf = buf, .len = bs,
                                  .flags = KESTREL_IOCB_ZONE_ALL};
    CHECK(kestrel_io_submit(ctx, 1, cb) == -EINVAL, "ZONE_ALL on a write");

    MUST(kestrel_io_destroy(ctx));
    MUST(kestrel_dma_free(k, buf));
    MUST(kestrel_dma_free(k, rep));
    MUST(kestrel_close(k));
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
