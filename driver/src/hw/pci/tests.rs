use super::fake::FakeSys;
use super::*;

trait Roots {
    fn roots(&self) -> SysRoots;
}
impl Roots for FakeSys {
    fn roots(&self) -> SysRoots {
        SysRoots::new(self.sys(), self.proc())
    }
}

#[test]
fn bdf_parse_and_normalise() {
    let b: Bdf = "01:00.0".parse().unwrap();
    assert_eq!(b.to_string(), "0000:01:00.0");
    let b: Bdf = " 0000:AF:1f.7\n".parse().unwrap();
    assert_eq!(b.to_string(), "0000:af:1f.7");
    assert_eq!(
        "10000:01:00.0".parse::<Bdf>().unwrap().to_string(),
        "10000:01:00.0"
    );
    for bad in [
        "",
        "01:00",
        "01:20.0",
        "01:00.8",
        "x1:00.0",
        "0:0:0:0.0",
        "001:00.0",
    ] {
        let e = bad.parse::<Bdf>().unwrap_err().to_string();
        assert!(e.contains(&format!("`{bad}`")), "{e}");
        assert!(e.contains("0000:01:00.0"), "{e}");
    }
}

#[test]
fn namespace_names() {
    assert_eq!(namespace_block_name("nvme0n1").as_deref(), Some("nvme0n1"));
    assert_eq!(
        namespace_block_name("nvme12n10").as_deref(),
        Some("nvme12n10")
    );
    assert_eq!(
        namespace_block_name("nvme0c1n2").as_deref(),
        Some("nvme0n2")
    );
    for no in [
        "nvme0",
        "nvme0n",
        "nvme0n1p1",
        "nvmecn1",
        "nvme0c0",
        "hwmon1",
        "nvme0cxn1",
    ] {
        assert_eq!(namespace_block_name(no), None, "{no}");
    }
}

#[test]
fn discovery_driver_group_and_blocks() {
    let f = FakeSys::new();
    let a = FakeSys::ON_NVME;
    // Node 1 rather than the preset's 0: a reader falling back to 0 would not pass.
    f.two_controllers()
        .numa(a, 1)
        .namespace(a, "nvme0", "nvme0n2", "259:1")
        .pci("0000:00:03.0", 0x020000, 0x8086, 0x100e)
        .bind("0000:00:03.0", "e1000");
    let c = list_nvme_controllers(&f.roots()).unwrap();
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[0].bdf.to_string(), a);
    assert_eq!((c[0].vendor, c[0].device), (0x1b36, 0x0010));
    assert_eq!(c[0].numa_node, Some(1));
    assert_eq!(c[0].iommu_group, Some(3));
    assert_eq!(c[0].driver.as_deref(), Some("nvme"));
    let names: Vec<_> = c[0].block_devices.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["nvme0n1", "nvme0n2"]);
    assert_eq!(c[0].block_devices[0].partitions, ["nvme0n1p1"]);
    // No `size` or `queue/zoned` in the tree: not known, not zoned.
    assert_eq!(c[0].block_devices[1].size_bytes, None);
    assert_eq!(c[0].block_devices[1].zoned, None);
    assert!(!c[0].in_use());
    assert_eq!(c[1].driver.as_deref(), Some("vfio-pci"));
    assert_eq!(c[1].numa_node, None);
    assert!(c[1].block_devices.is_empty());
    let b: Bdf = FakeSys::ON_VFIO.parse().unwrap();
    assert_eq!(iommu_group(&f.roots(), &b).unwrap(), Some(4));
    assert_eq!(
        bound_driver(&f.roots(), &b).unwrap().as_deref(),
        Some("vfio-pci")
    );
    assert_eq!(iommu_groups(&f.sys()).unwrap(), [3, 4]);
    assert!(iommu_units(&f.sys()).unwrap().is_empty());
    f.write("class/iommu/dmar0/x", "");
    assert_eq!(iommu_units(&f.sys()).unwrap(), ["dmar0"]);
    let none: Bdf = "00:06.0".parse().unwrap();
    assert_eq!(iommu_group(&f.roots(), &none).unwrap(), None);
    assert_eq!(bound_driver(&f.roots(), &none).unwrap(), None);
}

/// A controller at 0000:01:00.0 on the kernel's `nvme` driver with namespace nvme0n1
/// (259:0) and its partitions nvme0n1p1 and nvme0n1p2; returns the tree and the BDF.
fn nvme0n1_with_two_partitions() -> (FakeSys, &'static str) {
    let f = FakeSys::new();
    let b = "0000:01:00.0";
    f.nvme(b)
        .bind(b, "nvme")
        .namespace(b, "nvme0", "nvme0n1", "259:0")
        .partition(b, "nvme0", "nvme0n1", "nvme0n1p1")
        .partition(b, "nvme0", "nvme0n1", "nvme0n1p2");
    (f, b)
}

