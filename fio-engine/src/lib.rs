//! An external fio ioengine for Kestrel: `ioengine=external:/path/libkestrel_fio.so`.
//!
//! Two halves. `shim.c` is compiled against the headers of the fio that loads the engine
//! (see `build.rs`), so every fio structure it touches has the right layout by
//! construction; it defines fio's `struct ioengine_ops` and the engine options, checks
//! the job's fio options, and calls this half through the plain-integer interface of
//! `kfio.h`. This half drives a Kestrel target through the library's public API only:
//! [`kestrel::target_spec`] parses and opens the target string, [`kestrel::Target`]
//! makes one queue pair per job thread, and I/O buffers are carved from the target's DMA
//! pool (fio's `iomem_alloc` hook), so requests carry fio's buffers with no copy.
//!
//! Jobs of one fio process that name the same target string share one opened target (one
//! controller, one emulator), each with its own queue pair; the target is closed when the
//! last of them ends.
//!
//! Nothing unwinds into fio: every entry point runs under `catch_unwind` and turns a
//! panic into an error return.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use kestrel::io::{IoError, IoRequest, SubmitError};
use kestrel::{DmaBuf, QueueOptions, Target, TargetQueue};

/// `KFIO_OP_READ` of `kfio.h`.
pub const OP_READ: c_int = 0;
/// `KFIO_OP_WRITE`.
pub const OP_WRITE: c_int = 1;
/// `KFIO_OP_TRIM`: NVMe Deallocate.
pub const OP_TRIM: c_int = 2;
/// `KFIO_OP_FLUSH`: fio's fsync and fdatasync.
pub const OP_FLUSH: c_int = 3;
/// `KFIO_QUEUED`.
pub const QUEUED: c_int = 0;
/// `KFIO_BUSY`.
pub const BUSY: c_int = 1;
/// `KFIO_OPEN_NOIOMMU`: open a `pci:` target in VFIO's noiommu mode.
pub const OPEN_NOIOMMU: u32 = 1 << 0;

/// The most I/O units (fio's `iodepth`) one job may have.
pub const MAX_IODEPTH: u32 = 65_536;
/// Ring entries of a queue pair when `kestrel_queue_size` is not given: as `kestrel
/// perf`, 2 x iodepth + 1 and at least this many.
pub const MIN_QUEUE_SIZE: u32 = 64;
/// The largest automatic ring size.
pub const MAX_AUTO_QUEUE_SIZE: u32 = 4096;
/// How long closing a job waits for I/O still at the device before giving up on it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(40);

/// The fio version the glue was compiled for.
pub const FIO_VERSION: Option<&str> = option_env!("KFIO_FIO_VERSION");

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
fn acquire(spec: &str, noiommu: bool) -> Result<Arc<dyn Target>, (i32, String)> {
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
    list.push(Shared {
        key: spec.to_string(),
        noiommu,
        target: Arc::clone(&target),
        users: 1,
    });
    Ok(target)
}

