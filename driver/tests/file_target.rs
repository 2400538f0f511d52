//! The file target against real files: on the machine's disk with direct I/O, on tmpfs
//! with the buffered fallback, and on a loop device when one can be set up.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::hw::dma::{DmaPoolOptions, IdentityMapper, PageKind};
use kestrel::io::{InvalidRequest, IoError, IoOp, IoRequest, SubmitError};
use kestrel::target::file::{Direct, FileError, FileKind, FileOptions, FileTarget};
use kestrel::{Completion, DmaBuf, DmaPool, QueueOptions, Target, TargetQueue};

/// A directory on the machine's disk (not tmpfs), for direct I/O.
fn disk_dir() -> tempfile::TempDir {
    let candidates = [
        std::env::var("KESTREL_TEST_DIR").ok().map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
        Some(PathBuf::from("/var/tmp")),
    ];
    for dir in candidates.into_iter().flatten() {
        if std::fs::create_dir_all(&dir).is_err() || on_tmpfs(&dir) {
            continue;
        }
        if let Ok(t) = tempfile::Builder::new()
            .prefix("kestrel-file-")
            .tempdir_in(&dir)
        {
            return t;
        }
    }
    panic!("no directory on a disk filesystem for the test files; set KESTREL_TEST_DIR");
}

fn on_tmpfs(dir: &Path) -> bool {
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .expect("run stat");
    String::from_utf8_lossy(&out.stdout).trim() == "tmpfs"
}

fn opts(size: u64) -> FileOptions {
    FileOptions {
        size: Some(size),
        ..FileOptions::default()
    }
}

fn qopts(depth: u32, sw: u32) -> QueueOptions {
    QueueOptions {
        depth,
        sw_queue_depth: sw,
        ..QueueOptions::default()
    }
}

/// The byte expected at file offset `off` for a pattern `seed`.
fn pat(seed: u64, off: u64) -> u8 {
    let x = (off ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8
}

fn fill(buf: &mut DmaBuf, buf_off: usize, seed: u64, file_off: u64, len: usize) {
    let data: Vec<u8> = (0..len as u64).map(|i| pat(seed, file_off + i)).collect();
    buf.write_at(buf_off, &data).unwrap();
}

fn check(buf: &DmaBuf, buf_off: usize, seed: u64, file_off: u64, len: usize, what: &str) {
    let mut got = vec![0u8; len];
    buf.read_at(buf_off, &mut got).unwrap();
    for (i, &b) in got.iter().enumerate() {
        let want = pat(seed, file_off + i as u64);
        assert_eq!(
            b,
            want,
            "{what}: byte {i} (file offset {}) is {b:#x}, want {want:#x}",
            file_off + i as u64
        );
    }
}

fn check_zero(buf: &DmaBuf, off: usize, len: usize, what: &str) {
    let mut got = vec![0xFFu8; len];
    buf.read_at(off, &mut got).unwrap();
    if let Some(i) = got.iter().position(|&b| b != 0) {
        panic!("{what}: byte {} is {:#x}, want 0", off + i, got[i]);
    }
}

/// Polls until `n` completions have come (bounded wait), returning them.
fn reap(q: &mut dyn TargetQueue, n: usize) -> Vec<Completion> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(30);
    q.flush();
    while out.len() < n {
        q.poll(64, &mut |c| out.push(c));
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions within 30 s",
            out.len()
        );
    }
    out
}

/// Runs one request to completion.
fn run1(q: &mut dyn TargetQueue, req: IoRequest) -> Result<(), IoError> {
    q.submit(req).expect("submit");
    let c = reap(q, 1);
    assert_eq!(c[0].token, req.token);
    c[0].result
}

fn ns(t: &FileTarget) -> u32 {
    t.info().nsid
}

#[test]
fn integrity_across_sizes_and_offsets_with_direct_io() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("disk.img"), &opts(16 << 20)).unwrap();
    assert!(
        t.is_direct(),
        "a file on {} should get direct i/o",
        dir.path().display()
    );
    assert_eq!(t.kind(), FileKind::Regular);
    let info = t.info().clone();
    let bs = info.block_size as u64;
    assert!(bs.is_power_of_two() && bs >= 512);
    assert_eq!(info.num_blocks, (16 << 20) / bs);
    let mut q = t.create_queue(&qopts(32, 64)).unwrap();
    let last = info.num_blocks;
    // (lba, nlb) pairs: edges, odd offsets, large and small.
    let cases: Vec<(u64, u32)> = vec![
        (0, 1),
        (1, 1),
        (7, 3),
        (100, 8),
        (1000, 256),
        (4097, 17),
        (last - 1, 1),
        (last - 64, 64),
        (last / 2, 1024),
    ];
    let pool = t.dma_pool().clone();
    let mut bufs = Vec::new();
    for (i, &(lba, nlb)) in cases.iter().enumerate() {
        let len = nlb as usize * bs as usize;
        let mut b = pool.alloc(len).unwrap();
        fill(&mut b, 0, 1, lba * bs, len);
        q.submit(IoRequest::write_buf(ns(&t), lba, nlb, &b, i as u64))
            .unwrap();
        bufs.push(b);
    }
    for c in reap(&mut *q, cases.len()) {
        c.result
            .unwrap_or_else(|e| panic!("write {}: {e}", c.token));
    }
    // Read back into fresh buffers, all at once.
    let mut rbufs = Vec::new();
    for (i, &(lba, nlb)) in cases.iter().enumerate() {
        let b = pool.alloc(nlb as usize * bs as usize).unwrap();
        q.submit(IoRequest::read_buf(ns(&t), lba, nlb, &b, 100 + i as u64))
            .unwrap();
        rbufs.push(b);
    }
    let mut seen = reap(&mut *q, cases.len())
        .into_iter()
        .map(|c| {
            c.result.unwrap();
            c.token
        })
        .collect::<Vec<_>>();
    seen.sort();
    assert_eq!(seen, (100..100 + cases.len() as u64).collect::<Vec<_>>());
    for (i, &(lba, nlb)) in cases.iter().enumerate() {
        check(
            &rbufs[i],
            0,
            1,
            lba * bs,
            nlb as usize * bs as usize,
            "read back",
        );
    }
    // A block never written reads as zeroes (sparse file).
    let z = pool.alloc(bs as usize).unwrap();
    run1(&mut *q, IoRequest::read_buf(ns(&t), 50, 1, &z, 999)).unwrap();
    check_zero(&z, 0, bs as usize, "unwritten block");
    let st = q.stats();
    assert_eq!(st.submitted, 2 * cases.len() as u64 + 1);
    assert_eq!(st.completed, st.submitted);
}