/// The controllers of the tree, and the uses of controller 0 as text.
fn uses_of(f: &FakeSys) -> (Vec<PciNvmeController>, Vec<String>) {
    let c = list_nvme_controllers(&f.roots()).unwrap();
    let uses = c[0].uses().map(|u| u.to_string()).collect();
    (c, uses)
}

#[test]
fn uses_mounts_swap_holders() {
    let (f, b) = nvme0n1_with_two_partitions();
    f.partition(b, "nvme0", "nvme0n1", "nvme0n1p3")
        .holder(b, "nvme0/nvme0n1/nvme0n1p3", "dm-0", Some("vg0-root"))
        .holder(b, "nvme0/nvme0n1/nvme0n1p3", "md0", None)
        .mount("/dev/nvme0n1p1", "/boot")
        .mount("/dev/sda1", "/")
        .swap("/dev/nvme0n1p2");
    let (c, uses) = uses_of(&f);
    assert_eq!(
        uses,
        [
            "nvme0n1p1 mounted on /boot",
            "nvme0n1p2 used as swap",
            "nvme0n1p3 held by dm-0 (vg0-root)",
            "nvme0n1p3 held by md0",
        ]
    );
    assert!(c[0].in_use());
}

#[test]
fn mounts_found_by_device_number() {
    let (f, b) = nvme0n1_with_two_partitions();
    f.devno(b, "nvme0/nvme0n1/nvme0n1p1", "259:1")
        .devno(b, "nvme0/nvme0n1/nvme0n1p2", "259:2")
        // The root filesystem as a kernel without initramfs mounts it.
        .mount_devno("259:2", "/dev/root", "/")
        // Listed in both files: reported once.
        .mount("/dev/nvme0n1p1", "/boot")
        .mount_devno("259:1", "/dev/nvme0n1p1", "/boot")
        .mount_devno("8:1", "/dev/sda1", "/data");
    let (_, uses) = uses_of(&f);
    assert_eq!(
        uses,
        ["nvme0n1p1 mounted on /boot", "nvme0n1p2 mounted on /"]
    );
}

#[test]
fn multipath_path_device_maps_to_head() {
    let f = FakeSys::new();
    let b = "0000:01:00.0";
    f.nvme(b).bind(b, "nvme");
    // Path device under the controller, head elsewhere with a partition, mounted.
    let p = f
        .sys()
        .join("devices/pci0000:00")
        .join(b)
        .join("nvme/nvme0/nvme0c0n1");
    fs::create_dir_all(&p).unwrap();
    let head = f
        .sys()
        .join("devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1");
    fs::create_dir_all(head.join("nvme0n1p1")).unwrap();
    fs::write(head.join("nvme0n1p1/partition"), "1\n").unwrap();
    std::os::unix::fs::symlink(&head, f.sys().join("class/block/nvme0n1")).unwrap();
    f.mount("/dev/nvme0n1p1", "/data");
    let c = list_nvme_controllers(&f.roots()).unwrap();
    assert_eq!(c[0].block_devices[0].name, "nvme0n1");
    assert_eq!(c[0].block_devices[0].partitions, ["nvme0n1p1"]);
    assert_eq!(
        c[0].uses().next().unwrap().to_string(),
        "nvme0n1p1 mounted on /data"
    );
}

#[test]
fn group_members_and_viability_rules() {
    let f = FakeSys::new();
    f.nvme("0000:01:00.0")
        .bind("0000:01:00.0", "vfio-pci")
        .group("0000:01:00.0", 7);
    f.pci("0000:01:00.1", 0x040300, 0x8086, 0x1234)
        .bind("0000:01:00.1", "snd_hda_intel")
        .group("0000:01:00.1", 7);
    f.pci("0000:00:1c.0", 0x060400, 0x8086, 0x4321)
        .bind("0000:00:1c.0", "pcieport")
        .group("0000:00:1c.0", 7);
    f.pci("0000:01:00.2", 0x0c0330, 0x8086, 0x1111)
        .group("0000:01:00.2", 7);
    let m = group_members(&f.roots(), 7).unwrap();
    let shown: Vec<String> = m.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        shown,
        [
            "0000:00:1c.0 (driver pcieport)",
            "0000:01:00.0 (driver vfio-pci)",
            "0000:01:00.1 (driver snd_hda_intel)",
            "0000:01:00.2 (no driver)",
        ]
    );
    let ok: Vec<bool> = m.iter().map(|m| m.allows_vfio()).collect();
    assert_eq!(ok, [true, true, false, true]);
    assert!(group_members(&f.roots(), 99).unwrap().is_empty());
}

