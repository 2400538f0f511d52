//! Bad requests refused before submission, and open errors that name the path and the
//! remedy.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use kestrel::hw::dma::{DmaPoolOptions, IdentityMapper, LeaseError};
use kestrel::io::{InvalidRequest, IoOp, IoRequest};
use kestrel::target::file::{Direct, FileError, FileOptions, FileTarget};
use kestrel::{DmaPool, QueueOptions, Target};

use crate::common::{disk_dir, invalid, lend, opts, run1};

#[test]
fn bad_input_is_rejected_before_submission() {
    let dir = disk_dir();
    let path = dir.path().join("bad.img");
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    assert!(t.is_direct());
    let bs = t.info().block_size as usize;
    malformed_requests_are_refused(&t);
    drop(t);
    writes_to_a_read_only_target_are_refused(&path, bs);
}

/// Each malformed request is refused at submit, and nothing reaches the kernel.
fn malformed_requests_are_refused(t: &FileTarget) {
    let bs = t.info().block_size as usize;
    let cap = t.info().num_blocks;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut *q, &pool, 4 * bs + 4096);

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
    // Memory that is not the target's pool cannot be lent to its queue, and a slice of
    // the target's memory lent to another queue is not this one's.
    let other_pool = DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default());
    let foreign = other_pool.alloc(bs).unwrap();
    let e = q.lend(foreign).unwrap_err();
    assert!(matches!(e, LeaseError::ForeignPool { .. }), "{e}");
    let mut other_q = t.create_queue(&QueueOptions::default()).unwrap();
    let elsewhere = lend(&mut *other_q, &pool, bs);
    assert!(matches!(
        invalid(&mut *q, IoRequest::read(1, 0, 1, elsewhere, 8)),
        InvalidRequest::NotLent { index: 0, .. }
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
}

/// Writes to a read-only target are refused; reads go through.
fn writes_to_a_read_only_target_are_refused(path: &Path, bs: usize) {
    let ro = FileTarget::open(
        path,
        &FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    assert!(ro.info().read_only);
    let mut q = ro.create_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut *q, ro.dma_pool(), bs);
    for req in [
        IoRequest::write(1, 0, 1, b, 11),
        IoRequest::write_zeroes(1, 0, 1, 12),
        IoRequest::deallocate(1, 0, 1, 13),
    ] {
        assert_eq!(invalid(&mut *q, req), InvalidRequest::ReadOnly);
    }
    run1(&mut *q, IoRequest::read(1, 0, 1, b, 14)).unwrap();
}

#[test]
fn open_errors_name_the_path_and_the_remedy() {
    let dir = disk_dir();
    let missing = dir.path().join("nope.img");
    a_missing_file_needs_a_size(&missing);
    only_files_and_block_devices_open(dir.path());
    files_too_small_for_a_block_are_refused(dir.path());
    bad_options_are_refused(&missing);
}

/// A missing file is refused without a size, created sparse with one; an existing shorter
/// file is extended, a longer one not truncated. Leaves `missing` at 64 MiB.
fn a_missing_file_needs_a_size(missing: &Path) {
    let e = FileTarget::open(missing, &FileOptions::default()).unwrap_err();
    assert!(matches!(e, FileError::Missing { .. }), "{e}");
    assert!(
        e.to_string().contains("nope.img") && e.to_string().contains("size"),
        "{e}"
    );
    // With a size it is created, sparse.
    let t = FileTarget::open(missing, &opts(64 << 20)).unwrap();
    assert_eq!(std::fs::metadata(missing).unwrap().len(), 64 << 20);
    drop(t);
    // An existing shorter file is extended; a longer one is not truncated.
    let t = FileTarget::open(missing, &opts(1 << 20)).unwrap();
    assert_eq!(t.info().num_blocks * t.info().block_size as u64, 1 << 20);
    assert_eq!(std::fs::metadata(missing).unwrap().len(), 64 << 20);
    drop(t);
}

/// Directories, character devices and fifos are refused, naming what they are.
fn only_files_and_block_devices_open(dir: &Path) {
    let e = FileTarget::open(dir, &FileOptions::default()).unwrap_err();
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
    let fifo = dir.join("fifo");
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
}

/// A size, or a file, too small for one block is refused.
fn files_too_small_for_a_block_are_refused(dir: &Path) {
    let tiny = dir.join("tiny.img");
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
}

/// Options out of range are refused naming the option; a block size given is used.
fn bad_options_are_refused(missing: &Path) {
    let e = FileTarget::open(
        missing,
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
        missing,
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
        missing,
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
        missing,
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
