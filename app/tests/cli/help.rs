//! `--help` of every subcommand, its examples run, no or an unknown subcommand.

use crate::common::{assert_usage_error, kestrel, stderr, stdout};

#[test]
fn help_for_every_subcommand() {
    for sub in [
        &[][..],
        &["identify"],
        &["smart"],
        &["list"],
        &["perf"],
        &["read"],
        &["serve"],
    ] {
        let mut args = sub.to_vec();
        args.push("--help");
        let o = kestrel(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let out = stdout(&o);
        assert!(out.contains("Usage: kestrel"), "{args:?}: {out}");
        assert!(out.contains("Examples:"), "{args:?} has no examples: {out}");
    }
    let perf = stdout(&kestrel(&["perf", "--help"]));
    for opt in [
        "--queue-depth",
        "--io-size",
        "--workload",
        "--rwmixread",
        "--time",
        "--warmup",
        "--cores",
        "--qpairs-per-core",
        "--io-queue-size",
        "--doorbell",
        "--shadow-doorbells",
        "--max-completions",
        "--verify",
        "--seed",
        "--json",
        "--latency-plot",
        "--quiet",
        "--target",
        "--io-timeout",
        "--admin-timeout",
    ] {
        assert!(perf.contains(opt), "perf --help lacks {opt}");
    }
    assert!(perf.contains("-q is --queue-depth"));
    assert!(
        perf.contains("Exit status"),
        "perf --help documents its exit statuses"
    );
}

/// The examples of `--help` that run on the built-in emulator work on this machine: each
/// is run for a moment (-t 200ms, no warmup) and must succeed without a warning.
#[test]
fn help_examples_run_on_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("lat.svg");
    for sub in [&["perf"][..], &[]] {
        let mut args = sub.to_vec();
        args.push("--help");
        let help = stdout(&kestrel(&args));
        for line in help.lines().map(str::trim) {
            let Some(ex) = line.strip_prefix("kestrel perf") else {
                continue;
            };
            let words: Vec<&str> = ex.split_whitespace().collect();
            if words
                .iter()
                .any(|w| w.contains("pci:") || w.contains("faults="))
            {
                continue; // needs hardware, or fails on purpose
            }
            let mut run: Vec<String> = vec!["perf".into()];
            let mut it = words.iter();
            while let Some(w) = it.next() {
                match *w {
                    // The example's own length, replaced by a short one below.
                    "-t" | "--time" => {
                        it.next();
                    }
                    "--latency-plot" => {
                        it.next();
                        run.push((*w).into());
                        run.push(svg.display().to_string());
                    }
                    w => run.push(w.into()),
                }
            }
            // A run of known size, not of known length: a loaded machine slows it down
            // but cannot leave its window empty.
            run.extend(
                [
                    "-t",
                    "60",
                    "--number-ios",
                    "500",
                    "--warmup",
                    "0",
                    "--quiet",
                ]
                .map(String::from),
            );
            let argv: Vec<&str> = run.iter().map(String::as_str).collect();
            let o = kestrel(&argv);
            assert!(o.status.success(), "{argv:?}: {}", stderr(&o));
            // (A poller kept waiting for the CPU by other load on the machine is the
            // machine's doing, not the example's.)
            let err = stderr(&o);
            let warns: Vec<&str> = err
                .lines()
                .filter(|l| l.contains("warning") && !l.contains("waited"))
                .collect();
            assert!(warns.is_empty(), "{argv:?} warns: {warns:?}");
        }
    }
}

#[test]
fn no_subcommand_and_unknown_ones_are_usage_errors() {
    let o = kestrel(&["frobnicate"]);
    assert_usage_error(&o, &["frobnicate"]);
    let o = kestrel(&[]);
    assert_eq!(o.status.code(), Some(2));
}
