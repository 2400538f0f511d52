//! What doctor reads: the machine below its root, who is asking, and the facts
//! gathered before any check judges them.

use super::*;

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
    pub(super) fn roots(&self) -> SysRoots {
        SysRoots::new(&self.sysfs, &self.proc)
    }
    pub(super) fn read(&self, p: &Path) -> Option<String> {
        fs::read_to_string(p).ok()
    }
}

/// Who is asking: from `proc/self/status`.
#[derive(Clone, Debug, Default)]
pub(super) struct Identity {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) groups: Vec<u32>,
    pub(super) cap_eff: u64,
    pub(super) name: String,
}

impl Identity {
    pub(super) fn read(m: &Machine) -> Identity {
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
    pub(super) fn has_cap(&self, bit: u32) -> bool {
        self.cap_eff & (1 << bit) != 0
    }
    pub(super) fn is_root(&self) -> bool {
        self.uid == 0
    }
    /// Whether this identity may open `p` for reading and writing, from its owner, group
    /// and mode (root, or CAP_DAC_OVERRIDE, may always).
    pub(super) fn can_rw(&self, md: &fs::Metadata) -> bool {
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
pub(super) fn memlock_limits(m: &Machine) -> Option<(Option<u64>, Option<u64>)> {
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

pub(super) fn limit_text(l: Option<u64>) -> String {
    l.map_or_else(|| "unlimited".to_string(), human_bytes)
}

/// Parses a CPU list like `0-3,8,10-11` (sysfs `online`, `isolated`, `nohz_full`, and
/// the kernel parameters). Empty or unparsable: none.
pub(super) fn cpu_list(s: &str) -> Vec<u32> {
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
pub(super) fn cmdline_param<'a>(cmdline: &'a str, name: &str) -> Option<&'a str> {
    cmdline
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .next_back()
}

/// A PCI class code in words, for the members of an IOMMU group.
pub(super) fn class_name(class: Option<u32>) -> &'static str {
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
pub(super) struct Facts {
    pub(super) id: Identity,
    pub(super) cmdline: String,
    pub(super) cpu_vendor: Option<String>,
    pub(super) cpu_flags: Vec<String>,
    pub(super) iommu_units: Vec<String>,
    pub(super) iommu_groups: Vec<u32>,
    pub(super) noiommu_param: Option<String>,
    pub(super) controllers: Vec<PciNvmeController>,
    pub(super) errors: Vec<String>,
}

impl Facts {
    pub(super) fn gather(m: &Machine) -> Facts {
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
    pub(super) fn iommu_on(&self) -> bool {
        !self.iommu_units.is_empty()
    }
    pub(super) fn noiommu_on(&self) -> bool {
        matches!(self.noiommu_param.as_deref(), Some("Y" | "1"))
    }
    /// The kernel parameter that turns the IOMMU on for this CPU.
    pub(super) fn iommu_param(&self) -> &'static str {
        match self.cpu_vendor.as_deref() {
            Some("AuthenticAMD" | "HygonGenuine") => "amd_iommu=on",
            Some("GenuineIntel") => "intel_iommu=on",
            _ => "intel_iommu=on (Intel) or amd_iommu=on (AMD)",
        }
    }
}
