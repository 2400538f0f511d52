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

mod controller;
mod host;
mod kernel;
mod machine;
mod memory;
#[cfg(test)]
mod tests;

use controller::check_controller;
use host::{check_cpus, check_tsc, check_user};
use kernel::{check_container, check_iommu, check_kernel, check_modules, check_noiommu};
use machine::Facts;
pub use machine::Machine;
use memory::{check_hugepages, check_hugetlbfs, check_memlock};

/// Examines the machine at `m`; with `target`, judges readiness for that controller only.
pub fn examine(m: &Machine, target: Option<Bdf>) -> Report {
    let f = Facts::gather(m);
    let (checks, ready_ctrls) = run_checks(m, &f, target);
    judge(checks, &ready_ctrls, target, !f.iommu_on())
}

/// Every check, in the order of the report; with the controllers ready for perf.
fn run_checks(m: &Machine, f: &Facts, target: Option<Bdf>) -> (Vec<Check>, Vec<Bdf>) {
    let mut checks = vec![check_kernel(m, f), check_iommu(f)];
    checks.extend(check_modules(m, f));
    checks.push(check_noiommu(f));
    checks.push(check_container(m, f));
    let mut ready_ctrls = Vec::new();
    if f.controllers.is_empty() {
        checks.push(
            Check::new("controller", Mark::Fail, "no NVMe controller (PCI class 0x010802) on this machine")
                .fix("kestrel perf with no --target runs on the built-in emulated controller; for a device, install an NVMe controller (a VM: -device nvme,serial=x,drive=d)"),
        );
    }
    for c in &f.controllers {
        let (ch, ok) = check_controller(m, f, c);
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
    checks.push(check_hugepages(m, f));
    checks.push(check_hugetlbfs(m));
    checks.push(check_memlock(m, f));
    checks.push(check_user(f));
    checks.push(check_cpus(m, f));
    checks.push(check_tsc(f));
    for e in &f.errors {
        checks.push(
            Check::new("sysfs", Mark::Fail, format!("cannot read: {e}"))
                .fix("mount sysfs on /sys and procfs on /proc"),
        );
    }
    (checks, ready_ctrls)
}

/// What perf on a device needs: the machine-wide checks, and one ready controller (the
/// one asked for, with `target`). Adds the `perf` check and makes the report.
fn judge(
    mut checks: Vec<Check>,
    ready_ctrls: &[Bdf],
    target: Option<Bdf>,
    noiommu: bool,
) -> Report {
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

/// The fix that adds a kernel parameter.
fn grub_fix(param: &str) -> String {
    format!(
        "add {param} to GRUB_CMDLINE_LINUX in /etc/default/grub, run 'sudo update-grub' (or 'sudo grub2-mkconfig -o /boot/grub2/grub.cfg') and reboot"
    )
}
