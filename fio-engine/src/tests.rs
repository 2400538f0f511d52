//! Tests of the Rust half through the same `extern "C"` functions the glue calls, on the
//! emulator. Each test names its own target string, so tests running at once never share
//! a target through the process-wide list.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ffi::*;
use super::shared::{is_open, users_of};
use super::*;

#[path = "../../driver/tests/support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{unwatch_this_thread, Counter};

mod idle;
mod run;
mod sync;
mod zones;

const MSG: usize = 512;

/// A job handle as the glue holds it, with helpers that call the C entry points.
struct H {
    job: *mut Job,
    mem: *mut u8,
    mem_len: usize,
    msg: [c_char; MSG],
}

fn open(spec: &str) -> Result<H, (i32, String)> {
    open_flags(spec, 0)
}

fn open_flags(spec: &str, flags: u32) -> Result<H, (i32, String)> {
    open_run(spec, flags, 0)
}

/// Opens `spec` as a job of a fio run in which `run_jobs` jobs name it.
fn open_run(spec: &str, flags: u32, run_jobs: u32) -> Result<H, (i32, String)> {
    let c = CString::new(spec).unwrap();
    let mut err = 0;
    let mut msg = [0 as c_char; MSG];
    // SAFETY: a NUL-terminated string, writable err and msg.
    let job =
        unsafe { kfio_job_open(c.as_ptr(), flags, run_jobs, &mut err, msg.as_mut_ptr(), MSG) };
    if job.is_null() {
        // SAFETY: `msg` started zeroed and kfio_job_open's write_msg ends what it writes
        // with a NUL, so a NUL lies within its MSG bytes.
        let m = unsafe { CStr::from_ptr(msg.as_ptr()) };
        return Err((err, m.to_string_lossy().into_owned()));
    }
    Ok(H {
        job,
        mem: std::ptr::null_mut(),
        mem_len: 0,
        msg,
    })
}

// SAFETY: a job is used by one thread at a time, which moving the handle preserves (as fio
// sets a job up on its main thread and runs it on the job's thread).
unsafe impl Send for H {}

