//! PCI discovery from sysfs: NVMe controllers, their IOMMU groups, drivers and block
//! devices, and the hugepage pools. Read-only, pure Rust, no `unsafe`.
//!
//! Everything is read below a sysfs root and a procfs root given by the caller
//! ([`SysRoots`]), so a service can use the real `/sys` and `/proc` and tests a fake tree.
//! `scripts/setup.sh status` reads the same files and prints the same table
//! ([`format_table`]); the two are compared by a test.
//!
//! Files read, relative to the sysfs root:
//! - `bus/pci/devices/<BDF>/{class,vendor,device,numa_node}`, and the `driver` and
//!   `iommu_group` links;
//! - `kernel/iommu_groups/<N>/devices/*`: the members of a group;
//! - `bus/pci/devices/<BDF>/nvme/nvme*/nvme*n*`: the namespaces' block devices (a
//!   multipath path device `nvmeXcYnZ` stands for its head `nvmeXnZ`, found in
//!   `class/block/`), their partitions (subdirectories with a `partition` file) and
//!   `holders/` (device mapper, md);
//! - `devices/system/node/node*/hugepages/hugepages-*kB/{nr,free}_hugepages`, or
//!   `kernel/mm/hugepages/` on a kernel without NUMA.
//!
//! And relative to the procfs root: `mounts`, `self/mountinfo` and `swaps`. A mount is
//! matched to a block device by its source (`/dev/nvme0n1p1` in `mounts`) and by device
//! number (`259:1` in `mountinfo` against the block device's sysfs `dev` file), so a root
//! filesystem mounted from `/dev/root` is found too.
//!
//! The hugepage pools are read in `hugepages`, the status table is drawn in `table`; both
//! are re-exported here.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

mod hugepages;
mod table;

pub use hugepages::hugepage_status;
pub use table::{format_table, status_table};

/// The PCI class code of an NVM Express I/O controller (mass storage, non-volatile
/// memory, NVMe programming interface).
pub const NVME_CLASS: u32 = 0x01_08_02;

/// Class code of a PCI-to-PCI bridge (base 0x06, subclass 0x04), any programming
/// interface. Bridges in an IOMMU group do not make it unviable.
const PCI_BRIDGE_CLASS: u32 = 0x06_04;

/// Errors of PCI discovery.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// A PCI address that does not parse.
    #[error("invalid pci address `{input}`: expected [domain:]bus:device.function in hex, like 0000:01:00.0 or 01:00.0")]
    InvalidBdf {
        /// What was given.
        input: String,
    },
    /// A sysfs or procfs file that exists but cannot be read or parsed.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The PCI device directory is missing altogether (no sysfs mounted?).
    #[error("{path} does not exist: is sysfs mounted (`mount -t sysfs sysfs /sys`)?")]
    NoPciBus {
        /// The directory looked for.
        path: PathBuf,
    },
}

pub use crate::parse::Bdf;

impl FromStr for Bdf {
    type Err = PciError;

    /// Parses `DDDD:BB:DD.F` or `BB:DD.F` (domain 0), hex, either case
    /// ([`crate::parse::parse_bdf`]).
    fn from_str(s: &str) -> Result<Self, PciError> {
        crate::parse::parse_bdf(s).map_err(|_| PciError::InvalidBdf {
            input: s.to_string(),
        })
    }
}

/// Where sysfs and procfs are: `/sys` and `/proc`, or a fake tree in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysRoots {
    /// The sysfs root (`/sys`).
    pub sysfs: PathBuf,
    /// The procfs root (`/proc`); `mounts` and `swaps` are read below it.
    pub proc: PathBuf,
}

impl Default for SysRoots {
    fn default() -> Self {
        SysRoots {
            sysfs: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
        }
    }
}

impl SysRoots {
    /// Roots at `sysfs` and `proc`.
    pub fn new(sysfs: impl Into<PathBuf>, proc: impl Into<PathBuf>) -> Self {
        SysRoots {
            sysfs: sysfs.into(),
            proc: proc.into(),
        }
    }

    /// The sysfs directory of a PCI device: `<sysfs>/bus/pci/devices/<BDF>`.
    pub fn pci_device_dir(&self, bdf: &Bdf) -> PathBuf {
        self.sysfs.join("bus/pci/devices").join(bdf.to_string())
    }
}

