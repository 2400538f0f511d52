//! The process and the CPUs: the user's rights, the cores and the TSC.

use super::machine::{cmdline_param, cpu_list, Facts, Machine};
use super::*;

pub(super) fn check_user(f: &Facts) -> Check {
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

pub(super) fn check_cpus(m: &Machine, f: &Facts) -> Check {
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

pub(super) fn check_tsc(f: &Facts) -> Check {
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
