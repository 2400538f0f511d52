/*
 * The fio half of the Kestrel ioengine. It is compiled against the configured source of
 * the fio that loads it (build.rs), so struct thread_data, io_u, fio_file and
 * ioengine_ops have fio's own layouts here; the Rust half (lib.rs and its modules) sees
 * only the plain integers and pointers of kfio.h.
 *
 * Which configure results matter: of the headers an engine includes, only CONFIG_CUDA
 * (fields at the end of struct thread_data) and the async-API union at the end of struct
 * io_u change with the libraries found by ./configure; no field used here comes after
 * them, so a tree configured on any Linux machine gives the installed fio's offsets. As a
 * check that costs nothing, setup refuses to run when fio's version string differs from
 * the one the engine was built for, or when td->io_ops (early in struct thread_data) is
 * not this engine's ops.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"
#include "smalloc.h"

#include "shim.h"

#ifndef KFIO_BUILT_FOR
#error "KFIO_BUILT_FOR (the fio version of the source tree) is set by build.rs"
#endif

/* Defined in fio (init.c), exported by its -rdynamic link. */
extern const char fio_version_string[];

struct kfio_options {
	void *pad; /* fio stores the thread_data pointer here */
	char *target;
	unsigned int queue_size;
	unsigned int noiommu;
	unsigned int idle;
	unsigned int spin_us;
};

static struct fio_option options[] = {
	{
		.name = "kestrel_target",
		.lname = "Kestrel target",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct kfio_options, target),
		/* Set from the library's target grammar by kfio_shim_ops(). */
		.help = "Kestrel target",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "kestrel_queue_size",
		.lname = "Kestrel queue pair entries",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct kfio_options, queue_size),
		.minval = 0,
		.maxval = 65536,
		.def = "0",
		.help = "Ring entries of each job's queue pair (0: 2 x iodepth + 1, at least 64; "
			"otherwise more than iodepth)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "kestrel_noiommu",
		.lname = "Kestrel VFIO noiommu mode",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct kfio_options, noiommu),
		.def = "0",
		.help = "Open a pci: target in VFIO's unsafe noiommu mode (the device must be "
			"in a noiommu group; DMA is then unconfined)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "kestrel_idle",
		.lname = "Kestrel idle policy",
		.type = FIO_OPT_STR,
		.off1 = offsetof(struct kfio_options, idle),
		.def = "hybrid",
		.help = "What a job does while fio waits for completions and none has come",
		.posval = {
			{ .ival = "busy", .oval = KFIO_IDLE_BUSY,
			  .help = "poll without pause (lowest latency; a core at 100%)" },
			{ .ival = "hybrid", .oval = KFIO_IDLE_HYBRID,
			  .help = "poll for kestrel_spin_us after the last completion, then sleep "
				  "on the queue's interrupt" },
			{ .ival = "interrupt", .oval = KFIO_IDLE_INTERRUPT,
			  .help = "sleep on the queue's interrupt as soon as a poll finds nothing" },
		},
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "kestrel_spin_us",
		.lname = "Kestrel hybrid spin",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct kfio_options, spin_us),
		.minval = 0,
		.maxval = 1000000,
		.def = "20",
		.help = "kestrel_idle=hybrid: microseconds of polling after the last completion "
			"before sleeping",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

static struct ioengine_ops ioengine;

int kfio_fail(struct thread_data *td, int err, const char *option, const char *msg)
{
	log_err("kestrel: %s\n", msg);
	td_vmsg(td, err, msg, option);
	return 1;
}

/* The target string of a job: kestrel_target= if given, else its first file's name. */
static const char *kfio_spec(struct thread_data *td, int *named)
{
	struct kfio_options *o = td->eo;

	*named = o && o->target && o->target[0];
	if (*named)
		return o->target;
	return td->files_index ? td->files[0]->file_name : NULL;
}

/*
 * How many jobs of this run name the target spec on this engine. fio's job table is
 * complete once the job files are parsed, before any job is set up, so the first job to
 * open a target can tell how many will use it: the target stays open until they have all
 * ended (fio tells an engine nothing about the end of the run).
 */
