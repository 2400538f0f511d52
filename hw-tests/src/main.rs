//! `kestrel-hw-tests`: runs the conformance suite against the emulator or a real
//! controller and prints a results table (per namespace: what ran, what was skipped and
//! why) and a summary.
//!
//! ```text
//! kestrel-hw-tests                                   # the emulator
//! kestrel-hw-tests --target 'emu:mdts=1,ns=64M+512+md8+pi1,ns=64M+4096+zoned'
//! kestrel-hw-tests --device 0000:01:00.0 --destructive [--noiommu] [--nsid 2] [--json out.json]
//! KESTREL_TEST_DEVICE=0000:01:00.0 KESTREL_TEST_DESTRUCTIVE=1 kestrel-hw-tests
//! ```
//! Exit status: 0 when no case failed, 1 when one did, 2 for usage errors.

use kestrel_hw_tests::targets::{run_file, run_spec, FileTarget};
use kestrel_hw_tests::{
    format_report, report_json, run, summary_json, tally, Device, Report, RunOptions,
};

const USAGE: &str =
    "usage: kestrel-hw-tests [--device BDF | --target TARGET] [--noiommu] [--destructive]
                        [--nsid N] [--filter SUBSTR] [--file PATH] [--remote TARGET] [--json PATH] [--list]

Runs Kestrel's NVMe conformance suite: the controller cases once, the namespace cases on
every active namespace, each in the form the namespace's format needs (metadata and
protection information, zone-sequential writes, sizes from MDTS) or skipped with the
reason (see docs/conformance.md).
  (no --device)     against the built-in emulated controller
  --device BDF      against a controller bound to vfio-pci (or KESTREL_TEST_DEVICE=BDF);
                    destructive: overwrites the first 64 MiB of every namespace it serves
                    (on a zoned namespace, the zones that start there), so it also needs
                    --destructive (or KESTREL_TEST_DESTRUCTIVE=1)
  --target TARGET   emu:OPTIONS (an emulated controller of that shape: namespaces, formats,
                    mdts, queues; the grammar of kestrel --target) or pci:BDF
  --noiommu         use the VFIO noiommu path (or KESTREL_NOIOMMU=1)
  --nsid N          only namespace N (its cases, and the controller cases' i/o on it)
  --file PATH       also run the target cases on a file target at PATH (created
                    sparse at 64 MiB if missing; direct I/O where the file system allows)
  --remote TARGET   also run the target cases on every namespace of TARGET, a target
                    string such as tcp:HOST:PORT/NQN (an NVMe/TCP subsystem)
  --filter SUBSTR   only cases whose name contains SUBSTR
  --json PATH       also write the report as JSON to PATH (- for stdout, instead of the table)
  --list            list the cases and exit";

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let mut bdf = std::env::var("KESTREL_TEST_DEVICE")
        .ok()
        .filter(|s| !s.is_empty());
    let mut target: Option<String> = None;
    let mut destructive = std::env::var("KESTREL_TEST_DESTRUCTIVE").is_ok_and(|v| v == "1");
    let mut noiommu = std::env::var("KESTREL_NOIOMMU").is_ok_and(|v| v == "1");
    let mut opts = RunOptions::default();
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    let mut remotes: Vec<String> = Vec::new();
    let mut json: Option<String> = None;
    let value = |args: &mut std::iter::Skip<std::env::Args>, what: &str| {
        args.next()
            .unwrap_or_else(|| usage(&format!("{what} needs a value")))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => bdf = Some(value(&mut args, "--device")),
            "--target" => target = Some(value(&mut args, "--target")),
            "--destructive" => destructive = true,
            "--noiommu" => noiommu = true,
            "--filter" => opts.filter = value(&mut args, "--filter"),
            "--nsid" => {
                let v = value(&mut args, "--nsid");
                opts.nsid = Some(v.parse().ok().filter(|n| *n >= 1).unwrap_or_else(|| {
                    usage(&format!("--nsid {v}: a namespace id is a number from 1"))
                }));
            }
            "--file" => files.push(value(&mut args, "--file").into()),
            "--remote" => remotes.push(value(&mut args, "--remote")),
            "--json" => json = Some(value(&mut args, "--json")),
            "--list" => return list_cases(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let device = match (target, bdf) {
        (Some(t), _) if t == "emu" || t.starts_with("emu:") => {
            Device::from_target(&t, noiommu).unwrap_or_else(|e| usage(&e))
        }
        (Some(t), _) => pci(
            Device::from_target(&t, noiommu).unwrap_or_else(|e| usage(&e)),
            destructive,
        ),
        (None, Some(bdf)) => pci(Device::Pci { bdf, noiommu }, destructive),
        (None, None) => Device::emulator(),
    };
    let mut report = run(&device, &opts);
    for path in files {
        report.rows.extend(run_file(
            &FileTarget {
                path,
                direct: false,
            },
            &opts.filter,
        ));
    }
    for spec in remotes {
        report.rows.extend(run_spec(&spec, &opts.filter));
    }
    print_report(&report, json.as_deref());
    let (p, f, s) = tally(&report);
    println!("hw-tests: {p} passed, {f} failed, {s} skipped");
    std::process::exit(if f == 0 && p + s > 0 { 0 } else { 1 });
}

/// `--list`: every case, its scope and what it checks.
fn list_cases() {
    for c in kestrel_hw_tests::cases() {
        let scope = match c.scope {
            kestrel_hw_tests::Scope::Controller => "controller",
            kestrel_hw_tests::Scope::Namespace => "namespace",
        };
        println!("{:<32} {scope:<10} {}", c.name, c.about);
    }
}

/// The report as a table (and JSON to `json`: a path, or `-` for stdout instead of the
/// table), then the one-line JSON summary.
fn print_report(report: &Report, json: Option<&str>) {
    let text = format_report(report);
    match json {
        Some("-") => println!("{}", report_json(report)),
        Some(path) => {
            print!("{text}");
            if let Err(e) = std::fs::write(path, format!("{:#}\n", report_json(report))) {
                eprintln!("kestrel-hw-tests: writing {path}: {e}");
                std::process::exit(2);
            }
        }
        None => print!("{text}"),
    }
    println!("{}", summary_json(report));
}

/// A PCI device, which the suite overwrites: only with --destructive.
fn pci(d: Device, destructive: bool) -> Device {
    if !destructive {
        eprintln!("kestrel-hw-tests: refusing to run on {}: the suite overwrites the first 64 MiB of every namespace kestrel serves; pass --destructive or set KESTREL_TEST_DESTRUCTIVE=1", d.name());
        std::process::exit(2);
    }
    d
}

fn usage(msg: &str) -> ! {
    eprintln!("kestrel-hw-tests: {msg}\n\n{USAGE}");
    std::process::exit(2);
}
