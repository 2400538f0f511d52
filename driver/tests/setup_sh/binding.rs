//! `config` binding controllers to vfio-pci: what it refuses (mounted, swap, holders,
//! the root filesystem), what it skips, what it writes, and what it loads and mounts.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

use crate::fake_kernel::FakeKernel;
use crate::fakesys::FakeSys;
use crate::fixture::{config_tree, dev_dir, read, run, run_working, snapshot, state_file, table};

#[test]
fn config_refuses_a_mounted_controller_named_in_pci_allowed() {
    need_bash!();
    let f = config_tree();
    let a = "0000:01:00.0";
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 3)
        .namespace(a, "nvme0", "nvme0n1", "259:0")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p1")
        .mount("/dev/nvme0n1p1", "/boot");
    let before = snapshot(&f);
    let r = run_working(&f, &["config"], &[("PCI_ALLOWED", "01:00.0")]);
    assert_eq!(r.code(), 1, "{}", r.stdout());
    assert!(r.stderr().contains("nothing was changed"), "{}", r.stderr());
    assert_eq!(snapshot(&f), before, "the refusal came before any action");
    assert_eq!(state_file(&f), None);
    assert!(
        r.stderr()
            .contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1p1 mounted on /boot"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")),
        None,
        "nothing written"
    );
    assert_eq!(read(f.sys().join("bus/pci/drivers_probe")), None);
    assert!(r.calls.is_empty(), "{}", r.calls);
}

#[test]
fn config_refuses_swap_and_holders_and_skips_them_when_not_named() {
    need_bash!();
    let f = config_tree();
    let (s, h) = ("0000:01:00.0", "0000:02:00.0");
    f.nvme(s)
        .bind(s, "nvme")
        .group(s, 3)
        .namespace(s, "nvme0", "nvme0n1", "259:0")
        .swap("/dev/nvme0n1");
    f.nvme(h)
        .bind(h, "nvme")
        .group(h, 4)
        .namespace(h, "nvme1", "nvme1n1", "259:1")
        .partition(h, "nvme1", "nvme1n1", "nvme1n1p1")
        .holder(h, "nvme1/nvme1n1/nvme1n1p1", "dm-3", Some("vg1-data"))
        .holder(h, "nvme1/nvme1n1", "md0", None);
    let r = run(
        &f,
        &["config"],
        &[("PCI_ALLOWED", "0000:01:00.0 0000:02:00.0")],
    );
    assert_eq!(r.code(), 1);
    let e = r.stderr();
    assert!(
        e.contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1 used as swap"),
        "{e}"
    );
    assert!(
        e.contains("refusing to unbind 0000:02:00.0 from nvme: nvme1n1 held by md0, nvme1n1p1 held by dm-3 (vg1-data)"),
        "{e}"
    );
    // Not named: skipped with the reason, not a failure.
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout()
            .contains("0000:01:00.0: skipped, in use: nvme0n1 used as swap"),
        "{}",
        r.stdout()
    );
    assert!(
        r.stdout()
            .contains("0000:02:00.0: skipped, in use: nvme1n1 held by md0"),
        "{}",
        r.stdout()
    );
    assert_eq!(read(dev_dir(&f, s).join("driver_override")), None);
    assert_eq!(read(dev_dir(&f, h).join("driver_override")), None);
}

#[test]
fn config_binds_through_driver_override_and_drivers_probe() {
    need_bash!();
    let f = config_tree();
    let a = "0000:03:00.0";
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 9)
        .namespace(a, "nvme2", "nvme2n1", "259:2");
    let r = run(&f, &["config"], &[("PCI_ALLOWED", a), ("HUGEMEM", "64")]);
    // The fake kernel does not rebind, so the script sees it still on nvme and fails.
    assert_eq!(r.code(), 1, "{}", r.stdout());
    assert!(
        r.stderr()
            .contains("0000:03:00.0 did not bind to vfio-pci within 0 s (driver now: nvme)"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")).as_deref(),
        Some("vfio-pci")
    );
    assert_eq!(
        read(f.sys().join("bus/pci/drivers/nvme/unbind")).as_deref(),
        Some("0000:03:00.0")
    );
    assert_eq!(
        read(f.sys().join("bus/pci/drivers_probe")).as_deref(),
        Some("0000:03:00.0")
    );
    assert_eq!(
        read(
            f.sys()
                .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        )
        .as_deref(),
        Some("32"),
        "HUGEMEM=64 MiB is 32 pages of 2 MiB"
    );
    assert!(r.calls.is_empty(), "{}", r.calls);
    // What config found, for reset.
    let st = state_file(&f).unwrap();
    assert!(st.contains("\nhugepages 2048 0\n"), "{st}");
    assert!(st.contains("\ndriver 0000:03:00.0 nvme\n"), "{st}");
}