#[test]
fn vectored_reads_and_writes() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("vec.img"), &opts(4 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    // Three segments of 1, 3 and 4 blocks, from different buffers.
    let lens = [bs, 3 * bs, 4 * bs];
    let lba = 33u64;
    let mut segs_bufs: Vec<DmaBuf> = lens.iter().map(|&l| pool.alloc(l).unwrap()).collect();
    let mut off = lba * bs as u64;
    for (b, &l) in segs_bufs.iter_mut().zip(&lens) {
        fill(b, 0, 7, off, l);
        off += l as u64;
    }
    let segs: Vec<_> = segs_bufs.iter().map(|b| b.slice_all()).collect();
    let w = IoRequest::vectored(IoOp::Write, 1, lba, 8, &segs, 1).unwrap();
    run1(&mut *q, w).unwrap();
    // Read as one buffer.
    let one = pool.alloc(8 * bs).unwrap();
    run1(&mut *q, IoRequest::read_buf(1, lba, 8, &one, 2)).unwrap();
    check(
        &one,
        0,
        7,
        lba * bs as u64,
        8 * bs,
        "vectored write, plain read",
    );
    // Read vectored into sub-slices of one buffer in another split (5 + 3 blocks), with
    // a last segment longer than the transfer needs.
    let big = pool.alloc(16 * bs).unwrap();
    let s1 = big.slice(0, 5 * bs).unwrap();
    let s2 = big.slice(8 * bs, 8 * bs).unwrap();
    let r = IoRequest::vectored(IoOp::Read, 1, lba, 8, &[s1, s2], 3).unwrap();
    run1(&mut *q, r).unwrap();
    check(
        &big,
        0,
        7,
        lba * bs as u64,
        5 * bs,
        "vectored read, first segment",
    );
    check(
        &big,
        8 * bs,
        7,
        (lba + 5) * bs as u64,
        3 * bs,
        "vectored read, second segment",
    );
    check_zero(&big, 11 * bs, 5 * bs, "untouched tail of the last segment");
}

#[test]
fn write_zeroes_and_deallocate_read_back_zeroes() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("zero.img"), &opts(4 << 20)).unwrap();
    zeroes_and_discard(&t);
    let mut fq = t.create_file_queue(&QueueOptions::default()).unwrap();
    run1(&mut fq, IoRequest::write_zeroes(1, 0, 4, 9)).unwrap();
    assert_eq!(
        fq.counters().zero_write_fallbacks,
        0,
        "ext4 zeroes ranges itself"
    );
}

fn zeroes_and_discard(t: &FileTarget) {
    let info = t.info().clone();
    assert!(info.write_zeroes && info.deallocate);
    assert!(info.deallocate_reads_zeroes);
    let bs = info.block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let nlb = 256u32;
    let mut b = pool.alloc(nlb as usize * bs).unwrap();
    fill(&mut b, 0, 3, 0, nlb as usize * bs);
    run1(&mut *q, IoRequest::write_buf(1, 0, nlb, &b, 1)).unwrap();
    // Zero blocks 10..30, deallocate 100..164 (aligned to 4 KiB and not).
    run1(&mut *q, IoRequest::write_zeroes(1, 10, 20, 2)).unwrap();
    run1(&mut *q, IoRequest::deallocate(1, 100, 64, 3)).unwrap();
    run1(&mut *q, IoRequest::deallocate(1, 201, 3, 4)).unwrap();
    let r = pool.alloc(nlb as usize * bs).unwrap();
    run1(&mut *q, IoRequest::read_buf(1, 0, nlb, &r, 5)).unwrap();
    let zeroed = |blk: usize| {
        (10..30).contains(&blk) || (100..164).contains(&blk) || (201..204).contains(&blk)
    };
    for blk in 0..nlb as usize {
        if zeroed(blk) {
            check_zero(&r, blk * bs, bs, &format!("block {blk}"));
        } else {
            check(
                &r,
                blk * bs,
                3,
                (blk * bs) as u64,
                bs,
                &format!("block {blk}"),
            );
        }
    }
}

#[test]
fn flush_makes_one_enter_per_batch_and_poll_reaps_without_syscalls() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("batch.img"), &opts(4 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_file_queue(&qopts(32, 0)).unwrap();
    let mut b = pool.alloc(16 * bs).unwrap();
    fill(&mut b, 0, 9, 0, 16 * bs);
    for i in 0..16u32 {
        let s = b.slice(i as usize * bs, bs).unwrap();
        q.submit(IoRequest::write(1, i as u64, 1, s, i as u64))
            .unwrap();
    }
    q.submit(IoRequest::flush(1, 16)).unwrap();
    assert_eq!(
        q.stats().sq_doorbell_writes,
        0,
        "submit must not enter the kernel"
    );
    assert_eq!(q.outstanding(), 17);
    q.flush();
    assert_eq!(
        q.stats().sq_doorbell_writes,
        1,
        "one io_uring_enter for the batch"
    );
    q.flush();
    assert_eq!(
        q.stats().sq_doorbell_writes,
        1,
        "an empty flush makes no syscall"
    );
    // Sleep until all 17 have completed (one more enter, or a few if the kernel returns
    // early: a wait with all 17 already in the CQ ring enters nothing), then reap:
    // completions are in the CQ ring, so polling takes them without entering the kernel.
    for _ in 0..1000 {
        q.wait(17);
    }
    let entered = q.stats().sq_doorbell_writes;
    assert!(entered >= 2, "{entered}");
    let mut seen = Vec::new();
    let n = q.poll(8, &mut |c| {
        c.result.unwrap();
        seen.push(c.token)
    });
    assert_eq!(n, 8, "poll delivers at most max");
    let n = q.poll(64, &mut |c| {
        c.result.unwrap();
        seen.push(c.token)
    });
    assert_eq!(n, 9);
    assert_eq!(
        q.stats().sq_doorbell_writes,
        entered,
        "reaping took completions from the ring without io_uring_enter"
    );
    seen.sort();
    assert_eq!(seen, (0..17).collect::<Vec<_>>());
    assert_eq!(q.outstanding(), 0);
    assert_eq!(q.stats().commands, 17);
    // An idle poll with nothing in flight makes no syscall either.
    assert_eq!(q.poll(8, &mut |_| panic!("nothing is outstanding")), 0);
    assert_eq!(q.stats().sq_doorbell_writes, entered);
}

#[test]
fn a_queue_belongs_to_the_thread_that_first_uses_it() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("thread.img"), &opts(1 << 20)).unwrap();
    // Created here, used (and dropped) on another thread.
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let b = t.dma_pool().alloc(t.info().block_size as usize).unwrap();
    let h = std::thread::spawn(move || {
        run1(&mut *q, IoRequest::write_buf(1, 0, 1, &b, 1)).unwrap();
        run1(&mut *q, IoRequest::read_buf(1, 0, 1, &b, 2)).unwrap();
        run1(&mut *q, IoRequest::flush(1, 3)).unwrap();
    });
    h.join().unwrap();
}

