/*
 * kestrel.h - C ABI of Kestrel, a polled-mode userspace NVMe driver.
 *
 * An aio-style API (after Linux aio and io_uring): open a target, allocate DMA
 * buffers from it, set up a context, submit iocbs, collect events. Two modes, with
 * the same kestrel_io_* calls:
 *   - run-to-completion (kestrel_io_setup): the context owns a queue on the target
 *     and the thread using it polls it;
 *   - cross-thread (kestrel_reactor_start + kestrel_reactor_io_setup): pinned
 *     poller threads own the queues; contexts hand them requests through lock-free
 *     rings and kestrel_io_getevents waits for their completions.
 *
 * Conventions
 *   - Functions returning int return 0 (or a count) on success and a negative
 *     errno on failure; kestrel_last_error() has the full message of the calling
 *     thread's last failure, kestrel_strerror() a short one for a code.
 *   - Every pointer and length is checked: NULL, zero, overflow, misaligned
 *     pointers, live handles of the wrong kind and buffers not from
 *     kestrel_dma_alloc() are -EINVAL.
 *   - Offsets and lengths are bytes and must be multiples of the block size.
 *   - A kestrel_t may be shared between threads; a kestrel_ctx_t is used by one
 *     thread at a time.
 *
 * Pointers: what every call relies on (breaking it is undefined behaviour; the
 * checks above catch mistakes, they cannot make these hold)
 *   - A handle (kestrel_t *, kestrel_ctx_t *, kestrel_reactor_t *) is NULL or live:
 *     returned by its constructor (kestrel_open*, kestrel_io_setup*,
 *     kestrel_reactor_io_setup, kestrel_reactor_start) and not yet given to its
 *     destructor (kestrel_close, kestrel_io_destroy, kestrel_reactor_stop). A live
 *     handle of another kind is refused by the magic number it starts with; a
 *     destroyed one must not be passed (its memory may have been reused).
 *   - A kestrel_t or kestrel_reactor_t may be used by several threads at once, but
 *     is not destroyed while another call uses it. A kestrel_ctx_t has one call at a
 *     time on it. After a destructor returns, the handle is not passed again.
 *   - An out-pointer (out, events) is NULL or, aligned for its type, valid for
 *     writes of one object (of nr events) for the duration of the call, and
 *     overlaps no other argument.
 *   - An in-pointer (params, iocbs, an iocb's iov, timeout) is NULL or, aligned
 *     for its type, valid for reads of one initialised object (of nr iocbs, of
 *     iovcnt entries) and unchanged for the duration of the call.
 *   - A string (target, cores) is NULL or readable up to and including its NUL
 *     (at most 4097 and 1024 bytes are read), unchanged during the call.
 *   - The library keeps none of these pointers after the call returns: all but
 *     the buffers below.
 *
 * Buffers: memory an accepted iocb names (buf, the iov bases, md_buf) stays valid
 * and untouched -- not freed (kestrel_dma_free, free), not written, and for a read
 * not read either -- until that iocb's event has been returned by
 * kestrel_io_getevents() or its context destroyed (kestrel_io_destroy() waits for
 * it; see there). The device, or the library's bounce copy, reads or writes it
 * until then.
 *   - kestrel_io_submit() never sleeps: it takes as many iocbs as fit, in order,
 *     and returns how many (-EAGAIN when none fit).
 *   - Every accepted iocb produces exactly one event.
 *
 * Link with -lkestrel (libkestrel.so or libkestrel.a; the static library also
 * needs -lpthread -ldl -lm -lgcc_s).
 */
#ifndef KESTREL_H
#define KESTREL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2: zoned namespaces (the zone opcodes, kestrel_event.value, 32-byte events)
 * and metadata (kestrel_iocb md_buf..app_mask, KESTREL_IOCB_MD; kestrel_info md_size,
 * pi_type, md_flags). */
#define KESTREL_ABI_VERSION 2

/* Opcodes (struct kestrel_iocb.opcode). */
#define KESTREL_OP_READ 0         /* len bytes at offset into buf */
#define KESTREL_OP_WRITE 1        /* len bytes at offset from buf */
#define KESTREL_OP_FLUSH 2        /* offset, len ignored; buf, iov NULL */
#define KESTREL_OP_WRITE_ZEROES 3 /* buf, iov NULL */
#define KESTREL_OP_DISCARD 4      /* buf, iov NULL */
#define KESTREL_OP_READV 5        /* into iov[0..iovcnt) */
#define KESTREL_OP_WRITEV 6       /* from iov[0..iovcnt) */
/* Zoned namespaces (KESTREL_INFO_ZONED; see docs/formats.md). offset is the byte
 * offset of a zone's start (report: any byte of the first zone reported). */