static unsigned int kfio_run_jobs(const char *spec)
{
	unsigned int i, n = 0;
	int named;

	for (i = 0; i < thread_number; i++) {
		struct thread_data *td = tnumber_to_td(i);
		const char *s;

		if (td->io_ops != &ioengine)
			continue;
		s = kfio_spec(td, &named);
		if (s && !strcmp(s, spec))
			n++;
	}
	return n;
}

/*
 * fio forks a process per job unless thread=1, and a forked job could not use the target
 * (its emulator or controller lives in this process, with threads that fork does not
 * copy). As fio's own rbd, rados and http engines do, the engine makes its jobs threads
 * when fio sets them up: fio decides between thread and fork only when it starts a job,
 * after every job's setup. Done for every job of the run on this engine at once, so that
 * jobs with create_serialize=0 (whose setup comes only once they run) are threads too.
 */
static int kfio_not_started(struct thread_data *td)
{
	/* pid is set when the job's thread or process starts; fio's setup_files() marks the
	 * job it sets up TD_SETTING_UP. */
	return !td->pid && (td->runstate == TD_NOT_CREATED || td->runstate == TD_SETTING_UP);
}

static void kfio_make_threads(void)
{
	unsigned int i;

	for (i = 0; i < thread_number; i++) {
		struct thread_data *td = tnumber_to_td(i);

		if (td->io_ops == &ioengine && kfio_not_started(td))
			td->o.use_thread = 1;
	}
}

/* Checks that do not need the target: this fio is the one the engine was built for, and
 * the job has one target. */
static int kfio_check_job(struct thread_data *td)
{
	char full[KFIO_MSG_LEN + 256];

	if (td->io_ops != &ioengine)
		return kfio_fail(td, EINVAL, "ioengine",
				 "this fio's struct thread_data does not match the headers the "
				 "engine was built with: rebuild it against this fio's source");
	if (strcmp(fio_version_string, KFIO_BUILT_FOR)) {
		snprintf(full, sizeof(full),
			 "the engine was built for %s but is loaded by %s: rebuild it (cargo build "
			 "--release -p kestrel-fio) against the installed fio",
			 KFIO_BUILT_FOR, fio_version_string);
		return kfio_fail(td, EINVAL, "ioengine", full);
	}
	if (td->files_index != 1) {
		snprintf(full, sizeof(full),
			 "a job drives one target, but this one has %u files (nrfiles= or a "
			 "filename= list): use one job per target",
			 td->files_index);
		return kfio_fail(td, EINVAL, "nrfiles", full);
	}
	return 0;
}

/* Opens or joins the job's target (once per job) and gives fio its size. */
static int kfio_attach(struct thread_data *td)
{
	struct kfio_options *o = td->eo;
	char msg[KFIO_MSG_LEN], full[KFIO_MSG_LEN + 256];
	struct kfio_job *job = td_job(td);
	struct fio_file *f = td->files[0];
	const char *spec;
	int err = EINVAL, named;

	if (!job) {
		spec = kfio_spec(td, &named);
		msg[0] = 0;
		job = kfio_job_open(spec, o && o->noiommu ? KFIO_OPEN_NOIOMMU : 0,
				    kfio_run_jobs(spec), &err, msg, sizeof(msg));
		if (!job) {
			if (named)
				snprintf(full, sizeof(full), "kestrel_target=%s: %s", spec, msg);
			else
				snprintf(full, sizeof(full),
					 "no kestrel_target= given, and filename=%s is not a target "
					 "either: %s",
					 spec, msg);
			return kfio_fail(td, err, named ? "kestrel_target" : "filename", full);
		}
		td->io_ops_data = job;
	}
	f->real_file_size = kfio_job_size(job);
	f->filetype = FIO_TYPE_BLOCK;
	fio_file_set_size_known(f);
	FILE_SET_ENG_DATA(f, job);
	return kfio_check_target(td, f, job);
}

/*
 * A job that names its target with kestrel_target= and gives no filename= has a file
 * name of fio's making (jobname.N.M), one per job. fio shares per-file state between
 * jobs by file name, and zonemode=zbd needs that (one table of zone write pointers and
 * locks per device), so the file takes the target's name: jobs on one target are jobs
 * on one device, as with filename=/dev/X. Before fio's zbd set-up, which comes after the
 * engine's setup in setup_files().
 */