#[test]
fn overflow_beyond_ring_depth_completes_each_once_then_busy() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("ovf.img"), &opts(4 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let depth = 8u32;
    let mut q = t.create_queue(&qopts(depth, 3 * depth)).unwrap();
    let total = 4 * depth;
    let mut b = pool.alloc(total as usize * bs).unwrap();
    fill(&mut b, 0, 11, 0, total as usize * bs);
    for i in 0..total {
        let s = b.slice(i as usize * bs, bs).unwrap();
        q.submit(IoRequest::write(1, i as u64, 1, s, i as u64))
            .unwrap_or_else(|e| panic!("request {i} of {total}: {e}"));
    }
    assert_eq!(q.outstanding(), total);
    let extra = IoRequest::flush(1, 1234);
    match q.submit(extra) {
        Err(SubmitError::Busy(busy)) => {
            assert_eq!(busy.request, extra, "the request comes back untouched");
            assert_eq!(busy.in_flight, depth);
            assert_eq!(busy.queued, 3 * depth);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    let mut count = vec![0u32; total as usize];
    for c in reap(&mut *q, total as usize) {
        c.result.unwrap();
        count[c.token as usize] += 1;
    }
    assert!(
        count.iter().all(|&n| n == 1),
        "each completes exactly once: {count:?}"
    );
    // Nothing more comes.
    let mut more = 0;
    for _ in 0..100 {
        q.poll(64, &mut |_| more += 1);
    }
    assert_eq!(more, 0);
    assert_eq!(q.stats().sw_queued, 3 * depth as u64);
    let r = pool.alloc(total as usize * bs).unwrap();
    run1(&mut *q, IoRequest::read_buf(1, 0, total, &r, 77)).unwrap();
    check(&r, 0, 11, 0, total as usize * bs, "overflowed writes");
}

#[test]
fn cancel_of_a_queued_request() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("cancel.img"), &opts(1 << 20)).unwrap();
    let mut q = t.create_queue(&qopts(1, 4)).unwrap();
    q.submit(IoRequest::flush(1, 1)).unwrap();
    q.submit(IoRequest::flush(1, 2)).unwrap();
    q.submit(IoRequest::flush(1, 3)).unwrap();
    assert!(q.cancel_queued(2));
    assert!(!q.cancel_queued(2));
    assert!(
        !q.cancel_queued(1),
        "a request in the ring is not cancellable here"
    );
    let mut got: Vec<_> = reap(&mut *q, 3)
        .into_iter()
        .map(|c| (c.token, c.result))
        .collect();
    got.sort_by_key(|x| x.0);
    assert_eq!(
        got,
        vec![(1, Ok(())), (2, Err(IoError::Cancelled)), (3, Ok(()))]
    );
}

fn invalid(q: &mut dyn TargetQueue, req: IoRequest) -> InvalidRequest {
    match q.submit(req) {
        Err(SubmitError::Invalid { token, reason }) => {
            assert_eq!(token, req.token);
            reason
        }
        other => panic!("expected an invalid-request error, got {other:?}"),
    }
}

#[test]
fn bad_input_is_rejected_before_submission() {
    let dir = disk_dir();
    let path = dir.path().join("bad.img");
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    assert!(t.is_direct());
    let bs = t.info().block_size as usize;
    let cap = t.info().num_blocks;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let b = pool.alloc(4 * bs + 4096).unwrap();

    // Buffer not aligned under direct I/O.
    let s = b.slice(8, bs).unwrap();
    assert!(matches!(
        invalid(&mut *q, IoRequest::read(1, 0, 1, s, 1)),
        InvalidRequest::Misaligned { index: 0, .. }
    ));
    // A segment that does not hold whole blocks.
    let s1 = b.slice(0, bs / 2).unwrap();
    let s2 = b.slice(bs, bs + bs / 2).unwrap();
    let v = IoRequest::vectored(IoOp::Write, 1, 0, 2, &[s1, s2], 2).unwrap();
    assert!(matches!(
        invalid(&mut *q, v),
        InvalidRequest::Misaligned { index: 0, .. }
    ));
    // Past the end, and wrapping.
    let s = b.slice(0, 2 * bs).unwrap();
    assert!(matches!(
        invalid(&mut *q, IoRequest::read(1, cap - 1, 2, s, 3)),
        InvalidRequest::OutOfRange { lba, nlb: 2, capacity, .. } if lba == cap - 1 && capacity == cap
    ));
    assert!(matches!(
        invalid(&mut *q, IoRequest::write_zeroes(1, u64::MAX, 2, 4)),
        InvalidRequest::OutOfRange { .. }
    ));
    // Zero blocks.
    assert!(matches!(
        invalid(&mut *q, IoRequest::read(1, 0, 0, s, 5)),
        InvalidRequest::ZeroBlocks { .. }
    ));
    assert!(matches!(
        invalid(&mut *q, IoRequest::deallocate(1, 0, 0, 6)),
        InvalidRequest::ZeroBlocks { .. }
    ));
    // Buffers shorter than the transfer.
    let short = b.slice(0, bs).unwrap();
    match invalid(&mut *q, IoRequest::write(1, 0, 2, short, 7)) {
        InvalidRequest::LengthMismatch { need, have, .. } => {
            assert_eq!((need, have), (2 * bs as u64, bs as u64))
        }
        other => panic!("{other:?}"),
    }
    // Memory that is not the target's pool.
    let other_pool = DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default());
    let foreign = other_pool.alloc(bs).unwrap();
    assert!(matches!(
        invalid(&mut *q, IoRequest::read_buf(1, 0, 1, &foreign, 8)),
        InvalidRequest::BadSegments { .. }
    ));
    // Data on an operation that takes none; none on one that needs it.
    let mut f = IoRequest::flush(1, 9);
    f.data = kestrel::io::Segments::one(short);
    assert!(matches!(
        invalid(&mut *q, f),
        InvalidRequest::BadSegments { n: 1, .. }
    ));
    let mut r = IoRequest::read(1, 0, 1, short, 10);
    r.data = kestrel::io::Segments::none();
    assert!(matches!(
        invalid(&mut *q, r),
        InvalidRequest::BadSegments { n: 0, .. }
    ));
    assert_eq!(q.outstanding(), 0);
    assert_eq!(q.stats().submitted, 0);
    drop(q);
    drop(t);

    // Writes to a read-only target.
    let ro = FileTarget::open(
        &path,
        &FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    assert!(ro.info().read_only);
    let mut q = ro.create_queue(&QueueOptions::default()).unwrap();
    let b = ro.dma_pool().alloc(bs).unwrap();
    for req in [
        IoRequest::write_buf(1, 0, 1, &b, 11),
        IoRequest::write_zeroes(1, 0, 1, 12),
        IoRequest::deallocate(1, 0, 1, 13),
    ] {
        assert_eq!(invalid(&mut *q, req), InvalidRequest::ReadOnly);
    }
    run1(&mut *q, IoRequest::read_buf(1, 0, 1, &b, 14)).unwrap();
}

