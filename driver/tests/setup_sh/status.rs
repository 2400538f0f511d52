//! `status`: the library's table, over fake trees and on this machine.

use std::process::Command;

use kestrel::hw::pci::{format_table, hugepage_status, list_nvme_controllers, SysRoots};

use crate::fakesys::FakeSys;
use crate::fixture::{run, script, table};

#[test]
fn status_prints_the_library_table_over_a_fake_tree() {
    need_bash!();
    let f = FakeSys::new();
    let a = FakeSys::ON_NVME;
    f.two_controllers()
        .namespace(a, "nvme0", "nvme0n10", "259:9")
        .namespace(a, "nvme0", "nvme0n2", "259:1")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p2")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p3")
        .holder(a, "nvme0/nvme0n1/nvme0n1p3", "dm-0", Some("vg0-root"))
        .holder(a, "nvme0/nvme0n2", "md127", None)
        .mount("/dev/nvme0n1p1", "/boot")
        .mount("/dev/nvme0n1p1", "/mnt/again")
        .mount("/dev/sda1", "/")
        .swap("/dev/nvme0n1p2");
    f.nvme("0000:00:0a.0").numa("0000:00:0a.0", 1);
    f.pci("0000:00:03.0", 0x020000, 0x8086, 0x100e)
        .bind("0000:00:03.0", "e1000");
    f.hugepages(Some(0), 2048, 60, 64)
        .hugepages(Some(0), 1048576, 0, 1)
        .hugepages(Some(1), 2048, 3, 4);
    let r = run(&f, &["status"], &[]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let want = table(&f);
    assert!(
        want.contains("nvme0n1p1 mounted on /boot, nvme0n1p1 mounted on /mnt/again"),
        "{want}"
    );
    assert!(want.contains("nvme0n1p3 held by dm-0 (vg0-root)"), "{want}");
    assert!(want.contains("nvme0n1,nvme0n10,nvme0n2"), "{want}");
    assert_eq!(r.stdout(), want);
    assert!(r.calls.is_empty(), "status ran {}", r.calls);
}

#[test]
fn status_on_an_empty_tree_and_without_numa() {
    need_bash!();
    let f = FakeSys::new();
    let r = run(&f, &["status"], &[]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout(), table(&f));
    assert!(r
        .stdout()
        .contains("no NVMe controllers (PCI class 0x010802) found"));
    f.hugepages(None, 2048, 5, 8).nvme("0000:05:00.0");
    let r = run(&f, &["status"], &[]);
    assert_eq!(r.stdout(), table(&f));
    assert!(
        r.stdout().contains("-       2048kB           5       8"),
        "{}",
        r.stdout()
    );
}

#[test]
fn status_on_this_machine() {
    need_bash!();
    let roots = SysRoots::default();
    if !roots.sysfs.join("bus/pci/devices").is_dir() {
        eprintln!("skipped: no /sys/bus/pci/devices on this machine");
        return;
    }
    let out = Command::new("bash")
        .arg(script())
        .arg("status")
        .env_remove("SYSFS_ROOT")
        .env_remove("PROC_ROOT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ctrls = list_nvme_controllers(&roots).unwrap();
    let want = format_table(&ctrls, &hugepage_status(&roots.sysfs).unwrap());
    assert_eq!(stdout, want);
    assert_eq!(stdout, kestrel::hw::pci::status_table(&roots).unwrap());
    if ctrls.is_empty() {
        assert!(
            stdout.contains("no NVMe controllers (PCI class 0x010802) found"),
            "{stdout}"
        );
    }
}