/// One way a block device is in use, which makes unbinding its controller unsafe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockUse {
    /// Mounted (from the mounts file).
    Mounted {
        /// The block device or partition (`nvme0n1p1`).
        dev: String,
        /// Where (`/boot`).
        mountpoint: String,
    },
    /// An active swap area (from the swaps file).
    Swap {
        /// The block device or partition.
        dev: String,
    },
    /// Held by another block device (device mapper/LVM, md RAID), from sysfs `holders/`.
    Held {
        /// The block device or partition.
        dev: String,
        /// The holder (`dm-0`).
        holder: String,
        /// The device-mapper name of the holder, when it has one (`vg0-root`).
        dm_name: Option<String>,
    },
}

impl fmt::Display for BlockUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockUse::Mounted { dev, mountpoint } => write!(f, "{dev} mounted on {mountpoint}"),
            BlockUse::Swap { dev } => write!(f, "{dev} used as swap"),
            BlockUse::Held {
                dev,
                holder,
                dm_name: Some(n),
            } => write!(f, "{dev} held by {holder} ({n})"),
            BlockUse::Held {
                dev,
                holder,
                dm_name: None,
            } => write!(f, "{dev} held by {holder}"),
        }
    }
}

/// A namespace's block device as the kernel's nvme driver exposes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    /// The block device (`nvme0n1`).
    pub name: String,
    /// Its partitions (`nvme0n1p1`, ...), sorted.
    pub partitions: Vec<String>,
    /// Everything that uses the device or one of its partitions.
    pub uses: Vec<BlockUse>,
    /// Its capacity in bytes (`size`, in 512-byte sectors whatever the LBA size), when
    /// sysfs says.
    pub size_bytes: Option<u64>,
    /// The kernel's zone model (`queue/zoned`: `host-managed` for a zoned namespace), when
    /// it is not `none`.
    pub zoned: Option<String>,
}

/// An NVMe controller found on the PCI bus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciNvmeController {
    /// Its address.
    pub bdf: Bdf,
    /// PCI vendor ID.
    pub vendor: u16,
    /// PCI device ID.
    pub device: u16,
    /// NUMA node, or `None` when the platform does not say (`numa_node` is -1).
    pub numa_node: Option<u32>,
    /// IOMMU group, or `None` when there is none (IOMMU off and not bound in noiommu mode).
    pub iommu_group: Option<u32>,
    /// The bound driver (`nvme`, `vfio-pci`), or `None`.
    pub driver: Option<String>,
    /// Block devices of its namespaces (only while bound to `nvme`), sorted by name.
    pub block_devices: Vec<BlockDevice>,
}

impl PciNvmeController {
    /// Every use of any of its block devices, in table order.
    pub fn uses(&self) -> impl Iterator<Item = &BlockUse> {
        self.block_devices.iter().flat_map(|b| b.uses.iter())
    }

    /// Whether any namespace is mounted, used as swap or held: unbinding it from `nvme`
    /// would pull a disk from under a user.
    pub fn in_use(&self) -> bool {
        self.uses().next().is_some()
    }
}

/// A member of an IOMMU group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMember {
    /// Its address.
    pub bdf: Bdf,
    /// Its bound driver, if any.
    pub driver: Option<String>,
    /// Its PCI class code (24 bits), when readable.
    pub class: Option<u32>,
}

impl GroupMember {
    /// Whether this member lets VFIO use the group: no driver, a vfio driver, `pci-stub`,
    /// or a PCI bridge (which the kernel tolerates whatever drives it).
    pub fn allows_vfio(&self) -> bool {
        match self.driver.as_deref() {
            None => true,
            Some(d) if d.starts_with("vfio") || d == "pci-stub" => true,
            Some(_) => self.class.is_some_and(|c| c >> 8 == PCI_BRIDGE_CLASS),
        }
    }
}

impl fmt::Display for GroupMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.driver {
            Some(d) => write!(f, "{} (driver {d})", self.bdf),
            None => write!(f, "{} (no driver)", self.bdf),
        }
    }
}

/// Free and total hugepages of one size on one NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HugepageCount {
    /// The node, or `None` on a kernel without NUMA (counts from `/sys/kernel/mm`).
    pub node: Option<u32>,
    /// Page size in KiB (2048, 1048576).
    pub page_kib: u64,
    /// Free pages.
    pub free: u64,
    /// Pages in the pool.
    pub total: u64,
}

/// Hugepage pools per NUMA node and page size, sorted by node then size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HugepageStatus {
    /// One entry per node and size.
    pub counts: Vec<HugepageCount>,
}