#[test]
fn buffered_io_is_accepted_unaligned() {
    let dir = disk_dir();
    let t = FileTarget::open(
        dir.path().join("buffered.img"),
        &FileOptions {
            direct: Direct::Off,
            size: Some(1 << 20),
            ..FileOptions::default()
        },
    )
    .unwrap();
    assert!(!t.is_direct());
    assert_eq!(t.info().block_size, 4096);
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let mut b = pool.alloc(3 * 4096).unwrap();
    fill(&mut b, 100, 5, 4096, 4096);
    let s = b.slice(100, 4096).unwrap();
    run1(&mut *q, IoRequest::write(1, 1, 1, s, 1)).unwrap();
    // Read back vectored, split at an odd byte.
    let r = pool.alloc(2 * 4096).unwrap();
    let a = r.slice(1, 1000).unwrap();
    let c = r.slice(2000, 3096).unwrap();
    run1(
        &mut *q,
        IoRequest::vectored(IoOp::Read, 1, 1, 1, &[a, c], 2).unwrap(),
    )
    .unwrap();
    check(&r, 1, 5, 4096, 1000, "first piece");
    check(&r, 2000, 5, 4096 + 1000, 3096, "second piece");
}

#[test]
fn tmpfs_falls_back_to_buffered_io_or_refuses_when_direct_is_required() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() || !on_tmpfs(shm) {
        eprintln!("skipped: /dev/shm is not a tmpfs here");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("kestrel-file-")
        .tempdir_in(shm)
        .unwrap();
    let path = dir.path().join("shm.img");
    let err = FileTarget::open(
        &path,
        &FileOptions {
            direct: Direct::Required,
            ..opts(1 << 20)
        },
    )
    .unwrap_err();
    assert!(matches!(err, FileError::DirectRefused { .. }), "{err}");
    assert!(err.to_string().contains("shm.img"), "{err}");
    let t = FileTarget::open(&path, &opts(2 << 20)).unwrap();
    assert!(!t.is_direct());
    assert_eq!(t.info().block_size, 4096);
    // The same checks as on disk; write zeroes takes the fallback of writing zeroes
    // where tmpfs refuses ZERO_RANGE.
    zeroes_and_discard(&t);
    let mut fq = t.create_file_queue(&QueueOptions::default()).unwrap();
    run1(&mut fq, IoRequest::write_zeroes(1, 0, 4, 9)).unwrap();
    assert_eq!(
        fq.counters().zero_write_fallbacks,
        1,
        "tmpfs refuses ZERO_RANGE"
    );
    drop(fq);
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let mut b = pool.alloc(64 * 4096).unwrap();
    fill(&mut b, 0, 21, 300 * 4096, 64 * 4096);
    run1(&mut *q, IoRequest::write_buf(1, 300, 64, &b, 1)).unwrap();
    run1(&mut *q, IoRequest::flush(1, 2)).unwrap();
    let r = pool.alloc(64 * 4096).unwrap();
    run1(&mut *q, IoRequest::read_buf(1, 300, 64, &r, 3)).unwrap();
    check(&r, 0, 21, 300 * 4096, 64 * 4096, "tmpfs read back");
}

#[test]
fn read_past_the_end_of_a_shorter_file_returns_zeroes() {
    let dir = disk_dir();
    let path = dir.path().join("short.img");
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let n = (256 << 10) / bs;
    let mut b = pool.alloc(n * bs).unwrap();
    fill(&mut b, 0, 13, 0, n * bs);
    run1(&mut *q, IoRequest::write_buf(1, 0, n as u32, &b, 1)).unwrap();
    // Someone shrinks the file under the target, to a length that is not a block
    // multiple: a read across the new end transfers short, the rest reads as zeroes.
    let cut = 64 * 1024 + 100;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut as u64)
        .unwrap();
    let mut r = pool.alloc(n * bs).unwrap();
    r.fill(0xEE);
    run1(&mut *q, IoRequest::read_buf(1, 0, n as u32, &r, 2)).unwrap();
    check(&r, 0, 13, 0, cut, "data before the end");
    check_zero(&r, cut, n * bs - cut, "past the end");
    // Wholly past the end.
    let mut r2 = pool.alloc(bs).unwrap();
    r2.fill(0xEE);
    run1(
        &mut *q,
        IoRequest::read_buf(1, (512 << 10) / bs as u64, 1, &r2, 3),
    )
    .unwrap();
    check_zero(&r2, 0, bs, "wholly past the end");
}

#[test]
fn dropping_a_queue_with_io_in_flight_waits_for_it() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("drop.img"), &opts(8 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let bufs: Vec<_> = (0..64).map(|_| pool.alloc(64 << 10).unwrap()).collect();
    for round in 0..4 {
        let mut q = t.create_queue(&qopts(32, 64)).unwrap();
        for (i, b) in bufs.iter().enumerate() {
            let nlb = ((64 << 10) / bs) as u32;
            let req = if round % 2 == 0 {
                IoRequest::write_buf(1, i as u64 * nlb as u64, nlb, b, i as u64)
            } else {
                IoRequest::read_buf(1, i as u64 * nlb as u64, nlb, b, i as u64)
            };
            q.submit(req).unwrap();
        }
        q.flush();
        assert!(q.outstanding() > 0);
        drop(q);
    }
    // The target and its pool are fine afterwards.
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    run1(&mut *q, IoRequest::read_buf(1, 0, 1, &bufs[0], 1)).unwrap();
}

#[test]
fn sqpoll_ring_moves_data() {
    let dir = disk_dir();
    let t = match FileTarget::open(
        dir.path().join("sqpoll.img"),
        &FileOptions {
            sqpoll: true,
            ..opts(4 << 20)
        },
    ) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    let mut q = match t.create_queue(&qopts(16, 16)) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("skipped: this kernel refuses an SQPOLL ring: {e}");
            return;
        }
    };
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut b = pool.alloc(32 * bs).unwrap();
    fill(&mut b, 0, 17, 0, 32 * bs);
    for i in 0..32u64 {
        let s = b.slice(i as usize * bs, bs).unwrap();
        q.submit(IoRequest::write(1, i * 3, 1, s, i)).unwrap();
    }
    for c in reap(&mut *q, 32) {
        c.result.unwrap();
    }
    let r = pool.alloc(bs).unwrap();
    for i in 0..32u64 {
        run1(&mut *q, IoRequest::read_buf(1, i * 3, 1, &r, 100 + i)).unwrap();
        check(&r, 0, 17, i * bs as u64, bs, "sqpoll read back");
    }
}

#[test]
fn pool_regions_created_after_the_queue_are_used() {
    let dir = disk_dir();
    let pool = DmaPool::new(
        Arc::new(IdentityMapper),
        DmaPoolOptions {
            page_kind: PageKind::Small,
            region_len: 64 << 10,
            max_bytes: 16 << 20,
        },
    );
    let t = FileTarget::open(
        dir.path().join("regions.img"),
        &FileOptions {
            pool: Some(pool.clone()),
            ..opts(4 << 20)
        },
    )
    .unwrap();
    let bs = t.info().block_size as usize;
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let before = pool.regions().len();
    // Each 64 KiB buffer takes a region of its own.
    let mut bufs: Vec<DmaBuf> = (0..8).map(|_| pool.alloc(64 << 10).unwrap()).collect();
    assert!(pool.regions().len() >= before + 7);
    let nlb = ((64 << 10) / bs) as u32;
    for (i, b) in bufs.iter_mut().enumerate() {
        fill(b, 0, 23, (i * (64 << 10)) as u64, 64 << 10);
    }
    for (i, b) in bufs.iter().enumerate() {
        q.submit(IoRequest::write_buf(
            1,
            i as u64 * nlb as u64,
            nlb,
            b,
            i as u64,
        ))
        .unwrap();
    }
    for c in reap(&mut *q, 8) {
        c.result.unwrap();
    }
    let r = pool.alloc(8 << 16).unwrap();
    run1(&mut *q, IoRequest::read_buf(1, 0, 8 * nlb, &r, 9)).unwrap();
    check(&r, 0, 23, 0, 8 << 16, "read back across regions");
}

