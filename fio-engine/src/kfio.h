/*
 * The interface between the fio glue (shim.c, compiled against fio's headers) and the
 * Rust half of the engine (its entry points in ffi.rs). Only plain integers and pointers
 * cross it, so nothing here depends on fio's struct layouts. None unwinds. Functions that
 * can fail write a one-line message (NUL-terminated, truncated to msglen) to msg and
 * return a negative errno.
 *
 * What every call relies on (the # Safety sections of ffi.rs say it per function):
 *   - job is NULL (refused) or live: returned by kfio_job_open and not yet given to
 *     kfio_job_close, and not passed again after that. One thread calls into a job at a
 *     time (its job thread; fio's main thread only before the job thread starts).
 *   - msg is NULL or valid for writes of msglen bytes; err is NULL or valid for writes
 *     of one int; ptr (kfio_job_iomem_alloc) is valid for writes of one void *; target
 *     is readable up to its NUL; none overlaps another argument, all for the call only.
 *   - The memory a queued request names (buf, inside the job's I/O memory) is not
 *     touched by fio until the request's io_u is returned by kfio_job_event, and the I/O
 *     memory is freed only by kfio_job_iomem_free (which waits for what is outstanding).
 */
#ifndef KESTREL_FIO_KFIO_H
#define KESTREL_FIO_KFIO_H

#include <stddef.h>
#include <stdint.h>

/* Operations of kfio_job_queue (mirrored as consts in lib.rs). */
#define KFIO_OP_READ  0
#define KFIO_OP_WRITE 1
#define KFIO_OP_TRIM  2
#define KFIO_OP_FLUSH 3

/* kfio_job_queue results besides negative errnos. */
#define KFIO_QUEUED    0
#define KFIO_BUSY      1
#define KFIO_COMPLETED 2 /* done at once, successfully, with no command (a Flush with no
			  * write since the last one) */

/* kfio_job_caps bits (mirrored as consts in lib.rs). */
#define KFIO_CAP_TRIM           1 /* Deallocate */
#define KFIO_CAP_TRIM_ZEROES    2 /* deallocated blocks read back as zeroes */
#define KFIO_CAP_VOLATILE_CACHE 4 /* a volatile write cache: Flush does something */
#define KFIO_CAP_READ_ONLY      8 /* writes are refused */
#define KFIO_CAP_ZONED          16 /* a zoned namespace */

/* kfio_job_open flags (mirrored as consts in lib.rs). */
#define KFIO_OPEN_NOIOMMU 1 /* a pci: target through VFIO's noiommu mode */

struct kfio_job;

/* One zone, as fio's struct zbd_zone has it (bytes; cond and type are fio's enum values,
 * which are NVMe's zone state and type codes). */
struct kfio_zone {
	uint64_t start;
	uint64_t wp;
	uint64_t len;
	uint64_t capacity;
	uint32_t cond;
	uint32_t type;
};

/* kfio_job_zone_action actions. */
#define KFIO_ZONE_RESET  0
#define KFIO_ZONE_FINISH 1

/* Opens (or joins, when another job of this process already opened the same string with
 * the same flags) the target and returns the job, or NULL with msg set and *err a
 * positive errno. run_jobs: how many jobs of the fio run name this target, this one
 * included (0: not known, as 1); the target stays open until that many jobs have been
 * closed, so that phases of a run (stonewall) share it. */
struct kfio_job *kfio_job_open(const char *target, unsigned int flags, unsigned int run_jobs,
			       int *err, char *msg, size_t msglen);
/* Capacity in bytes and logical block size of the job's target. */
uint64_t kfio_job_size(const struct kfio_job *job);
uint32_t kfio_job_block_size(const struct kfio_job *job);
/* The largest transfer one command carries, bytes (larger reads and writes are split,
 * except writes on a zoned namespace, which must reach the write pointer whole). */
uint64_t kfio_job_max_transfer(const struct kfio_job *job);
/* What the target can do: KFIO_CAP_* bits. */
uint32_t kfio_job_caps(const struct kfio_job *job);
/* The kestrel_target option's help text (the target grammar), static. */
const char *kfio_target_help(void);
/* A short name of the target, for messages; valid while the job lives. */
const char *kfio_job_name(const struct kfio_job *job);
/* What kfio_job_getevents does while it waits (kestrel_idle=). */
#define KFIO_IDLE_BUSY      0 /* poll without pause */
#define KFIO_IDLE_HYBRID    1 /* poll for spin_ns after the last completion, then sleep */
#define KFIO_IDLE_INTERRUPT 2 /* sleep on the queue's interrupt when a poll finds nothing */

/* On the job's thread: creates its queue pair (queue_size ring entries, 0: 2 x iodepth + 1
 * and at least 64; with interrupts unless idle is KFIO_IDLE_BUSY) and the tables for
 * iodepth I/O units. */
int kfio_job_start(struct kfio_job *job, uint32_t iodepth, uint32_t queue_size, int idle,
		   uint64_t spin_ns, char *msg, size_t msglen);
/* I/O memory from the target's DMA pool: len bytes at *ptr. */
int kfio_job_iomem_alloc(struct kfio_job *job, size_t len, void **ptr, char *msg,
			 size_t msglen);
void kfio_job_iomem_free(struct kfio_job *job);
/* Queues one request for the I/O unit index (< iodepth); io_u is returned by
 * kfio_job_event. Returns KFIO_QUEUED, KFIO_BUSY (nothing queued: reap and retry),
 * KFIO_COMPLETED (nothing to send: done) or a negative errno (the request failed at
 * once; msg says why when it is non-empty). A Flush waits (KFIO_BUSY) for the writes
 * queued before it to complete, and is sent only when a write was queued since the last
 * Flush (KFIO_COMPLETED otherwise, once that Flush is done). */
int kfio_job_queue(struct kfio_job *job, int op, uint64_t offset, uint64_t len, void *buf,
		   uint32_t index, void *io_u, char *msg, size_t msglen);
/* Makes the queued requests visible to the device: one doorbell write. */
void kfio_job_commit(struct kfio_job *job);
/* Polls until at least min completions (at most max) are reaped, or timeout_ns passes
 * (negative: no limit) or nothing is outstanding, idling as kfio_job_start's idle says.
 * Returns how many. */
int kfio_job_getevents(struct kfio_job *job, uint32_t min, uint32_t max, int64_t timeout_ns);
/* The i-th reaped completion: its io_u, and *err = 0 or a positive errno. */
void *kfio_job_event(struct kfio_job *job, uint32_t i, int *err);
/* What failed for I/O unit index, malloc()ed (the caller frees it), or NULL. */
char *kfio_job_errdetails(struct kfio_job *job, uint32_t index);
/* Zoned namespaces (fio's zonemode=zbd); callable before kfio_job_start, on fio's main
 * thread or the job's, waiting for the device. Report: up to nr zones from the one
 * holding byte offset into zones; how many, or a negative errno. Action: reset or finish
 * every zone of len bytes from byte offset (whole zones); 0 or a negative errno. Limit:
 * the namespace's open (active = 0) or active zone limit, 0 for none. */
int kfio_job_report_zones(struct kfio_job *job, uint64_t offset, struct kfio_zone *zones,
			  uint32_t nr, char *msg, size_t msglen);
int kfio_job_zone_action(struct kfio_job *job, int action, uint64_t offset, uint64_t len,
			 char *msg, size_t msglen);
uint32_t kfio_job_zone_limit(const struct kfio_job *job, int active);
/* Drains outstanding I/O, frees everything, and leaves the target (closed with the last
 * job of the run that names it). */
void kfio_job_close(struct kfio_job *job);

#endif
