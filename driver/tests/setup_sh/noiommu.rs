//! `NOIOMMU=1`: a controller without an IOMMU group, and a kernel without noiommu.

use std::fs;

use crate::fixture::{config_tree, dev_dir, read, run};

#[test]
fn config_refuses_a_controller_without_iommu_group_unless_noiommu() {
    need_bash!();
    let f = config_tree();
    let a = "0000:05:00.0";
    f.nvme(a).bind(a, "nvme");
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 1);
    let e = r.stderr();
    assert!(e.contains("0000:05:00.0 has no IOMMU group"), "{e}");
    assert!(
        e.contains("intel_iommu=on") && e.contains("NOIOMMU=1"),
        "{e}"
    );
    assert_eq!(read(dev_dir(&f, a).join("driver_override")), None);

    // noiommu: the parameter is switched on, loudly, and binding is attempted.
    f.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n");
    let r = run(&f, &["config"], &[("NOIOMMU", "1")]);
    assert!(r.stderr().contains("UNSAFE noiommu mode"), "{}", r.stderr());
    assert!(
        r.stderr().contains("can read and write ALL memory"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        read(
            f.sys()
                .join("module/vfio/parameters/enable_unsafe_noiommu_mode")
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")).as_deref(),
        Some("vfio-pci")
    );
}

#[test]
fn noiommu_on_a_kernel_without_it() {
    need_bash!();
    let f = config_tree();
    fs::create_dir_all(f.sys().join("module/vfio/parameters")).unwrap();
    let r = run(&f, &["config"], &[("NOIOMMU", "1")]);
    assert_eq!(r.code(), 1);
    assert!(r.stderr().contains("CONFIG_VFIO_NOIOMMU"), "{}", r.stderr());
    // vfio not loaded at all: the script asks modprobe for it with the parameter.
    let g = config_tree();
    let r = run(&g, &["config"], &[("NOIOMMU", "1")]);
    assert_eq!(r.code(), 1);
    assert_eq!(r.calls, "modprobe vfio enable_unsafe_noiommu_mode=1\n");
    assert!(
        r.stderr()
            .contains("modprobe vfio enable_unsafe_noiommu_mode=1 failed"),
        "{}",
        r.stderr()
    );
}