#[test]
fn hugepages_per_node_and_fallback() {
    let f = FakeSys::new();
    f.hugepages(Some(1), 2048, 3, 4)
        .hugepages(Some(0), 1048576, 0, 1)
        .hugepages(Some(0), 2048, 60, 64)
        .hugepages(None, 2048, 63, 68);
    let h = hugepage_status(&f.sys()).unwrap();
    let v: Vec<_> = h
        .counts
        .iter()
        .map(|c| (c.node, c.page_kib, c.free, c.total))
        .collect();
    assert_eq!(
        v,
        [
            (Some(0), 2048, 60, 64),
            (Some(0), 1048576, 0, 1),
            (Some(1), 2048, 3, 4)
        ]
    );
    assert_eq!((h.free(2048), h.total(2048)), (63, 68));
    let g = FakeSys::new();
    g.hugepages(None, 2048, 5, 8);
    let h = hugepage_status(&g.sys()).unwrap();
    assert_eq!(
        h.counts,
        [HugepageCount {
            node: None,
            page_kib: 2048,
            free: 5,
            total: 8
        }]
    );
    assert!(hugepage_status(&FakeSys::new().sys())
        .unwrap()
        .counts
        .is_empty());
}

#[test]
fn table_layout() {
    let f = FakeSys::new();
    let b = "0000:01:00.0";
    f.nvme(b)
        .bind(b, "nvme")
        .group(b, 3)
        .numa(b, 0)
        .namespace(b, "nvme0", "nvme0n1", "259:0")
        .namespace(b, "nvme0", "nvme0n2", "259:1")
        .mount("/dev/nvme0n2", "/mnt/x");
    f.nvme("0000:02:00.0");
    f.hugepages(Some(0), 2048, 60, 64);
    let t = format_table(
        &list_nvme_controllers(&f.roots()).unwrap(),
        &hugepage_status(&f.sys()).unwrap(),
    );
    let want = "\
NODE    HUGEPAGES     FREE   TOTAL
node0   2048kB          60      64

BDF           VENDOR:ID  NUMA  GROUP  DRIVER      BLOCK DEVICES     IN USE
0000:01:00.0  1b36:0010  0     3      nvme        nvme0n1,nvme0n2   nvme0n2 mounted on /mnt/x
0000:02:00.0  1b36:0010  -     -      -           -                 no
";
    assert_eq!(t, want);
    let empty = format_table(&[], &HugepageStatus::default());
    assert_eq!(
        empty,
        "hugepages: none (kernel without hugetlb support)\n\nno NVMe controllers (PCI class 0x010802) found\n"
    );
}

#[test]
fn missing_bus_and_bad_files() {
    let d = tempfile::tempdir().unwrap();
    let e = list_nvme_controllers(&SysRoots::new(d.path(), d.path())).unwrap_err();
    assert!(
        e.to_string().contains("bus/pci/devices does not exist"),
        "{e}"
    );
    let f = FakeSys::new();
    f.nvme("0000:01:00.0");
    fs::write(
        f.sys().join("devices/pci0000:00/0000:01:00.0/vendor"),
        "zzz\n",
    )
    .unwrap();
    let e = list_nvme_controllers(&f.roots()).unwrap_err().to_string();
    assert!(
        e.contains("0000:01:00.0/vendor") && e.contains("`zzz` is not hex"),
        "{e}"
    );
}

#[test]
fn real_machine_lists_without_error() {
    // This machine may or may not have NVMe; the listing must simply work on real sysfs.
    let roots = SysRoots::default();
    if !roots.sysfs.join("bus/pci/devices").is_dir() {
        eprintln!("skipped: no /sys/bus/pci/devices here");
        return;
    }
    let c = list_nvme_controllers(&roots).unwrap();
    for x in &c {
        assert!(x.bdf.to_string().len() >= 12);
    }
    hugepage_status(&roots.sysfs).unwrap();
}

#[test]
fn block_device_size_and_zone_model() {
    let f = FakeSys::new();
    f.nvme("0000:00:04.0")
        .bind("0000:00:04.0", "nvme")
        .namespace("0000:00:04.0", "nvme0", "nvme0n1", "259:0")
        .namespace("0000:00:04.0", "nvme0", "nvme0n2", "259:1");
    let ns = "devices/pci0000:00/0000:00:04.0/nvme/nvme0";
    // `size` counts 512-byte sectors whatever the LBA size.
    f.write(format!("{ns}/nvme0n1/size"), "2097152\n");
    f.write(format!("{ns}/nvme0n1/queue/zoned"), "none\n");
    f.write(format!("{ns}/nvme0n2/size"), "8388608\n");
    f.write(format!("{ns}/nvme0n2/queue/zoned"), "host-managed\n");
    let c = list_nvme_controllers(&f.roots()).unwrap();
    let b = &c[0].block_devices;
    assert_eq!(
        (b[0].size_bytes, b[0].zoned.as_deref()),
        (Some(1 << 30), None)
    );
    assert_eq!(
        (b[1].size_bytes, b[1].zoned.as_deref()),
        (Some(4 << 30), Some("host-managed"))
    );
    let t = format_table(&c, &HugepageStatus::default());
    assert!(t.contains("nvme0n1,nvme0n2 (host-managed)"), "{t}");
    f.write(format!("{ns}/nvme0n2/size"), "lots\n");
    let e = list_nvme_controllers(&f.roots()).unwrap_err().to_string();
    assert!(
        e.contains("nvme0n2/size") && e.contains("not a number"),
        "{e}"
    );
}
