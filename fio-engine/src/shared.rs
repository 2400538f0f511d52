//! The process-wide list of opened targets: jobs of one fio process that name the same
//! target string share one opened target, which stays open until every job of the run
//! that names it has ended.
//!
//! How the run's end is known: fio has no engine call for it (each job only gets
//! `cleanup`), so the first job to open a target tells how many jobs of the run name it
//! (the glue counts fio's job table, which is complete once the job file is parsed), and
//! the target is closed when that many have ended. Phases separated by `stonewall`, and
//! jobs that fio sets up only when they start (`create_serialize=0`), so find the target
//! still open, with the data the earlier ones wrote. A counted job that never ends (fio
//! gave up on it before it started) keeps the target open until the process exits, when
//! an exit handler closes what no job uses any more.

use std::sync::{Arc, Mutex};

use kestrel::file::FileTarget;
use kestrel::target_spec::Opened;
use kestrel::Target;

/// One opened target, shared by the jobs of this process that named the same string.
struct Shared {
    key: String,
    noiommu: bool,
    target: Arc<dyn Target>,
    /// The same target when it is a file (its queues can sleep in `io_uring_enter`).
    file: Option<Arc<FileTarget>>,
    /// Jobs holding it now.
    users: usize,
    /// Jobs of the run that will use it and have not ended yet (at least `users`).
    remaining: usize,
    /// The process that opened it: a forked child never uses its parent's targets (their
    /// threads and device state did not follow it).
    pid: u32,
}

static TARGETS: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

fn targets() -> std::sync::MutexGuard<'static, Vec<Shared>> {
    // A panic while the lock was held left the list itself consistent (entries are pushed
    // and removed whole).
    TARGETS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A target, and the same as a file target when it is one.
pub(crate) type Acquired = (Arc<dyn Target>, Option<Arc<FileTarget>>);

/// Opens `spec` (a `pci:` controller in VFIO's noiommu mode if `noiommu`), or joins the
/// target another job opened with the same string. `run_jobs`: how many jobs of the run
/// name this target, this one included (0: not known, as 1), which only the job that
/// opens it uses. Returns the target, and the same as a file target if it is one.
pub(crate) fn acquire(
    spec: &str,
    noiommu: bool,
    run_jobs: usize,
) -> Result<Acquired, (i32, String)> {
    let mut list = targets();
    forget_inherited(&mut list);
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
        s.remaining = s.remaining.max(s.users);
        return Ok((Arc::clone(&s.target), s.file.clone()));
    }
    let parsed = kestrel::target_spec::parse(spec).map_err(|e| (e.errno(), e.to_string()))?;
    let opts = kestrel::target_spec::OpenOptions {
        noiommu,
        ..Default::default()
    };
    let opened =
        kestrel::target_spec::open_with(&parsed, &opts).map_err(|e| (e.errno(), e.to_string()))?;
    let target = opened
        .first_target()
        .map_err(|e| (e.errno(), e.to_string()))?;
    let file = match &opened {
        Opened::File(f) => Some(Arc::clone(f)),
        Opened::Nvme { .. } | Opened::Tcp { .. } | Opened::Null(_) => None,
    };
    check_addressable(&*target)?;
    list.push(Shared {
        key: spec.to_string(),
        noiommu,
        target: Arc::clone(&target),
        file: file.clone(),
        users: 1,
        remaining: run_jobs.max(1),
        pid: std::process::id(),
    });
    Ok((target, file))
}

/// Refuses a target the engine cannot drive: a format whose metadata every I/O must
/// carry, or a capacity that does not fit in 64 bits of bytes.
fn check_addressable(target: &dyn Target) -> Result<(), (i32, String)> {
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
    Ok(())
}

/// Leaves a target; the last job of the run to leave closes it.
pub(crate) fn release(spec: &str) {
    let last = {
        let mut list = targets();
        match list.iter().position(|s| s.key == spec) {
            Some(i) => {
                let s = &mut list[i];
                s.users = s.users.saturating_sub(1);
                s.remaining = s.remaining.saturating_sub(1);
                (s.remaining == 0).then(|| list.swap_remove(i))
            }
            None => None,
        }
    };
    // Closing a controller (shutdown, queue deletion) happens outside the lock.
    drop(last);
}

/// Entries a forked child inherited from its parent: forgotten, never dropped (dropping
/// one would join threads or shut down a controller that belong to the parent).
fn forget_inherited(list: &mut Vec<Shared>) {
    let pid = std::process::id();
    if list.iter().any(|s| s.pid != pid) {
        for s in std::mem::take(list) {
            if s.pid == pid {
                list.push(s);
            } else {
                std::mem::forget(s);
            }
        }
    }
}

/// At exit, targets that no job holds any more (counted jobs that never ran kept them
/// open) are closed: a controller is shut down, an emulator stopped.
pub(crate) fn close_at_exit() {
    let mut list = targets();
    forget_inherited(&mut list);
    let idle: Vec<Shared> = {
        let (idle, busy) = std::mem::take(&mut *list)
            .into_iter()
            .partition(|s| s.users == 0);
        *list = busy;
        idle
    };
    drop(list);
    drop(idle);
}

/// Jobs of this process currently holding `spec`.
#[cfg(test)]
pub(crate) fn users_of(spec: &str) -> usize {
    targets()
        .iter()
        .find(|s| s.key == spec)
        .map_or(0, |s| s.users)
}

/// Whether `spec` is open in this process.
#[cfg(test)]
pub(crate) fn is_open(spec: &str) -> bool {
    targets().iter().any(|s| s.key == spec)
}
