//! `kestrel doctor`: can this machine run Kestrel on an NVMe device, and if not, what
//! exactly to do. Reads sysfs, procfs and `/dev` only: it never changes anything and needs
//! no root.
//!
//! Every file is read below one root (`/` by default; the hidden `--root DIR` or
//! `KESTREL_SYSROOT=DIR` point it at a fake tree): `sys/`, `proc/`, `dev/` and
//! `etc/passwd`. The current process is described by `proc/self/status` (uid, gids,
//! capabilities) and `proc/self/limits` (RLIMIT_MEMLOCK), so a fake tree can play any user.
//!
//! Exit status: 0 when a controller is ready for `kestrel perf --target pci:BDF` (the one
//! named by `--target`, or any), 1 when something is missing (each `✗` line says how to
//! fix it), 2 for a usage error.

use std::fmt;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use kestrel::hw::pci::{self, Bdf, GroupMember, PciNvmeController, SysRoots};
use serde::Serialize;

use crate::cli::DoctorArgs;
use crate::error::{AppError, Result};
use crate::units::{human_bytes, print_json};

/// Hugepage bytes (2 MiB pages, free) and locked-memory bytes doctor asks for, for
/// `kestrel perf` on one controller. With perf's defaults (one core, `-q 32`, `-o 4k`) the
/// DMA pool maps one 2 MiB region (measured on the emulator: bring-up, one queue pair and
/// the buffers); 16 MiB leaves room for a few cores or deeper queues. It grows by about
/// queue depth × I/O size per queue pair (`-q 128 -o 128k` maps 18 MiB); docs/doctor.md.
pub const PERF_DMA_BYTES: u64 = 16 << 20;

/// Capability bits of `CapEff` (linux/capability.h).
const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_RAWIO: u32 = 17;
const CAP_SYS_ADMIN: u32 = 21;

/// The verdict of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mark {
    /// Fine.
    Ok,
    /// Works, but worth knowing (does not change the exit status).
    Warn,
    /// Missing: `kestrel perf` on a device cannot run until it is fixed.
    Fail,
    /// A fact, no verdict.
    Info,
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mark::Ok => "✓",
            Mark::Warn => "⚠",
            Mark::Fail => "✗",
            Mark::Info => "·",
        })
    }
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Stable name: `kernel`, `iommu`, `vfio`, `vfio_pci`, `vfio_iommu_type1`, `noiommu`,
    /// `vfio_container`, `controller`, `hugepages`, `hugetlbfs`, `memlock`, `user`,
    /// `cpus`, `tsc`, `perf`.
    pub id: &'static str,
    /// The controller a `controller` check is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bdf: Option<String>,
    /// Verdict.
    pub status: Mark,
    /// What was checked and found, one line.
    pub summary: String,
    /// Further facts, one per line.
    pub details: Vec<String>,
    /// The exact command or change that fixes it (every `fail` and `warn` has one).
    pub fix: Option<String>,
}

impl Check {
    fn new(id: &'static str, status: Mark, summary: impl Into<String>) -> Self {
        Check {
            id,
            bdf: None,
            status,
            summary: summary.into(),
            details: Vec::new(),
            fix: None,
        }
    }
    fn fix(mut self, f: impl Into<String>) -> Self {
        self.fix = Some(f.into());
        self
    }
    fn detail(mut self, d: impl Into<String>) -> Self {
        self.details.push(d.into());
        self
    }
    fn title(&self) -> String {
        match &self.bdf {
            Some(b) => format!("controller {b}"),
            None => self.id.replace('_', "-"),
        }
    }
}

/// The whole report (`kestrel doctor --json`).
#[derive(Debug, Serialize)]
pub struct Report {
    /// Whether `kestrel perf` can run on a device: on `ready_controllers[0]`.
    pub ready: bool,
    /// The exit status `kestrel doctor` gives (0 ready, 1 something missing).
    pub exit_status: u8,
    /// Controllers `kestrel perf --target pci:BDF` can open now.
    pub ready_controllers: Vec<String>,
    /// The command that would run, when ready.
    pub perf_command: Option<String>,
    /// Every check, in report order.
    pub checks: Vec<Check>,
}

/// Where to read from.
#[derive(Clone, Debug)]
pub struct Machine {
    /// The root the others hang off (`/`).
    pub root: PathBuf,
    /// `<root>/sys`.
    pub sysfs: PathBuf,
    /// `<root>/proc`.
    pub proc: PathBuf,
    /// `<root>/dev`.
    pub dev: PathBuf,
}

impl Machine {
    /// The machine below `root` (`/` for this one).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Machine {
            sysfs: root.join("sys"),
            proc: root.join("proc"),
            dev: root.join("dev"),
            root,
        }
    }
    fn roots(&self) -> SysRoots {
        SysRoots::new(&self.sysfs, &self.proc)
    }
    fn read(&self, p: &Path) -> Option<String> {
        fs::read_to_string(p).ok()
    }
}

/// Who is asking: from `proc/self/status`.
#[derive(Clone, Debug, Default)]
struct Identity {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    cap_eff: u64,
    name: String,
}

