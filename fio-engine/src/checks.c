/*
 * The fio options that would change what a job tests, checked against the target when
 * the job is set up: a job either runs as it says or is refused there, with a message
 * naming the option (fio prints it and fails the job with func=<option>), never fails
 * I/O by I/O or silently does less.
 *
 *   mem=/iomem=        the engine allocates fio's buffers from the target's DMA memory;
 *                      fio 3.33 prints that they conflict and then crashes (its failed
 *                      allocation goes unchecked), so they are refused first
 *   offset=, size=,    the job's region must lie inside the target (fio would wrap a
 *   filesize=          size past the end, or do nothing from an offset past it)
 *   bs=, bssplit=,     whole logical blocks of the target
 *   blockalign=, bs_unaligned=, offset=
 *   rw= with trims     the target must support Deallocate
 *   rw= with writes    the target must not be read-only
 *   trim_percentage=   fio's trim-then-verify needs Deallocate, and trim_verify_zero
 *                      (its default) blocks that read back as zeroes
 *   sync=1, atomic=1   O_SYNC/O_ATOMIC writes are not offered (a target with a volatile
 *                      write cache would otherwise be tested without them)
 *   zonemode=          writes to a zoned namespace need zonemode=zbd (fio then keeps
 *                      them at the write pointers), and a write there must fit in one
 *                      command (it is not split: the pieces could reach the write
 *                      pointer out of order), so bs= is bounded by the transfer limit
 */
#include <errno.h>
#include <stdio.h>

#include "options.h"

#include "shim.h"

static const char *const ddir_name[DDIR_RWDIR_CNT] = { "read", "write", "trim" };

static int kfio_check_memory(struct thread_data *td)
{
	if (!fio_option_is_set(&td->o, mem_type))
		return 0;
	return kfio_fail(td, EINVAL, "mem",
			 "mem=/iomem= cannot be honoured: the engine gives fio I/O buffers from "
			 "the target's DMA memory (commands point at them, no copy); remove "
			 "the mem= or iomem= option");
}

/* Block sizes, bssplit entries and blockalign of one direction. */
static int kfio_check_ddir_bs(struct thread_data *td, enum fio_ddir d, uint32_t block)
{
	struct thread_options *o = &td->o;
	char full[KFIO_MSG_LEN];
	unsigned int i;

	if (o->min_bs[d] % block || o->max_bs[d] % block) {
		snprintf(full, sizeof(full),
			 "%s sizes %llu..%llu (bs=, bsrange= or bssplit=) are not whole %u-byte "
			 "blocks of the target",
			 ddir_name[d], o->min_bs[d], o->max_bs[d], block);
		return kfio_fail(td, EINVAL, "bs", full);
	}
	for (i = 0; i < o->bssplit_nr[d]; i++) {
		if (o->bssplit[d][i].bs % block) {
			snprintf(full, sizeof(full),
				 "bssplit= gives %s size %llu, not a whole number of the target's "
				 "%u-byte blocks",
				 ddir_name[d], (unsigned long long)o->bssplit[d][i].bs, block);
			return kfio_fail(td, EINVAL, "bssplit", full);
		}
	}
	if (o->ba[d] % block) {
		snprintf(full, sizeof(full),
			 "blockalign=%llu (%s) is not a whole number of the target's %u-byte "
			 "blocks: offsets would fall inside blocks",
			 o->ba[d], ddir_name[d], block);
		return kfio_fail(td, EINVAL, "blockalign", full);
	}
	return 0;
}

static int kfio_check_blocks(struct thread_data *td, uint32_t block)
{
	enum fio_ddir d;

	if (td->o.bs_unaligned)
		return kfio_fail(td, EINVAL, "bs_unaligned",
				 "bs_unaligned=1 asks for I/O sizes that are not whole blocks of "
				 "the target, which NVMe cannot carry: remove it");
	for (d = DDIR_READ; d < DDIR_RWDIR_CNT; d++) {
		if (((d == DDIR_READ && td_read(td)) || (d == DDIR_WRITE && td_write(td)) ||
		     (d == DDIR_TRIM && td_trim(td))) &&
		    kfio_check_ddir_bs(td, d, block))
			return 1;
	}
	return 0;
}

