//! fio's zone operations on the emulator's zoned namespace: reports with write pointers
//! and zone capacity, reset, finish, the open and active zone limits.

use super::*;

fn report(h: &mut H, offset: u64, nr: usize) -> Result<Vec<KfioZone>, (i32, String)> {
    let mut z = vec![KfioZone::default(); nr];
    h.msg[0] = 0;
    // SAFETY: a live job; `z` holds nr zones; msg is writable.
    let n = unsafe {
        kfio_job_report_zones(
            h.job,
            offset,
            z.as_mut_ptr(),
            nr as u32,
            h.msg.as_mut_ptr(),
            MSG,
        )
    };
    if n < 0 {
        return Err((-n, h.msg()));
    }
    z.truncate(n as usize);
    Ok(z)
}

fn action(h: &mut H, action: c_int, offset: u64, len: u64) -> (c_int, String) {
    h.msg[0] = 0;
    // SAFETY: a live job; msg is writable.
    let r = unsafe { kfio_job_zone_action(h.job, action, offset, len, h.msg.as_mut_ptr(), MSG) };
    (r, h.msg())
}

const MIB: u64 = 1 << 20;

#[test]
fn zones_are_reported_reset_and_finished_with_their_capacity() {
    let mut h = open("emu:ns=64M+4096+zoned+zone4M+zcap3M+open3+active5").unwrap();
    // SAFETY: a live job; shared reads.
    unsafe {
        assert_ne!(kfio_job_caps(h.job) & CAP_ZONED, 0);
        assert_eq!(kfio_job_zone_limit(h.job, 0), 3);
        assert_eq!(kfio_job_zone_limit(h.job, 1), 5);
    }
    // Before the job's queue pair exists, as fio reports zones at set-up.
    let all = report(&mut h, 0, 64).unwrap();
    assert_eq!(all.len(), 16);
    for (i, z) in all.iter().enumerate() {
        let start = i as u64 * 4 * MIB;
        let want = KfioZone {
            start,
            wp: start,
            len: 4 * MIB,
            capacity: 3 * MIB,
            cond: 1,
            kind: 2,
        };
        assert_eq!(*z, want, "zone {i}");
    }
    // From an offset inside zone 5, at most 4 zones.
    let some = report(&mut h, 5 * 4 * MIB + 8192, 4).unwrap();
    assert_eq!(
        some.iter().map(|z| z.start / (4 * MIB)).collect::<Vec<_>>(),
        [5, 6, 7, 8]
    );
    // Two writes at zone 2's write pointer move it; the zone is implicitly open.
    assert_eq!(h.start(2, 0), 0, "{}", h.msg());
    assert_eq!(h.iomem(2 * 65536), 0);
    for i in 0..2u64 {
        assert_eq!(
            h.queue(OP_WRITE, 8 * MIB + i * 65536, 65536, 0, 0),
            QUEUED,
            "{}",
            h.msg()
        );
        h.commit();
        h.reap_ok(1);
    }
    let z2 = report(&mut h, 8 * MIB, 1).unwrap()[0];
    assert_eq!((z2.wp, z2.cond), (8 * MIB + 131072, 2));
    // Finish: full, its write pointer at the end of its capacity.
    assert_eq!(
        action(&mut h, ZONE_FINISH, 8 * MIB, 4 * MIB),
        (0, String::new())
    );
    let z2 = report(&mut h, 8 * MIB, 1).unwrap()[0];
    assert_eq!((z2.wp, z2.cond), (8 * MIB + 3 * MIB, 0xE));
    // Reset of two zones: empty again, write pointer at the start.
    assert_eq!(action(&mut h, ZONE_RESET, 8 * MIB, 8 * MIB).0, 0);
    let z2 = report(&mut h, 8 * MIB, 1).unwrap()[0];
    assert_eq!((z2.wp, z2.cond), (8 * MIB, 1));
    // Reset of the whole namespace (one Select All command).
    assert_eq!(action(&mut h, ZONE_RESET, 0, 64 * MIB).0, 0);
    // Not whole zones: refused with the reason.
    let (r, m) = action(&mut h, ZONE_RESET, MIB, 4 * MIB);
    assert_eq!(r, -libc::EINVAL);
    assert!(m.contains("not whole zones of 4194304 bytes"), "{m}");
}

#[test]
fn a_namespace_that_is_not_zoned_has_no_zones() {
    let mut h = open("emu:size=30M").unwrap();
    let e = report(&mut h, 0, 4).unwrap_err();
    assert_eq!(e.0, libc::EOPNOTSUPP);
    assert!(e.1.contains("is not a zoned namespace"), "{}", e.1);
    // SAFETY: a live job; a shared read.
    assert_eq!(unsafe { kfio_job_zone_limit(h.job, 0) }, 0);
}
