//! The process-wide list of opened targets: jobs of one fio process that name the same
//! target string share one opened target, which the last of them to end closes.

use std::sync::{Arc, Mutex};

use kestrel::Target;

/// One opened target, shared by the jobs of this process that named the same string.
struct Shared {
    key: String,
    noiommu: bool,
    target: Arc<dyn Target>,
    users: usize,
}

static TARGETS: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

fn targets() -> std::sync::MutexGuard<'static, Vec<Shared>> {
    // A panic while the lock was held left the list itself consistent (entries are pushed
    // and removed whole).
    TARGETS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens `spec` (a `pci:` controller in VFIO's noiommu mode if `noiommu`), or joins the
/// target another job opened with the same string.
pub(crate) fn acquire(spec: &str, noiommu: bool) -> Result<Arc<dyn Target>, (i32, String)> {
    let mut list = targets();
    if let Some(s) = list.iter_mut().find(|s| s.key == spec) {
        if s.noiommu != noiommu {
            return Err((
                libc::EINVAL,
                format!(
                    "kestrel_noiommu={} differs from the {} of the jobs already sharing this \
                     target: give every job on one target the same kestrel_noiommu",
                    noiommu as u8, s.noiommu as u8
                ),
            ));
        }
        s.users += 1;
        return Ok(Arc::clone(&s.target));
    }
    let parsed = kestrel::target_spec::parse(spec).map_err(|e| (e.errno(), e.to_string()))?;
    let opts = kestrel::target_spec::OpenOptions {
        noiommu,
        ..Default::default()
    };
    let target = kestrel::target_spec::open_with(&parsed, &opts)
        .and_then(|o| o.first_target())
        .map_err(|e| (e.errno(), e.to_string()))?;
    // The engine's reads and writes carry no metadata: a format that needs it with every
    // I/O would fail them all, so it is refused here, once, with the reason.
    let info = target.info();
    if let Some(m) = info.metadata.filter(|m| m.required()) {
        return Err((
            libc::EINVAL,
            format!(
                "{}: its format has {} bytes of metadata per block ({}) that every read and \
                 write must carry, and the fio engine sends none: use a namespace formatted \
                 without metadata, or with exactly the 8 bytes of protection information \
                 (which the controller inserts and strips); kestrel perf --verify drives \
                 such formats",
                info.name,
                m.ms,
                if m.extended {
                    "extended lba"
                } else {
                    "separate buffer"
                }
            ),
        ));
    }
    // Every offset and length fio asks for is checked against the capacity in bytes: a
    // target whose size does not fit in 64 bits (or has no block size) is refused here, so
    // that capacity is never computed wrapped.
    if info.block_size == 0
        || info
            .num_blocks
            .checked_mul(u64::from(info.block_size))
            .is_none()
    {
        return Err((
            libc::EINVAL,
            format!(
                "{} (nsid {}) reports {} blocks of {} bytes, which is not a size the engine \
                 can address (zero-byte blocks, or more than 2^64 bytes): its identify data \
                 is wrong",
                info.name, info.nsid, info.num_blocks, info.block_size
            ),
        ));
    }
    list.push(Shared {
        key: spec.to_string(),
        noiommu,
        target: Arc::clone(&target),
        users: 1,
    });
    Ok(target)
}

/// Leaves a target; the last job to leave closes it.
pub(crate) fn release(spec: &str) {
    let last = {
        let mut list = targets();
        match list.iter().position(|s| s.key == spec) {
            Some(i) => {
                list[i].users -= 1;
                (list[i].users == 0).then(|| list.swap_remove(i))
            }
            None => None,
        }
    };
    // Closing a controller (shutdown, queue deletion) happens outside the lock.
    drop(last);
}

/// Jobs of this process currently holding `spec`.
#[cfg(test)]
pub(crate) fn users_of(spec: &str) -> usize {
    targets()
        .iter()
        .find(|s| s.key == spec)
        .map_or(0, |s| s.users)
}