#[test]
fn open_errors_name_the_path_and_the_remedy() {
    let dir = disk_dir();
    let missing = dir.path().join("nope.img");
    let e = FileTarget::open(&missing, &FileOptions::default()).unwrap_err();
    assert!(matches!(e, FileError::Missing { .. }), "{e}");
    assert!(
        e.to_string().contains("nope.img") && e.to_string().contains("size"),
        "{e}"
    );
    // With a size it is created, sparse.
    let t = FileTarget::open(&missing, &opts(64 << 20)).unwrap();
    assert_eq!(std::fs::metadata(&missing).unwrap().len(), 64 << 20);
    drop(t);
    // An existing shorter file is extended; a longer one is not truncated.
    let t = FileTarget::open(&missing, &opts(1 << 20)).unwrap();
    assert_eq!(t.info().num_blocks * t.info().block_size as u64, 1 << 20);
    assert_eq!(std::fs::metadata(&missing).unwrap().len(), 64 << 20);
    drop(t);

    let e = FileTarget::open(dir.path(), &FileOptions::default()).unwrap_err();
    assert!(matches!(e, FileError::IsDirectory { .. }), "{e}");

    let e = FileTarget::open("/dev/null", &FileOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::NotFileOrBlockDevice {
                kind: "character device",
                ..
            }
        ),
        "{e}"
    );
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let e = FileTarget::open(&fifo, &FileOptions::default()).unwrap_err();
    assert!(
        matches!(e, FileError::NotFileOrBlockDevice { kind: "fifo", .. }),
        "{e}"
    );

    let tiny = dir.path().join("tiny.img");
    let e = FileTarget::open(&tiny, &opts(100)).unwrap_err();
    assert!(matches!(e, FileError::TooSmall { size: 100, .. }), "{e}");
    std::fs::write(&tiny, [0u8; 100]).unwrap();
    let e = FileTarget::open(&tiny, &FileOptions::default()).unwrap_err();
    assert!(matches!(e, FileError::TooSmall { size: 100, .. }), "{e}");
    let e = FileTarget::open(
        &tiny,
        &FileOptions {
            read_only: true,
            ..opts(1 << 20)
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, FileError::ReadOnlyTooShort { len: 100, .. }),
        "{e}"
    );

    let e = FileTarget::open(
        &missing,
        &FileOptions {
            ring_entries: 0,
            ..FileOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            FileError::BadOption {
                option: "ring_entries",
                ..
            }
        ),
        "{e}"
    );
    let e = FileTarget::open(
        &missing,
        &FileOptions {
            block_size: Some(3000),
            ..FileOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            FileError::BadBlockSize {
                block_size: 3000,
                ..
            }
        ),
        "{e}"
    );
    let t = FileTarget::open(
        &missing,
        &FileOptions {
            block_size: Some(4096),
            ..FileOptions::default()
        },
    )
    .unwrap();
    assert_eq!(t.info().block_size, 4096);
    assert_eq!(t.info().num_blocks, (64 << 20) / 4096);
    drop(t);

    let e = FileTarget::open(
        &missing,
        &FileOptions {
            iopoll: true,
            direct: Direct::Off,
            ..FileOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, FileError::IopollUnsupported { .. }), "{e}");
}