impl H {
    fn msg(&self) -> String {
        // SAFETY: the buffer is NUL-terminated (write_msg, or zeroed by the caller).
        unsafe { CStr::from_ptr(self.msg.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
    fn start(&mut self, iodepth: u32, queue_size: u32) -> c_int {
        self.start_idle(iodepth, queue_size, IDLE_BUSY, 0)
    }
    fn start_idle(&mut self, iodepth: u32, queue_size: u32, idle: c_int, spin_ns: u64) -> c_int {
        self.msg[0] = 0;
        // SAFETY: a live job; msg is writable.
        unsafe {
            kfio_job_start(
                self.job,
                iodepth,
                queue_size,
                idle,
                spin_ns,
                self.msg.as_mut_ptr(),
                MSG,
            )
        }
    }
    fn iomem(&mut self, len: usize) -> c_int {
        let mut p: *mut c_void = std::ptr::null_mut();
        self.msg[0] = 0;
        // SAFETY: a live job; p and msg are writable.
        let r = unsafe { kfio_job_iomem_alloc(self.job, len, &mut p, self.msg.as_mut_ptr(), MSG) };
        if r == 0 {
            self.mem = p.cast();
            self.mem_len = len;
        }
        r
    }
    /// Queues op for unit `index` with buffer at `buf_off` in the I/O memory.
    fn queue(&mut self, op: c_int, offset: u64, len: u64, buf_off: usize, index: u32) -> c_int {
        self.msg[0] = 0;
        let buf = self.mem.wrapping_add(buf_off);
        // io_u stands in as 0x1000 + index, to see it come back from kfio_job_event.
        let io_u = (0x1000 + index as usize) as *mut c_void;
        // SAFETY: a live job; msg is writable.
        unsafe {
            kfio_job_queue(
                self.job,
                op,
                offset,
                len,
                buf.cast(),
                index,
                io_u,
                self.msg.as_mut_ptr(),
                MSG,
            )
        }
    }
    fn commit(&mut self) {
        // SAFETY: `self.job` is live (opened in `open`, closed only in `drop`) and used by
        // this thread alone.
        unsafe { kfio_job_commit(self.job) }
    }
    fn getevents(&mut self, min: u32, max: u32, timeout_ns: i64) -> c_int {
        // SAFETY: `self.job` is live (opened in `open`, closed only in `drop`) and used by
        // this thread alone.
        unsafe { kfio_job_getevents(self.job, min, max, timeout_ns) }
    }
    /// (index, errno) of event i.
    fn event(&mut self, i: u32) -> (u32, c_int) {
        let mut err = -1;
        // SAFETY: a live job; err is writable.
        let io_u = unsafe { kfio_job_event(self.job, i, &mut err) } as usize;
        ((io_u - 0x1000) as u32, err)
    }
    fn errdetails(&mut self, index: u32) -> String {
        // SAFETY: a live job; the result is malloc()ed and freed here.
        unsafe {
            let p = kfio_job_errdetails(self.job, index);
            let s = CStr::from_ptr(p).to_string_lossy().into_owned();
            libc::free(p.cast());
            s
        }
    }
    fn fill(&mut self, off: usize, len: usize, byte: u8) {
        assert!(off + len <= self.mem_len);
        // SAFETY: inside the I/O memory, which no request in flight uses.
        unsafe { std::ptr::write_bytes(self.mem.add(off), byte, len) }
    }
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.mem_len);
        // SAFETY: inside the I/O memory; the reads that filled it have completed.
        unsafe { std::slice::from_raw_parts(self.mem.add(off), len) }.to_vec()
    }
    /// Reaps exactly n completions, all successful.
    fn reap_ok(&mut self, n: u32) -> Vec<u32> {
        let mut got = Vec::new();
        while (got.len() as u32) < n {
            let r = self.getevents(1, n - got.len() as u32, -1);
            assert!(
                r > 0,
                "getevents returned {r} with {} of {n} reaped",
                got.len()
            );
            for i in 0..r as u32 {
                let (index, err) = self.event(i);
                assert_eq!(err, 0, "unit {index}: {}", self.errdetails(index));
                got.push(index);
            }
        }
        got
    }
}

impl Drop for H {
    fn drop(&mut self) {
        // SAFETY: closes the job once; iomem first, as fio does.
        unsafe {
            kfio_job_iomem_free(self.job);
            kfio_job_close(self.job);
        }
    }
}

#[test]
fn jobs_naming_one_target_share_it_until_the_last_closes() {
    let spec = "emu:size=12M";
    let a = open(spec).unwrap();
    let b = open(spec).unwrap();
    assert_eq!(users_of(spec), 2);
    // SAFETY: `a.job` and `b.job` are live until `a` and `b` drop below, and this thread
    // alone uses them; only shared reads are made.
    unsafe {
        assert_eq!(kfio_job_size(a.job), 12 << 20);
        assert_eq!(kfio_job_block_size(b.job), 4096);
        assert!(Arc::ptr_eq(&(*a.job).target, &(*b.job).target));
    }
    drop(a);
    assert_eq!(users_of(spec), 1);
    drop(b);
    assert_eq!(users_of(spec), 0);
    // A different string is a different target.
    let c = open("emu:size=16M").unwrap();
    let d = open("emu:size=16M,lba=4096").unwrap();
    // SAFETY: `c.job` and `d.job` are live until `c` and `d` drop, and this thread alone
    // uses them; only shared reads are made.
    unsafe { assert!(!Arc::ptr_eq(&(*c.job).target, &(*d.job).target)) };
    // Jobs sharing a target agree on how it is opened; the noiommu flag means nothing to
    // an emulator, but a second job asking otherwise is told, not silently joined.
    let e = open_flags("emu:size=16M", OPEN_NOIOMMU).err().unwrap();
    assert_eq!(e.0, libc::EINVAL);
    assert!(e.1.contains("kestrel_noiommu=1 differs"), "{}", e.1);
    assert_eq!(users_of("emu:size=16M"), 1);
    let f = open_flags("emu:size=24M", OPEN_NOIOMMU).unwrap();
    let g = open_flags("emu:size=24M", OPEN_NOIOMMU).unwrap();
    assert_eq!(users_of("emu:size=24M"), 2);
    drop((f, g));
    let e = open_flags("emu:size=24M", 1 << 7).err().unwrap();
    assert!(e.1.contains("unknown open flags 0x80"), "{}", e.1);
}

#[test]
fn two_job_threads_see_each_others_writes_through_their_own_queue_pairs() {
    let spec = "emu:size=20M";
    let mut w = open(spec).unwrap();
    let mut r = open(spec).unwrap();
    assert_eq!(w.start(4, 0), 0, "{}", w.msg());
    assert_eq!(w.iomem(4 * 8192), 0, "{}", w.msg());
    w.fill(0, 8192, 0xa5);
    assert_eq!(w.queue(OP_WRITE, 40960, 8192, 0, 0), QUEUED, "{}", w.msg());
    w.commit();
    w.reap_ok(1);
    // The reader runs on another thread with its own queue pair, as a second fio job.
    let r = std::thread::spawn(move || {
        assert_eq!(r.start(2, 0), 0, "{}", r.msg());
        assert_eq!(r.iomem(8192), 0, "{}", r.msg());
        assert_eq!(r.queue(OP_READ, 40960, 8192, 0, 1), QUEUED, "{}", r.msg());
        r.commit();
        assert_eq!(r.reap_ok(1), vec![1]);
        r.bytes(0, 8192)
    })
    .join()
    .unwrap();
    assert!(r.iter().all(|&b| b == 0xa5));
}

#[test]
fn batches_flush_trim_and_the_event_table() {
    let mut h = open("emu:size=24M").unwrap();
    assert_eq!(h.start(16, 0), 0, "{}", h.msg());
    assert_eq!(h.iomem(16 * 4096), 0);
    // Sixteen writes in one batch (one commit), each unit its own block and pattern.
    for i in 0..16u32 {
        h.fill(i as usize * 4096, 4096, i as u8 + 1);
        assert_eq!(
            h.queue(OP_WRITE, i as u64 * 4096, 4096, i as usize * 4096, i),
            QUEUED
        );
    }
    h.commit();
    let mut got = h.reap_ok(16);
    got.sort_unstable();
    assert_eq!(got, (0..16).collect::<Vec<_>>());
    // getevents never returns more than max.
    for i in 0..16u32 {
        assert_eq!(
            h.queue(OP_READ, i as u64 * 4096, 4096, (15 - i) as usize * 4096, i),
            QUEUED
        );
    }
    h.commit();
    let mut n = 0;
    while n < 16 {
        let r = h.getevents(1, 3, -1);
        assert!((1..=3).contains(&r), "{r}");
        n += r;
    }
    for i in 0..16usize {
        assert!(h
            .bytes((15 - i) * 4096, 4096)
            .iter()
            .all(|&b| b == i as u8 + 1));
    }
    // Flush, and a trim (Deallocate): the emulator's deallocated blocks read zeroes.
    assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, 0), QUEUED);
    assert_eq!(h.queue(OP_TRIM, 0, 8192, 0, 1), QUEUED, "{}", h.msg());
    h.commit();
    h.reap_ok(2);
    assert_eq!(h.queue(OP_READ, 0, 8192, 0, 2), QUEUED);
    h.commit();
    h.reap_ok(1);
    assert!(h.bytes(0, 8192).iter().all(|&b| b == 0));
    // Nothing outstanding: getevents returns at once, whatever min says.
    assert_eq!(h.getevents(4, 8, -1), 0);
}