#define KESTREL_OP_ZONE_APPEND 7  /* len bytes from buf (dma memory) to the zone's write
                                     pointer; event.value = the LBA written */
#define KESTREL_OP_ZONE_OPEN 8    /* buf, iov NULL, len 0; flags may be ZONE_ALL */
#define KESTREL_OP_ZONE_CLOSE 9   /* likewise */
#define KESTREL_OP_ZONE_FINISH 10 /* likewise */
#define KESTREL_OP_ZONE_RESET 11  /* likewise */
#define KESTREL_OP_REPORT_ZONES 12 /* len bytes into buf (dma memory): a 64-byte header
                                      (uint64_t number of descriptors), then 64-byte zone
                                      descriptors as the NVMe ZNS specification lays them out */

/* struct kestrel_iocb.flags of KESTREL_OP_ZONE_OPEN..RESET: every zone the action
 * applies to (Select All); offset ignored. */
#define KESTREL_IOCB_ZONE_ALL 1u

/* What a cancel did (struct kestrel_event.cancel). */
#define KESTREL_CANCEL_NONE 0      /* no cancel was asked for */
#define KESTREL_CANCEL_CANCELLED 1 /* never reached the device; res = -ECANCELED */
#define KESTREL_CANCEL_ABORTED 2   /* aborted at the device; res = -ECANCELED, sct/sc 0/7 */
#define KESTREL_CANCEL_TOO_LATE 3  /* completed anyway; res is its own result */

/* kestrel_io_cancel() results (the event still comes and has the final word). */
#define KESTREL_CANCEL_STATUS_CANCELLED 0   /* not at the device */
#define KESTREL_CANCEL_STATUS_ABORTED 1     /* NVMe Abort sent; the controller aborted it */
#define KESTREL_CANCEL_STATUS_NOT_ABORTED 2 /* NVMe Abort sent; the controller did not */
#define KESTREL_CANCEL_STATUS_TOO_LATE 3    /* already complete, or cannot be aborted */
#define KESTREL_CANCEL_STATUS_REQUESTED 4   /* handed to a poller thread */

/* struct kestrel_io_params.flags */
#define KESTREL_IO_BOUNCE 1u /* accept ordinary memory, copied through bounce buffers */

/* kestrel_reactor_start() flags: how idle pollers wait (at most one; none: busy-poll) */
#define KESTREL_REACTOR_BACKOFF 1u   /* pause, yield, then sleep when nothing is in flight */
#define KESTREL_REACTOR_INTERRUPT 2u /* sleep on completion interrupts whenever idle */
#define KESTREL_REACTOR_HYBRID 4u    /* busy-poll under load, sleep on interrupts when idle */

/* struct kestrel_info.flags */
#define KESTREL_INFO_WRITE_ZEROES (1u << 0)
#define KESTREL_INFO_DISCARD (1u << 1)
#define KESTREL_INFO_DISCARD_ZEROES (1u << 2)
#define KESTREL_INFO_FLUSH (1u << 3)
#define KESTREL_INFO_READ_ONLY (1u << 4)
#define KESTREL_INFO_ZONED (1u << 5) /* kestrel_get_zone_info() has its zones */

/* struct kestrel_info.md_flags (namespaces formatted with metadata, md_size > 0) */
#define KESTREL_MD_EXTENDED (1u << 0) /* metadata interleaved with the data (extended LBA) */
#define KESTREL_MD_PI_FIRST (1u << 1) /* the PI is the first 8 bytes of the metadata */
#define KESTREL_MD_REQUIRED (1u << 2) /* every read and write must carry the metadata */

/* struct kestrel_iocb.flags */
#define KESTREL_IOCB_MD (1u << 1) /* carries metadata: md_buf (separate), or in buf (extended) */

#define KESTREL_MAX_IOV 8
#define KESTREL_NAME_LEN 64
#define KESTREL_DEFAULT_BOUNCE_BUFFERS 64
#define KESTREL_DEFAULT_BOUNCE_BUF_SIZE (128 * 1024)

typedef struct kestrel kestrel_t;         /* an open target */
typedef struct kestrel_ctx kestrel_ctx_t; /* an I/O context */
typedef struct kestrel_reactor kestrel_reactor_t; /* pinned poller threads */

struct kestrel_info {
    uint64_t num_blocks;
    uint64_t capacity_bytes;
    uint64_t max_transfer_bytes;
    uint32_t block_size;
    uint32_t nsid;
    uint32_t flags; /* KESTREL_INFO_* */
    uint16_t md_size; /* metadata bytes per block; 0: none */
    uint8_t pi_type;  /* protection information type: 0 none, 1, 2, 3 (16-bit guard) */
    uint8_t md_flags; /* KESTREL_MD_* */
    char name[KESTREL_NAME_LEN]; /* NUL-terminated */
};

