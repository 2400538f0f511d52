//! Each NVMe controller: its driver, IOMMU group and device nodes, and what binding
//! it to vfio-pci takes.

use super::machine::{class_name, Facts, Machine};
use super::*;

/// One NVMe controller; `true` in the result when it is ready for perf.
pub(super) fn check_controller(m: &Machine, f: &Facts, c: &PciNvmeController) -> (Check, bool) {
    let (details, members) = describe(m, c);
    let mk = Mk {
        bdf: c.bdf.to_string(),
        details,
    };
    if let Some(ch) = in_use(&mk, c) {
        return (ch, false);
    }
    if let Some(ch) = group_not_viable(&mk, c, &members) {
        return (ch, false);
    }
    if c.driver.as_deref() != Some("vfio-pci") {
        return (not_on_vfio(&mk, f, c), false);
    }
    on_vfio(&mk, m, f, c)
}

/// The lines under a controller's check: its IDs, driver, NUMA node, IOMMU group and
/// block devices, and who else is in its group; with the other group members.
fn describe(m: &Machine, c: &PciNvmeController) -> (Vec<String>, Vec<GroupMember>) {
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
    (details, members)
}

/// Makes a controller's checks: its BDF and details on each.
struct Mk {
    bdf: String,
    details: Vec<String>,
}

impl Mk {
    fn check(&self, mark: Mark, summary: String) -> Check {
        let mut ch = Check::new("controller", mark, summary);
        ch.bdf = Some(self.bdf.clone());
        ch.details = self.details.clone();
        ch
    }
}

/// A controller the host uses (mounted, swap, a holder): not to be taken.
fn in_use(mk: &Mk, c: &PciNvmeController) -> Option<Check> {
    let uses: Vec<String> = c.uses().map(|u| u.to_string()).collect();
    if !uses.is_empty() {
        let root = c
            .uses()
            .any(|u| matches!(u, pci::BlockUse::Mounted { mountpoint, .. } if mountpoint == "/"));
        let what = if root {
            "holds the root filesystem"
        } else {
            "is in use"
        };
        return Some(
            mk.check(Mark::Warn, format!("{what}: {}; Kestrel must not take it", uses.join(", ")))
                .fix("none for this one (setup.sh refuses it): use another controller, or unmount / swapoff / remove the holder first"),
        );
    }
    None
}

/// Another device of the group on a host driver: VFIO cannot have the group.
fn group_not_viable(mk: &Mk, c: &PciNvmeController, members: &[GroupMember]) -> Option<Check> {
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
        return Some(
            mk.check(
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
        );
    }
    None
}

/// Not on vfio-pci yet: how to bind it.
fn not_on_vfio(mk: &Mk, f: &Facts, c: &PciNvmeController) -> Check {
    let bdf = &mk.bdf;
    let driver = c.driver.clone().unwrap_or_else(|| "no driver".into());
    if c.iommu_group.is_none() && !f.noiommu_on() {
        return mk
            .check(
                Mark::Fail,
                format!("on {driver}, and in no IOMMU group (the IOMMU is off)"),
            )
            .fix(
                "turn the IOMMU on (see the iommu line), then: sudo PCI_ALLOWED=".to_string()
                    + bdf
                    + " scripts/setup.sh config",
            );
    }
    let noiommu = if f.iommu_on() { "" } else { "NOIOMMU=1 " };
    mk.check(Mark::Fail, format!("on {driver}, not on vfio-pci"))
        .fix(format!(
            "sudo {noiommu}PCI_ALLOWED={bdf} scripts/setup.sh config"
        ))
}

/// Bound to vfio-pci: the group node, and whether this user may open it.
fn on_vfio(mk: &Mk, m: &Machine, f: &Facts, c: &PciNvmeController) -> (Check, bool) {
    let bdf = &mk.bdf;
    let Some(group) = c.iommu_group else {
        return (
            mk.check(Mark::Fail, "on vfio-pci but in no IOMMU group".into())
                .fix(format!(
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
                mk.check(
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
                mk.check(Mark::Fail, format!("on vfio-pci in a noiommu group ({node_desc}): opening it needs CAP_SYS_RAWIO and CAP_SYS_ADMIN"))
                    .fix("run kestrel as root (sudo kestrel perf --noiommu ...), or enable the IOMMU to run without root"),
                false,
            );
        }
        return (
            mk.check(
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
            mk.check(Mark::Fail, format!("on vfio-pci, but {node_desc} cannot be opened by uid {}", f.id.uid))
                .fix(format!("sudo TARGET_USER={} PCI_ALLOWED={bdf} scripts/setup.sh config (or sudo chown {} {})", f.id.name, f.id.name, node.display())),
            false,
        );
    }
    (
        mk.check(
            Mark::Ok,
            format!("ready: on vfio-pci, {node_desc} opens for uid {}", f.id.uid),
        ),
        true,
    )
}
