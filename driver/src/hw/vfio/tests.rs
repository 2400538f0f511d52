//! Tests of everything in `VfioTransport::open` up to the first ioctl on a real VFIO
//! node, over a fake sysfs and /dev tree, and of every error message.

use super::*;
use crate::hw::pci::fake::FakeSys;

const B: &str = "0000:01:00.0";

fn opts(f: &FakeSys) -> VfioOptions {
    VfioOptions {
        sysfs_root: f.sys(),
        dev_root: f.dev(),
        ..VfioOptions::default()
    }
}

/// An NVMe controller bound to vfio-pci in group 7, alone in it.
fn bound(f: &FakeSys) {
    f.nvme(B).bind(B, "vfio-pci").group(B, 7);
}

fn open_err(bdf: &str, o: &VfioOptions) -> String {
    let e = VfioTransport::open(bdf, o).unwrap_err();
    // Also through the crate's error type.
    let top: crate::Error = e.into();
    top.to_string()
}

fn bdf() -> Bdf {
    B.parse().unwrap()
}

#[test]
fn invalid_address() {
    let f = FakeSys::new();
    let e = open_err("1:2:3", &opts(&f));
    assert!(e.contains("invalid pci address `1:2:3`"), "{e}");
}

#[test]
fn no_such_device_lists_the_controllers_there_are() {
    let f = FakeSys::new();
    f.nvme("0000:02:00.0").nvme("0000:03:00.0");
    f.pci("0000:00:03.0", 0x020000, 0x8086, 0x100e);
    let e = open_err("01:00.0", &opts(&f));
    assert!(e.contains("no pci device 0000:01:00.0"), "{e}");
    assert!(
        e.contains("bus/pci/devices/0000:01:00.0 does not exist"),
        "{e}"
    );
    assert!(
        e.contains("nvme controllers on this machine: 0000:02:00.0, 0000:03:00.0"),
        "{e}"
    );
    let g = FakeSys::new();
    let e = open_err(B, &opts(&g));
    assert!(e.contains("nvme controllers on this machine: none"), "{e}");
}

#[test]
fn not_an_nvme_controller() {
    let f = FakeSys::new();
    f.pci(B, 0x020000, 0x8086, 0x100e)
        .bind(B, "vfio-pci")
        .group(B, 7);
    let e = open_err(B, &opts(&f));
    assert!(
        e.contains("0000:01:00.0 is not an nvme controller: its pci class is 0x020000"),
        "{e}"
    );
}

#[test]
fn driver_detection() {
    let f = FakeSys::new();
    f.nvme(B).bind(B, "nvme").group(B, 7);
    let e = open_err("01:00.0", &opts(&f));
    assert!(
        e.contains("0000:01:00.0 is bound to nvme, not vfio-pci"),
        "{e}"
    );
    assert!(
        e.contains("`PCI_ALLOWED=0000:01:00.0 scripts/setup.sh config`"),
        "{e}"
    );
    let g = FakeSys::new();
    g.nvme(B).group(B, 7);
    let e = open_err(B, &opts(&g));
    assert!(
        e.contains("0000:01:00.0 is bound to no driver, not vfio-pci"),
        "{e}"
    );
}

#[test]
fn no_iommu_group() {
    let f = FakeSys::new();
    f.nvme(B).bind(B, "vfio-pci");
    let e = open_err(B, &opts(&f));
    assert!(e.contains("0000:01:00.0 has no iommu group"), "{e}");
    assert!(e.contains("0000:01:00.0/iommu_group is missing"), "{e}");
    assert!(
        e.contains("intel_iommu=on") && e.contains("amd_iommu=on"),
        "{e}"
    );
    assert!(
        e.contains("NOIOMMU=1 PCI_ALLOWED=0000:01:00.0 scripts/setup.sh config"),
        "{e}"
    );
}

#[test]
fn group_lookup_and_viability() {
    let f = FakeSys::new();
    bound(&f);
    // A bridge on pcieport, an unbound function and a pci-stub one do not matter...
    f.pci("0000:00:1c.0", 0x060400, 0x8086, 0x1)
        .bind("0000:00:1c.0", "pcieport")
        .group("0000:00:1c.0", 7);
    f.pci("0000:01:00.2", 0x0c0330, 0x8086, 0x2)
        .group("0000:01:00.2", 7);
    f.pci("0000:01:00.3", 0x0c0330, 0x8086, 0x3)
        .bind("0000:01:00.3", "pci-stub")
        .group("0000:01:00.3", 7);
    let pf = preflight(bdf(), &opts(&f)).unwrap();
    assert_eq!(pf.group, 7);
    // ...a sound function on its host driver does.
    f.pci("0000:01:00.1", 0x040300, 0x8086, 0x4)
        .bind("0000:01:00.1", "snd_hda_intel")
        .group("0000:01:00.1", 7);
    f.pci("0000:01:00.4", 0x020000, 0x8086, 0x5)
        .bind("0000:01:00.4", "e1000e")
        .group("0000:01:00.4", 7);
    let e = open_err(B, &opts(&f));
    assert!(
        e.contains("iommu group 7 of 0000:01:00.0 is not viable"),
        "{e}"
    );
    assert!(
        e.contains(
            "it also holds 0000:01:00.1 (driver snd_hda_intel), 0000:01:00.4 (driver e1000e)"
        ),
        "{e}"
    );
    assert!(
        e.contains("PCI_ALLOWED=\"0000:01:00.0 0000:01:00.1 0000:01:00.4\""),
        "{e}"
    );
    assert!(!e.contains("0000:00:1c.0") && !e.contains("01:00.2"), "{e}");
}