struct kestrel_iovec {
    void *base; /* inside a buffer from kestrel_dma_alloc() */
    size_t len;
};

struct kestrel_iocb {
    uint64_t user_data; /* returned in the event */
    uint64_t offset;    /* bytes, a multiple of the block size */
    uint64_t len;       /* bytes, a multiple of the block size */
    void *buf;          /* READ/WRITE: from kestrel_dma_alloc(), or (with
                           KESTREL_IO_BOUNCE) ordinary memory that stays valid and
                           untouched until the event; NULL otherwise */
    const struct kestrel_iovec *iov; /* READV/WRITEV; NULL otherwise */
    uint32_t iovcnt;    /* 1..KESTREL_MAX_IOV for READV/WRITEV */
    uint32_t nsid;      /* 0: the target's namespace */
    uint16_t opcode;    /* KESTREL_OP_* */
    uint16_t flags;     /* KESTREL_IOCB_*; 0 without metadata */
    uint32_t reserved;  /* 0 */
    /* Metadata (KESTREL_IOCB_MD, READ/WRITE/READV/WRITEV): separate metadata in md_buf
     * (from kestrel_dma_alloc(), md_len >= len / block_size * md_size); for extended
     * LBAs md_buf is NULL and buf holds block_size + md_size bytes per block (len still
     * counts the data only). With protection information the PI in the metadata is the
     * caller's and the controller checks it: the guard, the reference tag (type 1: the
     * LBA's low 32 bits; type 2: ref_tag, counting up per block) and the application
     * tag under app_mask. Without KESTREL_IOCB_MD, on a namespace whose metadata is
     * exactly the 8-byte PI, the controller inserts and strips it. */
    void *md_buf;
    uint64_t md_len;
    uint32_t ref_tag;
    uint16_t app_tag;
    uint16_t app_mask;
};

struct kestrel_event {
    uint64_t user_data;
    int64_t res;        /* bytes transferred (0 for flush), or -errno */
    uint8_t has_status; /* 1: sct/sc/dnr/more hold the NVMe status the device gave */
    uint8_t sct;
    uint8_t sc;
    uint8_t dnr;
    uint8_t more;
    uint8_t cancel;     /* KESTREL_CANCEL_* */
    uint8_t reserved[2];
    uint64_t value;     /* KESTREL_OP_ZONE_APPEND: the LBA written; 0 otherwise */
};

struct kestrel_zone_info {
    uint64_t zone_size_blocks;
    uint64_t zones;
    uint64_t zasl_bytes;  /* the largest zone append */
    uint32_t max_open;    /* 0: no limit */
    uint32_t max_active;  /* 0: no limit */
};

/* How kestrel_open_params() opens a target; zero-initialised, it means what
 * kestrel_open() does. The timeouts apply to NVMe targets (emu, pci); a file target
 * has none and ignores them. */
struct kestrel_open_params {
    uint64_t io_timeout_ns;    /* per-command I/O timeout: a command not completed
                                  within it is aborted, then the controller reset;
                                  1 ms..1 day, 0: 30 s */
    uint64_t admin_timeout_ns; /* admin commands (bring-up, queue creation, Abort,
                                  reset): 1 ms..1 day, 0: 60 s */
    uint32_t flags;            /* 0 */
    uint32_t reserved;         /* 0 */
};

struct kestrel_io_params {
    uint32_t nr_events;       /* requests outstanding at once, 1..65536 */
    uint32_t flags;           /* KESTREL_IO_* */
    uint32_t bounce_buffers;  /* 0: min(nr_events, KESTREL_DEFAULT_BOUNCE_BUFFERS) */
    uint32_t bounce_buf_size; /* 0: KESTREL_DEFAULT_BOUNCE_BUF_SIZE */
};

/* The ABI version of the library (KESTREL_ABI_VERSION it was built with). */
uint32_t kestrel_abi_version(void);

/*
 * Opens a target:
 *   emu[:size=SIZE,lba=512|4096,namespaces=N,latency=DURATION,
 *        store=memory|null|PATH,mdts=N,queues=N,core=N|none,faults=SPEC]
 *   file:PATH[,size=SIZE][,direct=on|off]
 *   pci:DDDD:BB:DD.F (or a bare BDF)
 *   tcp:HOST:PORT/NQN[,digest=none|hdr|data|both,hostnqn=NQN,hostid=UUID,queues=N,
 *        queue_size=N,kato=DURATION,ctrl_loss_tmo=DURATION] (NVMe/TCP; namespace 1,
 *        or /ns=N; docs/nvme-tcp-host.md)
 * Options are key=value in any order; the strings are those of `kestrel --target`
 * and mean the same targets.
 */
int kestrel_open(const char *target, kestrel_t **out);
/* kestrel_open() with options (timeouts); params must not be NULL (24 bytes read). */
int kestrel_open_params(const char *target, const struct kestrel_open_params *params,
                        kestrel_t **out);
