//! The kernel side: version, IOMMU, the VFIO modules, no-IOMMU mode and the VFIO
//! container.

use super::machine::{cmdline_param, Facts, Machine};
use super::*;

pub(super) fn check_kernel(m: &Machine, f: &Facts) -> Check {
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

pub(super) fn check_iommu(f: &Facts) -> Check {
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

pub(super) fn check_modules(m: &Machine, f: &Facts) -> Vec<Check> {
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

pub(super) fn check_noiommu(f: &Facts) -> Check {
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
pub(super) fn vfio_nodes(m: &Machine, f: &Facts) -> Vec<String> {
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
pub(super) fn check_container(m: &Machine, f: &Facts) -> Check {
    let mut c = container(m, f);
    c.details.extend(vfio_nodes(m, f));
    c
}

pub(super) fn container(m: &Machine, f: &Facts) -> Check {
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