/* The job's region: [offset, offset + size) inside the target. */
static int kfio_check_region(struct thread_data *td, struct fio_file *f, struct kfio_job *job)
{
	struct thread_options *o = &td->o;
	uint64_t cap = kfio_job_size(job), off = get_start_offset(td, f);
	uint32_t block = kfio_job_block_size(job);
	const char *name = kfio_job_name(job);
	char full[KFIO_MSG_LEN];

	if (off >= cap || off % block) {
		snprintf(full, sizeof(full),
			 "the job starts at byte %llu (offset=%llu, offset_increment=%llu, numjobs "
			 "job %u), %s %s (%llu bytes of %u-byte blocks)",
			 (unsigned long long)off, o->start_offset, o->offset_increment,
			 td->subjob_number, off >= cap ? "at or past the end of" : "inside a block of",
			 name, (unsigned long long)cap, block);
		return kfio_fail(td, EINVAL, "offset", full);
	}
	if (!o->fill_device && !o->size_percent && o->size && o->size > cap - off) {
		snprintf(full, sizeof(full),
			 "size=%llu from byte %llu ends past the end of %s (%llu bytes): fio would "
			 "wrap around; give a size of at most %llu (or size=100%%)",
			 o->size, (unsigned long long)off, name, (unsigned long long)cap,
			 (unsigned long long)(cap - off));
		return kfio_fail(td, EINVAL, "size", full);
	}
	if (fio_option_is_set(o, file_size_low) && o->file_size_high > cap - off) {
		snprintf(full, sizeof(full),
			 "filesize=%llu from byte %llu ends past the end of %s (%llu bytes)",
			 o->file_size_high, (unsigned long long)off, name,
			 (unsigned long long)cap);
		return kfio_fail(td, EINVAL, "filesize", full);
	}
	return 0;
}

/* What the target can do against what the job's operations and verification need. */
static int kfio_check_caps(struct thread_data *td, struct kfio_job *job)
{
	uint32_t caps = kfio_job_caps(job);
	const char *name = kfio_job_name(job);
	char full[KFIO_MSG_LEN];

	if ((td_trim(td) || td->o.trim_percentage) && !(caps & KFIO_CAP_TRIM)) {
		snprintf(full, sizeof(full),
			 "%s does not support Deallocate, which fio's trims (rw= with trim, "
			 "trim_percentage=) need",
			 name);
		return kfio_fail(td, EOPNOTSUPP, td_trim(td) ? "rw" : "trim_percentage", full);
	}
	if (td->o.trim_percentage && td->o.trim_zero && td_write(td) &&
	    !(caps & KFIO_CAP_TRIM_ZEROES)) {
		snprintf(full, sizeof(full),
			 "trim_percentage= with trim_verify_zero=1 verifies that trimmed blocks "
			 "read back as zeroes, which %s does not promise: set trim_verify_zero=0",
			 name);
		return kfio_fail(td, EOPNOTSUPP, "trim_verify_zero", full);
	}
	if ((td_write(td) || td_trim(td)) && (caps & KFIO_CAP_READ_ONLY)) {
		snprintf(full, sizeof(full), "%s is read-only, and the job writes or trims", name);
		return kfio_fail(td, EROFS, "rw", full);
	}
	if (td->o.sync_io && td_write(td) && (caps & KFIO_CAP_VOLATILE_CACHE)) {
		snprintf(full, sizeof(full),
			 "sync=1 asks for writes that are durable when they complete, but %s has "
			 "a volatile write cache and the engine sends no FUA: use fsync=1 (a "
			 "Flush after every write) instead",
			 name);
		return kfio_fail(td, EINVAL, "sync", full);
	}
	if (td->o.oatomic)
		return kfio_fail(td, EINVAL, "atomic",
				 "atomic=1 (O_ATOMIC writes) is not offered by the engine");
	return 0;
}

static int kfio_check_zoned(struct thread_data *td, struct kfio_job *job)
{
	uint64_t max = kfio_job_max_transfer(job);
	const char *name = kfio_job_name(job);
	char full[KFIO_MSG_LEN];

	if (!(kfio_job_caps(job) & KFIO_CAP_ZONED) || !td_write(td))
		return 0;
	if (td->o.zone_mode != ZONE_MODE_ZBD) {
		snprintf(full, sizeof(full),
			 "%s is a zoned namespace, where writes must go to a zone's write "
			 "pointer: add zonemode=zbd (and direct=1), and fio places them",
			 name);
		return kfio_fail(td, EINVAL, "zonemode", full);
	}
	if (max && td->o.max_bs[DDIR_WRITE] > max) {
		snprintf(full, sizeof(full),
			 "writes of up to %llu bytes (bs=) on the zoned namespace %s, which "
			 "carries at most %llu bytes per command and does not split writes (the "
			 "pieces could reach the write pointer out of order): use bs=%llu or less",
			 td->o.max_bs[DDIR_WRITE], name, (unsigned long long)max,
			 (unsigned long long)max);
		return kfio_fail(td, EINVAL, "bs", full);
	}
	return 0;
}

int kfio_check_target(struct thread_data *td, struct fio_file *f, struct kfio_job *job)
{
	return kfio_check_memory(td) || kfio_check_blocks(td, kfio_job_block_size(job)) ||
	       kfio_check_region(td, f, job) || kfio_check_caps(td, job) ||
	       kfio_check_zoned(td, job);
}