impl Identity {
    fn read(m: &Machine) -> Identity {
        let mut id = Identity::default();
        let status = m.read(&m.proc.join("self/status")).unwrap_or_default();
        for line in status.lines() {
            let (k, v) = line.split_once(':').unwrap_or((line, ""));
            let mut nums = v.split_whitespace();
            match k {
                // Real, effective, saved, filesystem: the effective one decides.
                "Uid" => id.uid = nums.nth(1).and_then(|x| x.parse().ok()).unwrap_or(0),
                "Gid" => id.gid = nums.nth(1).and_then(|x| x.parse().ok()).unwrap_or(0),
                "Groups" => id.groups = nums.filter_map(|x| x.parse().ok()).collect(),
                "CapEff" => id.cap_eff = u64::from_str_radix(v.trim(), 16).unwrap_or(0),
                _ => {}
            }
        }
        let passwd = m.read(&m.root.join("etc/passwd")).unwrap_or_default();
        id.name = passwd
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2].parse() == Ok(id.uid)).then(|| f[0].to_string())
            })
            // limits.conf wants a name; say where it goes when there is none.
            .unwrap_or_else(|| format!("<user of uid {}>", id.uid));
        id
    }
    fn has_cap(&self, bit: u32) -> bool {
        self.cap_eff & (1 << bit) != 0
    }
    fn is_root(&self) -> bool {
        self.uid == 0
    }
    /// Whether this identity may open `p` for reading and writing, from its owner, group
    /// and mode (root, or CAP_DAC_OVERRIDE, may always).
    fn can_rw(&self, md: &fs::Metadata) -> bool {
        if self.has_cap(CAP_DAC_OVERRIDE) {
            return true;
        }
        let mode = md.mode();
        let bits = if md.uid() == self.uid {
            mode >> 6
        } else if md.gid() == self.gid || self.groups.contains(&md.gid()) {
            mode >> 3
        } else {
            mode
        };
        bits & 0o6 == 0o6
    }
}

/// `RLIMIT_MEMLOCK` from `proc/self/limits`: (soft, hard), `None` = unlimited.
fn memlock_limits(m: &Machine) -> Option<(Option<u64>, Option<u64>)> {
    let text = m.read(&m.proc.join("self/limits"))?;
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let mut f = line["Max locked memory".len()..].split_whitespace();
    let parse = |s: Option<&str>| -> Option<Option<u64>> {
        match s? {
            "unlimited" => Some(None),
            n => n.parse().ok().map(Some),
        }
    };
    Some((parse(f.next())?, parse(f.next())?))
}

fn limit_text(l: Option<u64>) -> String {
    l.map_or_else(|| "unlimited".to_string(), human_bytes)
}

/// Parses a CPU list like `0-3,8,10-11` (sysfs `online`, `isolated`, `nohz_full`, and
/// the kernel parameters). Empty or unparsable: none.
fn cpu_list(s: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for part in s.trim().split(',') {
        let part = part.split(':').next().unwrap_or(""); // "2-7:2/8" group syntax
        if let Some((a, b)) = part.split_once('-') {
            if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                if a <= b && b - a < 65536 {
                    v.extend(a..=b);
                }
            }
        } else if let Ok(a) = part.parse() {
            v.push(a);
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The value of `name=` on the kernel command line.
fn cmdline_param<'a>(cmdline: &'a str, name: &str) -> Option<&'a str> {
    cmdline
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .next_back()
}

/// A PCI class code in words, for the members of an IOMMU group.
fn class_name(class: Option<u32>) -> &'static str {
    match class.map(|c| c >> 16) {
        Some(0x01) => "storage controller",
        Some(0x02) => "network controller",
        Some(0x03) => "display controller",
        Some(0x04) => "multimedia controller",
        Some(0x06) => "bridge",
        Some(0x0c) => "serial bus controller (USB, SMBus)",
        Some(_) => "device",
        None => "device of unknown class",
    }
}

/// Everything doctor learns about the machine before it judges.
struct Facts {
    id: Identity,
    cmdline: String,
    cpu_vendor: Option<String>,
    cpu_flags: Vec<String>,
    iommu_units: Vec<String>,
    iommu_groups: Vec<u32>,
    noiommu_param: Option<String>,
    controllers: Vec<PciNvmeController>,
    errors: Vec<String>,
}

impl Facts {
    fn gather(m: &Machine) -> Facts {
        let mut errors = Vec::new();
        let cmdline = m
            .read(&m.proc.join("cmdline"))
            .unwrap_or_default()
            .trim()
            .to_string();
        let cpuinfo = m.read(&m.proc.join("cpuinfo")).unwrap_or_default();
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let cpu_vendor = field("vendor_id");
        let cpu_flags = field("flags")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        fn note<T: Default>(
            errors: &mut Vec<String>,
            r: std::result::Result<T, pci::PciError>,
        ) -> T {
            r.unwrap_or_else(|e| {
                errors.push(e.to_string());
                T::default()
            })
        }
        let iommu_units = note(&mut errors, pci::iommu_units(&m.sysfs));
        let iommu_groups = note(&mut errors, pci::iommu_groups(&m.sysfs));
        let controllers = note(&mut errors, pci::list_nvme_controllers(&m.roots()));
        let noiommu_param = m
            .read(
                &m.sysfs
                    .join("module/vfio/parameters/enable_unsafe_noiommu_mode"),
            )
            .map(|s| s.trim().to_string());
        Facts {
            id: Identity::read(m),
            cmdline,
            cpu_vendor,
            cpu_flags,
            iommu_units,
            iommu_groups,
            noiommu_param,
            controllers,
            errors,
        }
    }
    fn iommu_on(&self) -> bool {
        !self.iommu_units.is_empty()
    }
    fn noiommu_on(&self) -> bool {
        matches!(self.noiommu_param.as_deref(), Some("Y" | "1"))
    }
    /// The kernel parameter that turns the IOMMU on for this CPU.
    fn iommu_param(&self) -> &'static str {
        match self.cpu_vendor.as_deref() {
            Some("AuthenticAMD" | "HygonGenuine") => "amd_iommu=on",
            Some("GenuineIntel") => "intel_iommu=on",
            _ => "intel_iommu=on (Intel) or amd_iommu=on (AMD)",
        }
    }
}

