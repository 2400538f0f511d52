//! The hugepage pools, per NUMA node, from sysfs.

use std::path::Path;

use super::*;

/// Parses `hugepages-2048kB`.
fn hugepage_dir_kib(name: &str) -> Option<u64> {
    name.strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse()
        .ok()
}

fn hugepage_counts(dir: &Path, node: Option<u32>) -> Result<Vec<HugepageCount>, PciError> {
    let mut out = Vec::new();
    for name in dir_names(dir)? {
        let Some(page_kib) = hugepage_dir_kib(&name) else {
            continue;
        };
        let d = dir.join(&name);
        out.push(HugepageCount {
            node,
            page_kib,
            free: read_u64(&d.join("free_hugepages"))?.unwrap_or(0),
            total: read_u64(&d.join("nr_hugepages"))?.unwrap_or(0),
        });
    }
    Ok(out)
}

/// Free and total hugepages per NUMA node and page size. Falls back to the global pools
/// (`node: None`) on a kernel without NUMA nodes in sysfs. Empty without hugetlb support.
pub fn hugepage_status(sysfs_root: &Path) -> Result<HugepageStatus, PciError> {
    let nodes_dir = sysfs_root.join("devices/system/node");
    let mut counts = Vec::new();
    for name in dir_names(&nodes_dir)? {
        let Some(n) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        counts.extend(hugepage_counts(
            &nodes_dir.join(&name).join("hugepages"),
            Some(n),
        )?);
    }
    if counts.is_empty() {
        counts = hugepage_counts(&sysfs_root.join("kernel/mm/hugepages"), None)?;
    }
    counts.sort_by_key(|c| (c.node, c.page_kib));
    Ok(HugepageStatus { counts })
}