#[test]
fn permission_denied_on_an_immutable_file() {
    let dir = disk_dir();
    let path = dir.path().join("immutable.img");
    std::fs::write(&path, vec![0u8; 1 << 16]).unwrap();
    let ok = Command::new("chattr")
        .arg("+i")
        .arg(&path)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: cannot make a file immutable here (chattr +i failed)");
        return;
    }
    let e = FileTarget::open(&path, &FileOptions::default()).unwrap_err();
    let _ = Command::new("chattr").arg("-i").arg(&path).status();
    assert!(
        matches!(
            e,
            FileError::PermissionDenied {
                access: "read-write",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("immutable.img"), "{e}");
    // Read-only works.
    let t = FileTarget::open(
        &path,
        &FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    );
    let _ = Command::new("chattr").arg("-i").arg(&path).status();
    t.unwrap();
}

// --- Crash consistency and short writes: child processes of this test binary. ---

const CHILD_ENV: &str = "KESTREL_FILE_TEST_CHILD";
const CHILD_PATH_ENV: &str = "KESTREL_FILE_TEST_PATH";

fn spawn_child(test: &str, role: &str, path: &Path) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // SAFETY: runs in the child between fork and exec, and only calls signal(2), which is
    // async-signal-safe. An ignored SIGXFSZ (this process opened writable targets) would
    // otherwise be inherited through exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
    cmd.args([
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, role)
    .env(CHILD_PATH_ENV, path)
    .output()
    .unwrap()
}

fn child_role() -> Option<(String, PathBuf)> {
    Some((
        std::env::var(CHILD_ENV).ok()?,
        PathBuf::from(std::env::var(CHILD_PATH_ENV).ok()?),
    ))
}

const CRASH_BLOCKS: u32 = 512;

#[test]
#[ignore = "helper: runs only as a child process of crash_consistency"]
fn crash_child() {
    let Some((role, path)) = child_role() else {
        return;
    };
    let t = FileTarget::open(&path, &FileOptions::default()).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    match role.as_str() {
        "write" => {
            let mut b = pool.alloc(CRASH_BLOCKS as usize * bs).unwrap();
            fill(&mut b, 0, 31, 0, CRASH_BLOCKS as usize * bs);
            // Many writes in flight, then a flush; once the flush completes, die without
            // any cleanup.
            for i in 0..CRASH_BLOCKS / 8 {
                let s = b.slice(i as usize * 8 * bs, 8 * bs).unwrap();
                q.submit(IoRequest::write(1, i as u64 * 8, 8, s, i as u64))
                    .unwrap();
            }
            for c in reap(&mut *q, (CRASH_BLOCKS / 8) as usize) {
                c.result.unwrap();
            }
            run1(&mut *q, IoRequest::flush(1, 9999)).unwrap();
            println!("flushed");
            std::process::abort();
        }
        "verify" => {
            let r = pool.alloc(CRASH_BLOCKS as usize * bs).unwrap();
            run1(&mut *q, IoRequest::read_buf(1, 0, CRASH_BLOCKS, &r, 1)).unwrap();
            check(
                &r,
                0,
                31,
                0,
                CRASH_BLOCKS as usize * bs,
                "fresh process read back",
            );
            println!("verified");
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn crash_consistency_flushed_data_is_read_by_a_fresh_process() {
    let dir = disk_dir();
    let path = dir.path().join("crash.img");
    drop(FileTarget::open(&path, &opts(4 << 20)).unwrap());
    let w = spawn_child("crash_child", "write", &path);
    let out = String::from_utf8_lossy(&w.stdout);
    assert!(
        out.contains("flushed"),
        "writer: {out}\n{}",
        String::from_utf8_lossy(&w.stderr)
    );
    assert!(
        !w.status.success(),
        "the writer dies without cleanup (abort)"
    );
    let v = spawn_child("crash_child", "verify", &path);
    assert!(
        v.status.success() && String::from_utf8_lossy(&v.stdout).contains("verified"),
        "verifier: {}\n{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
}

#[test]
#[ignore = "helper: runs only as a child process of short_write_is_completed_not_reported_as_success"]
fn short_write_child() {
    let Some((_, path)) = child_role() else {
        return;
    };
    assert!(
        !sigxfsz_ignored(),
        "a fresh child has the default SIGXFSZ action"
    );
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    assert!(
        sigxfsz_ignored(),
        "opening a writable target ignores SIGXFSZ"
    );
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let limit = 64 * 1024 + 3 * bs as u64;
    let lim = limit_file_size(limit);
    assert!(lim, "setrlimit");
    let mut b = pool.alloc(256 << 10).unwrap();
    fill(&mut b, 0, 41, 0, 256 << 10);
    let nlb = ((256 << 10) / bs) as u32;
    let r = run1(&mut *q, IoRequest::write_buf(1, 0, nlb, &b, 1));
    // The kernel writes up to the limit (a short write), the rest is resubmitted and
    // fails with EFBIG: the request fails rather than reporting success, with an error
    // naming the offset and the limit.
    assert_eq!(
        r,
        Err(IoError::FileTooLarge {
            offset: limit,
            rlimit: Some(limit)
        })
    );
    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains(&format!("byte offset {limit}"))
            && msg.contains(&format!("file size limit of {limit} bytes"))
            && msg.contains("ulimit -f"),
        "{msg}"
    );
    assert_eq!(r.unwrap_err().errno(), libc::EFBIG);
    assert_eq!(q.stats().retries, 1, "the short write was resubmitted once");
    println!("short write ok");
}

/// Lowers RLIMIT_FSIZE for this (child) process. SIGXFSZ is left as it is: opening a
/// writable target makes it ignored.
fn limit_file_size(limit: u64) -> bool {
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain syscall with a valid struct; this process is a single-test child.
    unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rl) == 0 }
}

/// Whether SIGXFSZ is ignored in this process.
fn sigxfsz_ignored() -> bool {
    // SAFETY: sigaction with a null new action only writes the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGXFSZ, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

#[test]
fn short_write_is_completed_not_reported_as_success() {
    let dir = disk_dir();
    let path = dir.path().join("fsize.img");
    // Create it small: the child's limit stops writes beyond 64 KiB + 3 blocks.
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    drop(t);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let out = spawn_child("short_write_child", "run", &path);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("short write ok"),
        "child: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "helper: runs only as a child process of the process-limit tests"]
fn limits_child() {
    let Some((role, path)) = child_role() else {
        return;
    };
    match role.as_str() {
        "fsize" => {
            // Extending a new file past RLIMIT_FSIZE at open.
            assert!(limit_file_size(1 << 20), "setrlimit");
            let e = FileTarget::open(&path, &opts(4 << 20)).unwrap_err();
            assert!(
                matches!(e, FileError::FileSizeLimit { size, .. } if size == 4 << 20),
                "{e:?}"
            );
            println!("@@ refused: {e}");
        }
        "nofile" => {
            // The lowest free descriptor becomes the limit: the next open is one too many.
            // SAFETY: plain descriptor syscalls in a single-test child process.
            let n = unsafe {
                let fd = libc::dup(0);
                assert!(fd >= 0);
                libc::close(fd);
                let mut rl = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl), 0);
                rl.rlim_cur = fd as libc::rlim_t;
                assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &rl), 0);
                fd
            };
            let e = FileTarget::open(&path, &opts(1 << 20)).unwrap_err();
            assert!(matches!(e, FileError::TooManyOpenFiles { .. }), "{e:?}");
            println!("@@ refused (limit {n}): {e}");
        }
        other => panic!("unknown role {other}"),
    }
}

/// The line a child printed after its `@@ ` marker (the test harness may have put its own
/// words before it on the same line).
fn child_line(stdout: &str) -> Option<String> {
    let (_, rest) = stdout.split_once("@@ ")?;
    Some(rest.lines().next().unwrap_or("").to_string())
}

fn child_refusal(role: &str, path: &Path) -> String {
    let out = spawn_child("limits_child", role, path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {role}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    child_line(&stdout)
        .filter(|l| l.starts_with("refused"))
        .unwrap_or_else(|| panic!("child {role} printed no refusal: {stdout}"))
}

#[test]
fn extending_past_the_file_size_limit_is_an_error_naming_the_limit() {
    let dir = disk_dir();
    let path = dir.path().join("fsize-open.img");
    let msg = child_refusal("fsize", &path);
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("extending the file to 4194304 bytes")
            && msg.contains("file size limit of 1048576 bytes")
            && msg.contains("RLIMIT_FSIZE")
            && msg.contains("ulimit -f"),
        "{msg}"
    );
}

#[test]
fn running_out_of_file_descriptors_names_the_limit() {
    let dir = disk_dir();
    let path = dir.path().join("nofile.img");
    let msg = child_refusal("nofile", &path);
    let n: u32 = msg["refused (limit ".len()..msg.find(')').unwrap()]
        .parse()
        .unwrap();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("too many open files")
            && msg.contains(&format!("RLIMIT_NOFILE, `ulimit -n`) is {n} "))
            && msg.contains("limits.conf"),
        "{msg}"
    );
}

// --- Exclusive access: OFD locks. ---

#[test]
#[ignore = "helper: runs only as a child process of the lock tests"]
fn lock_child() {
    let Some((role, path)) = child_role() else {
        return;
    };
    let o = FileOptions {
        read_only: role == "ro",
        ..FileOptions::default()
    };
    match FileTarget::open(&path, &o) {
        Ok(_) => println!("@@ opened"),
        Err(e) => println!("@@ refused: {e}"),
    }
}

