//! A block device through a loop device, when one can be set up (root and losetup).

use std::path::{Path, PathBuf};
use std::process::Command;

use kestrel::io::{InvalidRequest, IoRequest};
use kestrel::target::file::{FileError, FileKind, FileOptions, FileTarget};
use kestrel::{QueueOptions, Target};

use crate::common::{check, check_zero, disk_dir, fill, invalid, lend, opts, run1};

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

/// The logical block size sysfs gives for the block device `dev`.
fn sysfs_lbs(dev: &std::path::Path) -> u32 {
    std::fs::read_to_string(format!(
        "/sys/block/{}/queue/logical_block_size",
        dev.file_name().unwrap().to_string_lossy()
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap()
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
    assert_eq!(
        info.block_size,
        sysfs_lbs(&lo.dev),
        "block size from BLKSSZGET"
    );
    assert_eq!(info.num_blocks * info.block_size as u64, 8 << 20);
    let bs = info.block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let n = 128u32;
    let b = lend(&mut *q, &pool, n as usize * bs);
    fill(&mut *q, &b, 0, 51, 0, n as usize * bs);
    run1(&mut *q, IoRequest::write(1, 0, n, b, 1)).unwrap();
    run1(&mut *q, IoRequest::flush(1, 2)).unwrap();
    run1(&mut *q, IoRequest::write_zeroes(1, 8, 8, 3)).unwrap();
    let discard = info.deallocate;
    if discard {
        assert!(info.deallocate_reads_zeroes, "loop discards punch holes");
        run1(&mut *q, IoRequest::deallocate(1, 64, 16, 4)).unwrap();
    } else {
        eprintln!("note: this loop device does not take discards");
    }
    let r = lend(&mut *q, &pool, n as usize * bs);
    run1(&mut *q, IoRequest::read(1, 0, n, r, 5)).unwrap();
    for blk in 0..n as usize {
        if (8..16).contains(&blk) || (discard && (64..80).contains(&blk)) {
            check_zero(&*q, &r, blk * bs, bs, &format!("block {blk}"));
        } else {
            check(
                &*q,
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