fn grub_fix(param: &str) -> String {
    format!(
        "add {param} to GRUB_CMDLINE_LINUX in /etc/default/grub, run 'sudo update-grub' (or 'sudo grub2-mkconfig -o /boot/grub2/grub.cfg') and reboot"
    )
}

fn check_kernel(m: &Machine, f: &Facts) -> Check {
    let release = m
        .read(&m.proc.join("sys/kernel/osrelease"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let wanted = [
        "intel_iommu",
        "amd_iommu",
        "iommu",
        "iommu.passthrough",
        "vfio.enable_unsafe_noiommu_mode",
        "isolcpus",
        "nohz_full",
        "rcu_nocbs",
        "hugepagesz",
        "hugepages",
        "default_hugepagesz",
    ];
    let relevant: Vec<&str> = f
        .cmdline
        .split_whitespace()
        .filter(|w| wanted.contains(&w.split('=').next().unwrap_or("")))
        .collect();
    Check::new("kernel", Mark::Info, format!("Linux {release}")).detail(format!(
        "command line: {} (relevant: {})",
        if f.cmdline.is_empty() {
            "unreadable"
        } else {
            &f.cmdline
        },
        if relevant.is_empty() {
            "none".to_string()
        } else {
            relevant.join(" ")
        }
    ))
}

fn check_iommu(f: &Facts) -> Check {
    let param = f.iommu_param();
    let off_param = ["intel_iommu", "amd_iommu"].iter().find_map(|k| {
        cmdline_param(&f.cmdline, k)
            .filter(|v| v.contains("off"))
            .map(|v| format!("{k}={v}"))
    });
    if f.iommu_on() {
        let mut c = Check::new(
            "iommu",
            Mark::Ok,
            format!(
                "on ({}; IOMMU groups: {})",
                f.iommu_units.join(", "),
                f.iommu_groups.len()
            ),
        );
        if let Some(p) = ["intel_iommu", "amd_iommu"]
            .iter()
            .find_map(|k| cmdline_param(&f.cmdline, k).map(|v| format!("{k}={v}")))
        {
            c = c.detail(format!("kernel command line: {p}"));
        } else {
            c = c.detail("kernel command line: no intel_iommu/amd_iommu (on by default here)");
        }
        return c;
    }
    let mut c = if f.noiommu_on() {
        Check::new(
            "iommu",
            Mark::Warn,
            "off: the kernel registered no IOMMU (/sys/class/iommu is empty); vfio runs in the unsafe noiommu mode",
        )
    } else {
        Check::new(
            "iommu",
            Mark::Fail,
            "off: the kernel registered no IOMMU (/sys/class/iommu is empty)",
        )
    };
    c = match &off_param {
        Some(p) => c.detail(format!("the kernel command line turns it off: {p}")),
        None => c.detail(format!("the kernel command line has no {param}")),
    };
    c.fix(format!(
        "enable VT-d / AMD-Vi in the firmware, {}; or, on a machine without an IOMMU and for a device you trust, vfio's unsafe noiommu mode as root: sudo NOIOMMU=1 PCI_ALLOWED=<BDF> scripts/setup.sh config, then kestrel perf --noiommu",
        grub_fix(param)
    ))
}

fn check_modules(m: &Machine, f: &Facts) -> Vec<Check> {
    let present = |p: &str| m.sysfs.join(p).exists();
    let mut v = Vec::new();
    let vfio = present("module/vfio") || m.dev.join("vfio/vfio").exists();
    v.push(if vfio {
        Check::new("vfio", Mark::Ok, "loaded")
    } else {
        Check::new("vfio", Mark::Fail, "not loaded (no /sys/module/vfio)")
            .fix("sudo modprobe vfio-pci (it loads vfio), or sudo scripts/setup.sh config")
    });
    v.push(if present("bus/pci/drivers/vfio-pci") {
        Check::new("vfio_pci", Mark::Ok, "loaded (driver vfio-pci registered)")
    } else {
        Check::new(
            "vfio_pci",
            Mark::Fail,
            "not loaded (no /sys/bus/pci/drivers/vfio-pci)",
        )
        .fix("sudo modprobe vfio-pci, or sudo scripts/setup.sh config")
    });
    let type1 = present("module/vfio_iommu_type1");
    v.push(match (type1, f.iommu_on()) {
        (true, _) => Check::new("vfio_iommu_type1", Mark::Ok, "loaded"),
        (false, true) => Check::new(
            "vfio_iommu_type1",
            Mark::Fail,
            "not loaded: vfio cannot use the IOMMU",
        )
        .fix("sudo modprobe vfio_iommu_type1, or sudo scripts/setup.sh config"),
        (false, false) => Check::new(
            "vfio_iommu_type1",
            Mark::Info,
            "not loaded (not needed without an IOMMU)",
        ),
    });
    v
}

fn check_noiommu(f: &Facts) -> Check {
    match (f.noiommu_param.as_deref(), f.iommu_on()) {
        (None, true) => Check::new("noiommu", Mark::Ok, "not available (not needed: the IOMMU is on)"),
        (Some(_), true) if !f.noiommu_on() => Check::new("noiommu", Mark::Ok, "off"),
        (Some(_), true) => Check::new(
            "noiommu",
            Mark::Warn,
            "ON although the IOMMU is on: devices bound to vfio-pci now may get no DMA protection",
        )
        .fix("echo N | sudo tee /sys/module/vfio/parameters/enable_unsafe_noiommu_mode (before binding)"),
        (None, false) => Check::new(
            "noiommu",
            Mark::Info,
            "not available: vfio is not loaded, or this kernel has no CONFIG_VFIO_NOIOMMU",
        )
        .detail("without an IOMMU, noiommu mode is the only way to run on a device"),
        (Some(_), false) if f.noiommu_on() => Check::new(
            "noiommu",
            Mark::Warn,
            "on: the unsafe mode (no IOMMU: a device can read and write all memory); root only, kestrel perf --noiommu",
        )
        .fix("enable the IOMMU to run safely and without root (see the iommu line)"),
        (Some(_), false) => Check::new(
            "noiommu",
            Mark::Info,
            "off (vfio supports it: sudo NOIOMMU=1 scripts/setup.sh config turns it on, unsafely)",
        ),
    }
}

/// Every node in `/dev/vfio` but the container: owner, group, mode, and whether this user
/// can open it.
fn vfio_nodes(m: &Machine, f: &Facts) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(m.dev.join("vfio"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "vfio")
        .collect();
    names.sort();
    names
        .iter()
        .filter_map(|n| {
            let md = fs::metadata(m.dev.join("vfio").join(n)).ok()?;
            let open = if n.starts_with("noiommu-") {
                f.id.has_cap(CAP_SYS_RAWIO) && f.id.can_rw(&md)
            } else {
                f.id.can_rw(&md)
            };
            Some(format!(
                "/dev/vfio/{n}: owner {}, group {}, mode {:o}, {}",
                md.uid(),
                md.gid(),
                md.mode() & 0o7777,
                if open {
                    "opens for this user"
                } else {
                    "does not open for this user"
                }
            ))
        })
        .collect()
}

/// The vfio container node, and whether this user can open it; the group nodes as details.
fn check_container(m: &Machine, f: &Facts) -> Check {
    let mut c = container(m, f);
    c.details.extend(vfio_nodes(m, f));
    c
}

fn container(m: &Machine, f: &Facts) -> Check {
    let p = m.dev.join("vfio/vfio");
    match fs::metadata(&p) {
        Err(_) => Check::new(
            "vfio_container",
            Mark::Fail,
            format!("{} does not exist", p.display()),
        )
        .fix("load vfio (sudo modprobe vfio-pci); if it is loaded, mount devtmpfs on /dev"),
        Ok(md) if f.id.can_rw(&md) => Check::new(
            "vfio_container",
            Mark::Ok,
            format!(
                "{} mode {:o}, open for reading and writing",
                p.display(),
                md.mode() & 0o7777
            ),
        ),
        Ok(md) => Check::new(
            "vfio_container",
            Mark::Fail,
            format!(
                "{} (owner {}, group {}, mode {:o}) cannot be opened read-write by uid {}",
                p.display(),
                md.uid(),
                md.gid(),
                md.mode() & 0o7777,
                f.id.uid
            ),
        )
        .fix(format!("sudo chmod 0666 {} (its normal mode)", p.display())),
    }
}

/// One NVMe controller; `true` in the result when it is ready for perf.
fn check_controller(m: &Machine, f: &Facts, c: &PciNvmeController) -> (Check, bool) {
    let bdf = c.bdf.to_string();
    let driver = c.driver.clone().unwrap_or_else(|| "no driver".into());
    let numa = c
        .numa_node
        .map_or_else(|| "no NUMA node".to_string(), |n| format!("NUMA node {n}"));
    let blocks: Vec<&str> = c.block_devices.iter().map(|b| b.name.as_str()).collect();
    let mut details = Vec::new();
    details.push(format!(
        "{:04x}:{:04x}, driver {driver}, {numa}, IOMMU group {}, block devices: {}",
        c.vendor,
        c.device,
        c.iommu_group
            .map_or_else(|| "none".to_string(), |g| g.to_string()),
        if blocks.is_empty() {
            "none".to_string()
        } else {
            blocks.join(", ")
        }
    ));
    let members: Vec<GroupMember> = c
        .iommu_group
        .and_then(|g| pci::group_members(&m.roots(), g).ok())
        .unwrap_or_default()
        .into_iter()
        .filter(|x| x.bdf != c.bdf)
        .collect();
    if c.iommu_group.is_some() {
        if members.is_empty() {
            details.push("alone in its IOMMU group".into());
        } else {
            let list: Vec<String> = members
                .iter()
                .map(|x| format!("{x}, {}", class_name(x.class)))
                .collect();
            details.push(format!("shares its IOMMU group with: {}", list.join("; ")));
        }
    }
    let uses: Vec<String> = c.uses().map(|u| u.to_string()).collect();
    let mk = |mark, summary: String| {
        let mut ch = Check::new("controller", mark, summary);
        ch.bdf = Some(bdf.clone());
        ch.details = details.clone();
        ch
    };
    if !uses.is_empty() {
        let root = c
            .uses()
            .any(|u| matches!(u, pci::BlockUse::Mounted { mountpoint, .. } if mountpoint == "/"));
        let what = if root {
            "holds the root filesystem"
        } else {
            "is in use"
        };
        return (
            mk(Mark::Warn, format!("{what}: {}; Kestrel must not take it", uses.join(", ")))
                .fix("none for this one (setup.sh refuses it): use another controller, or unmount / swapoff / remove the holder first"),
            false,
        );
    }
    let blocking: Vec<&GroupMember> = members.iter().filter(|x| !x.allows_vfio()).collect();
    if !blocking.is_empty() {
        let names: Vec<String> = blocking
            .iter()
            .map(|x| {
                format!(
                    "{} ({}, {})",
                    x.bdf,
                    x.driver.as_deref().unwrap_or("no driver"),
                    class_name(x.class)
                )
            })
            .collect();
        let unbind: Vec<String> = blocking
            .iter()
            .map(|x| {
                format!(
                    "echo {0} | sudo tee /sys/bus/pci/devices/{0}/driver/unbind",
                    x.bdf
                )
            })
            .collect();
        return (
            mk(
                Mark::Fail,
                format!(
                    "IOMMU group {} is not viable: it also holds {}, on a host driver; VFIO hands out whole groups",
                    c.iommu_group.unwrap_or_default(),
                    names.join(", ")
                ),
            )
            .fix(format!(
                "give up those devices too ({}; they stop working for the host), or move the controller to a slot with its own IOMMU group (one behind an ACS-capable port)",
                unbind.join("; ")
            )),
            false,
        );
    }
    if c.driver.as_deref() != Some("vfio-pci") {
        if c.iommu_group.is_none() && !f.noiommu_on() {
            return (
                mk(
                    Mark::Fail,
                    format!("on {driver}, and in no IOMMU group (the IOMMU is off)"),
                )
                .fix(
                    "turn the IOMMU on (see the iommu line), then: sudo PCI_ALLOWED=".to_string()
                        + &bdf
                        + " scripts/setup.sh config",
                ),
                false,
            );
        }
        let noiommu = if f.iommu_on() { "" } else { "NOIOMMU=1 " };
        return (
            mk(Mark::Fail, format!("on {driver}, not on vfio-pci")).fix(format!(
                "sudo {noiommu}PCI_ALLOWED={bdf} scripts/setup.sh config"
            )),
            false,
        );
    }
    // Bound to vfio-pci: the group node.
    let Some(group) = c.iommu_group else {
        return (
            mk(Mark::Fail, "on vfio-pci but in no IOMMU group".into()).fix(format!(
                "sudo scripts/setup.sh reset; then sudo PCI_ALLOWED={bdf} scripts/setup.sh config"
            )),
            false,
        );
    };
    let plain = m.dev.join(format!("vfio/{group}"));
    let noiommu_node = m.dev.join(format!("vfio/noiommu-{group}"));
    let (node, is_noiommu) = if noiommu_node.exists() {
        (noiommu_node, true)
    } else {
        (plain, false)
    };
    let md = match fs::metadata(&node) {
        Ok(md) => md,
        Err(_) => {
            return (
                mk(
                    Mark::Fail,
                    format!("on vfio-pci, but {} does not exist", node.display()),
                )
                .fix("mount devtmpfs on /dev (mount -t devtmpfs devtmpfs /dev)"),
                false,
            )
        }
    };
    let node_desc = format!(
        "{} (owner {}, group {}, mode {:o}{})",
        node.display(),
        md.uid(),
        md.gid(),
        md.mode() & 0o7777,
        if md.file_type().is_char_device() {
            ""
        } else {
            ", not a device node"
        }
    );
    if is_noiommu {
        if !f.id.has_cap(CAP_SYS_RAWIO) || !f.id.has_cap(CAP_SYS_ADMIN) {
            return (
                mk(Mark::Fail, format!("on vfio-pci in a noiommu group ({node_desc}): opening it needs CAP_SYS_RAWIO and CAP_SYS_ADMIN"))
                    .fix("run kestrel as root (sudo kestrel perf --noiommu ...), or enable the IOMMU to run without root"),
                false,
            );
        }
        return (
            mk(
                Mark::Ok,
                format!(
                    "ready in noiommu mode: {node_desc}; kestrel perf --noiommu --target pci:{bdf}"
                ),
            ),
            true,
        );
    }
    if !f.id.can_rw(&md) {
        return (
            mk(Mark::Fail, format!("on vfio-pci, but {node_desc} cannot be opened by uid {}", f.id.uid))
                .fix(format!("sudo TARGET_USER={} PCI_ALLOWED={bdf} scripts/setup.sh config (or sudo chown {} {})", f.id.name, f.id.name, node.display())),
            false,
        );
    }
    (
        mk(
            Mark::Ok,
            format!("ready: on vfio-pci, {node_desc} opens for uid {}", f.id.uid),
        ),
        true,
    )
}

fn check_hugepages(m: &Machine, f: &Facts) -> Check {
    let need_pages = PERF_DMA_BYTES / (2 << 20);
    let huge = match pci::hugepage_status(&m.sysfs) {
        Ok(h) => h,
        Err(e) => {
            return Check::new(
                "hugepages",
                Mark::Fail,
                format!("cannot read the pools: {e}"),
            )
            .fix("mount sysfs on /sys")
        }
    };
    if huge.counts.is_empty() {
        return Check::new(
            "hugepages",
            Mark::Fail,
            "none: this kernel has no hugetlb support",
        )
        .fix("use a kernel built with CONFIG_HUGETLBFS");
    }
    let mut c = Check::new("hugepages", Mark::Ok, "");
    for h in &huge.counts {
        c.details.push(format!(
            "{} {} kB: {} free of {}",
            h.node
                .map_or_else(|| "all nodes".to_string(), |n| format!("node{n}")),
            h.page_kib,
            h.free,
            h.total
        ));
    }
    let (free, total) = (huge.free(2048), huge.total(2048));
    // The pool to have: what others use now, plus perf's need; at least setup.sh's
    // default of 2 GiB.
    let pages = (total.saturating_sub(free) + need_pages).max(1024);
    let fix = format!(
        "sudo HUGEMEM={} scripts/setup.sh config (or: echo {pages} | sudo tee /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)",
        pages * 2
    );
    if total == 0 {
        c.status = Mark::Fail;
        c.summary = format!(
            "no 2 MiB hugepages: kestrel perf on a device needs at least {need_pages} free ({})",
            human_bytes(PERF_DMA_BYTES)
        );
        return c.fix(fix);
    }
    if free < need_pages {
        c.status = Mark::Fail;
        c.summary = format!("{free} of {total} 2 MiB hugepages free: kestrel perf on a device needs at least {need_pages}");
        return c.fix(fix);
    }
    c.summary = format!(
        "{free} of {total} 2 MiB hugepages free ({}; perf needs {} with its defaults)",
        human_bytes(free * (2 << 20)),
        need_pages
    );
    // Memory on the controllers' NUMA nodes?
    for ctrl in &f.controllers {
        if let Some(n) = ctrl.numa_node {
            let local = huge
                .counts
                .iter()
                .any(|h| h.node == Some(n) && h.page_kib == 2048 && h.free >= need_pages);
            let per_node = huge.counts.iter().any(|h| h.node.is_some());
            if per_node && !local && ctrl.driver.as_deref() == Some("vfio-pci") {
                c.status = Mark::Warn;
                c.details.push(format!(
                    "{} is on NUMA node {n}, which has fewer than {need_pages} free 2 MiB pages: its DMA memory will be remote",
                    ctrl.bdf
                ));
                c.fix = Some(format!(
                    "echo {} | sudo tee /sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/nr_hugepages, and run perf on that node's cores",
                    need_pages.max(512)
                ));
            }
        }
    }
    c
}

fn check_hugetlbfs(m: &Machine) -> Check {
    let mounts = m.read(&m.proc.join("mounts")).unwrap_or_default();
    let found: Vec<String> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3 && f[2] == "hugetlbfs").then(|| format!("{} ({})", f[1], f[3]))
        })
        .collect();
    if found.is_empty() {
        Check::new(
            "hugetlbfs",
            Mark::Info,
            "not mounted (Kestrel does not need it: it maps hugepages with MAP_HUGETLB)",
        )
    } else {
        Check::new(
            "hugetlbfs",
            Mark::Info,
            format!("mounted at {} (not needed by Kestrel)", found.join(", ")),
        )
    }
}

