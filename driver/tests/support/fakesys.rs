//! A builder of fake sysfs/procfs/dev trees for tests, shared by the library's unit
//! tests (`pci`, `vfio`) and the `setup.sh` integration test.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// What the kernel does when a device at `<sys>/devices/pci0000:00/<bdf>` is bound to
/// `driver`: the device's `driver` link and `bus/pci/drivers/<driver>/<bdf>`. Unbinds it
/// from its current driver first.
pub fn kernel_bind(sys: &Path, bdf: &str, driver: &str) {
    kernel_unbind(sys, bdf);
    let drv = sys.join("bus/pci/drivers").join(driver);
    fs::create_dir_all(&drv).unwrap();
    symlink(
        format!("../../../bus/pci/drivers/{driver}"),
        sys.join("devices/pci0000:00").join(bdf).join("driver"),
    )
    .unwrap();
    let _ = fs::remove_file(drv.join(bdf));
    symlink(
        format!("../../../../devices/pci0000:00/{bdf}"),
        drv.join(bdf),
    )
    .unwrap();
}

/// Undoes [`kernel_bind`]; returns the driver the device had.
pub fn kernel_unbind(sys: &Path, bdf: &str) -> Option<String> {
    let link = sys.join("devices/pci0000:00").join(bdf).join("driver");
    let old = fs::read_link(&link).ok()?;
    let name = old.file_name()?.to_string_lossy().into_owned();
    fs::remove_file(&link).unwrap();
    let _ = fs::remove_file(sys.join("bus/pci/drivers").join(&name).join(bdf));
    Some(name)
}

/// A fake `/sys` + `/proc` (+ `/dev`) in a temporary directory.
pub struct FakeSys {
    /// Holds the directory.
    pub dir: tempfile::TempDir,
}