static void kfio_name_file(struct thread_data *td, struct fio_file *f)
{
	struct kfio_options *o = td->eo;
	char *name;

	if (td->o.filename || !o || !o->target || !o->target[0] ||
	    !strcmp(f->file_name, o->target))
		return;
	name = td_ioengine_flagged(td, FIO_NOFILEHASH) ? strdup(o->target)
						       : smalloc_strdup(o->target);
	if (!name)
		return;
	if (td_ioengine_flagged(td, FIO_NOFILEHASH))
		free(f->file_name);
	else
		sfree(f->file_name);
	f->file_name = name;
}

/* On fio's main thread before any job starts (create_serialize=1, fio's default), or at
 * the job's start (create_serialize=0, from kfio_init). */
static int kfio_setup(struct thread_data *td)
{
	if (kfio_check_job(td))
		return 1;
	if (kfio_not_started(td))
		kfio_make_threads();
	kfio_name_file(td, td->files[0]);
	return kfio_attach(td);
}

static int kfio_init(struct thread_data *td)
{
	struct kfio_options *o = td->eo;
	char msg[KFIO_MSG_LEN];
	struct kfio_job *job;

	/* Only when every job of the run has create_serialize=0 does fio start one without
	 * setting it up first, and then it may fork it. */
	if (!td->o.use_thread)
		return kfio_fail(td, EINVAL, "thread",
				 "this job runs in a process of its own (fio forks one per job "
				 "unless thread=1), and the engine shares a target between the jobs "
				 "of a run as threads of one process: add thread=1 (the engine makes "
				 "jobs threads when fio sets them up first, which create_serialize=0 "
				 "on every job skips)");
	/* With create_serialize=0 fio sets files up after init, in the job's thread. */
	if (!td_job(td)) {
		if (kfio_check_job(td))
			return 1;
		kfio_name_file(td, td->files[0]);
		if (kfio_attach(td))
			return 1;
	}
	job = td_job(td);
	msg[0] = 0;
	if (kfio_job_start(job, td->o.iodepth, o ? o->queue_size : 0,
			   o ? (int)o->idle : KFIO_IDLE_HYBRID, (o ? o->spin_us : 20) * 1000ULL, msg,
			   sizeof(msg)))
		return kfio_fail(td, EINVAL, "iodepth", msg);
	return 0;
}

static enum fio_q_status kfio_queue(struct thread_data *td, struct io_u *io_u)
{
	char msg[KFIO_MSG_LEN];
	int op, ret;

	fio_ro_check(td, io_u);