fn check_memlock(m: &Machine, f: &Facts) -> Check {
    let limits = memlock_limits(m);
    let need = PERF_DMA_BYTES;
    if f.id.has_cap(CAP_IPC_LOCK) {
        let mut c = Check::new(
            "memlock",
            Mark::Ok,
            "no limit applies: this process has CAP_IPC_LOCK",
        );
        if let Some((soft, hard)) = limits {
            c = c.detail(format!(
                "RLIMIT_MEMLOCK {} (hard {})",
                limit_text(soft),
                limit_text(hard)
            ));
        }
        return c;
    }
    let Some((soft, hard)) = limits else {
        return Check::new(
            "memlock",
            Mark::Warn,
            "RLIMIT_MEMLOCK unknown (no Max locked memory line in /proc/self/limits)",
        )
        .fix("check with ulimit -l");
    };
    let text = format!(
        "RLIMIT_MEMLOCK {} (hard {})",
        limit_text(soft),
        limit_text(hard)
    );
    if soft.is_none_or(|s| s >= need) {
        return Check::new(
            "memlock",
            Mark::Ok,
            format!(
                "{text}: enough for perf's {} of DMA memory",
                human_bytes(need)
            ),
        );
    }
    let kib = need.div_ceil(1024);
    let fix = if hard.is_none_or(|h| h >= need) {
        format!("raise the soft limit in this shell: ulimit -l {kib} (the hard limit allows it)")
    } else {
        format!(
            "as root, a line '{} - memlock {kib}' (or unlimited) in /etc/security/limits.conf and log in again; or LimitMEMLOCK={} in the service's systemd unit; or run as root",
            f.id.name, need
        )
    };
    Check::new(
        "memlock",
        Mark::Fail,
        format!("{text}: kestrel perf locks and pins about {} of DMA memory on a device, more than the limit", human_bytes(need)),
    )
    .fix(fix)
}