/// What a child process opening `path` (`rw` or `ro`) printed: "opened" or the refusal.
fn child_open(role: &str, path: &Path) -> String {
    let out = spawn_child("lock_child", role, path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {role}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    child_line(&stdout).unwrap_or_else(|| panic!("child {role} printed nothing: {stdout}"))
}

#[test]
fn a_second_writer_in_another_process_is_refused_at_open_naming_the_holder() {
    let dir = disk_dir();
    let path = dir.path().join("locked.img");
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    // A queue that has done I/O: the ring holds the file too.
    let b = t.dma_pool().alloc(t.info().block_size as usize).unwrap();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    run1(&mut *q, IoRequest::write_buf(1, 0, 1, &b, 1)).unwrap();
    let me = std::process::id();
    for role in ["rw", "ro"] {
        let msg = child_open(role, &path);
        assert!(msg.starts_with("refused: "), "child {role}: {msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("pid {me} (")) && msg.contains("holds a write lock on it"),
            "the holder is named: {msg}"
        );
        if role == "rw" {
            assert!(
                msg.contains("a read-write target needs exclusive access")
                    && msg.contains("two writers would overwrite each other's data"),
                "{msg}"
            );
        } else {
            assert!(
                msg.contains("a read-only target needs shared access")
                    && msg.contains("a writer has it"),
                "{msg}"
            );
        }
    }
    // Once the writer has gone, the file is free again.
    drop(q);
    drop(t);
    assert_eq!(child_open("rw", &path), "opened");
}

#[test]
fn readers_in_two_processes_share_a_file_and_keep_writers_out() {
    let dir = disk_dir();
    let path = dir.path().join("shared.img");
    drop(FileTarget::open(&path, &opts(1 << 20)).unwrap());
    let ro = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let t = FileTarget::open(&path, &ro).unwrap();
    assert_eq!(child_open("ro", &path), "opened");
    let msg = child_open("rw", &path);
    assert!(
        msg.contains(&format!("pid {} (", std::process::id()))
            && msg.contains("holds a read lock on it")
            && msg.contains("needs exclusive access"),
        "{msg}"
    );
    drop(t);
}

#[test]
fn the_same_file_twice_in_one_process_is_refused() {
    let dir = disk_dir();
    let path = dir.path().join("twice.img");
    let me = std::process::id();
    let ro = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    let b = t.dma_pool().alloc(t.info().block_size as usize).unwrap();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    run1(&mut *q, IoRequest::write_buf(1, 0, 1, &b, 1)).unwrap();
    // Through the same path, another path to the same inode, writable or read-only.
    let link = dir.path().join("twice-link.img");
    std::fs::hard_link(&path, &link).unwrap();
    for (p, o) in [
        (&path, opts(1 << 20)),
        (&link, opts(1 << 20)),
        (&path, ro.clone()),
    ] {
        let e = FileTarget::open(p, &o).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, FileError::Locked { .. }), "{e:?}");
        assert!(
            msg.contains(&format!(
                "this process (pid {me}) already holds a write lock on it"
            )) && msg.contains("the same file is named twice"),
            "{msg}"
        );
    }
    // Dropping the target frees the file at once, though the ring that registered it may
    // be torn down by the kernel later.
    drop(q);
    drop(t);
    let t = FileTarget::open(&path, &ro).unwrap();
    // Two read-only targets on one file in one process: refused as well.
    let e = FileTarget::open(&link, &ro).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("already holds a read lock on it") && msg.contains("named twice"),
        "{msg}"
    );
    drop(t);
    drop(FileTarget::open(&link, &opts(1 << 20)).unwrap());
}

// --- Threads. ---

#[test]
fn an_idle_queue_moves_to_another_thread_and_keeps_working() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("move.img"), &opts(1 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let b = t.dma_pool().alloc(bs).unwrap();
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    // Single-issuer rings need Linux 6.1; older kernels give rings any thread may use.
    let single = q.is_single_issuer();
    run1(&mut q, IoRequest::write_buf(1, 0, 1, &b, 1)).unwrap();
    // Used here (this thread owns the ring), then on another thread, with one request
    // pushed here and never submitted: it goes with the queue.
    q.submit(IoRequest::write_buf(1, 2, 1, &b, 5)).unwrap();
    let (mut q, b) = std::thread::spawn(move || {
        let c = reap(&mut q, 1);
        assert_eq!((c[0].token, c[0].result), (5, Ok(())));
        run1(&mut q, IoRequest::write_buf(1, 1, 1, &b, 2)).unwrap();
        run1(&mut q, IoRequest::read_buf(1, 0, 1, &b, 3)).unwrap();
        (q, b)
    })
    .join()
    .unwrap();
    // A queue that moved once works from any thread: no second move back here.
    run1(&mut q, IoRequest::read_buf(1, 1, 1, &b, 4)).unwrap();
    assert_eq!(q.counters().thread_moves, u64::from(single));
    assert!(!q.is_single_issuer());
    let start = Instant::now();
    drop(q);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        start.elapsed()
    );
}

#[test]
fn another_thread_is_refused_at_once_while_the_owner_has_io_in_flight() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("inflight.img"), &opts(1 << 20)).unwrap();
    let b = t.dma_pool().alloc(t.info().block_size as usize).unwrap();
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    run1(&mut q, IoRequest::write_buf(1, 0, 1, &b, 1)).unwrap();
    q.submit(IoRequest::write_buf(1, 1, 1, &b, 2)).unwrap();
    q.flush();
    let (mut q, b, r, took) = std::thread::spawn(move || {
        let start = Instant::now();
        let r = q.submit(IoRequest::read_buf(1, 0, 1, &b, 3));
        (q, b, r, start.elapsed())
    })
    .join()
    .unwrap();
    if q.counters().thread_moves == 0 && !q.is_single_issuer() {
        // A ring usable from any thread (a kernel before 6.1): the submit was taken.
        eprintln!("skipped: this kernel's rings are not single-issuer");
        assert!(r.is_ok(), "{r:?}");
        return;
    }
    match r {
        Err(SubmitError::Invalid {
            token: 3,
            reason: InvalidRequest::WrongThread { in_flight: 1 },
        }) => {}
        other => panic!("expected a wrong-thread refusal, got {other:?}"),
    }
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("in use by another thread"), "{msg}");
    // Back on the owner the request in flight completes, and nothing was lost.
    let c = reap(&mut q, 1);
    assert_eq!((c[0].token, c[0].result), (2, Ok(())));
    assert_eq!(q.outstanding(), 0);
    // Idle now: the other thread may have it.
    let q = std::thread::spawn(move || {
        run1(&mut q, IoRequest::read_buf(1, 1, 1, &b, 4)).unwrap();
        q
    })
    .join()
    .unwrap();
    assert_eq!(q.counters().thread_moves, 1);
}

#[test]
fn dropping_on_a_thread_that_cannot_complete_the_io_is_fast() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("dropthread.img"), &opts(1 << 20)).unwrap();
    let b = t.dma_pool().alloc(64 << 10).unwrap();
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let nlb = (64 << 10) / t.info().block_size;
    run1(&mut q, IoRequest::write_buf(1, 0, nlb, &b, 1)).unwrap();
    q.submit(IoRequest::write_buf(1, 0, nlb, &b, 2)).unwrap();
    q.flush();
    let took = std::thread::spawn(move || {
        let start = Instant::now();
        drop(q);
        start.elapsed()
    })
    .join()
    .unwrap();
    // It cannot wait (only the owner completes the write), so it leaks the buffers at once
    // rather than hang; on a ring without a single issuer it waits for the write.
    assert!(took < Duration::from_secs(5), "drop took {took:?}");
}