impl HugepageStatus {
    /// Free pages of `page_kib` on all nodes.
    pub fn free(&self, page_kib: u64) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.page_kib == page_kib)
            .map(|c| c.free)
            .sum()
    }
    /// Total pages of `page_kib` on all nodes.
    pub fn total(&self, page_kib: u64) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.page_kib == page_kib)
            .map(|c| c.total)
            .sum()
    }
}

fn read_err(path: &Path, e: impl fmt::Display) -> PciError {
    PciError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Reads a small sysfs file, trimmed. `Ok(None)` when it does not exist.
fn read_opt(path: &Path) -> Result<Option<String>, PciError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(read_err(path, e)),
    }
}

/// Parses `0x1b36`-style hex.
fn parse_hex(path: &Path, s: &str) -> Result<u32, PciError> {
    let t = s.strip_prefix("0x").unwrap_or(s);
    u32::from_str_radix(t, 16).map_err(|e| read_err(path, format!("`{s}` is not hex: {e}")))
}

fn read_hex(path: &Path) -> Result<Option<u32>, PciError> {
    read_opt(path)?.map(|s| parse_hex(path, &s)).transpose()
}

fn read_u64(path: &Path) -> Result<Option<u64>, PciError> {
    read_opt(path)?
        .map(|s| {
            s.parse::<u64>()
                .map_err(|e| read_err(path, format!("`{s}` is not a number: {e}")))
        })
        .transpose()
}

/// The last path component a symlink points to (`driver` -> `.../drivers/nvme` gives
/// `nvme`). `None` when the link does not exist.
fn link_name(path: &Path) -> Result<Option<String>, PciError> {
    match fs::read_link(path) {
        Ok(t) => Ok(t.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(read_err(path, e)),
    }
}

/// Names of the entries of a directory, sorted; empty when it does not exist.
fn dir_names(path: &Path) -> Result<Vec<String>, PciError> {
    let rd = match fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_err(path, e)),
    };
    let mut v = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| read_err(path, e))?;
        v.push(ent.file_name().to_string_lossy().into_owned());
    }
    v.sort();
    Ok(v)
}

/// The driver bound to a PCI device, from its sysfs `driver` link.
pub fn bound_driver(roots: &SysRoots, bdf: &Bdf) -> Result<Option<String>, PciError> {
    link_name(&roots.pci_device_dir(bdf).join("driver"))
}

/// The IOMMU group of a PCI device, from its sysfs `iommu_group` link. `None` when the
/// device has none: no IOMMU, and not bound to vfio-pci in noiommu mode.
pub fn iommu_group(roots: &SysRoots, bdf: &Bdf) -> Result<Option<u32>, PciError> {
    let path = roots.pci_device_dir(bdf).join("iommu_group");
    match link_name(&path)? {
        None => Ok(None),
        Some(n) => n
            .parse()
            .map(Some)
            .map_err(|_| read_err(&path, format!("link target `{n}` is not a group number"))),
    }
}

/// The PCI class code (24 bits) of a device.
pub fn class(roots: &SysRoots, bdf: &Bdf) -> Result<Option<u32>, PciError> {
    read_hex(&roots.pci_device_dir(bdf).join("class"))
}

/// The IOMMU units the kernel registered (`class/iommu/*`: `dmar0`, `ivhd0`, ...), sorted.
/// Empty when there is no IOMMU or it is off (`intel_iommu=off`, not enabled in firmware).
pub fn iommu_units(sysfs_root: &Path) -> Result<Vec<String>, PciError> {
    dir_names(&sysfs_root.join("class/iommu"))
}