fn check_user(f: &Facts) -> Check {
    let caps: Vec<&str> = [
        (CAP_IPC_LOCK, "CAP_IPC_LOCK"),
        (CAP_SYS_RAWIO, "CAP_SYS_RAWIO"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ]
    .iter()
    .filter(|(b, _)| f.id.has_cap(*b))
    .map(|(_, n)| *n)
    .collect();
    Check::new(
        "user",
        Mark::Info,
        format!(
            "{} (uid {}, gid {}){}; capabilities: {}",
            f.id.name,
            f.id.uid,
            f.id.gid,
            if f.id.is_root() { "" } else { ", not root" },
            if caps.is_empty() {
                "none of IPC_LOCK, SYS_RAWIO, SYS_ADMIN".to_string()
            } else {
                caps.join(", ")
            }
        ),
    )
}

fn check_cpus(m: &Machine, f: &Facts) -> Check {
    let cpu = m.sysfs.join("devices/system/cpu");
    let online = m
        .read(&cpu.join("online"))
        .map(|s| cpu_list(&s))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            let n = m
                .read(&m.proc.join("cpuinfo"))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count() as u32;
            (0..n).collect()
        });
    let isolated = cpu_list(&m.read(&cpu.join("isolated")).unwrap_or_default());
    let nohz = cpu_list(
        &m.read(&cpu.join("nohz_full"))
            .unwrap_or_default()
            .replace("(null)", ""),
    );
    let iso_param = cmdline_param(&f.cmdline, "isolcpus").unwrap_or("-");
    let nohz_param = cmdline_param(&f.cmdline, "nohz_full").unwrap_or("-");
    let show = |v: &[u32]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        }
    };
    let summary = format!(
        "{} online; isolated: {} (isolcpus={iso_param}); nohz_full: {} (nohz_full={nohz_param})",
        online.len(),
        show(&isolated),
        show(&nohz)
    );
    let n = online.len();
    if n < 2 {
        return Check::new("cpus", Mark::Warn, summary).fix(
            "with one CPU a poller shares it with everything else: give the machine a second CPU",
        );
    }
    if isolated.is_empty() {
        let last = online.last().copied().unwrap_or(1);
        let spare = if n >= 4 {
            format!("{}-{last}", last - 1)
        } else {
            last.to_string()
        };
        return Check::new("cpus", Mark::Warn, summary).fix(format!(
            "for steady latency keep the pollers' cores away from the scheduler: boot with isolcpus={spare} nohz_full={spare} rcu_nocbs={spare} ({}) and run kestrel perf -c {spare}",
            grub_fix("them")
        ));
    }
    Check::new("cpus", Mark::Ok, summary)
}

