//! fio's sync requests: one Flush per sync only after writes, and only once the writes
//! queued before it are done. fio asks for a sync again and again until its first one
//! completes (its `last_was_sync` is set at completion), so at depth it sends a sync
//! request for nearly every I/O slot; those must not each become a Flush.

use super::*;

fn flushes(h: &H) -> (u64, u64) {
    // SAFETY: `h.job` is live until `h` drops, and this thread alone uses it; a shared
    // read of two counters.
    let s = unsafe { (*h.job).sync };
    (s.requests, s.flushes)
}

#[test]
fn a_flush_follows_writes_once_they_are_done_and_only_after_writes() {
    let mut h = open("emu:size=26M").unwrap();
    assert_eq!(h.start(8, 0), 0, "{}", h.msg());
    assert_eq!(h.iomem(8 * 4096), 0);
    // No write yet: a sync is done at once, with no command.
    assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, 0), COMPLETED);
    assert_eq!(flushes(&h), (1, 0));
    // Writes at the device: the sync waits for them (fio reaps and asks again).
    for i in 0..4u32 {
        assert_eq!(h.queue(OP_WRITE, i as u64 * 4096, 4096, 0, i), QUEUED);
    }
    assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, 4), BUSY);
    h.commit();
    h.reap_ok(4);
    assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, 4), QUEUED);
    // fio's repeated syncs while that Flush is out: wait for it, then cost nothing.
    assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, 5), BUSY);
    h.commit();
    h.reap_ok(1);
    for i in 5..8u32 {
        assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, i), COMPLETED);
    }
    assert_eq!(flushes(&h), (5, 1));
    // A read is not a write: still nothing to flush.
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 0), QUEUED);
    h.commit();
    h.reap_ok(1);
    assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, 1), COMPLETED);
    // One more write: the next sync is a Flush again.
    assert_eq!(h.queue(OP_WRITE, 0, 4096, 0, 2), QUEUED);
    h.commit();
    h.reap_ok(1);
    assert_eq!(h.queue(OP_FLUSH, 0, 0, 0, 3), QUEUED);
    h.commit();
    h.reap_ok(1);
    assert_eq!(flushes(&h), (7, 2));
}

#[test]
fn the_target_s_capabilities_and_the_option_help() {
    let a = open("emu:size=28M").unwrap();
    // SAFETY: `a.job` is live until `a` drops; a shared read.
    let caps = unsafe { kfio_job_caps(a.job) };
    assert_ne!(caps & CAP_TRIM, 0, "{caps:#x}");
    assert_eq!(caps & (CAP_READ_ONLY | CAP_ZONED), 0, "{caps:#x}");
    // SAFETY: a static NUL-terminated string.
    let help = unsafe { CStr::from_ptr(kfio_target_help()) }.to_string_lossy();
    for w in [
        "namespaces=N",
        "ns=NSDEF",
        "/ns=N",
        "file:PATH",
        "pci:",
        "'\\:'",
    ] {
        assert!(help.contains(w), "no {w} in {help}");
    }
}
