//! Memory for DMA: hugepages, hugetlbfs and the locked-memory limit.

use super::machine::{limit_text, memlock_limits, Facts, Machine};
use super::*;

pub(super) fn check_hugepages(m: &Machine, f: &Facts) -> Check {
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
    numa_locality(&mut c, f, &huge, need_pages);
    c
}

/// Memory on the controllers' NUMA nodes: a warning for a controller on vfio-pci whose
/// node has too few free 2 MiB pages.
fn numa_locality(c: &mut Check, f: &Facts, huge: &pci::HugepageStatus, need_pages: u64) {
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
}

pub(super) fn check_hugetlbfs(m: &Machine) -> Check {
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

pub(super) fn check_memlock(m: &Machine, f: &Facts) -> Check {
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
