//! `kestrel list`: NVMe controllers on the PCI bus and hugepages, from sysfs; with
//! `--target tcp:HOST[:PORT]`, what that discovery controller offers (`remote::list`).

use std::path::Path;

use kestrel::hw::pci::{self, SysRoots};
use serde::Serialize;

use crate::cli::ListArgs;
use crate::error::{AppError, Result};
use crate::units::print_json;

/// One controller, for `--json`.
#[derive(Serialize, Debug)]
pub struct ControllerJson {
    /// PCI address.
    pub bdf: String,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// IOMMU group.
    pub iommu_group: Option<u32>,
    /// Bound driver.
    pub driver: Option<String>,
    /// Block devices of its namespaces.
    pub block_devices: Vec<String>,
    /// The same block devices with what sysfs says of them.
    pub namespaces: Vec<BlockJson>,
    /// What uses them (mounts, swap, holders).
    pub in_use: Vec<String>,
}

/// One namespace's block device (kernel-bound controllers only), for `--json`.
#[derive(Serialize, Debug)]
pub struct BlockJson {
    /// Block device name (`nvme0n1`).
    pub name: String,
    /// Capacity in bytes, when sysfs says.
    pub size_bytes: Option<u64>,
    /// The kernel's zone model (`host-managed`); null for a conventional namespace.
    pub zoned: Option<String>,
}

/// Hugepages of one size on one node, for `--json`.
#[derive(Serialize, Debug)]
pub struct HugepagesJson {
    /// NUMA node (null: the system-wide pool).
    pub node: Option<u32>,
    /// Page size, KiB.
    pub page_kib: u64,
    /// Free pages.
    pub free: u64,
    /// Total pages.
    pub total: u64,
}

/// `kestrel list --json`.
#[derive(Serialize, Debug)]
pub struct ListJson {
    /// The controllers.
    pub controllers: Vec<ControllerJson>,
    /// The hugepage pools.
    pub hugepages: Vec<HugepagesJson>,
}

/// Runs `kestrel list` over `/sys` and `/proc`.
pub fn run(args: &ListArgs) -> Result<()> {
    if !args.targets.is_empty() {
        return crate::remote::list(&args.targets, args.json);
    }
    let roots = SysRoots::new("/sys", "/proc");
    let ctrls = pci::list_nvme_controllers(&roots).map_err(|e| AppError::runtime(e.to_string()))?;
    let huge =
        pci::hugepage_status(Path::new("/sys")).map_err(|e| AppError::runtime(e.to_string()))?;
    if args.json {
        let j = ListJson {
            controllers: ctrls
                .iter()
                .map(|c| ControllerJson {
                    bdf: c.bdf.to_string(),
                    vendor: c.vendor,
                    device: c.device,
                    numa_node: c.numa_node,
                    iommu_group: c.iommu_group,
                    driver: c.driver.clone(),
                    block_devices: c.block_devices.iter().map(|b| b.name.clone()).collect(),
                    namespaces: c
                        .block_devices
                        .iter()
                        .map(|b| BlockJson {
                            name: b.name.clone(),
                            size_bytes: b.size_bytes,
                            zoned: b.zoned.clone(),
                        })
                        .collect(),
                    in_use: c.uses().map(|u| u.to_string()).collect(),
                })
                .collect(),
            hugepages: huge
                .counts
                .iter()
                .map(|h| HugepagesJson {
                    node: h.node,
                    page_kib: h.page_kib,
                    free: h.free,
                    total: h.total,
                })
                .collect(),
        };
        return print_json(&j);
    }
    // With no controller the table says "no NVMe controllers (PCI class 0x010802) found".
    print!("{}", pci::format_table(&ctrls, &huge));
    Ok(())
}