fn check_tsc(f: &Facts) -> Check {
    let has = |x: &str| f.cpu_flags.iter().any(|y| y == x);
    if f.cpu_flags.is_empty() {
        return Check::new(
            "tsc",
            Mark::Info,
            "no CPU flags in /proc/cpuinfo (not x86?): latency timestamps use the monotonic clock",
        );
    }
    if has("constant_tsc") && has("nonstop_tsc") {
        return Check::new(
            "tsc",
            Mark::Ok,
            "invariant (constant_tsc, nonstop_tsc): cheap, steady latency timestamps",
        );
    }
    let missing: Vec<&str> = ["constant_tsc", "nonstop_tsc"]
        .into_iter()
        .filter(|x| !has(x))
        .collect();
    Check::new(
        "tsc",
        Mark::Warn,
        format!("not invariant (no {}): latency timestamps may drift with frequency changes or C-states", missing.join(", ")),
    )
    .fix("on a VM, pass the host CPU's flags through (QEMU: -cpu host,+invtsc); on bare metal, nothing to do but read latencies with care")
}

/// Examines the machine at `m`; with `target`, judges readiness for that controller only.
pub fn examine(m: &Machine, target: Option<Bdf>) -> Report {
    let f = Facts::gather(m);
    let mut checks = vec![check_kernel(m, &f), check_iommu(&f)];
    checks.extend(check_modules(m, &f));
    checks.push(check_noiommu(&f));
    checks.push(check_container(m, &f));
    let mut ready_ctrls = Vec::new();
    if f.controllers.is_empty() {
        checks.push(
            Check::new("controller", Mark::Fail, "no NVMe controller (PCI class 0x010802) on this machine")
                .fix("kestrel perf with no --target runs on the built-in emulated controller; for a device, install an NVMe controller (a VM: -device nvme,serial=x,drive=d)"),
        );
    }
    for c in &f.controllers {
        let (ch, ok) = check_controller(m, &f, c);
        if ok {
            ready_ctrls.push(c.bdf);
        }
        checks.push(ch);
    }
    if let Some(t) = target {
        if !f.controllers.iter().any(|c| c.bdf == t) {
            let mut c = Check::new(
                "controller",
                Mark::Fail,
                format!("no NVMe controller at {t}"),
            )
            .fix("pick one from 'kestrel list'");
            c.bdf = Some(t.to_string());
            checks.push(c);
        }
    }
    checks.push(check_hugepages(m, &f));
    checks.push(check_hugetlbfs(m));
    checks.push(check_memlock(m, &f));
    checks.push(check_user(&f));
    checks.push(check_cpus(m, &f));
    checks.push(check_tsc(&f));
    for e in &f.errors {
        checks.push(
            Check::new("sysfs", Mark::Fail, format!("cannot read: {e}"))
                .fix("mount sysfs on /sys and procfs on /proc"),
        );
    }

    // What perf on a device needs: the machine-wide checks, and one ready controller.
    let wanted: Vec<&Bdf> = match &target {
        Some(t) => ready_ctrls.iter().filter(|b| *b == t).collect(),
        None => ready_ctrls.iter().collect(),
    };
    let mut missing: Vec<String> = checks
        .iter()
        .filter(|c| c.status == Mark::Fail)
        .filter(|c| match (&c.bdf, &target) {
            // A controller's own problem matters only when it is the one asked for, or
            // when none is ready.
            (Some(b), Some(t)) => *b == t.to_string(),
            (Some(_), None) => wanted.is_empty(),
            (None, _) => c.id != "controller" || wanted.is_empty(),
        })
        .map(|c| c.title())
        .collect();
    if wanted.is_empty()
        && !checks
            .iter()
            .any(|c| c.id == "controller" && c.status == Mark::Fail)
    {
        missing.push(match &target {
            Some(t) => format!("controller {t} (see its line)"),
            None => "a controller Kestrel may take (see the controller lines)".to_string(),
        });
    }
    let noiommu = !f.iommu_on();
    let ready = missing.is_empty() && !wanted.is_empty();
    let perf_command = wanted.first().map(|b| {
        format!(
            "{}kestrel perf --target pci:{b}{}",
            if noiommu { "sudo " } else { "" },
            if noiommu { " --noiommu" } else { "" }
        )
    });
    let perf = if ready {
        Check::new(
            "perf",
            Mark::Ok,
            format!("ready: {}", perf_command.clone().unwrap_or_default()),
        )
    } else {
        let mut c = Check::new(
            "perf",
            Mark::Fail,
            format!(
                "kestrel perf on a device still needs: {}",
                missing.join(", ")
            ),
        )
        .fix("apply each fix above, then run kestrel doctor again");
        c.details.push(
            "kestrel perf with no --target runs now, on the built-in emulated controller".into(),
        );
        c
    };
    checks.push(perf);
    Report {
        ready,
        exit_status: if ready { 0 } else { 1 },
        ready_controllers: wanted.iter().map(|b| b.to_string()).collect(),
        perf_command: if ready { perf_command } else { None },
        checks,
    }
}