#[test]
fn bad_requests_fail_at_once_with_one_message_per_kind() {
    let mut h = open("emu:size=28M").unwrap();
    // Before init.
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 0), -libc::EINVAL);
    assert_eq!(h.start(4, 0), 0);
    assert_eq!(h.iomem(4 * 4096), 0);
    assert_eq!(h.queue(OP_READ, 512, 4096, 0, 0), -libc::EINVAL);
    let m = h.msg();
    assert!(m.contains("offset 512") && m.contains("bs="), "{m}");
    // The same kind again: failed, but not said twice.
    assert_eq!(h.queue(OP_WRITE, 4096, 1000, 0, 0), -libc::EINVAL);
    assert_eq!(h.msg(), "");
    assert_eq!(h.queue(OP_READ, 28 << 20, 4096, 0, 0), -libc::EINVAL);
    assert!(h.msg().contains("past the end"), "{}", h.msg());
    // A buffer outside the engine's DMA memory.
    h.mem = h.mem.wrapping_sub(1 << 30);
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 0), -libc::EFAULT);
    assert!(h.msg().contains("DMA memory"), "{}", h.msg());
    h.mem = h.mem.wrapping_add(1 << 30);
    // A unit index beyond iodepth.
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 4), -libc::EINVAL);
    assert!(h.msg().contains("iodepth=4"), "{}", h.msg());
    assert_eq!(h.queue(9, 0, 4096, 0, 0), -libc::EINVAL);
    assert!(h.msg().contains("unknown operation 9"), "{}", h.msg());
    // Nothing reached the device.
    assert_eq!(h.getevents(0, 4, 0), 0);
}