#[test]
fn vfio_modules_not_loaded() {
    let f = FakeSys::new();
    bound(&f);
    let e = open_err(B, &opts(&f));
    assert!(
        e.contains("dev/vfio/vfio does not exist: the vfio modules are not loaded"),
        "{e}"
    );
    assert!(e.contains("modprobe vfio-pci"), "{e}");
    // The group node is there but not the container.
    f.dev_vfio("7");
    let e = open_err(B, &opts(&f));
    assert!(e.contains("dev/vfio/vfio does not exist"), "{e}");
}

#[test]
fn group_node_missing() {
    let f = FakeSys::new();
    bound(&f);
    f.dev_vfio("vfio");
    let e = open_err(B, &opts(&f));
    assert!(
        e.contains("dev/vfio/7 (iommu group 7 of 0000:01:00.0) does not exist"),
        "{e}"
    );
    assert!(e.contains("is devtmpfs mounted at"), "{e}");
}

#[test]
fn noiommu_group_kinds_must_match_the_request() {
    let f = FakeSys::new();
    bound(&f);
    f.dev_vfio("vfio").dev_vfio("noiommu-7");
    let e = open_err(B, &opts(&f));
    assert!(e.contains("0000:01:00.0 is in a noiommu group"), "{e}");
    assert!(e.contains("dev/vfio/noiommu-7"), "{e}");
    assert!(e.contains("open it with noiommu"), "{e}");

    let g = FakeSys::new();
    bound(&g);
    g.dev_vfio("vfio").dev_vfio("7");
    let o = VfioOptions {
        noiommu: true,
        ..opts(&g)
    };
    let e = open_err(B, &o);
    assert!(
        e.contains("noiommu mode was asked for, but 0000:01:00.0 is in a real iommu group"),
        "{e}"
    );
    assert!(e.contains("dev/vfio/7"), "{e}");
}

#[test]
fn noiommu_needs_hugepages() {
    let f = FakeSys::new();
    bound(&f);
    let o = VfioOptions {
        noiommu: true,
        page_kind: PageKind::Small,
        ..opts(&f)
    };
    let e = open_err(B, &o);
    assert!(
        e.contains("noiommu mode for 0000:01:00.0 needs hugepage dma memory"),
        "{e}"
    );
}

#[test]
fn reaches_the_first_ioctl_on_the_container() {
    // Group and container nodes exist (as plain files): open gets as far as
    // VFIO_GET_API_VERSION, which a plain file refuses with ENOTTY.
    let f = FakeSys::new();
    bound(&f);
    f.dev_vfio("vfio").dev_vfio("7");
    let e = open_err("01:00.0", &opts(&f));
    assert!(e.contains("VFIO_GET_API_VERSION on "), "{e}");
    assert!(e.contains("dev/vfio/vfio for 0000:01:00.0 failed"), "{e}");
    assert!(e.contains("(not a vfio node?)"), "{e}");
    // Same in noiommu mode, through the noiommu node.
    let g = FakeSys::new();
    bound(&g);
    g.dev_vfio("vfio").dev_vfio("noiommu-7");
    let o = VfioOptions {
        noiommu: true,
        ..opts(&g)
    };
    let e = open_err(B, &o);
    assert!(e.contains("VFIO_GET_API_VERSION"), "{e}");
}

