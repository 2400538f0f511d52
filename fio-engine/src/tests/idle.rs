//! The idle policies (`kestrel_idle=`): a job waiting for a slow completion polls
//! (`busy`, or `hybrid` within its spin) or sleeps on the queue's interrupt (`interrupt`,
//! or `hybrid` past its spin), and gets its completion either way.

use super::*;

/// One 4 KiB read on an emulator that takes 3 ms per command, reaped with `idle`; the
/// job's sleeps.
fn sleeps_waiting(spec: &str, idle: c_int, spin_ns: u64) -> u64 {
    let mut h = open(spec).unwrap();
    assert_eq!(h.start_idle(2, 0, idle, spin_ns), 0, "{}", h.msg());
    assert_eq!(h.iomem(4096), 0);
    let t = Instant::now();
    assert_eq!(h.queue(OP_READ, 0, 4096, 0, 0), QUEUED);
    h.commit();
    assert_eq!(h.reap_ok(1), vec![0]);
    assert!(t.elapsed() >= Duration::from_millis(3), "{:?}", t.elapsed());
    // SAFETY: `h.job` is live until `h` drops; a shared read.
    unsafe { (*h.job).sleeps }
}

#[test]
fn waiting_jobs_sleep_on_interrupts_unless_they_busy_poll() {
    let spec = |n: u32| format!("emu:size={n}M,latency=3ms");
    assert_eq!(sleeps_waiting(&spec(32), IDLE_BUSY, 0), 0);
    assert!(sleeps_waiting(&spec(34), IDLE_INTERRUPT, 0) >= 1);
    // Hybrid: a spin longer than the command polls it through; a short one sleeps.
    assert_eq!(sleeps_waiting(&spec(36), IDLE_HYBRID, 1_000_000_000), 0);
    assert!(sleeps_waiting(&spec(38), IDLE_HYBRID, 20_000) >= 1);
}

#[test]
fn an_unknown_idle_policy_is_refused() {
    let mut h = open("emu:size=40M").unwrap();
    assert_eq!(h.start_idle(2, 0, 7, 0), -libc::EINVAL);
    assert!(
        h.msg().contains("kestrel_idle: unknown policy 7"),
        "{}",
        h.msg()
    );
}

#[test]
fn a_file_target_sleeps_in_the_kernel() {
    // In the target directory: on disk (direct I/O), where /tmp may be tmpfs.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(format!("kfio-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.img");
    // Written blocks (holes would read back at once, with nothing to wait for).
    std::fs::write(&path, vec![0x5au8; 4 << 20]).unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    let spec = format!("file:{},size=4M", path.display());
    let mut h = open(&spec).unwrap();
    assert_eq!(h.start_idle(4, 0, IDLE_INTERRUPT, 0), 0, "{}", h.msg());
    assert_eq!(h.iomem(4 * 4096), 0);
    for round in 0..50u64 {
        for i in 0..4u32 {
            let off = (round * 4 + i as u64) % 1024 * 4096;
            assert_eq!(h.queue(OP_READ, off, 4096, i as usize * 4096, i), QUEUED);
        }
        h.commit();
        h.reap_ok(4);
    }
    // SAFETY: `h.job` is live until `h` drops; a shared read.
    let sleeps = unsafe { (*h.job).sleeps };
    assert!(
        sleeps > 0,
        "200 reads reaped without one sleep in io_uring_enter"
    );
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}