#[test]
fn bad_options_and_targets_are_refused_with_reasons() {
    let e = open("emu:size=0").err().unwrap();
    assert_eq!(e.0, libc::EINVAL);
    assert!(e.1.contains("at least one block"), "{}", e.1);
    let e = open("disk0").err().unwrap();
    assert!(e.1.contains("no known kind of target"), "{}", e.1);
    let e = open("pci:0000:ff:1f.7").err().unwrap();
    assert_eq!(e.0, libc::ENODEV, "{}", e.1);
    assert!(e.1.contains("0000:ff:1f.7"), "{}", e.1);
    let e = open("file:/nonexistent-dir/x.img").err().unwrap();
    assert!(e.1.contains("/nonexistent-dir/x.img"), "{}", e.1);
    // Formats whose metadata every I/O must carry: the engine sends none.
    for (spec, want) in [
        (
            "emu:ns=16M+4096+md8",
            "8 bytes of metadata per block (separate buffer)",
        ),
        (
            "emu:ns=16M+512+md8+ext",
            "8 bytes of metadata per block (extended lba)",
        ),
    ] {
        let e = open(spec).err().unwrap();
        assert_eq!(e.0, libc::EINVAL, "{spec}");
        assert!(e.1.contains(want), "{spec}: {}", e.1);
    }
    // A namespace whose size in bytes does not fit in 64 bits (2^52 blocks of 4096 bytes)
    // is refused, not opened with a capacity that wrapped to 0.
    let e = open("emu:size=16M,faults=nsze/4503599627370496")
        .err()
        .unwrap();
    assert_ne!(e.0, 0, "{}", e.1);
    assert!(
        e.1.contains("nsze 4503599627370496") && e.1.contains("4096 bytes"),
        "{}",
        e.1
    );
    // PI that is the whole metadata is inserted and stripped by the controller.
    let mut h = open("emu:ns=16M+4096+md8+pi1").unwrap();
    assert_eq!(h.start(4, 0), 0, "{}", h.msg());

    let mut h = open("emu:size=32M").unwrap();
    assert_eq!(h.start(8, 8), -libc::EINVAL);
    assert!(h.msg().contains("kestrel_queue_size=8"), "{}", h.msg());
    assert_eq!(h.start(0, 0), -libc::EINVAL);
    assert!(h.msg().contains("iodepth=0"), "{}", h.msg());
    assert_eq!(h.start(8, 9), 0, "{}", h.msg());
    assert_eq!(h.iomem(0), -libc::ENOMEM);
    assert!(h.msg().contains("I/O buffers"), "{}", h.msg());
}

