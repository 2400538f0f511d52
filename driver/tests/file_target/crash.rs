//! Crash consistency: data flushed by a process that then dies is read by a fresh one.

use kestrel::io::IoRequest;
use kestrel::target::file::{FileOptions, FileTarget};
use kestrel::{QueueOptions, Target};

use crate::child::{child_role, spawn_child};
use crate::common::{check, disk_dir, fill, lend, opts, reap, run1};

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
            let b = lend(&mut *q, &pool, CRASH_BLOCKS as usize * bs);
            fill(&mut *q, &b, 0, 31, 0, CRASH_BLOCKS as usize * bs);
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
            let r = lend(&mut *q, &pool, CRASH_BLOCKS as usize * bs);
            run1(&mut *q, IoRequest::read(1, 0, CRASH_BLOCKS, r, 1)).unwrap();
            check(
                &*q,
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
    let w = spawn_child("crash::crash_child", "write", &path);
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
    let v = spawn_child("crash::crash_child", "verify", &path);
    assert!(
        v.status.success() && String::from_utf8_lossy(&v.stdout).contains("verified"),
        "verifier: {}\n{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
}