#[test]
fn an_aio_context_used_on_one_thread_then_another() {
    use kestrel::{AioError, ContextOptions, Event, IoContext, Iocb};
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("aio-thread.img"), &opts(1 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let buf = t.dma_pool().alloc(2 * bs).unwrap();
    let target: Arc<dyn Target> = t;
    let mut opts_ctx = ContextOptions::new(8);
    opts_ctx.drain_timeout = Duration::from_millis(300);

    // Idle when moved: the request made on the other thread completes.
    let mut ctx = IoContext::setup_with(Arc::clone(&target), opts_ctx.clone()).unwrap();
    let mut evs = [Event::default(); 4];
    ctx.submit(&[Iocb::write(0, buf.slice(0, bs).unwrap(), 1)])
        .unwrap();
    assert_eq!(
        ctx.getevents(1, &mut evs, Some(Duration::from_secs(10)))
            .unwrap(),
        1
    );
    let s = buf.slice(bs, bs).unwrap();
    let (n, drop_took) = std::thread::spawn(move || {
        ctx.submit(&[Iocb::read(0, s, 2)]).unwrap();
        let n = ctx
            .getevents(1, &mut evs, Some(Duration::from_secs(10)))
            .unwrap();
        assert_eq!(evs[0].user_data, 2);
        assert_eq!(evs[0].res, Ok(bs as u64), "{:?}", evs[0]);
        let start = Instant::now();
        drop(ctx);
        (n, start.elapsed())
    })
    .join()
    .unwrap();
    assert_eq!(n, 1);
    assert!(
        drop_took < Duration::from_secs(1),
        "drop took {drop_took:?}"
    );

    // With a request in flight from the first thread: refused at once on the other,
    // getevents there fails at once instead of waiting (forever, with no timeout), and
    // dropping there does not wait for what it cannot complete.
    opts_ctx.drain_timeout = Duration::from_secs(20);
    let mut ctx = IoContext::setup_with(Arc::clone(&target), opts_ctx).unwrap();
    ctx.submit(&[Iocb::write(0, buf.slice(0, bs).unwrap(), 3)])
        .unwrap();
    let s = buf.slice(bs, bs).unwrap();
    let (r, took, g, drop_took) = std::thread::spawn(move || {
        let start = Instant::now();
        let r = ctx.submit(&[Iocb::read(0, s, 4)]);
        let took = start.elapsed();
        let mut evs = [Event::default(); 4];
        let g = ctx.getevents(1, &mut evs, None).map(|n| (n, evs[0]));
        let start = Instant::now();
        drop(ctx);
        (r, took, g, start.elapsed())
    })
    .join()
    .unwrap();
    match r {
        Err(
            ref e @ AioError::Rejected {
                user_data: 4,
                reason: InvalidRequest::WrongThread { in_flight: 1 },
                ..
            },
        ) => {
            // C callers see -EBUSY, not the -EINVAL of a malformed request.
            assert_eq!(e.errno(), libc::EBUSY);
            assert!(took < Duration::from_secs(1), "refused after {took:?}");
            match g {
                Err(ref e @ AioError::WrongThread { in_flight: 1 }) => {
                    assert_eq!(e.errno(), libc::EBUSY);
                    assert!(e.to_string().contains("thread that submitted"), "{e}");
                }
                // The kernel may complete the write inside the submitting enter (a direct
                // write whose bio ends before the submitter drops its reference, as when
                // it is preempted under load): its completion is then already in the CQ,
                // which any thread may read, so nothing is stranded and getevents returns
                // it. The write's own event, and nothing else, must come back.
                Ok((1, ev)) => {
                    assert_eq!(ev.user_data, 3, "{ev:?}");
                    assert_eq!(ev.res, Ok(bs as u64), "{ev:?}");
                }
                other => panic!("expected a refusal or the write's event, got {other:?}"),
            }
            // Not the 20 s drain timeout: nothing on this thread could complete them.
            assert!(
                drop_took < Duration::from_secs(10),
                "drop took {drop_took:?}"
            );
        }
        // A kernel without single-issuer rings: the ring is usable from any thread.
        Ok(1) => eprintln!("skipped: this kernel's rings are not single-issuer"),
        other => panic!("expected a wrong-thread refusal, got {other:?}"),
    }
}

// --- Block device through a loop device. ---

struct Loop {
    dev: PathBuf,
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

fn setup_loop(backing: &Path, direct: bool) -> Result<Loop, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(format!("--direct-io={}", if direct { "on" } else { "off" }))
        .arg(backing)
        .output()
        .map_err(|e| format!("cannot run losetup: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(Loop {
        dev: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
    })
}

#[test]
fn block_device_through_a_loop_device() {
    let dir = disk_dir();
    let backing = dir.path().join("loop-backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let lo = match setup_loop(&backing, true) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: no loop device ({why})");
            return;
        }
    };
    let t = FileTarget::open(&lo.dev, &FileOptions::default()).unwrap();
    assert_eq!(t.kind(), FileKind::BlockDevice);
    assert!(t.is_direct());
    let info = t.info().clone();
    let sysfs_lbs: u32 = std::fs::read_to_string(format!(
        "/sys/block/{}/queue/logical_block_size",
        lo.dev.file_name().unwrap().to_string_lossy()
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert_eq!(info.block_size, sysfs_lbs, "block size from BLKSSZGET");
    assert_eq!(info.num_blocks * info.block_size as u64, 8 << 20);
    let bs = info.block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let n = 128u32;
    let mut b = pool.alloc(n as usize * bs).unwrap();
    fill(&mut b, 0, 51, 0, n as usize * bs);
    run1(&mut *q, IoRequest::write_buf(1, 0, n, &b, 1)).unwrap();
    run1(&mut *q, IoRequest::flush(1, 2)).unwrap();
    run1(&mut *q, IoRequest::write_zeroes(1, 8, 8, 3)).unwrap();
    let discard = info.deallocate;
    if discard {
        assert!(info.deallocate_reads_zeroes, "loop discards punch holes");
        run1(&mut *q, IoRequest::deallocate(1, 64, 16, 4)).unwrap();
    } else {
        eprintln!("note: this loop device does not take discards");
    }
    let r = pool.alloc(n as usize * bs).unwrap();
    run1(&mut *q, IoRequest::read_buf(1, 0, n, &r, 5)).unwrap();
    for blk in 0..n as usize {
        if (8..16).contains(&blk) || (discard && (64..80).contains(&blk)) {
            check_zero(&r, blk * bs, bs, &format!("block {blk}"));
        } else {
            check(
                &r,
                blk * bs,
                51,
                (blk * bs) as u64,
                bs,
                &format!("block {blk}"),
            );
        }
    }
    // Out of range on the device, and no poll queues for IOPOLL.
    let s = b.slice(0, bs).unwrap();
    assert!(matches!(
        invalid(&mut *q, IoRequest::read(1, info.num_blocks, 1, s, 6)),
        InvalidRequest::OutOfRange { .. }
    ));
    drop(q);
    drop(t);
    let e = FileTarget::open(
        &lo.dev,
        &FileOptions {
            iopoll: true,
            ..FileOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, FileError::IopollUnsupported { .. }), "{e}");
    let e = FileTarget::open(&lo.dev, &opts(16 << 20)).unwrap_err();
    assert!(matches!(e, FileError::SizeBeyondDevice { .. }), "{e}");
}