#[test]
fn config_is_idempotent_for_bound_controllers_and_chowns_the_group() {
    need_bash!();
    let f = config_tree();
    let a = "0000:04:00.0";
    f.nvme(a)
        .bind(a, "vfio-pci")
        .group(a, 12)
        .dev_vfio("12")
        .dev_vfio("vfio");
    f.hugepages(None, 2048, 1024, 1024);
    let uid = Command::new("id").args(["-u", "nobody"]).output();
    let me = Command::new("id").arg("-u").output().unwrap();
    let root = String::from_utf8_lossy(&me.stdout).trim() == "0";
    let nobody = uid.ok().filter(|o| o.status.success()).map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    });
    let env: Vec<(&str, &str)> = if root && nobody.is_some() {
        vec![("TARGET_USER", "nobody")]
    } else {
        eprintln!("chown part skipped: needs root and a `nobody` user");
        vec![]
    };
    for _ in 0..2 {
        let r = run(&f, &["config"], &env);
        assert_eq!(r.code(), 0, "{}", r.stderr());
        assert!(
            r.stdout()
                .contains("0000:04:00.0: already bound to vfio-pci"),
            "{}",
            r.stdout()
        );
        assert!(
            r.stdout()
                .contains("hugepages: 1024 x 2048 kB already (HUGEMEM=2048 MiB needs 1024)"),
            "{}",
            r.stdout()
        );
        assert_eq!(read(f.sys().join("bus/pci/drivers_probe")), None);
        assert!(r.calls.is_empty(), "{}", r.calls);
    }
    if let (true, Some(n)) = (root, nobody) {
        assert_eq!(fs::metadata(f.dev().join("vfio/12")).unwrap().uid(), n);
    }
}

#[test]
fn config_loads_modules_and_mounts_hugetlbfs_when_missing() {
    need_bash!();
    let f = FakeSys::new();
    f.hugepages(None, 2048, 0, 0);
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 1);
    assert_eq!(
        r.calls,
        format!(
            "mount -t hugetlbfs -o pagesize=2048K nodev {}/hugepages\n",
            f.dev().display()
        )
    );
    assert!(
        r.stderr().contains("cannot mount hugetlbfs"),
        "{}",
        r.stderr()
    );
    fs::write(
        f.proc().join("mounts"),
        "nodev /dev/hugepages hugetlbfs rw 0 0\n",
    )
    .unwrap();
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.calls, "modprobe vfio-pci\n");
    assert!(
        r.stderr().contains("modprobe vfio-pci  failed"),
        "{}",
        r.stderr()
    );
    fs::create_dir_all(f.sys().join("bus/pci/drivers/vfio-pci")).unwrap();
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 1);
    assert_eq!(r.calls, "modprobe vfio_iommu_type1\n");
}

#[test]
fn pci_blocked_keeps_a_controller_out() {
    need_bash!();
    let f = config_tree();
    f.nvme("0000:01:00.0")
        .bind("0000:01:00.0", "nvme")
        .group("0000:01:00.0", 1);
    let r = run(&f, &["config"], &[("PCI_BLOCKED", "01:00.0")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout().contains("0000:01:00.0: skipped (PCI_BLOCKED)"),
        "{}",
        r.stdout()
    );
    assert_eq!(
        read(dev_dir(&f, "0000:01:00.0").join("driver_override")),
        None
    );
}

#[test]
fn a_controller_holding_the_root_filesystem_is_never_bound() {
    need_bash!();
    let f = config_tree();
    let a = "0000:01:00.0";
    // Root mounted from /dev/root: only mountinfo's device number says where it is.
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 2)
        .namespace(a, "nvme0", "nvme0n1", "259:0")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p2")
        .devno(a, "nvme0/nvme0n1/nvme0n1p2", "259:2")
        .mount_devno("259:2", "/dev/root", "/");
    fs::write(
        f.proc().join("mounts"),
        "/dev/root / ext4 rw 0 0\nnodev /dev/hugepages hugetlbfs rw 0 0\n",
    )
    .unwrap();
    let before = snapshot(&f);
    let r = run_working(&f, &["config"], &[("PCI_ALLOWED", a)]);
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr()
            .contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1p2 mounted on /;"),
        "{}",
        r.stderr()
    );
    assert_eq!(snapshot(&f), before);
    assert!(r.calls.is_empty(), "{}", r.calls);
    // Not named: skipped, and the rest of config goes on.
    let _k = FakeKernel::start(&f);
    let r = run_working(&f, &["config"], &[("HUGEMEM", "4")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout()
            .contains("0000:01:00.0: skipped, in use: nvme0n1p2 mounted on /"),
        "{}",
        r.stdout()
    );
    assert_eq!(read(dev_dir(&f, a).join("driver_override")), None);
    assert!(dev_dir(&f, a).join("driver").exists());
    // The library's table says the same.
    assert!(
        table(&f).contains("nvme0n1p2 mounted on /\n"),
        "{}",
        table(&f)
    );
}
