/*
 * What the C files of the fio half share (shim.c: the ops table and the I/O path;
 * checks.c: the refusals of fio options at set-up; zbd.c: fio's zone operations). All
 * are compiled against the headers of the fio that loads the engine (build.rs).
 */
#ifndef KESTREL_FIO_SHIM_H
#define KESTREL_FIO_SHIM_H

#include "fio.h"

#include "kfio.h"

#define KFIO_MSG_LEN 1024

/* The job of a thread_data (NULL before it is attached to its target). */
static inline struct kfio_job *td_job(struct thread_data *td)
{
	return td->io_ops_data;
}

/* Fails the job: the message now, and fio's error (with the option named) for its
 * report. Returns 1. */
int kfio_fail(struct thread_data *td, int err, const char *option, const char *msg);

/* Refuses, naming the option, what the job asks for that the target cannot give as
 * asked (checks.c). f is the job's file, its size already the target's. */
int kfio_check_target(struct thread_data *td, struct fio_file *f, struct kfio_job *job);

/* fio's zone operations (zbd.c). */
int kfio_get_zoned_model(struct thread_data *td, struct fio_file *f,
			 enum zbd_zoned_model *model);
int kfio_report_zones(struct thread_data *td, struct fio_file *f, uint64_t offset,
		      struct zbd_zone *zones, unsigned int nr_zones);
int kfio_reset_wp(struct thread_data *td, struct fio_file *f, uint64_t offset,
		  uint64_t length);
int kfio_finish_zone(struct thread_data *td, struct fio_file *f, uint64_t offset,
		     uint64_t length);
int kfio_get_max_open_zones(struct thread_data *td, struct fio_file *f,
			    unsigned int *max_open_zones);
int kfio_get_max_active_zones(struct thread_data *td, struct fio_file *f,
			      unsigned int *max_active_zones);

#endif