#[test]
fn permission_denied_busy_and_rawio_messages() {
    let f = FakeSys::new();
    f.dev_vfio("7");
    let path = f.dev().join("vfio/7");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let e = open_error(
        bdf(),
        &path,
        io::Error::from_raw_os_error(libc::EACCES),
        false,
        &f.proc(),
    )
    .to_string();
    assert!(
        e.contains("permission denied opening ") && e.contains("dev/vfio/7"),
        "{e}"
    );
    assert!(e.contains("(for 0000:01:00.0)"), "{e}");
    assert!(
        e.contains(&format!("owned by uid {} with mode 600", sys::euid())),
        "{e}"
    );
    assert!(
        e.contains("TARGET_USER=")
            && e.contains("PCI_ALLOWED=0000:01:00.0 scripts/setup.sh config"),
        "{e}"
    );
    assert!(e.contains("or run as root"), "{e}");

    let e = open_error(
        bdf(),
        &path,
        io::Error::from_raw_os_error(libc::EPERM),
        true,
        &f.proc(),
    )
    .to_string();
    assert!(
        e.contains("can be opened only with CAP_SYS_RAWIO in noiommu mode"),
        "{e}"
    );
    let e = open_error(
        bdf(),
        &path,
        io::Error::from_raw_os_error(libc::EBUSY),
        false,
        &f.proc(),
    )
    .to_string();
    assert!(
        e.contains(
            "is already open (vfio allows one opener at a time): no process with it open was found"
        ),
        "{e}"
    );
    // A holder in the (fake) proc tree is named, by pid and command.
    let fd = f.proc().join("4242/fd");
    std::fs::create_dir_all(&fd).unwrap();
    std::fs::write(f.proc().join("4242/comm"), "qemu-system-x86\n").unwrap();
    std::os::unix::fs::symlink(&path, fd.join("9")).unwrap();
    let e = open_error(
        bdf(),
        &path,
        io::Error::from_raw_os_error(libc::EBUSY),
        false,
        &f.proc(),
    )
    .to_string();
    assert!(
        e.ends_with("is already open (vfio allows one opener at a time): pid 4242 (qemu-system-x86) has it open; stop it first"),
        "{e}"
    );
    let e = open_error(
        bdf(),
        &path,
        io::Error::from_raw_os_error(libc::EMFILE),
        false,
        &f.proc(),
    )
    .to_string();
    assert!(
        e.contains("too many open files")
            && e.contains("RLIMIT_NOFILE")
            && e.contains(&crate::hw::limits::Limit::Nofile.text())
            && e.contains("ulimit -n"),
        "{e}"
    );
    let e = open_error(
        bdf(),
        &path,
        io::Error::from_raw_os_error(libc::EIO),
        false,
        &f.proc(),
    )
    .to_string();
    assert!(
        e.contains("cannot open ") && e.contains("(for 0000:01:00.0)"),
        "{e}"
    );
}

#[test]
fn permission_denied_for_real_when_not_root() {
    if sys::euid() == 0 {
        eprintln!("skipped: root opens any file; the EACCES mapping is tested directly");
        return;
    }
    let f = FakeSys::new();
    bound(&f);
    f.dev_vfio("vfio").dev_vfio("7");
    let path = f.dev().join("vfio/7");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    let e = open_err(B, &opts(&f));
    assert!(
        e.contains("permission denied opening") && e.contains("mode 0"),
        "{e}"
    );
}

#[test]
fn bar0_checks() {
    let e = check_bar0(bdf(), 4096, 7).unwrap_err().to_string();
    assert!(
        e.contains("bar0 of 0000:01:00.0 is 4096 bytes, smaller than the 4104 bytes"),
        "{e}"
    );
    let e = check_bar0(bdf(), 16384, 3).unwrap_err().to_string();
    assert!(
        e.contains("bar0 of 0000:01:00.0 cannot be mmapped (region flags 0x3"),
        "{e}"
    );
    assert_eq!(check_bar0(bdf(), 16384, 7).unwrap(), 16384);
    assert_eq!(
        check_bar0(bdf(), 16384, 0xf).unwrap(),
        16384,
        "caps flag is fine"
    );
}

#[test]
fn ioctl_derived_messages() {
    let b = bdf();
    let all = [
        VfioError::NoType1 { bdf: b }.to_string(),
        VfioError::NoiommuUnsupported { bdf: b }.to_string(),
        VfioError::ApiVersion {
            path: "/dev/vfio/vfio".into(),
            got: 1,
        }
        .to_string(),
        VfioError::NotPciDevice {
            bdf: b,
            flags: 1,
            regions: 2,
        }
        .to_string(),
        VfioError::CommandRegister {
            bdf: b,
            wrote: 0x0406,
            read: 0x0400,
        }
        .to_string(),
        VfioError::Bar0Mmap {
            bdf: b,
            size: 16384,
            offset: 0,
            source: io::Error::from_raw_os_error(libc::EINVAL),
        }
        .to_string(),
        VfioError::GroupNotViable {
            bdf: b,
            group: 3,
            others: vec![],
        }
        .to_string(),
    ];
    assert!(all[0].contains("modprobe vfio_iommu_type1"), "{}", all[0]);
    assert!(
        all[1].contains("enable_unsafe_noiommu_mode=1") && all[1].contains("NOIOMMU=1"),
        "{}",
        all[1]
    );
    assert!(all[2].contains("api version 1"), "{}", all[2]);
    assert!(
        all[3].contains("not a vfio pci device (device flags 0x1, 2 regions)"),
        "{}",
        all[3]
    );
    assert!(
        all[4].contains("wrote pci command 0x0406, read back 0x0400"),
        "{}",
        all[4]
    );
    assert!(
        all[5].contains("16384 bytes at device offset 0x0"),
        "{}",
        all[5]
    );
    assert!(
        all[6].contains("the kernel reports the group unviable"),
        "{}",
        all[6]
    );
    for m in &all {
        assert!(
            m.contains("0000:01:00.0") || m.contains("/dev/vfio/vfio"),
            "{m}"
        );
    }
}

#[test]
fn options_default_to_2m_hugepages_and_real_roots() {
    let o = VfioOptions::default();
    assert_eq!(o.page_kind, PageKind::Huge2M);
    assert!(!o.noiommu);
    assert_eq!(o.sysfs_root, Path::new("/sys"));
    assert_eq!(o.dev_root, Path::new("/dev"));
}