	switch (io_u->ddir) {
	case DDIR_READ:
		op = KFIO_OP_READ;
		break;
	case DDIR_WRITE:
		op = KFIO_OP_WRITE;
		break;
	case DDIR_TRIM:
		op = KFIO_OP_TRIM;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		op = KFIO_OP_FLUSH;
		break;
	default:
		log_err("kestrel: fio operation %d is not supported\n", (int)io_u->ddir);
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	msg[0] = 0;
	ret = kfio_job_queue(td_job(td), op, io_u->offset, io_u->xfer_buflen, io_u->xfer_buf,
			     io_u->index, io_u, msg, sizeof(msg));
	if (ret == KFIO_QUEUED)
		return FIO_Q_QUEUED;
	if (ret == KFIO_BUSY)
		return FIO_Q_BUSY;
	if (ret == KFIO_COMPLETED) {
		io_u->error = 0;
		return FIO_Q_COMPLETED;
	}
	if (msg[0])
		log_err("kestrel: %s\n", msg);
	io_u->error = -ret;
	return FIO_Q_COMPLETED;
}

static int kfio_commit(struct thread_data *td)
{
	kfio_job_commit(td_job(td));
	return 0;
}

static int kfio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *t)
{
	int64_t timeout_ns = -1;

	if (t)
		timeout_ns = (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
	return kfio_job_getevents(td_job(td), min, max, timeout_ns);
}

static struct io_u *kfio_event(struct thread_data *td, int ev)
{
	int err = 0;
	struct io_u *io_u = kfio_job_event(td_job(td), (uint32_t)ev, &err);

	if (io_u)
		io_u->error = err;
	return io_u;
}

static char *kfio_errdetails(struct io_u *io_u)
{
	struct kfio_job *job = io_u->file ? FILE_ENG_DATA(io_u->file) : NULL;
	char *s = job ? kfio_job_errdetails(job, io_u->index) : NULL;

	return s ? s : strdup("kestrel: no details");
}

static void kfio_cleanup(struct thread_data *td)
{
	struct fio_file *f;
	unsigned int i;

	for_each_file(td, f, i)
		FILE_SET_ENG_DATA(f, NULL);
	kfio_job_close(td_job(td));
	td->io_ops_data = NULL;
}

static int kfio_open_file(struct thread_data *td, struct fio_file *f)
{
	FILE_SET_ENG_DATA(f, td_job(td));
	return 0;
}

static int kfio_close_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int kfio_invalidate(struct thread_data *td, struct fio_file *f)
{
	/* No page cache between fio and the target: nothing to invalidate. */
	return 0;
}

static int kfio_unlink_file(struct thread_data *td, struct fio_file *f)
{
	/* The target is not a file fio created; there is nothing to remove. */
	return 0;
}

static int kfio_get_file_size(struct thread_data *td, struct fio_file *f)
{
	struct kfio_job *job = td_job(td);

	if (!job)
		return 0;
	f->real_file_size = kfio_job_size(job);
	fio_file_set_size_known(f);
	return 0;
}

static int kfio_iomem_alloc(struct thread_data *td, size_t total)
{
	char msg[KFIO_MSG_LEN];
	void *p = NULL;

	msg[0] = 0;
	if (kfio_job_iomem_alloc(td_job(td), total, &p, msg, sizeof(msg))) {
		log_err("kestrel: %s\n", msg);
		return 1;
	}
	td->orig_buffer = p;
	return 0;
}

static void kfio_iomem_free(struct thread_data *td)
{
	kfio_job_iomem_free(td_job(td));
}

static struct ioengine_ops ioengine = {
	.name = "kestrel",
	.version = FIO_IOOPS_VERSION,
	/* FIO_NO_OFFLOAD: a queue pair belongs to its job's thread, so fio must not queue from
	 * its io_submit_mode=offload worker threads. */
	/* FIO_NOFILEHASH: fio keeps its file structures and names on the heap rather than in
	 * its shared-memory pool, which forked jobs would need and the engine's threads do
	 * not; that pool runs out (and fio aborts in alloc_new_file) with nrfiles=31250,
	 * before the engine could refuse the job. */
	.flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_MEMALIGN | FIO_NO_OFFLOAD |
		 FIO_NOFILEHASH,
	.setup = kfio_setup,
	.init = kfio_init,
	.queue = kfio_queue,
	.commit = kfio_commit,
	.getevents = kfio_getevents,
	.event = kfio_event,
	.errdetails = kfio_errdetails,
	.cleanup = kfio_cleanup,
	.open_file = kfio_open_file,
	.close_file = kfio_close_file,
	.invalidate = kfio_invalidate,
	.unlink_file = kfio_unlink_file,
	.get_file_size = kfio_get_file_size,
	.iomem_alloc = kfio_iomem_alloc,
	.iomem_free = kfio_iomem_free,
	.get_zoned_model = kfio_get_zoned_model,
	.report_zones = kfio_report_zones,
	.reset_wp = kfio_reset_wp,
	.get_max_open_zones = kfio_get_max_open_zones,
#ifdef KFIO_HAVE_FINISH_ZONE
	.finish_zone = kfio_finish_zone,
#endif
#ifdef KFIO_HAVE_MAX_ACTIVE_ZONES
	.get_max_active_zones = kfio_get_max_active_zones,
#endif
	.option_struct_size = sizeof(struct kfio_options),
	.options = options,
};

/* Called by get_ioengine (ffi.rs), which fio looks up with dlsym. */
struct ioengine_ops *kfio_shim_ops(void);
struct ioengine_ops *kfio_shim_ops(void)
{
	options[0].help = kfio_target_help();
	return &ioengine;
}