/// The report as text: one line per check with its mark, then its details and fix.
pub fn format_text(r: &Report) -> String {
    use fmt::Write as _;
    let mut s = String::new();
    for c in &r.checks {
        let _ = writeln!(s, "{} {}: {}", c.status, c.title(), c.summary);
        for d in &c.details {
            let _ = writeln!(s, "    {d}");
        }
        if let Some(fx) = &c.fix {
            let _ = writeln!(s, "    fix: {fx}");
        }
    }
    let fails = r.checks.iter().filter(|c| c.status == Mark::Fail).count();
    let warns = r.checks.iter().filter(|c| c.status == Mark::Warn).count();
    let _ = writeln!(
        s,
        "\n{} ({fails} ✗, {warns} ⚠); exit status {}",
        if r.ready {
            "ready for an NVMe device"
        } else {
            "not ready for an NVMe device"
        },
        r.exit_status
    );
    s
}

/// The machine root: `--root`, else `KESTREL_SYSROOT`, else `/`.
fn machine_root(args: &DoctorArgs) -> Result<PathBuf> {
    let root = match (&args.root, std::env::var_os("KESTREL_SYSROOT")) {
        (Some(r), _) => r.clone(),
        (None, Some(r)) if !r.is_empty() => PathBuf::from(r),
        _ => PathBuf::from("/"),
    };
    if !root.is_dir() {
        return Err(AppError::usage(format!(
            "--root / KESTREL_SYSROOT: {} is not a directory",
            root.display()
        )));
    }
    Ok(root)
}