/// Leaves a target; the last job to leave closes it.
fn release(spec: &str) {
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
fn users_of(spec: &str) -> usize {
    targets()
        .iter()
        .find(|s| s.key == spec)
        .map_or(0, |s| s.users)
}

/// One fio job thread's state.
pub struct Job {
    key: String,
    target: Arc<dyn Target>,
    name: CString,
    nsid: u32,
    block_size: u64,
    num_blocks: u64,
    deallocate: bool,
    queue: Option<Box<dyn TargetQueue>>,
    mem: Option<DmaBuf>,
    /// Per I/O unit index: the io_u of the request in flight.
    io_us: Box<[usize]>,
    /// Per I/O unit index: why its last request failed.
    errors: Box<[Option<IoError>]>,
    /// Completions reaped by the last getevents: (index, errno).
    events: Vec<(u32, i32)>,
    /// Messages already printed (one per kind per job, not one per I/O).
    warned: u32,
}

const WARN_ALIGN: u32 = 1 << 0;
const WARN_RANGE: u32 = 1 << 1;
const WARN_TRIM: u32 = 1 << 2;
const WARN_BUF: u32 = 1 << 3;
const WARN_INVALID: u32 = 1 << 4;
const WARN_OP: u32 = 1 << 5;

/// A failure: a positive errno and, unless already said, a message.
type Failure = (i32, Option<String>);

impl Job {
    fn open(spec: &str, flags: u32) -> Result<Job, (i32, String)> {
        if flags & !OPEN_NOIOMMU != 0 {
            return Err((libc::EINVAL, format!("unknown open flags {flags:#x}")));
        }
        let target = acquire(spec, flags & OPEN_NOIOMMU != 0)?;
        let info = target.info().clone();
        Ok(Job {
            key: spec.to_string(),
            name: CString::new(info.name.replace('\0', " ")).unwrap_or_default(),
            nsid: info.nsid,
            block_size: info.block_size as u64,
            num_blocks: info.num_blocks,
            deallocate: info.deallocate,
            target,
            queue: None,
            mem: None,
            io_us: Box::new([]),
            errors: Box::new([]),
            events: Vec::new(),
            warned: 0,
        })
    }

    fn start(&mut self, iodepth: u32, queue_size: u32) -> Result<(), String> {
        if iodepth == 0 || iodepth > MAX_IODEPTH {
            return Err(format!("iodepth={iodepth}: expected 1 to {MAX_IODEPTH}"));
        }
        let depth = match queue_size {
            0 => (2 * iodepth + 1).clamp(MIN_QUEUE_SIZE, MAX_AUTO_QUEUE_SIZE.max(iodepth + 1)),
            n if n <= iodepth => {
                return Err(format!(
                    "kestrel_queue_size={n} must be more than iodepth={iodepth} (a ring of N \
                     entries holds N - 1 commands)"
                ))
            }
            n => n,
        };
        let opts = QueueOptions {
            depth,
            ..QueueOptions::default()
        };
        let q = self.target.create_queue(&opts).map_err(|e| {
            format!(
                "creating a queue pair of {depth} entries on {}: {e}",
                self.name.to_string_lossy()
            )
        })?;
        self.queue = Some(q);
        let n = iodepth as usize;
        self.io_us = vec![0; n].into_boxed_slice();
        self.errors = vec![None; n].into_boxed_slice();
        self.events = Vec::with_capacity(n);
        Ok(())
    }

    fn iomem_alloc(&mut self, len: usize) -> Result<*mut u8, String> {
        if self.mem.is_some() {
            return Err("I/O memory is already allocated for this job".into());
        }
        let buf = self.target.dma_pool().alloc(len).map_err(|e| {
            format!(
                "allocating {len} bytes of I/O buffers from {}'s DMA memory: {e} (reduce \
                 iodepth or bs)",
                self.name.to_string_lossy()
            )
        })?;
        let p = buf.as_ptr();
        self.mem = Some(buf);
        Ok(p)
    }

    /// Waits (bounded) for requests still at the device; false if some never completed.
    fn drain(&mut self) -> bool {
        let Some(q) = self.queue.as_mut() else {
            return true;
        };
        let end = Instant::now() + DRAIN_TIMEOUT;
        while q.outstanding() > 0 {
            if Instant::now() >= end {
                return false;
            }
            q.poll(u32::MAX, &mut |_| {});
            std::hint::spin_loop();
        }
        true
    }

    fn iomem_free(&mut self) {
        if let Some(mem) = self.mem.take() {
            if !self.drain() {
                // The device may still write into it: keep it out of the pool for good.
                eprintln!(
                    "kestrel: {}: requests still outstanding after {} s; their buffers are \
                     not reused",
                    self.name.to_string_lossy(),
                    DRAIN_TIMEOUT.as_secs()
                );
                std::mem::forget(mem);
            }
        }
    }

    /// `msg(target name)`, the first time a message of this kind comes up in the job.
    fn say(&mut self, kind: u32, msg: impl FnOnce(&str) -> String) -> Option<String> {
        if self.warned & kind != 0 {
            return None;
        }
        self.warned |= kind;
        Some(msg(&self.name.to_string_lossy()))
    }

    fn queue(
        &mut self,
        op: c_int,
        offset: u64,
        len: u64,
        buf: usize,
        index: u32,
        io_u: usize,
    ) -> Result<c_int, Failure> {
        if self.queue.is_none() {
            return Err((libc::EINVAL, Some("I/O before the engine's init".into())));
        }
        let i = index as usize;
        if i >= self.io_us.len() {
            return Err((
                libc::EINVAL,
                Some(format!(
                    "I/O unit {index} beyond iodepth={}",
                    self.io_us.len()
                )),
            ));
        }
        let token = index as u64;
        let bs = self.block_size;
        let req = if op == OP_FLUSH {
            IoRequest::flush(self.nsid, token)
        } else {
            if !matches!(op, OP_READ | OP_WRITE | OP_TRIM) {
                return Err((
                    libc::EINVAL,
                    self.say(WARN_OP, |_| format!("unknown operation {op}")),
                ));
            }
            if len == 0 || offset % bs != 0 || len % bs != 0 || len / bs > u32::MAX as u64 {
                return Err((
                    libc::EINVAL,
                    self.say(WARN_ALIGN, |name| {
                        format!(
                            "I/O at offset {offset} of {len} bytes is not whole {bs}-byte blocks \
                             of {}: check bs=, bsrange=, bssplit=, offset=, offset_increment= \
                             and blockalign=",
                            name
                        )
                    }),
                ));
            }
            let (lba, nlb) = (offset / bs, (len / bs) as u32);
            if lba + nlb as u64 > self.num_blocks {
                let capacity = self.num_blocks * bs;
                return Err((
                    libc::EINVAL,
                    self.say(WARN_RANGE, |name| {
                        format!(
                            "I/O at offset {offset} of {len} bytes ends past the end of {} ({} \
                             bytes): check size=, offset= and filesize=",
                            name, capacity
                        )
                    }),
                ));
            }
            if op == OP_TRIM {
                if !self.deallocate {
                    return Err((
                        libc::EOPNOTSUPP,
                        self.say(WARN_TRIM, |name| {
                            format!("trim: {} does not support Deallocate", name)
                        }),
                    ));
                }
                IoRequest::deallocate(self.nsid, lba, nlb, token)
            } else {
                let slice = self.mem.as_ref().and_then(|m| {
                    let off = buf.checked_sub(m.as_ptr() as usize)?;
                    m.slice(off, len as usize).ok()
                });
                let Some(slice) = slice else {
                    return Err((
                        libc::EFAULT,
                        self.say(WARN_BUF, |_| {
                            "an I/O buffer is not in the engine's DMA memory (do not set mem= or \
                             iomem=: the engine allocates fio's buffers itself)"
                                .to_string()
                        }),
                    ));
                };
                if op == OP_READ {
                    IoRequest::read(self.nsid, lba, nlb, slice, token)
                } else {
                    IoRequest::write(self.nsid, lba, nlb, slice, token)
                }
            }
        };
        let q = self.queue.as_mut().expect("checked above");
        match q.submit(req) {
            Ok(()) => {
                self.io_us[i] = io_u;
                self.errors[i] = None;
                Ok(QUEUED)
            }
            Err(SubmitError::Busy(_)) => Ok(BUSY),
            Err(SubmitError::DeviceRemoved) => Err((
                libc::ENODEV,
                Some(format!("{}: device removed", self.name.to_string_lossy())),
            )),
            Err(e @ SubmitError::Invalid { .. }) => Err((
                libc::EINVAL,
                self.say(WARN_INVALID, |name| format!("{}: {e}", name)),
            )),
        }
    }

    fn commit(&mut self) {
        if let Some(q) = self.queue.as_mut() {
            q.flush();
        }
    }

    fn getevents(&mut self, min: u32, max: u32, timeout_ns: i64) -> c_int {
        self.events.clear();
        let Some(q) = self.queue.as_mut() else {
            return 0;
        };
        let cap = self.events.capacity() as u32;
        let max = max.min(cap);
        let min = min.min(max);
        let deadline =
            (timeout_ns >= 0).then(|| Instant::now() + Duration::from_nanos(timeout_ns as u64));
        let (events, errors) = (&mut self.events, &mut self.errors);
        loop {
            let want = max - events.len() as u32;
            if want > 0 {
                q.poll(want, &mut |c| {
                    let index = c.token as u32;
                    let err = match c.result {
                        Ok(()) => 0,
                        Err(e) => {
                            if let Some(slot) = errors.get_mut(index as usize) {
                                *slot = Some(e);
                            }
                            e.errno()
                        }
                    };
                    events.push((index, err));
                });
            }
            let n = events.len() as u32;
            if n >= min || n >= max || q.outstanding() == 0 {
                return n as c_int;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return n as c_int;
            }
            std::hint::spin_loop();
        }
    }

    fn event(&self, i: u32) -> (usize, c_int) {
        match self.events.get(i as usize) {
            Some(&(index, err)) => (self.io_us.get(index as usize).copied().unwrap_or(0), err),
            None => (0, libc::EINVAL),
        }
    }

    fn errdetails(&self, index: u32) -> String {
        match self.errors.get(index as usize).copied().flatten() {
            Some(e) => format!("kestrel: {}: {e}", self.name.to_string_lossy()),
            None => format!(
                "kestrel: {}: no error recorded",
                self.name.to_string_lossy()
            ),
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(q) = self.queue.as_ref() {
            let s = q.stats();
            tracing::info!(
                "{}: queue pair: {} requests, {} completions, {} commands, {} sq doorbell writes, \
                 {} cq doorbell writes, {} shadow-only doorbell updates, {} polls ({} idle)",
                self.name.to_string_lossy(),
                s.submitted,
                s.completed,
                s.commands,
                s.sq_doorbell_writes,
                s.cq_doorbell_writes,
                s.shadow_doorbell_updates,
                s.polls,
                s.idle_polls
            );
        }
        self.iomem_free();
        if !self.drain() {
            eprintln!(
                "kestrel: {}: closing its queue pair with requests outstanding",
                self.name.to_string_lossy()
            );
        }
        // The queue pair goes before the target it was made on.
        self.queue = None;
        release(&self.key);
    }
}

/// Copies `s` into the C buffer `msg` of `len` bytes, truncated and NUL-terminated.
///
/// # Safety
/// `msg` is null or valid for writes of `len` bytes.
unsafe fn write_msg(msg: *mut c_char, len: usize, s: &str) {
    if msg.is_null() || len == 0 {
        return;
    }
    let mut n = s.len().min(len - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `msg` has room for `len` bytes and n + 1 <= len; `s` is a distinct Rust
    // string, so the ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), msg.cast::<u8>(), n);
        *msg.add(n) = 0;
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`, turning a panic into `on_panic()` (and a message on stderr). `on_panic` is
/// a closure so that the I/O path builds no error value unless one is needed.
fn guard<T>(what: &str, on_panic: impl FnOnce() -> T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            eprintln!(
                "kestrel: internal error in {what}: {}; the job fails",
                panic_text(&*p)
            );
            on_panic()
        }
    }
}

fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .try_init();
        }
    });
}

/// # Safety
/// `job` is null or a pointer returned by [`kfio_job_open`] and not yet closed, used by
/// one thread at a time.
unsafe fn job_mut<'a>(job: *mut Job) -> Option<&'a mut Job> {
    // SAFETY: the caller's contract.
    unsafe { job.as_mut() }
}

/// Opens or joins a target; see `kfio.h`.
///
/// # Safety
/// `target` is a NUL-terminated string; `err` is null or writable; `msg` is null or
/// writable for `msglen` bytes.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_open(
    target: *const c_char,
    flags: u32,
    err: *mut c_int,
    msg: *mut c_char,
    msglen: usize,
) -> *mut Job {
    let r = guard(
        "kfio_job_open",
        || Err((libc::EIO, "panic".into())),
        || {
            init_logging();
            if target.is_null() {
                return Err((libc::EINVAL, "no target string".into()));
            }
            // SAFETY: the caller passes a NUL-terminated string.
            let spec = unsafe { CStr::from_ptr(target) };
            let spec = spec
                .to_str()
                .map_err(|_| (libc::EINVAL, "the target string is not UTF-8".to_string()))?;
            Job::open(spec, flags)
        },
    );
    match r {
        Ok(job) => Box::into_raw(Box::new(job)),
        Err((e, m)) => {
            // SAFETY: the caller's contract on err and msg.
            unsafe {
                if !err.is_null() {
                    *err = e;
                }
                write_msg(msg, msglen, &m);
            }
            std::ptr::null_mut()
        }
    }
}

/// Capacity of the job's target in bytes.
///
/// # Safety
/// As [`job_mut`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_size(job: *const Job) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { job.as_ref() }.map_or(0, |j| j.num_blocks * j.block_size)
}

/// Logical block size of the job's target.
///
/// # Safety
/// As [`job_mut`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_block_size(job: *const Job) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { job.as_ref() }.map_or(0, |j| j.block_size as u32)
}

/// The target's name, NUL-terminated, valid while the job lives.
///
/// # Safety
/// As [`job_mut`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_name(job: *const Job) -> *const c_char {
    // SAFETY: the caller's contract.
    unsafe { job.as_ref() }.map_or(c"?".as_ptr(), |j| j.name.as_ptr())
}

/// Creates the job's queue pair, on the job's thread.
///
/// # Safety
/// As [`job_mut`]; `msg` as in [`kfio_job_open`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_start(
    job: *mut Job,
    iodepth: u32,
    queue_size: u32,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    let r = guard(
        "kfio_job_start",
        || Err("panic".into()),
        || j.start(iodepth, queue_size),
    );
    match r {
        Ok(()) => 0,
        Err(m) => {
            // SAFETY: the caller's contract on msg.
            unsafe { write_msg(msg, msglen, &m) };
            -libc::EINVAL
        }
    }
}

/// Allocates fio's I/O buffers from the target's DMA memory.
///
/// # Safety
/// As [`job_mut`]; `ptr` is writable; `msg` as in [`kfio_job_open`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_iomem_alloc(
    job: *mut Job,
    len: usize,
    ptr: *mut *mut c_void,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    match guard(
        "kfio_job_iomem_alloc",
        || Err("panic".into()),
        || j.iomem_alloc(len),
    ) {
        Ok(p) => {
            // SAFETY: the caller passes a writable pointer.
            unsafe { *ptr = p.cast() };
            0
        }
        Err(m) => {
            // SAFETY: the caller's contract on msg.
            unsafe { write_msg(msg, msglen, &m) };
            -libc::ENOMEM
        }
    }
}

/// Frees the I/O buffers (after outstanding I/O completes).
///
/// # Safety
/// As [`job_mut`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_iomem_free(job: *mut Job) {
    // SAFETY: the caller's contract.
    if let Some(j) = unsafe { job_mut(job) } {
        guard("kfio_job_iomem_free", || (), || j.iomem_free());
    }
}

/// Queues one request; see `kfio.h`.
///
/// # Safety
/// As [`job_mut`]; `msg` as in [`kfio_job_open`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kfio_job_queue(
    job: *mut Job,
    op: c_int,
    offset: u64,
    len: u64,
    buf: *mut c_void,
    index: u32,
    io_u: *mut c_void,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    let r = guard(
        "kfio_job_queue",
        || Err((libc::EIO, Some("panic".into()))),
        || j.queue(op, offset, len, buf as usize, index, io_u as usize),
    );
    match r {
        Ok(v) => v,
        Err((e, m)) => {
            if let Some(m) = m {
                // SAFETY: the caller's contract on msg.
                unsafe { write_msg(msg, msglen, &m) };
            }
            -e
        }
    }
}

/// Rings the doorbell once for everything queued since the last commit.
///
/// # Safety
/// As [`job_mut`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_commit(job: *mut Job) {
    // SAFETY: the caller's contract.
    if let Some(j) = unsafe { job_mut(job) } {
        guard("kfio_job_commit", || (), || j.commit());
    }
}

/// Polls for completions; see `kfio.h`.
///
/// # Safety
/// As [`job_mut`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_getevents(
    job: *mut Job,
    min: u32,
    max: u32,
    timeout_ns: i64,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    guard(
        "kfio_job_getevents",
        || -libc::EIO,
        || j.getevents(min, max, timeout_ns),
    )
}

/// The i-th completion of the last getevents: its io_u and errno.
///
/// # Safety
/// As [`job_mut`]; `err` is writable.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_event(job: *mut Job, i: u32, err: *mut c_int) -> *mut c_void {
    // SAFETY: the caller's contract.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return std::ptr::null_mut();
    };
    let (io_u, e) = guard("kfio_job_event", || (0, libc::EIO), || j.event(i));
    if !err.is_null() {
        // SAFETY: the caller passes a writable pointer.
        unsafe { *err = e };
    }
    io_u as *mut c_void
}

/// Why the last request of I/O unit `index` failed, as a malloc()ed string.
///
/// # Safety
/// As [`job_mut`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_errdetails(job: *mut Job, index: u32) -> *mut c_char {
    // SAFETY: the caller's contract.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return std::ptr::null_mut();
    };
    let s = guard("kfio_job_errdetails", String::new, || j.errdetails(index));
    // SAFETY: malloc of the string's length plus the NUL; a null result is returned as is.
    unsafe {
        let p = libc::malloc(s.len() + 1).cast::<c_char>();
        write_msg(p, s.len() + 1, &s);
        p
    }
}

/// Closes the job.
///
/// # Safety
/// `job` is null or a pointer from [`kfio_job_open`], not used again after this.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_close(job: *mut Job) {
    if job.is_null() {
        return;
    }
    // SAFETY: the pointer came from Box::into_raw in kfio_job_open and is closed once.
    let b = unsafe { Box::from_raw(job) };
    guard("kfio_job_close", || (), || drop(b));
}

/// What fio calls to find the engine (`dlsym(handle, "get_ioengine")`): the
/// `struct ioengine_ops` defined by the glue compiled against fio's headers.
///
/// # Safety
/// `ops` is writable.
#[cfg(all(kestrel_fio_shim, not(test)))]
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
    extern "C" {
        fn kfio_shim_ops() -> *mut c_void;
    }
    if !ops.is_null() {
        // SAFETY: kfio_shim_ops returns the address of a static; ops is writable.
        unsafe { *ops = kfio_shim_ops() };
    }
}

#[cfg(test)]
mod tests;
