//! Data moved through the file target: direct I/O at many sizes and offsets, vectored
//! requests, write zeroes and deallocate, buffered I/O, tmpfs, short files, SQPOLL rings
//! and pool regions added after the queue.

use std::path::Path;
use std::sync::Arc;

use kestrel::hw::dma::{DmaPoolOptions, IdentityMapper, PageKind};
use kestrel::io::{IoOp, IoRequest};
use kestrel::target::file::{Direct, FileError, FileKind, FileOptions, FileTarget};
use kestrel::{DmaPool, DmaSlice, QueueOptions, Target};

use crate::common::{
    check, check_zero, disk_dir, fill, fill_byte, lend, ns, on_tmpfs, opts, qopts, reap, run1,
};

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
        let b = lend(&mut *q, &pool, len);
        fill(&mut *q, &b, 0, 1, lba * bs, len);
        q.submit(IoRequest::write(ns(&t), lba, nlb, b, i as u64))
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
        let b = lend(&mut *q, &pool, nlb as usize * bs as usize);
        q.submit(IoRequest::read(ns(&t), lba, nlb, b, 100 + i as u64))
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
            &*q,
            &rbufs[i],
            0,
            1,
            lba * bs,
            nlb as usize * bs as usize,
            "read back",
        );
    }
    // A block never written reads as zeroes (sparse file).
    let z = lend(&mut *q, &pool, bs as usize);
    run1(&mut *q, IoRequest::read(ns(&t), 50, 1, z, 999)).unwrap();
    check_zero(&*q, &z, 0, bs as usize, "unwritten block");
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
    let segs: Vec<DmaSlice> = lens.iter().map(|&l| lend(&mut *q, &pool, l)).collect();
    let mut off = lba * bs as u64;
    for (b, &l) in segs.iter().zip(&lens) {
        fill(&mut *q, b, 0, 7, off, l);
        off += l as u64;
    }
    let w = IoRequest::vectored(IoOp::Write, 1, lba, 8, &segs, 1).unwrap();
    run1(&mut *q, w).unwrap();
    // Read as one buffer.
    let one = lend(&mut *q, &pool, 8 * bs);
    run1(&mut *q, IoRequest::read(1, lba, 8, one, 2)).unwrap();
    check(
        &*q,
        &one,
        0,
        7,
        lba * bs as u64,
        8 * bs,
        "vectored write, plain read",
    );
    // Read vectored into sub-slices of one buffer in another split (5 + 3 blocks), with
    // a last segment longer than the transfer needs.
    let big = lend(&mut *q, &pool, 16 * bs);
    let s1 = big.slice(0, 5 * bs).unwrap();
    let s2 = big.slice(8 * bs, 8 * bs).unwrap();
    let r = IoRequest::vectored(IoOp::Read, 1, lba, 8, &[s1, s2], 3).unwrap();
    run1(&mut *q, r).unwrap();
    check(
        &*q,
        &big,
        0,
        7,
        lba * bs as u64,
        5 * bs,
        "vectored read, first segment",
    );
    check(
        &*q,
        &big,
        8 * bs,
        7,
        (lba + 5) * bs as u64,
        3 * bs,
        "vectored read, second segment",
    );
    check_zero(
        &*q,
        &big,
        11 * bs,
        5 * bs,
        "untouched tail of the last segment",
    );
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
    let b = lend(&mut *q, &pool, nlb as usize * bs);
    fill(&mut *q, &b, 0, 3, 0, nlb as usize * bs);
    run1(&mut *q, IoRequest::write(1, 0, nlb, b, 1)).unwrap();
    // Zero blocks 10..30, deallocate 100..164 (aligned to 4 KiB and not).
    run1(&mut *q, IoRequest::write_zeroes(1, 10, 20, 2)).unwrap();
    run1(&mut *q, IoRequest::deallocate(1, 100, 64, 3)).unwrap();
    run1(&mut *q, IoRequest::deallocate(1, 201, 3, 4)).unwrap();
    let r = lend(&mut *q, &pool, nlb as usize * bs);
    run1(&mut *q, IoRequest::read(1, 0, nlb, r, 5)).unwrap();
    let zeroed = |blk: usize| {
        (10..30).contains(&blk) || (100..164).contains(&blk) || (201..204).contains(&blk)
    };
    for blk in 0..nlb as usize {
        if zeroed(blk) {
            check_zero(&*q, &r, blk * bs, bs, &format!("block {blk}"));
        } else {
            check(
                &*q,
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
    let b = lend(&mut *q, &pool, 3 * 4096);
    fill(&mut *q, &b, 100, 5, 4096, 4096);
    let s = b.slice(100, 4096).unwrap();
    run1(&mut *q, IoRequest::write(1, 1, 1, s, 1)).unwrap();
    // Read back vectored, split at an odd byte.
    let r = lend(&mut *q, &pool, 2 * 4096);
    let a = r.slice(1, 1000).unwrap();
    let c = r.slice(2000, 3096).unwrap();
    run1(
        &mut *q,
        IoRequest::vectored(IoOp::Read, 1, 1, 1, &[a, c], 2).unwrap(),
    )
    .unwrap();
    check(&*q, &r, 1, 5, 4096, 1000, "first piece");
    check(&*q, &r, 2000, 5, 4096 + 1000, 3096, "second piece");
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
    let b = lend(&mut *q, &pool, 64 * 4096);
    fill(&mut *q, &b, 0, 21, 300 * 4096, 64 * 4096);
    run1(&mut *q, IoRequest::write(1, 300, 64, b, 1)).unwrap();
    run1(&mut *q, IoRequest::flush(1, 2)).unwrap();
    let r = lend(&mut *q, &pool, 64 * 4096);
    run1(&mut *q, IoRequest::read(1, 300, 64, r, 3)).unwrap();
    check(&*q, &r, 0, 21, 300 * 4096, 64 * 4096, "tmpfs read back");
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
    let b = lend(&mut *q, &pool, n * bs);
    fill(&mut *q, &b, 0, 13, 0, n * bs);
    run1(&mut *q, IoRequest::write(1, 0, n as u32, b, 1)).unwrap();
    // Someone shrinks the file under the target, to a length that is not a block
    // multiple: a read across the new end transfers short, the rest reads as zeroes.
    let cut = 64 * 1024 + 100;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut as u64)
        .unwrap();
    let r = lend(&mut *q, &pool, n * bs);
    fill_byte(&mut *q, &r, 0xEE);
    run1(&mut *q, IoRequest::read(1, 0, n as u32, r, 2)).unwrap();
    check(&*q, &r, 0, 13, 0, cut, "data before the end");
    check_zero(&*q, &r, cut, n * bs - cut, "past the end");
    // Wholly past the end.
    let r2 = lend(&mut *q, &pool, bs);
    fill_byte(&mut *q, &r2, 0xEE);
    run1(
        &mut *q,
        IoRequest::read(1, (512 << 10) / bs as u64, 1, r2, 3),
    )
    .unwrap();
    check_zero(&*q, &r2, 0, bs, "wholly past the end");
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
    let b = lend(&mut *q, &pool, 32 * bs);
    fill(&mut *q, &b, 0, 17, 0, 32 * bs);
    for i in 0..32u64 {
        let s = b.slice(i as usize * bs, bs).unwrap();
        q.submit(IoRequest::write(1, i * 3, 1, s, i)).unwrap();
    }
    for c in reap(&mut *q, 32) {
        c.result.unwrap();
    }
    let r = lend(&mut *q, &pool, bs);
    for i in 0..32u64 {
        run1(&mut *q, IoRequest::read(1, i * 3, 1, r, 100 + i)).unwrap();
        check(&*q, &r, 0, 17, i * bs as u64, bs, "sqpoll read back");
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
    let bufs: Vec<DmaSlice> = (0..8).map(|_| lend(&mut *q, &pool, 64 << 10)).collect();
    assert!(pool.regions().len() >= before + 7);
    let nlb = ((64 << 10) / bs) as u32;
    for (i, b) in bufs.iter().enumerate() {
        fill(&mut *q, b, 0, 23, (i * (64 << 10)) as u64, 64 << 10);
    }
    for (i, b) in bufs.iter().enumerate() {
        q.submit(IoRequest::write(
            1,
            i as u64 * nlb as u64,
            nlb,
            *b,
            i as u64,
        ))
        .unwrap();
    }
    for c in reap(&mut *q, 8) {
        c.result.unwrap();
    }
    let r = lend(&mut *q, &pool, 8 << 16);
    run1(&mut *q, IoRequest::read(1, 0, 8 * nlb, r, 9)).unwrap();
    check(&*q, &r, 0, 23, 0, 8 << 16, "read back across regions");
}