/// The IOMMU groups there are (`kernel/iommu_groups/*`), sorted. With the IOMMU off only
/// the groups vfio made in noiommu mode exist.
pub fn iommu_groups(sysfs_root: &Path) -> Result<Vec<u32>, PciError> {
    let mut v: Vec<u32> = dir_names(&sysfs_root.join("kernel/iommu_groups"))?
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// The members of IOMMU group `group`, sorted by address.
pub fn group_members(roots: &SysRoots, group: u32) -> Result<Vec<GroupMember>, PciError> {
    let dir = roots
        .sysfs
        .join("kernel/iommu_groups")
        .join(group.to_string())
        .join("devices");
    let mut out = Vec::new();
    for name in dir_names(&dir)? {
        // Non-PCI members (rare: platform devices) cannot be named by a BDF; they are
        // reported by the kernel's viability check instead.
        let Ok(bdf) = name.parse::<Bdf>() else {
            continue;
        };
        out.push(GroupMember {
            bdf,
            driver: link_name(&dir.join(&name).join("driver"))?,
            class: read_hex(&dir.join(&name).join("class"))?,
        });
    }
    out.sort_by_key(|m| m.bdf);
    Ok(out)
}

/// Whether `name` is `nvme<N>n<M>` or `nvme<N>c<C>n<M>`; returns the block device it
/// stands for (the multipath head `nvme<N>n<M>` for a path device).
fn namespace_block_name(name: &str) -> Option<String> {
    let rest = name.strip_prefix("nvme")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (subsys, after) = rest.split_once(['c', 'n'])?;
    if !digits(subsys) {
        return None;
    }
    let nsid = if rest.as_bytes()[subsys.len()] == b'c' {
        let (ctrl, nsid) = after.split_once('n')?;
        if !digits(ctrl) {
            return None;
        }
        nsid
    } else {
        after
    };
    digits(nsid).then(|| format!("nvme{subsys}n{nsid}"))
}

/// Mount sources and swap areas, read once per listing.
struct Usage {
    /// (device basename, mountpoint), in mounts-file order.
    mounts: Vec<(String, String)>,
    /// (device number `major:minor`, mountpoint), in mountinfo order.
    mount_devnos: Vec<(String, String)>,
    /// Device basenames of swap areas.
    swaps: Vec<String>,
}

/// The block device name a mount source or swap file name refers to: the basename of
/// `/dev/...` after resolving symlinks (`/dev/mapper/x` -> `dm-0`) when that works.
fn dev_basename(source: &str) -> Option<String> {
    if !source.starts_with("/dev/") {
        return None;
    }
    let p = Path::new(source);
    let resolved = fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    resolved
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

impl Usage {
    fn read(roots: &SysRoots) -> Result<Usage, PciError> {
        let mut mounts = Vec::new();
        let mpath = roots.proc.join("mounts");
        if let Some(text) = read_opt(&mpath)? {
            for line in text.lines() {
                let mut f = line.split_whitespace();
                if let (Some(src), Some(mnt)) = (f.next(), f.next()) {
                    if let Some(dev) = dev_basename(src) {
                        mounts.push((dev, mnt.to_string()));
                    }
                }
            }
        }
        // mountinfo: "id parent major:minor root mountpoint options ... - type source ...".
        let mut mount_devnos = Vec::new();
        if let Some(text) = read_opt(&roots.proc.join("self/mountinfo"))? {
            for line in text.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if let (Some(devno), Some(mnt)) = (f.get(2), f.get(4)) {
                    mount_devnos.push((devno.to_string(), mnt.to_string()));
                }
            }
        }
        let mut swaps = Vec::new();
        let spath = roots.proc.join("swaps");
        if let Some(text) = read_opt(&spath)? {
            for line in text.lines().skip(1) {
                if let Some(dev) = line.split_whitespace().next().and_then(dev_basename) {
                    swaps.push(dev);
                }
            }
        }
        Ok(Usage {
            mounts,
            mount_devnos,
            swaps,
        })
    }

    /// The uses of one block device or partition whose sysfs directory is `dir`.
    fn of(&self, roots: &SysRoots, dev: &str, dir: &Path) -> Result<Vec<BlockUse>, PciError> {
        let mut v = Vec::new();
        for (d, m) in &self.mounts {
            if d == dev {
                v.push(BlockUse::Mounted {
                    dev: dev.to_string(),
                    mountpoint: m.clone(),
                });
            }
        }
        // The same mounts by device number, for sources that do not name the device
        // (`/dev/root`, a `/dev/disk/by-*` link that is gone); each mountpoint once.
        if let Some(devno) = read_opt(&dir.join("dev"))? {
            for (n, m) in &self.mount_devnos {
                let seen = v
                    .iter()
                    .any(|u| matches!(u, BlockUse::Mounted { mountpoint, .. } if mountpoint == m));
                if *n == devno && !seen {
                    v.push(BlockUse::Mounted {
                        dev: dev.to_string(),
                        mountpoint: m.clone(),
                    });
                }
            }
        }
        if self.swaps.iter().any(|s| s == dev) {
            v.push(BlockUse::Swap {
                dev: dev.to_string(),
            });
        }
        for holder in dir_names(&dir.join("holders"))? {
            let dm_name = read_opt(
                &roots
                    .sysfs
                    .join("class/block")
                    .join(&holder)
                    .join("dm/name"),
            )?;
            v.push(BlockUse::Held {
                dev: dev.to_string(),
                holder,
                dm_name,
            });
        }
        Ok(v)
    }
}

/// The block devices of the controller whose sysfs directory is `dev_dir`.
fn block_devices(
    roots: &SysRoots,
    dev_dir: &Path,
    usage: &Usage,
) -> Result<Vec<BlockDevice>, PciError> {
    let nvme_dir = dev_dir.join("nvme");
    let mut out: Vec<BlockDevice> = Vec::new();
    for ctrl in dir_names(&nvme_dir)? {
        if !ctrl.starts_with("nvme") {
            continue;
        }
        for entry in dir_names(&nvme_dir.join(&ctrl))? {
            let Some(name) = namespace_block_name(&entry) else {
                continue;
            };
            if out.iter().any(|b| b.name == name) {
                continue;
            }
            // The head of a multipath namespace lives elsewhere; class/block finds it.
            let by_class = roots.sysfs.join("class/block").join(&name);
            let dir = if by_class.exists() {
                by_class
            } else {
                nvme_dir.join(&ctrl).join(&entry)
            };
            let mut partitions = Vec::new();
            for sub in dir_names(&dir)? {
                if sub.starts_with(&name) && dir.join(&sub).join("partition").exists() {
                    partitions.push(sub);
                }
            }
            let mut uses = usage.of(roots, &name, &dir)?;
            for p in &partitions {
                uses.extend(usage.of(roots, p, &dir.join(p))?);
            }
            let size_bytes =
                read_u64(&dir.join("size"))?.map(|sectors| sectors.saturating_mul(512));
            let zoned =
                read_opt(&dir.join("queue/zoned"))?.filter(|z| z != "none" && !z.is_empty());
            out.push(BlockDevice {
                name,
                partitions,
                uses,
                size_bytes,
                zoned,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Reads what sysfs says about one PCI device, whatever its class.
pub fn read_controller(roots: &SysRoots, bdf: &Bdf) -> Result<PciNvmeController, PciError> {
    let usage = Usage::read(roots)?;
    read_controller_with(roots, bdf, &usage)
}

fn read_controller_with(
    roots: &SysRoots,
    bdf: &Bdf,
    usage: &Usage,
) -> Result<PciNvmeController, PciError> {
    let dir = roots.pci_device_dir(bdf);
    let id = |f: &str| -> Result<u16, PciError> {
        let p = dir.join(f);
        let v = read_hex(&p)?.ok_or_else(|| read_err(&p, "missing"))?;
        u16::try_from(v).map_err(|_| read_err(&p, format!("{v:#x} is not a 16-bit id")))
    };
    let numa_path = dir.join("numa_node");
    let numa_node = match read_opt(&numa_path)? {
        None => None,
        Some(s) => {
            let n: i64 = s
                .parse()
                .map_err(|e| read_err(&numa_path, format!("`{s}`: {e}")))?;
            u32::try_from(n).ok()
        }
    };
    Ok(PciNvmeController {
        bdf: *bdf,
        vendor: id("vendor")?,
        device: id("device")?,
        numa_node,
        iommu_group: iommu_group(roots, bdf)?,
        driver: bound_driver(roots, bdf)?,
        block_devices: block_devices(roots, &dir, usage)?,
    })
}

/// The addresses of the NVMe controllers (PCI class 0x010802) under
/// `<sysfs_root>/bus/pci/devices`, sorted.
pub fn nvme_bdfs(sysfs_root: &Path) -> Result<Vec<Bdf>, PciError> {
    let roots = SysRoots::new(sysfs_root, "/proc");
    let devdir = sysfs_root.join("bus/pci/devices");
    if !devdir.is_dir() {
        return Err(PciError::NoPciBus { path: devdir });
    }
    let mut out = Vec::new();
    for name in dir_names(&devdir)? {
        let Ok(bdf) = name.parse::<Bdf>() else {
            continue;
        };
        if class(&roots, &bdf)? == Some(NVME_CLASS) {
            out.push(bdf);
        }
    }
    out.sort();
    Ok(out)
}

/// Every NVMe controller (PCI class 0x010802) under `<sysfs>/bus/pci/devices`, sorted by
/// address, with its driver, IOMMU group and the block devices of its namespaces.
pub fn list_nvme_controllers(roots: &SysRoots) -> Result<Vec<PciNvmeController>, PciError> {
    let bdfs = nvme_bdfs(&roots.sysfs)?;
    let usage = Usage::read(roots)?;
    bdfs.iter()
        .map(|b| read_controller_with(roots, b, &usage))
        .collect()
}

#[cfg(test)]
#[path = "../../../tests/support/fakesys.rs"]
pub(crate) mod fake;

#[cfg(test)]
mod tests;