/// Runs `kestrel doctor`.
pub fn run(args: &DoctorArgs) -> Result<()> {
    let m = Machine::at(machine_root(args)?);
    let target = match &args.target {
        None => None,
        Some(t) => Some(
            t.strip_prefix("pci:")
                .unwrap_or(t)
                .parse::<Bdf>()
                .map_err(|e| AppError::usage(format!("--target: {e}")))?,
        ),
    };
    let r = examine(&m, target);
    if args.json {
        print_json(&r)?;
    } else {
        print!("{}", format_text(&r));
    }
    if r.ready {
        Ok(())
    } else {
        Err(AppError::runtime(
            "not ready for an NVMe device: see the ✗ lines and their fixes (kestrel perf with no --target still runs, on the emulated controller)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpu_list(""), Vec::<u32>::new());
        assert_eq!(cpu_list("2-7:2/8"), [2, 3, 4, 5, 6, 7]);
        assert_eq!(cpu_list("junk,5"), [5]);
        assert_eq!(cpu_list("9-2"), Vec::<u32>::new());
    }

    #[test]
    fn cmdline_params() {
        let c = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on isolcpus=2-3 intel_iommu=off";
        assert_eq!(
            cmdline_param(c, "intel_iommu"),
            Some("off"),
            "the last one wins"
        );
        assert_eq!(cmdline_param(c, "isolcpus"), Some("2-3"));
        assert_eq!(cmdline_param(c, "nohz_full"), None);
    }
}
