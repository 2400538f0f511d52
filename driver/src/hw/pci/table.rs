//! The status table `kestrel list` and `scripts/setup.sh status` print.

use super::*;

/// Text of an optional column value: the value, or `-`.
fn or_dash<T: fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "-".to_string(), |x| x.to_string())
}

/// The table `kestrel list` and `scripts/setup.sh status` print: the hugepage pools per
/// NUMA node, then one line per NVMe controller (address, vendor:device, NUMA node, IOMMU
/// group, driver, block devices, and what uses them). Missing values print as `-`.
///
/// The layout is fixed-width and mirrored byte for byte by `setup.sh`; change both.
pub fn format_table(ctrls: &[PciNvmeController], huge: &HugepageStatus) -> String {
    use fmt::Write as _;
    let mut s = String::new();
    if huge.counts.is_empty() {
        s.push_str("hugepages: none (kernel without hugetlb support)\n");
    } else {
        let _ = writeln!(
            s,
            "{:<6}  {:<10}  {:>6}  {:>6}",
            "NODE", "HUGEPAGES", "FREE", "TOTAL"
        );
        for c in &huge.counts {
            let node = c
                .node
                .map_or_else(|| "-".to_string(), |n| format!("node{n}"));
            let size = format!("{}kB", c.page_kib);
            let _ = writeln!(
                s,
                "{:<6}  {:<10}  {:>6}  {:>6}",
                node, size, c.free, c.total
            );
        }
    }
    s.push('\n');
    if ctrls.is_empty() {
        s.push_str("no NVMe controllers (PCI class 0x010802) found\n");
        return s;
    }
    let _ = writeln!(
        s,
        "{:<12}  {:<9}  {:<4}  {:<5}  {:<10}  {:<16}  IN USE",
        "BDF", "VENDOR:ID", "NUMA", "GROUP", "DRIVER", "BLOCK DEVICES"
    );
    for c in ctrls {
        let ids = format!("{:04x}:{:04x}", c.vendor, c.device);
        let blocks = if c.block_devices.is_empty() {
            "-".to_string()
        } else {
            c.block_devices
                .iter()
                .map(|b| match &b.zoned {
                    Some(z) => format!("{} ({z})", b.name),
                    None => b.name.clone(),
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let uses = if c.in_use() {
            c.uses()
                .map(|u| u.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            "no".to_string()
        };
        let _ = writeln!(
            s,
            "{:<12}  {:<9}  {:<4}  {:<5}  {:<10}  {:<16}  {}",
            c.bdf.to_string(),
            ids,
            or_dash(&c.numa_node),
            or_dash(&c.iommu_group),
            or_dash(&c.driver),
            blocks,
            uses
        );
    }
    s
}

/// The whole `kestrel list` / `setup.sh status` text for the machine at `roots`.
pub fn status_table(roots: &SysRoots) -> Result<String, PciError> {
    let ctrls = list_nvme_controllers(roots)?;
    let huge = hugepage_status(&roots.sysfs)?;
    Ok(format_table(&ctrls, &huge))
}