#[test]
fn device_errors_come_back_as_eio_with_the_nvme_status() {
    let mut h = open("emu:size=36M,faults=status/read/read-error/dnr/100%").unwrap();
    assert_eq!(h.start(4, 0), 0);
    assert_eq!(h.iomem(4 * 4096), 0);
    assert_eq!(h.queue(OP_WRITE, 0, 4096, 0, 0), QUEUED);
    assert_eq!(h.queue(OP_READ, 4096, 4096, 4096, 3), QUEUED);
    h.commit();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let r = h.getevents(1, 2, -1);
        for i in 0..r as u32 {
            seen.push(h.event(i));
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![(0, 0), (3, libc::EIO)]);
    let d = h.errdetails(3);
    assert!(d.contains("Unrecovered Read Error"), "{d}");
    assert!(h.errdetails(0).contains("no error"));
}

#[test]
fn getevents_honours_its_timeout() {
    // Each command takes a second: a 1 ms timeout returns before it completes (only a
    // stall of the test thread longer than the emulator's latency could see it complete).
    let mut h = open("emu:size=40M,latency=1s").unwrap();
    assert_eq!(h.start(2, 0), 0);
    assert_eq!(h.iomem(4096), 0);
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 0), QUEUED);
    h.commit();
    let t = Instant::now();
    assert_eq!(h.getevents(1, 1, 1_000_000), 0);
    // No timeout: polls until the completion arrives.
    assert_eq!(h.getevents(1, 1, -1), 1);
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn closing_with_io_outstanding_waits_for_it() {
    let mut h = open("emu:size=44M,latency=20ms").unwrap();
    assert_eq!(h.start(4, 0), 0);
    assert_eq!(h.iomem(4 * 4096), 0);
    for i in 0..4 {
        assert_eq!(
            h.queue(OP_WRITE, i as u64 * 4096, 4096, i * 4096, i as u32),
            QUEUED
        );
    }
    h.commit();
    // SAFETY: `h.job` is live until `h` drops, and this thread alone uses it.
    let pool = unsafe { (*h.job).target.dma_pool().clone() };
    let used = pool.used_bytes();
    assert!(used >= 4 * 4096);
    let t = Instant::now();
    // SAFETY: `h.job` is live until `h` drops, and this thread alone uses it.
    unsafe { kfio_job_iomem_free(h.job) };
    assert!(
        t.elapsed() >= Duration::from_millis(15),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(pool.used_bytes(), used - 4 * 4096);
    // SAFETY: `h.job` is live until `h` drops, and this thread alone uses it.
    assert_eq!(unsafe { (*h.job).queue.as_ref().unwrap().outstanding() }, 0);
}

/// Buffers lent to the job's queue pair (0 before iomem_alloc and after iomem_free).
fn lent(h: &H) -> usize {
    // SAFETY: `h.job` is live until `h` drops, and this thread alone uses it.
    unsafe { (*h.job).queue.as_ref() }.map_or(0, |q| q.leases().lent())
}

/// fio's I/O memory is lent to the job's queue pair, which owns it while the job runs
/// (whether fio allocates it after init, as fio does, or before), carries the units' data
/// both ways, and goes back to the pool when fio frees it.
#[test]
fn the_io_memory_is_lent_to_the_queue_pair_and_given_back() {
    let mut h = open("emu:size=52M").unwrap();
    assert_eq!(h.start(2, 0), 0, "{}", h.msg());
    // SAFETY: `h.job` is live until `h` drops, and this thread alone uses it.
    let pool = unsafe { (*h.job).target.dma_pool().clone() };
    let before = pool.used_bytes();
    assert_eq!(lent(&h), 0);
    assert_eq!(h.iomem(2 * 4096), 0, "{}", h.msg());
    assert_eq!(lent(&h), 1, "the I/O memory is lent to the queue pair");
    assert_eq!(pool.used_bytes(), before + 2 * 4096);
    // A second init would replace the queue pair that holds it: refused.
    assert_eq!(h.start(2, 0), -libc::EINVAL);
    assert!(h.msg().contains("already made"), "{}", h.msg());
    assert_eq!(lent(&h), 1);
    h.fill(0, 4096, 0x3c);
    assert_eq!(h.queue(OP_WRITE, 8192, 4096, 0, 0), QUEUED, "{}", h.msg());
    h.commit();
    h.reap_ok(1);
    assert_eq!(h.queue(OP_READ, 8192, 4096, 4096, 1), QUEUED, "{}", h.msg());
    h.commit();
    h.reap_ok(1);
    assert!(h.bytes(4096, 4096).iter().all(|&b| b == 0x3c));
    // SAFETY: `h.job` is a live job from kfio_job_open (until `h` drops) with nothing in
    // flight (every unit was reaped above), used by this thread alone.
    unsafe { kfio_job_iomem_free(h.job) };
    assert_eq!(lent(&h), 0, "given back");
    assert_eq!(pool.used_bytes(), before, "freed");
    // No memory: a read or write has no buffer to name.
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 0), -libc::EFAULT);

    // fio's I/O memory allocated before init is lent when the queue pair is made.
    let mut h = open("emu:size=56M").unwrap();
    assert_eq!(h.iomem(4096), 0, "{}", h.msg());
    assert_eq!(lent(&h), 0, "no queue pair yet");
    assert_eq!(
        h.queue(OP_READ, 0, 4096, 0, 0),
        -libc::EINVAL,
        "before init"
    );
    assert_eq!(h.start(1, 0), 0, "{}", h.msg());
    assert_eq!(lent(&h), 1);
    h.fill(0, 4096, 0xc3);
    assert_eq!(h.queue(OP_WRITE, 0, 4096, 0, 0), QUEUED, "{}", h.msg());
    h.commit();
    h.reap_ok(1);
    h.fill(0, 4096, 0);
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 0), QUEUED, "{}", h.msg());
    h.commit();
    h.reap_ok(1);
    assert!(h.bytes(0, 4096).iter().all(|&b| b == 0xc3));
}