/* Closes the handle; open contexts keep the target alive until destroyed. No other
 * call may use k during or after this one. */
int kestrel_close(kestrel_t *k);
int kestrel_get_info(const kestrel_t *k, struct kestrel_info *out);
/* The zones of a zoned namespace; -ENOTSUP for any other target. */
int kestrel_get_zone_info(const kestrel_t *k, struct kestrel_zone_info *out);
uint32_t kestrel_block_size(const kestrel_t *k); /* 0 for a bad handle */
uint64_t kestrel_capacity(const kestrel_t *k);   /* bytes; 0 for a bad handle */

/* Zeroed, page-aligned DMA memory of the target. Allocate at setup, not per I/O. */
int kestrel_dma_alloc(kestrel_t *k, size_t len, void **out);
/* Unmaps buf (from kestrel_dma_alloc on k) for reuse: no iocb naming it may still be
 * outstanding (see "Buffers"), and the program does not touch it afterwards. */
int kestrel_dma_free(kestrel_t *k, void *buf);

int kestrel_io_setup(kestrel_t *k, unsigned nr_events, kestrel_ctx_t **out);
int kestrel_io_setup_params(kestrel_t *k, const struct kestrel_io_params *params,
                            kestrel_ctx_t **out);
/* Returns the number accepted (1..nr), or -errno if none was. Reads at most the
 * first nr_events of the nr iocbs (80 bytes each); each accepted iocb's memory
 * follows the "Buffers" rule until its event. */
int kestrel_io_submit(kestrel_ctx_t *ctx, size_t nr, const struct kestrel_iocb *iocbs);
/*
 * Polls until at least min_nr events are ready (at most nr are returned) or the
 * timeout passes (NULL: no limit; zero: just look). Returns the number written
 * to events. Waiting with no timeout for more than is outstanding is -EDEADLK.
 * -EBUSY: the requests in flight were submitted on another thread to a file
 * target, whose io_uring only that thread can complete (call it there).
 * events has room for nr events (32 bytes each; at most nr_events are written).
 */
int kestrel_io_getevents(kestrel_ctx_t *ctx, size_t min_nr, size_t nr,
                         struct kestrel_event *events, const struct timespec *timeout);
/* A KESTREL_CANCEL_STATUS_*, or -ENOENT if nothing outstanding has user_data. */
int kestrel_io_cancel(kestrel_ctx_t *ctx, uint64_t user_data);
/* Waits for outstanding requests (their events are dropped), then frees ctx; their
 * buffers may then be reused. The wait is bounded: if it logs that requests were left
 * outstanding (its drain timeout passed, or a file target's requests were submitted
 * on another thread), their memory must stay valid and untouched for good. The
 * library does its part for DMA memory: from then on kestrel_dma_free (and
 * kestrel_close) of that kestrel_t keeps the buffers it is given out of the pool for
 * good instead of freeing them, since any of them may be one a device still writes. */
int kestrel_io_destroy(kestrel_ctx_t *ctx);

/*
 * Cross-thread mode. Starts one poller thread per core of `cores` ("0,2-3" or a
 * mask "0x5"), each pinned (a core that cannot be pinned is -EINVAL) and owning a
 * queue on the target. Contexts made with kestrel_reactor_io_setup() (which may be
 * called from several threads at once) are used with the kestrel_io_* calls above,
 * each context by one thread at a time. `flags`: one KESTREL_REACTOR_* at most; with
 * INTERRUPT or HYBRID the queues are created with interrupts (MSI-X through VFIO, or
 * the emulator's) and an idle poller uses ~0% of its core.
 */
int kestrel_reactor_start(kestrel_t *k, const char *cores, uint32_t flags,
                          kestrel_reactor_t **out);
int kestrel_reactor_io_setup(kestrel_reactor_t *r, const struct kestrel_io_params *params,
                             kestrel_ctx_t **out);
/*
 * Stops accepting requests (later submits are -ESHUTDOWN), drains those in flight
 * (their events stay collectable), deletes the queues, joins the threads, frees r.
 * Contexts are still destroyed with kestrel_io_destroy(). No other call on r may
 * run concurrently with this one, and r is not passed again after it, whatever it
 * returns (r is freed even when the drain reports an error).
 */
int kestrel_reactor_stop(kestrel_reactor_t *r);

/*
 * A static description of an errno the library returns (either sign); for any other code
 * (INT_MIN among them) "unknown error N", N as given, in a buffer of the calling thread
 * that stays valid until its next call of kestrel_strerror(). Never NULL.
 */
const char *kestrel_strerror(int err);
/* The calling thread's last error message ("" if none). */
const char *kestrel_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* KESTREL_H */
