/*
 * fio's zone operations (zonemode=zbd) for the Kestrel engine: a zoned namespace is a
 * host-managed zoned device to fio, which then keeps writes at the write pointers and
 * within zone capacities, resets zones when it needs room, and limits open zones to the
 * namespace's. Any other target is ZBD_NONE (fio emulates zones of zonesize= on it).
 * The work is the Rust half's (kfio_job_report_zones, kfio_job_zone_action).
 *
 * finish_zone and get_max_active_zones exist only in newer fio headers; build.rs defines
 * KFIO_HAVE_FINISH_ZONE / KFIO_HAVE_MAX_ACTIVE_ZONES when the fio source has them.
 */
#include <errno.h>
#include <stdlib.h>

#include "zbd_types.h"

#include "shim.h"

/* Zones asked of the Rust half per call (the kfio_zone array on the stack). */
#define KFIO_ZONES_PER_CALL 128

int kfio_get_zoned_model(struct thread_data *td, struct fio_file *f,
			 enum zbd_zoned_model *model)
{
	struct kfio_job *job = td_job(td);

	if (!job)
		return -EINVAL;
	*model = (kfio_job_caps(job) & KFIO_CAP_ZONED) ? ZBD_HOST_MANAGED : ZBD_NONE;
	return 0;
}

static void kfio_to_zbd(const struct kfio_zone *k, struct zbd_zone *z)
{
	z->start = k->start;
	z->wp = k->wp;
	z->len = k->len;
	z->capacity = k->capacity;
	z->type = (enum zbd_zone_type)k->type;
	z->cond = (enum zbd_zone_cond)k->cond;
}

int kfio_report_zones(struct thread_data *td, struct fio_file *f, uint64_t offset,
		      struct zbd_zone *zones, unsigned int nr_zones)
{
	struct kfio_zone k[KFIO_ZONES_PER_CALL];
	struct kfio_job *job = td_job(td);
	char msg[KFIO_MSG_LEN];
	unsigned int n = 0;

	if (!job)
		return -EINVAL;
	while (n < nr_zones) {
		uint32_t want = nr_zones - n < KFIO_ZONES_PER_CALL ? nr_zones - n
								  : KFIO_ZONES_PER_CALL;
		int got, i;

		msg[0] = 0;
		got = kfio_job_report_zones(job, offset, k, want, msg, sizeof(msg));
		if (got < 0) {
			log_err("kestrel: %s\n", msg);
			return got;
		}
		for (i = 0; i < got; i++)
			kfio_to_zbd(&k[i], &zones[n + i]);
		n += got;
		if ((uint32_t)got < want)
			break;
		offset = k[got - 1].start + k[got - 1].len;
	}
	return n;
}

static int kfio_zone_action(struct thread_data *td, int action, uint64_t offset,
			    uint64_t length)
{
	struct kfio_job *job = td_job(td);
	char msg[KFIO_MSG_LEN];
	int ret;

	if (!job)
		return -EINVAL;
	msg[0] = 0;
	ret = kfio_job_zone_action(job, action, offset, length, msg, sizeof(msg));
	if (ret)
		log_err("kestrel: %s\n", msg);
	return ret;
}

int kfio_reset_wp(struct thread_data *td, struct fio_file *f, uint64_t offset,
		  uint64_t length)
{
	return kfio_zone_action(td, KFIO_ZONE_RESET, offset, length);
}

int kfio_finish_zone(struct thread_data *td, struct fio_file *f, uint64_t offset,
		     uint64_t length)
{
	return kfio_zone_action(td, KFIO_ZONE_FINISH, offset, length);
}

int kfio_get_max_open_zones(struct thread_data *td, struct fio_file *f,
			    unsigned int *max_open_zones)
{
	struct kfio_job *job = td_job(td);

	if (!job)
		return -EINVAL;
	*max_open_zones = kfio_job_zone_limit(job, 0);
	return 0;
}

int kfio_get_max_active_zones(struct thread_data *td, struct fio_file *f,
			      unsigned int *max_active_zones)
{
	struct kfio_job *job = td_job(td);

	if (!job)
		return -EINVAL;
	*max_active_zones = kfio_job_zone_limit(job, 1);
	return 0;
}