#[test]
fn no_allocation_per_io() {
    let mut h = open("emu:size=48M").unwrap();
    // The default idle policy: polls, and sleeps on the interrupt when it waits.
    assert_eq!(h.start_idle(32, 0, IDLE_HYBRID, 20_000), 0);
    assert_eq!(h.iomem(32 * 4096), 0);
    let mut free: Vec<u32> = Vec::with_capacity(32);
    let mut run = |h: &mut H, n: u64| {
        let mut next = 0u64;
        free.clear();
        free.extend(0..32);
        let mut done = 0u64;
        while done < n {
            while let Some(i) = free.pop() {
                let op = match next % 5 {
                    0 => OP_WRITE,
                    1 => OP_FLUSH,
                    2 => OP_TRIM,
                    _ => OP_READ,
                };
                let off = (next * 7919 % 4096) * 4096;
                next += 1;
                // A Flush waits for the writes before it (BUSY), or has nothing to do.
                match h.queue(op, off, 4096, i as usize * 4096, i) {
                    QUEUED => {}
                    COMPLETED if op == OP_FLUSH => {
                        free.push(i);
                        done += 1;
                    }
                    BUSY if op == OP_FLUSH => {
                        free.push(i);
                        break;
                    }
                    r => panic!("op {op}: {r}"),
                }
                if next % 8 == 0 {
                    h.commit();
                }
            }
            h.commit();
            let r = h.getevents(1, 32, -1);
            for e in 0..r as u32 {
                let (i, err) = h.event(e);
                assert_eq!(err, 0);
                free.push(i);
            }
            done += r as u64;
        }
        while h.getevents(1, 32, -1) > 0 {}
    };
    run(&mut h, 2000);
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    run(&mut h, 20_000);
    let allocs = counter.disarm();
    unwatch_this_thread();
    assert_eq!(allocs, 0, "allocations across 20 000 I/Os");
}

#[test]
fn messages_are_truncated_on_a_character_boundary() {
    let mut buf = [0x7f as c_char; 6];
    let text = |buf: &[c_char; 6]| {
        // SAFETY: `buf` holds a NUL within its 6 bytes: write_msg ends what it writes with
        // one (len > 0).
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        s.to_str().unwrap().to_string()
    };
    // SAFETY: a writable buffer of 6 bytes.
    unsafe { write_msg(buf.as_mut_ptr(), 6, "abcdé") };
    assert_eq!(text(&buf), "abcd");
    // SAFETY: a writable buffer of 6 bytes.
    unsafe { write_msg(buf.as_mut_ptr(), 6, "ab") };
    assert_eq!(text(&buf), "ab");
}