impl FakeSys {
    /// The controller [`FakeSys::two_controllers`] leaves on the kernel's `nvme` driver.
    pub const ON_NVME: &'static str = "0000:01:00.0";
    /// The controller [`FakeSys::two_controllers`] leaves on `vfio-pci`.
    pub const ON_VFIO: &'static str = "0000:02:00.0";

    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for d in ["sys/bus/pci/devices", "sys/class/block", "proc", "dev/vfio"] {
            fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        fs::write(dir.path().join("proc/mounts"), "").unwrap();
        fs::write(
            dir.path().join("proc/swaps"),
            "Filename\tType\tSize\tUsed\tPriority\n",
        )
        .unwrap();
        FakeSys { dir }
    }
    pub fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }
    pub fn proc(&self) -> PathBuf {
        self.dir.path().join("proc")
    }
    pub fn dev(&self) -> PathBuf {
        self.dir.path().join("dev")
    }
    /// Writes a file below the sysfs root, creating its directories.
    pub fn write(&self, rel: impl AsRef<Path>, text: &str) {
        let p = self.sys().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    fn real_dir(&self, bdf: &str) -> PathBuf {
        self.sys().join("devices/pci0000:00").join(bdf)
    }
    /// A PCI device with its `bus/pci/devices` link.
    pub fn pci(&self, bdf: &str, class: u32, vendor: u16, device: u16) -> &Self {
        let d = self.real_dir(bdf);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("class"), format!("{class:#08x}\n")).unwrap();
        fs::write(d.join("vendor"), format!("{vendor:#06x}\n")).unwrap();
        fs::write(d.join("device"), format!("{device:#06x}\n")).unwrap();
        fs::write(d.join("numa_node"), "-1\n").unwrap();
        symlink(
            format!("../../../devices/pci0000:00/{bdf}"),
            self.sys().join("bus/pci/devices").join(bdf),
        )
        .unwrap();
        self
    }
    pub fn nvme(&self, bdf: &str) -> &Self {
        self.pci(bdf, 0x010802, 0x1b36, 0x0010)
    }
    /// The machine the `pci` discovery test and the `setup.sh` status and busybox tests
    /// start from (each adds what it checks on top), two NVMe controllers (QEMU's model,
    /// 1b36:0010):
    /// - [`Self::ON_NVME`] bound to `nvme`, in IOMMU group 3, on NUMA node 0, with one
    ///   namespace `nvme0n1` (259:0) holding one partition `nvme0n1p1`; nothing mounted,
    ///   used as swap or held;
    /// - [`Self::ON_VFIO`] bound to `vfio-pci`, in IOMMU group 4, no NUMA node, no block
    ///   device (and no `/dev/vfio/4` node).
    ///
    /// Adds to the tree as it is, so it goes on a prepared one too (`config_tree`).
    pub fn two_controllers(&self) -> &Self {
        let (a, b) = (Self::ON_NVME, Self::ON_VFIO);
        self.nvme(a)
            .bind(a, "nvme")
            .group(a, 3)
            .numa(a, 0)
            .namespace(a, "nvme0", "nvme0n1", "259:0")
            .partition(a, "nvme0", "nvme0n1", "nvme0n1p1");
        self.nvme(b).bind(b, "vfio-pci").group(b, 4)
    }
    pub fn numa(&self, bdf: &str, node: i32) -> &Self {
        fs::write(self.real_dir(bdf).join("numa_node"), format!("{node}\n")).unwrap();
        self
    }
    /// Binds a device to `driver`: its `driver` link and the driver's link to it, as
    /// the kernel makes them.
    pub fn bind(&self, bdf: &str, driver: &str) -> &Self {
        kernel_bind(&self.sys(), bdf, driver);
        self
    }
    /// Puts a device into IOMMU group `g`.
    pub fn group(&self, bdf: &str, g: u32) -> &Self {
        let gdir = self.sys().join("kernel/iommu_groups").join(g.to_string());
        fs::create_dir_all(gdir.join("devices")).unwrap();
        symlink(
            format!("../../../../devices/pci0000:00/{bdf}"),
            gdir.join("devices").join(bdf),
        )
        .unwrap();
        symlink(
            format!("../../../kernel/iommu_groups/{g}"),
            self.real_dir(bdf).join("iommu_group"),
        )
        .unwrap();
        self
    }
    /// A namespace block device `name` under controller `ctrl` (`nvme0`), listed in
    /// `class/block`.
    pub fn namespace(&self, bdf: &str, ctrl: &str, name: &str, devno: &str) -> &Self {
        let d = self.real_dir(bdf).join("nvme").join(ctrl).join(name);
        fs::create_dir_all(d.join("holders")).unwrap();
        fs::write(d.join("dev"), format!("{devno}\n")).unwrap();
        symlink(
            format!("../../devices/pci0000:00/{bdf}/nvme/{ctrl}/{name}"),
            self.sys().join("class/block").join(name),
        )
        .unwrap();
        self
    }
    pub fn partition(&self, bdf: &str, ctrl: &str, ns: &str, part: &str) -> &Self {
        let d = self
            .real_dir(bdf)
            .join("nvme")
            .join(ctrl)
            .join(ns)
            .join(part);
        fs::create_dir_all(d.join("holders")).unwrap();
        fs::write(d.join("partition"), "1\n").unwrap();
        self
    }
    /// Makes `holder` (e.g. `dm-0`) hold `rel` (a block dir below the device dir).
    pub fn holder(&self, bdf: &str, rel: &str, holder: &str, dm_name: Option<&str>) -> &Self {
        let d = self.real_dir(bdf).join("nvme").join(rel).join("holders");
        fs::create_dir_all(&d).unwrap();
        let hdir = self.sys().join("devices/virtual/block").join(holder);
        fs::create_dir_all(&hdir).unwrap();
        if let Some(n) = dm_name {
            self.write(format!("devices/virtual/block/{holder}/dm/name"), n);
            symlink(
                format!("../../devices/virtual/block/{holder}"),
                self.sys().join("class/block").join(holder),
            )
            .unwrap();
        }
        symlink(&hdir, d.join(holder)).unwrap();
        self
    }
    pub fn mount(&self, source: &str, mountpoint: &str) -> &Self {
        let p = self.proc().join("mounts");
        let mut s = fs::read_to_string(&p).unwrap();
        s.push_str(&format!("{source} {mountpoint} ext4 rw,relatime 0 0\n"));
        fs::write(p, s).unwrap();
        self
    }
    /// A mount known only by device number (a `self/mountinfo` line), as the root
    /// filesystem mounted from `/dev/root` is.
    pub fn mount_devno(&self, devno: &str, source: &str, mountpoint: &str) -> &Self {
        let p = self.proc().join("self/mountinfo");
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let mut s = fs::read_to_string(&p).unwrap_or_default();
        let id = 20 + s.lines().count();
        s.push_str(&format!(
            "{id} 1 {devno} / {mountpoint} rw,relatime shared:1 - ext4 {source} rw\n"
        ));
        fs::write(p, s).unwrap();
        self
    }
    /// Gives a partition (below the device dir's `nvme/`, like `nvme0/nvme0n1/nvme0n1p2`)
    /// its device number.
    pub fn devno(&self, bdf: &str, rel: &str, devno: &str) -> &Self {
        let d = self.real_dir(bdf).join("nvme").join(rel);
        fs::write(d.join("dev"), format!("{devno}\n")).unwrap();
        self
    }
    pub fn swap(&self, source: &str) -> &Self {
        let p = self.proc().join("swaps");
        let mut s = fs::read_to_string(&p).unwrap();
        s.push_str(&format!("{source}\tpartition\t1048572\t0\t-2\n"));
        fs::write(p, s).unwrap();
        self
    }
    pub fn hugepages(&self, node: Option<u32>, kib: u64, free: u64, total: u64) -> &Self {
        let base = match node {
            Some(n) => format!("devices/system/node/node{n}/hugepages"),
            None => "kernel/mm/hugepages".to_string(),
        };
        self.write(
            format!("{base}/hugepages-{kib}kB/free_hugepages"),
            &format!("{free}\n"),
        );
        self.write(
            format!("{base}/hugepages-{kib}kB/nr_hugepages"),
            &format!("{total}\n"),
        );
        self
    }
    /// A `/dev/vfio/<name>` node stand-in (a regular file).
    pub fn dev_vfio(&self, name: &str) -> &Self {
        fs::write(self.dev().join("vfio").join(name), "").unwrap();
        self
    }
}
