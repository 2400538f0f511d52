//! `kestrel-hw-tests`: runs the conformance suite against the emulator or a real
//! controller and prints a results table and a summary.
//!
//! ```text
//! kestrel-hw-tests                       # the emulator
//! kestrel-hw-tests --device 0000:01:00.0 --destructive [--noiommu]
//! KESTREL_TEST_DEVICE=0000:01:00.0 KESTREL_TEST_DESTRUCTIVE=1 kestrel-hw-tests
//! ```
//! Exit status: 0 when no case failed, 1 when one did, 2 for usage errors.

use kestrel_hw_tests::targets::{run_targets, TargetKind};
use kestrel_hw_tests::{format_report, run, summary_json, tally, Device};

const USAGE: &str =
    "usage: kestrel-hw-tests [--device BDF] [--noiommu] [--destructive] [--filter SUBSTR] [--list]

Runs Kestrel's NVMe conformance suite: the controller cases once, the data path cases
on every active namespace (a namespace of a format kestrel refuses: skipped, with the reason).
  (no --device)     against the built-in emulated controller
  --device BDF      against a controller bound to vfio-pci (or KESTREL_TEST_DEVICE=BDF);
                    destructive: overwrites the first 64 MiB of every namespace it serves, so it also
                    needs --destructive (or KESTREL_TEST_DESTRUCTIVE=1)
  --noiommu         use the VFIO noiommu path (or KESTREL_NOIOMMU=1)
  --file PATH       also run the target cases on a file target at PATH (created
                    sparse at 64 MiB if missing; direct I/O where the file system allows)
  --filter SUBSTR   only cases whose name contains SUBSTR
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
    let mut destructive = std::env::var("KESTREL_TEST_DESTRUCTIVE").is_ok_and(|v| v == "1");
    let mut noiommu = std::env::var("KESTREL_NOIOMMU").is_ok_and(|v| v == "1");
    let mut filter = String::new();
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => {
                bdf = Some(
                    args.next()
                        .unwrap_or_else(|| usage("--device needs a PCI address")),
                )
            }
            "--destructive" => destructive = true,
            "--noiommu" => noiommu = true,
            "--filter" => {
                filter = args
                    .next()
                    .unwrap_or_else(|| usage("--filter needs a value"))
            }
            "--file" => files.push(
                args.next()
                    .unwrap_or_else(|| usage("--file needs a path"))
                    .into(),
            ),
            "--list" => {
                for c in kestrel_hw_tests::cases() {
                    println!("{:<28} {}", c.name, c.about);
                }
                for (name, _) in kestrel_hw_tests::targets::target_cases() {
                    println!("{name:<28} (through the Target trait: nvme namespace and file)");
                }
                return;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let device = match bdf {
        Some(bdf) => {
            if !destructive {
                eprintln!("kestrel-hw-tests: refusing to run on {bdf}: the suite overwrites the first 64 MiB of every namespace kestrel serves; pass --destructive or set KESTREL_TEST_DESTRUCTIVE=1");
                std::process::exit(2);
            }
            Device::Pci { bdf, noiommu }
        }
        None => Device::Emulator,
    };
    let mut reports = run(&device, &filter);
    reports.extend(run_targets(&TargetKind::Nvme(device.clone()), &filter));
    for path in files {
        reports.extend(run_targets(
            &TargetKind::File {
                path,
                direct: false,
            },
            &filter,
        ));
    }
    print!("{}", format_report(&reports));
    println!("{}", summary_json(&reports));
    let (p, f, s) = tally(&reports);
    println!("hw-tests: {p} passed, {f} failed, {s} skipped");
    std::process::exit(if f == 0 && p + s > 0 { 0 } else { 1 });
}

fn usage(msg: &str) -> ! {
    eprintln!("kestrel-hw-tests: {msg}\n\n{USAGE}");
    std::process::exit(2);
}