#[test]
fn a_panic_does_not_cross_the_boundary() {
    let r = guard("test", || -5, || -> c_int { panic!("boom") });
    assert_eq!(r, -5);
    // A null job is refused, not dereferenced.
    // SAFETY: a null job is within each function's contract (refused with an error or
    // ignored), and no other pointer is passed.
    unsafe {
        assert_eq!(
            kfio_job_getevents(std::ptr::null_mut(), 1, 1, -1),
            -libc::EINVAL
        );
        assert_eq!(kfio_job_size(std::ptr::null()), 0);
        kfio_job_close(std::ptr::null_mut());
    }
}

/// Not a test of speed (it asserts only that every I/O succeeds): the rate of the engine's
/// entry points called in fio's order for a batched random-read job — getevents(1, QD),
/// then one queue per completion, then one commit — without fio's own work, on the null
/// emulator. `scripts/bench-fio.sh` runs it pinned beside `kestrel perf` and fio, to
/// separate what the engine costs from what fio costs:
///
/// ```text
/// KFIO_LOOP_QD=32 KFIO_LOOP_SECS=3 KFIO_LOOP_WARMUP=1 KFIO_LOOP_TARGET=emu:store=null,core=1 \
///     taskset -c 0 <test binary> engine_loop_rate --ignored --nocapture
/// ```
///
/// It prints `engine loop: qd N, IOPS X`.
#[test]
#[ignore = "a benchmark: run by scripts/bench-fio.sh (pins it to a core)"]
fn engine_loop_rate() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let qd: u32 = env("KFIO_LOOP_QD", "32")
        .parse()
        .expect("KFIO_LOOP_QD: a number");
    let secs: f64 = env("KFIO_LOOP_SECS", "2")
        .parse()
        .expect("KFIO_LOOP_SECS: seconds");
    let warmup: f64 = env("KFIO_LOOP_WARMUP", "1")
        .parse()
        .expect("KFIO_LOOP_WARMUP: seconds");
    let target = env("KFIO_LOOP_TARGET", "emu:store=null");
    let mut h = open(&target).unwrap();
    assert_eq!(h.start(qd, 0), 0, "{}", h.msg());
    assert_eq!(h.iomem(qd as usize * 4096), 0, "{}", h.msg());
    // SAFETY: `h.job` is live until `h` drops, and this thread alone uses it.
    let blocks = unsafe { kfio_job_size(h.job) } / 4096;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut offset = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % blocks) * 4096
    };
    for i in 0..qd {
        let r = h.queue(OP_READ, offset(), 4096, i as usize * 4096, i);
        assert_eq!(r, QUEUED, "{}", h.msg());
    }
    h.commit();
    // The first `warmup` seconds are not counted, as kestrel perf's warmup and fio's
    // ramp_time.
    let mut start = Instant::now();
    let (mut n, mut elapsed, mut warming) = (0u64, 0.0, warmup > 0.0);
    while warming || elapsed < secs {
        if warming && start.elapsed().as_secs_f64() >= warmup {
            (start, n, warming) = (Instant::now(), 0, false);
        }
        let r = h.getevents(1, qd, -1);
        assert!(r > 0, "getevents returned {r} with {qd} I/Os outstanding");
        for i in 0..r as u32 {
            let (index, err) = h.event(i);
            assert_eq!(err, 0, "{}", h.errdetails(index));
            let r = h.queue(OP_READ, offset(), 4096, index as usize * 4096, index);
            assert_eq!(r, QUEUED, "{}", h.msg());
        }
        h.commit();
        n += r as u64;
        elapsed = start.elapsed().as_secs_f64();
    }
    println!("engine loop: qd {qd}, IOPS {:.0}", n as f64 / elapsed);
}
