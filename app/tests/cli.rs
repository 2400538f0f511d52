//! The `kestrel` binary, run as a user runs it: on the built-in emulator (no hardware).

use std::path::Path;
use std::process::{Command, Output};

fn kestrel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run kestrel")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "kestrel failed ({:?}): {}",
        o.status,
        stderr(o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not json ({e}): {}", stdout(o)))
}

/// A usage error: exit status 2 and exactly one line `kestrel: error: ...` on stderr.
fn assert_usage_error(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "stderr: {}", stderr(o));
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got: {err}");
    assert!(lines[0].starts_with("kestrel: error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

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

#[test]
fn identify_json_on_the_default_emulator() {
    let j = json(&kestrel(&["identify", "--json"]));
    assert_eq!(j["vs"], "1.4.0");
    assert!(!j["model"].as_str().unwrap().is_empty());
    assert!(!j["serial"].as_str().unwrap().is_empty());
    assert!(j["firmware"].is_string());
    assert_eq!(
        j["mqes"].as_u64().unwrap() + 1,
        j["max_queue_entries"].as_u64().unwrap()
    );
    assert!(j["mdts_bytes"].as_u64().unwrap() >= 4096);
    assert!(j["io_queues"].as_u64().unwrap() >= 1);
    let ns = j["namespaces"].as_array().unwrap();
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0]["nsid"], 1);
    assert_eq!(ns[0]["lba_size"], 4096);
    assert_eq!(ns[0]["size_bytes"], 1u64 << 30);
    assert_eq!(ns[0]["size_lbas"], (1u64 << 30) / 4096);
}

#[test]
fn identify_text_with_emulator_options() {
    let o = kestrel(&[
        "identify",
        "--target",
        "emu:namespaces=2,lba=512,size=64M,mdts=3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("NVMe version (VS)          1.4.0"), "{out}");
    assert!(out.contains("Namespace 2:"), "{out}");
    assert!(
        out.contains("131072 LBAs x 512 bytes = 67108864 bytes"),
        "{out}"
    );
    assert!(out.contains("32768 bytes"), "mdts=3 is 32 KiB: {out}");
}

#[test]
fn identify_a_file_target() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let spec = format!("file:{},size=16M", path.display());
    let j = json(&kestrel(&["identify", "--json", "--target", &spec]));
    assert_eq!(j["kind"], "file");
    assert_eq!(j["capacity_bytes"], 16u64 << 20);
    assert!(j["direct"].is_boolean());
    assert_eq!(
        j["size_lbas"].as_u64().unwrap() * j["block_size"].as_u64().unwrap(),
        16u64 << 20
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 << 20);
}

#[test]
fn smart_and_error_log() {
    let o = kestrel(&["smart"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for field in [
        "Critical warning",
        "Temperature",
        "Available spare",
        "Percentage used",
        "Data units read",
        "Power-on hours",
        "Unsafe shutdowns",
        "Media and data integrity errors",
        "Error Information log",
    ] {
        assert!(out.contains(field), "{field} missing: {out}");
    }
    let j = json(&kestrel(&["smart", "--json"]));
    assert!(j["smart"]["available_spare_pct"].is_u64());
    assert!(j["smart"]["critical_warnings"].is_array());
    assert!(j["error_log"].is_array());
}

#[test]
fn smart_on_a_file_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("file:{},size=1M", dir.path().join("f").display());
    let o = kestrel(&["smart", "--target", &spec]);
    assert_usage_error(&o, &["only on NVMe targets"]);
}

#[test]
fn list_reads_sysfs() {
    let o = kestrel(&["list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let has_none = out.contains("no NVMe controllers");
    let has_table = out.contains("BDF") && out.contains("DRIVER");
    assert!(has_none || has_table, "{out}");
    let j = json(&kestrel(&["list", "--json"]));
    assert!(j["controllers"].is_array());
    assert_eq!(
        j["controllers"].as_array().unwrap().is_empty(),
        has_none,
        "text and json disagree"
    );
}

#[test]
fn perf_json_is_consistent() {
    let j = json(&kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-q", "16", "--json", "--quiet",
    ]));
    let t = &j["total"];
    let ios = t["ios"].as_u64().unwrap();
    let secs = t["seconds"].as_f64().unwrap();
    let iops = t["iops"].as_f64().unwrap();
    assert!(ios > 0);
    // The window spans -t from the pollers' first and last loop iterations past the
    // marks; a descheduled poller can stretch or shrink it, so only a loose bound.
    assert!((0.5..10.0).contains(&secs), "window {secs} s for -t 1");
    assert!(
        (iops - ios as f64 / secs).abs() <= 0.01,
        "iops {iops} != {ios} / {secs}"
    );
    let mib = t["mib_per_s"].as_f64().unwrap();
    assert!((mib - iops * 4096.0 / 1048576.0).abs() <= 0.01 + mib * 1e-9);
    let l = &t["latency_us"];
    for k in ["avg", "min", "max", "p50", "p99", "p99_9", "p1", "p99_99"] {
        assert!(l[k].is_number(), "latency_us.{k}");
    }
    let (min, avg, max) = (
        l["min"].as_f64().unwrap(),
        l["avg"].as_f64().unwrap(),
        l["max"].as_f64().unwrap(),
    );
    assert!(min > 0.0 && min <= avg && avg <= max, "{min} {avg} {max}");
    assert!(l["p50"].as_f64().unwrap() <= l["p99"].as_f64().unwrap());
    assert!(t["ns_per_io_cpu"].as_f64().unwrap() > 0.0);
    assert!(t["ns_per_io_cpu_p50"].as_f64().unwrap() > 0.0);
    let busy = t["busy_ns"].as_u64().unwrap();
    assert!(
        (t["ns_per_io_cpu"].as_f64().unwrap() - busy as f64 / ios as f64).abs() <= 0.06,
        "ns_per_io_cpu is busy_ns / ios"
    );
    let tr = &j["transport"];
    // Completions counted by the transport over the window are the I/Os measured.
    assert_eq!(tr["completed"].as_u64().unwrap(), ios);
    let sq = tr["sq_doorbell_writes"].as_u64().unwrap();
    let cq = tr["cq_doorbell_writes"].as_u64().unwrap();
    let per = tr["doorbell_writes_per_io"].as_f64().unwrap();
    assert!((per - (sq + cq) as f64 / ios as f64).abs() < 1e-3);
    let per_core = j["per_core"].as_array().unwrap();
    assert_eq!(per_core.len(), 1);
    assert_eq!(per_core[0]["core"], 0);
    assert_eq!(per_core[0]["ios"].as_u64().unwrap(), ios);
    assert_eq!(per_core[0]["targets"].as_array().unwrap().len(), 1);
    assert_eq!(j["config"]["queue_depth"], 16);
    assert_eq!(j["config"]["io_queue_size"], 64);
    assert_eq!(j["config"]["io_size"], 4096);
    assert_eq!(j["config"]["workload"], "randread");
    assert_eq!(j["targets"][0]["emulator"]["store"], "null");
    assert!(j["verify"].is_null());
}

#[test]
fn perf_text_table() {
    let o = kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-w",
        "randwrite",
        "-o",
        "8k",
        "-q",
        "4",
        "--doorbell",
        "immediate",
        "--transport-stats",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for s in [
        "Device Information",
        "IOPS",
        "MiB/s",
        "stdev",
        "[0] emulator ns1 from core 0",
        "Placement: pollers on core 0",
        "null store",
        "99.9999%",
        "Total",
        "Latency percentiles (us",
        "Outcomes",
        "Result: ok",
        "99.99%",
        "SQ db",
        "CPU",
    ] {
        assert!(out.contains(s), "{s:?} missing: {out}");
    }
    let err = stderr(&o);
    assert!(err.contains("null store"), "the store is announced: {err}");
    assert!(err.contains("immediate doorbells"), "{err}");
}

#[test]
fn bad_io_size_is_a_usage_error() {
    let o = kestrel(&["perf", "-o", "4q"]);
    assert_usage_error(&o, &["--io-size", "invalid size '4q'", "4k", "128KiB"]);
    let o = kestrel(&["perf", "-o", "0"]);
    assert_usage_error(&o, &["--io-size"]);
    let o = kestrel(&["perf", "-t", "1", "-o", "1000"]);
    assert_usage_error(&o, &["--io-size", "not a multiple of the 4096-byte blocks"]);
}

#[test]
fn bad_cores_are_a_usage_error() {
    let o = kestrel(&["perf", "-c", "3-1"]);
    assert_usage_error(
        &o,
        &[
            "--cores",
            "runs backwards",
            "0,2-3",
            "0x5",
            "see 'kestrel perf --help'",
        ],
    );
    let o = kestrel(&["perf", "-q", "32", "--io-queue-size", "32"]);
    assert_usage_error(&o, &["--io-queue-size", "cannot hold queue depth 32"]);
    let o = kestrel(&["perf", "-c", "0xzz"]);
    assert_usage_error(&o, &["--cores", "not hexadecimal"]);
    let o = kestrel(&["perf", "-t", "1", "-c", "4000"]);
    assert_usage_error(&o, &["core 4000 is not available"]);
    let o = kestrel(&["perf", "-t", "1", "--target", "emu:core=4000"]);
    assert_usage_error(&o, &["emu core=4000", "not available"]);
}

/// Every usage error exits 2 with one line, before anything runs (no report on stdout).
#[test]
fn usage_errors_are_found_before_the_run() {
    let o = kestrel(&["perf", "-w", "foo"]);
    assert_usage_error(
        &o,
        &[
            "'foo'",
            "--workload",
            "read, write, randread, randwrite, rw, randrw",
        ],
    );
    let o = kestrel(&["perf", "-t", "2x"]);
    assert_usage_error(&o, &["--time"]);
    for t in ["0", "500", "10us"] {
        let o = kestrel(&["perf", "--io-timeout", t]);
        assert_usage_error(&o, &["--io-timeout"]);
    }
    // A plot that cannot be written fails now, not after the run.
    let o = kestrel(&[
        "perf",
        "-t",
        "30",
        "--latency-plot",
        "/nonexistent-dir/lat.svg",
    ]);
    assert_usage_error(&o, &["--latency-plot", "/nonexistent-dir/lat.svg"]);
    assert!(o.stdout.is_empty(), "nothing ran");
    let dir = tempfile::tempdir().unwrap();
    let o = kestrel(&[
        "perf",
        "-t",
        "30",
        "--latency-plot",
        dir.path().to_str().unwrap(),
    ]);
    assert_usage_error(&o, &["--latency-plot", "is a directory"]);
    // A file target that does not exist names the way to create it.
    let missing = dir.path().join("none.img");
    let o = kestrel(&[
        "perf",
        "-t",
        "30",
        "--target",
        &format!("file:{}", missing.display()),
    ]);
    assert_usage_error(&o, &["does not exist", ",size=1G"]);
    assert!(!stderr(&o).contains("--size"), "{}", stderr(&o));
    // The same file twice.
    let f = format!("file:{},size=1M", dir.path().join("f.img").display());
    let o = kestrel(&["perf", "-t", "30", "--target", &f, "--target", &f]);
    assert_usage_error(&o, &["named twice"]);
    // A fault that can never fire.
    let o = kestrel(&["perf", "-t", "30", "--target", "emu:faults=fatal/after/0"]);
    assert_usage_error(&o, &["fatal/after/0", "never fires"]);
}

/// `-t` and `--warmup` take seconds or durations.
#[test]
fn durations_everywhere() {
    let o = kestrel(&[
        "perf", "-t", "300ms", "--warmup", "100ms", "-q", "4", "--json", "--quiet",
    ]);
    // A poller kept off the CPU for the whole window by other load completes nothing in
    // it, and perf says so (exit 3); the durations are reported either way.
    let starved = o.status.code() == Some(3)
        && stderr(&o).contains("none completed inside the measured window");
    assert!(
        o.status.success() || starved,
        "{:?}: {}",
        o.status,
        stderr(&o)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["config"]["time_s"], 0.3);
    assert_eq!(j["config"]["warmup_s"], 0.1);
    assert_eq!(j["config"]["io_timeout_ms"], 30000.0);
    assert_eq!(j["config"]["number_ios"], serde_json::Value::Null);
    // The window never ends before its 300 ms; how long after them the poller notices is up
    // to the scheduler (a loaded machine stretched it past 5 s once), so no upper bound.
    let secs = j["total"]["seconds"].as_f64().unwrap();
    assert!(secs > 0.2, "{secs}");
}

#[test]
fn number_ios_ends_the_window_after_exactly_that_many() {
    for (cores, q) in [("0", "8"), ("0", "1")] {
        let j = json(&kestrel(&[
            "perf",
            "-t",
            "60",
            "--warmup",
            "0",
            "-q",
            q,
            "-c",
            cores,
            "--number-ios",
            "777",
            "--json",
            "--quiet",
        ]));
        assert_eq!(j["config"]["number_ios"], 777);
        assert_eq!(j["total"]["ios"], 777, "{q}");
        let secs = j["total"]["seconds"].as_f64().unwrap();
        assert!(secs > 0.0 && secs < 60.0, "{secs}");
    }
    let o = kestrel(&["perf", "--number-ios", "0"]);
    assert_usage_error(&o, &["--number-ios", "at least 1"]);
}

#[test]
fn bad_targets_are_usage_errors() {
    let o = kestrel(&["identify", "--target", "emu:lba=1024"]);
    assert_usage_error(&o, &["--target", "512 and 4096"]);
    let o = kestrel(&["perf", "--verify", "--target", "emu:store=null"]);
    assert_usage_error(&o, &["--verify needs a store that keeps data"]);
}

#[test]
fn verify_passes_on_an_honest_store() {
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-w",
        "randrw",
        "-q",
        "8",
        "--verify",
        "--json",
        "--quiet",
        "--target",
        "emu:size=16M",
    ]));
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0);
    assert!(v["blocks_checked"].as_u64().unwrap() > 0);
    assert_eq!(j["targets"][0]["emulator"]["store"], "memory");
    assert_eq!(j["io_errors"], 0);
}

#[test]
fn verify_reads_back_what_a_write_workload_wrote() {
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-w",
        "write",
        "-q",
        "8",
        "--verify",
        "--json",
        "--quiet",
        "--target",
        "emu:size=4M,lba=512",
    ]));
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0);
    // Sequential 4 KiB writes cover all 1024 units of 4 MiB many times over in a second;
    // each unit is read back once, 8 blocks of 512 bytes each.
    assert_eq!(v["readback_reads"], 1024, "{v}");
    assert_eq!(v["blocks_checked"], 1024 * 8, "{v}");
}

#[test]
fn injected_errors_fail_the_run_and_retryable_ones_are_retried() {
    // Unrecovered Read Error with DNR on 1% of reads: final, reported, exit status 3.
    let o = kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "20000",
        "--warmup",
        "0",
        "-q",
        "8",
        "--json",
        "--quiet",
        "--target",
        "emu:faults=status/read/read-error/dnr/1%",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let n = j["io_errors"].as_u64().unwrap();
    assert!(n > 0);
    assert_eq!(j["outcomes"]["errors"], n);
    assert_eq!(j["result"]["exit_status"], 3);
    assert!(
        j["errors"][0]
            .as_str()
            .unwrap()
            .contains("Unrecovered Read Error"),
        "{}",
        j["errors"]
    );
    let err = stderr(&o);
    assert!(
        err.contains(&format!("kestrel: error: {n} of ")) && err.contains("did not succeed"),
        "{err}"
    );
    // Without DNR the driver retries: no failure, retries counted. (A read fails for good
    // only when it and its 4 retries all fail: 1e-10 per read at 1 %, so a run of known
    // size, 20000 reads, not however many a fast machine does in a second.)
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "20000",
        "--warmup",
        "0",
        "-q",
        "8",
        "--json",
        "--quiet",
        "--target",
        "emu:faults=status/read/read-error/1%",
    ]));
    assert_eq!(j["io_errors"], 0);
    assert!(
        j["transport"]["retries"].as_u64().unwrap() > 0,
        "{}",
        j["transport"]
    );
    assert_eq!(j["result"]["ok"], true);
    // A malformed spec is a usage error naming the item.
    let o = kestrel(&["identify", "--target", "emu:faults=explode/read"]);
    assert_usage_error(&o, &["faults=explode/read"]);
}

fn flip_byte(path: &Path, offset: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x5a;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
}

/// Writes every block with `--verify`, corrupts one in the emulator's backing file, and
/// reads everything back with `--verify`: the corrupted block is reported with its LBA and
/// the exit status is 1.
#[test]
fn verify_catches_a_corrupted_block() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("ns.img");
    let spec = format!("emu:size=4M,store={}", store.display());
    let o = kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "write", "-q", "4", "--verify", "--quiet",
        "--target", &spec,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A clean read-back passes (blocks of the earlier run are accepted when intact).
    let j = json(&kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "read", "-q", "4", "--verify", "--json",
        "--quiet", "--target", &spec,
    ]));
    assert_eq!(j["verify"]["mismatches"], 0, "{}", j["verify"]);
    assert!(j["verify"]["blocks_checked"].as_u64().unwrap() >= 1024);

    // One byte in the payload of LBA 100.
    flip_byte(&store, 100 * 4096 + 1000);
    let o = kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "read", "-q", "4", "--verify", "--json",
        "--quiet", "--target", &spec,
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &j["verify"]["first_mismatches"][0];
    assert_eq!(m["lba"], 100, "{}", j["verify"]);
    assert_eq!(m["field"], "checksum");
    let err = stderr(&o);
    assert!(err.contains("kestrel: error: verify:"), "{err}");
    assert!(err.contains("lba 100"), "{err}");

    // A block whose header names another LBA (a misdirected write).
    flip_byte(&store, 100 * 4096 + 1000);
    flip_byte(&store, 200 * 4096);
    let o = kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "read", "-q", "4", "--verify", "--json",
        "--quiet", "--target", &spec,
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &j["verify"]["first_mismatches"][0];
    assert_eq!(m["lba"], 200);
    assert_eq!(m["field"], "lba");
    assert_eq!(m["expected"], 200);
    assert_eq!(m["actual"], 200 ^ 0x5a);
}

#[test]
fn latency_plot_is_an_svg() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("lat.svg");
    let o = kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-q",
        "8",
        "--quiet",
        "--latency-plot",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg"), "{}", &s[..80.min(s.len())]);
    assert!(s.contains("Latency CDF") && s.contains("<rect") && s.contains("<polyline"));
}

#[test]
fn perf_on_a_file_target_and_two_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let file = format!("file:{},size=8M", dir.path().join("f.img").display());
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        // Enough I/Os that the slowest target (the file, a hundredth of the emulator's
        // rate or less) sees reads and writes.
        "--number-ios",
        "300000",
        "--warmup",
        "0",
        "-q",
        "4",
        "-w",
        "randrw",
        "--json",
        "--quiet",
        "--target",
        &file,
        "--target",
        "emu:namespaces=2,size=16M",
    ]));
    let targets = j["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 3);
    assert_eq!(targets[0]["kind"], "file");
    assert_eq!(targets[2]["name"], "emulator ns2");
    let rows = j["per_core"][0]["targets"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let sum: u64 = rows.iter().map(|r| r["ios"].as_u64().unwrap()).sum();
    assert_eq!(sum, j["total"]["ios"].as_u64().unwrap());
    for r in rows {
        assert!(r["ios"].as_u64().unwrap() > 0, "{r}");
        assert!(r["reads"].as_u64().unwrap() > 0 && r["writes"].as_u64().unwrap() > 0);
    }
}

/// The short verify soak of the reliability promise: random reads and writes, verified,
/// while the emulator injects retryable errors, delays, duplicate and spurious completions.
/// Nothing may fail, nothing may mismatch, every I/O must complete (the long run and its
/// figures are in docs/reliability.md).
#[test]
fn verify_soak_with_random_faults() {
    let faults = "status/io/internal/2%+delay/io/2ms/1%+duplicate/io/1%+spurious/io/1%+seed/11";
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "3",
        "--warmup",
        "0",
        "-w",
        "randrw",
        "-M",
        "50",
        "-q",
        "32",
        "--verify",
        "--json",
        "--quiet",
        "--target",
        &format!("emu:size=64M,faults={faults}"),
    ]));
    assert_eq!(j["io_errors"], 0, "{}", j["errors"]);
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0, "{v}");
    assert!(v["blocks_checked"].as_u64().unwrap() > 1000, "{v}");
    let t = &j["transport"];
    assert!(t["retries"].as_u64().unwrap() > 0, "{t}");
    assert!(t["bogus_completions"].as_u64().unwrap() > 0, "{t}");
}

#[test]
fn ctrl_c_stops_the_run_and_still_reports() {
    let child = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args([
            "perf", "-t", "60", "--warmup", "0", "-q", "4", "--json", "--quiet",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = child.id().to_string();
    let st = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(st.success());
    let start = std::time::Instant::now();
    let o = child.wait_with_output().unwrap();
    // Bound: the run stops at the next loop iteration and drains; 30 s is generous.
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let secs = j["total"]["seconds"].as_f64().unwrap();
    assert!(secs > 0.0 && secs < 60.0, "{secs}");
    assert!(j["total"]["ios"].as_u64().unwrap() > 0);
    assert!(stderr(&o).contains("interrupted"), "{}", stderr(&o));
}

#[test]
fn two_pollers_with_two_qpairs_each_split_the_lba_space() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        eprintln!("skipped: needs 2 cores, this machine has {cores}");
        return;
    }
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-q",
        "4",
        "-c",
        "0-1",
        "--qpairs-per-core",
        "2",
        "--json",
        "--quiet",
        "--target",
        // Both cores poll: the emulator shares them (unpinned), as asked.
        "emu:size=64M,core=none",
    ]));
    let pc = j["per_core"].as_array().unwrap();
    assert_eq!(pc.len(), 2);
    assert_eq!(pc[0]["core"], 0);
    assert_eq!(pc[1]["core"], 1);
    let r0 = &pc[0]["targets"][0];
    let r1 = &pc[1]["targets"][0];
    let (f0, n0) = (
        r0["lba_first"].as_u64().unwrap(),
        r0["lba_count"].as_u64().unwrap(),
    );
    let (f1, n1) = (
        r1["lba_first"].as_u64().unwrap(),
        r1["lba_count"].as_u64().unwrap(),
    );
    assert_eq!((f0, f0 + n0), (0, f1), "disjoint and adjacent");
    assert_eq!(f1 + n1, (64 << 20) / 4096, "together the whole namespace");
    let total: u64 = pc.iter().map(|c| c["ios"].as_u64().unwrap()).sum();
    assert_eq!(total, j["total"]["ios"].as_u64().unwrap());
    // Two queue pairs per core, each filled to the queue depth at the start.
    for c in pc {
        assert!(c["transport"]["submitted"].as_u64().unwrap() > 0);
    }
}

#[test]
fn read_copies_a_range_of_a_file_target() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("t.img");
    let data: Vec<u8> = (0..(256u32 << 10))
        .map(|i| (i * 7 + (i >> 12)) as u8)
        .collect();
    std::fs::write(&img, &data).unwrap();
    let out = dir.path().join("out.bin");
    let o = kestrel(&[
        "read",
        "--target",
        &format!("file:{},direct=off", img.display()),
        "--offset",
        "8k",
        "--length",
        "200k",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = std::fs::read(&out).unwrap();
    assert!(got == data[8192..8192 + 200 * 1024], "the range read back");
    let o = kestrel(&[
        "read",
        "--target",
        &format!("file:{},direct=off", img.display()),
        "--offset",
        "100",
        "--length",
        "4k",
    ]);
    assert_usage_error(&o, &["multiples of the block size"]);
}

#[test]
fn serve_refuses_open_access_off_loopback() {
    let o = kestrel(&[
        "serve",
        "--target",
        "emu:size=16M",
        "--listen",
        "192.0.2.1:4420",
        "--allow-any-host",
    ]);
    assert_usage_error(&o, &["only on loopback"]);
}

/// A run in which no I/O succeeds is a failure that says why, with no latency figures.
#[test]
fn a_run_where_nothing_succeeds_fails_and_says_why() {
    let spec = "emu:faults=status/read/read-error/dnr";
    let o = kestrel(&[
        "perf", "-t", "300ms", "--warmup", "0", "-q", "4", "--json", "--quiet", "--target", spec,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["total"]["ios"], 0);
    assert_eq!(j["total"]["iops"], 0.0);
    assert_eq!(j["total"]["mib_per_s"], 0.0);
    assert!(j["total"]["latency_us"].is_null(), "{}", j["total"]);
    assert!(j["total"]["ns_per_io_cpu"].is_null());
    let out = &j["outcomes"];
    assert!(out["errors"].as_u64().unwrap() > 0);
    assert_eq!(out["succeeded"], 0);
    assert_eq!(out["errors"], out["submitted"]);
    assert_eq!(
        out["errors_by_status"][0]["error"],
        "Unrecovered Read Error"
    );
    assert_eq!(out["errors_by_status"][0]["sct"], 2);
    assert_eq!(out["errors_by_status"][0]["sc"], 0x81);
    assert!(
        j["result"]["reason"]
            .as_str()
            .unwrap()
            .contains("no I/O succeeded"),
        "{}",
        j["result"]
    );
    let err = stderr(&o);
    assert!(err.contains("kestrel: error: no I/O succeeded"), "{err}");
    assert!(err.contains("Unrecovered Read Error"), "{err}");
    // The text report has no percentiles of zero.
    let o = kestrel(&[
        "perf", "-t", "300ms", "--warmup", "0", "-q", "4", "--quiet", "--target", spec,
    ]);
    assert_eq!(o.status.code(), Some(3));
    let text = stdout(&o);
    assert!(!text.contains("Latency percentiles"), "{text}");
    assert!(text.contains("no I/O succeeded"), "{text}");
    assert!(text.contains("Result: FAILED (exit status 3)"), "{text}");
}

/// With every core running a poller, the emulator has none of its own: said on stderr and
/// in the report, not hidden.
#[test]
fn an_emulator_without_a_core_of_its_own_is_reported() {
    let Some(ids) = std::thread::available_parallelism().ok().map(|n| n.get()) else {
        return;
    };
    if ids > 8 {
        eprintln!("skipped: {ids} cores; the case needs a poller on every one");
        return;
    }
    let cores = format!("0-{}", ids - 1);
    // The window ends after 200 I/Os per poller (or a minute): a poller that shares its
    // core with the emulator and other load cannot be left with an empty window, as a
    // 200 ms one was once.
    let o = kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "200",
        "--warmup",
        "0",
        "-q",
        "2",
        "-c",
        &cores,
        // Busy pollers on every core are refused (below); sleeping ones may share.
        "--poll-mode",
        "hybrid",
        "--json",
        "--quiet",
        "--target",
        "emu:size=64M",
    ]);
    let j = json(&o);
    assert_eq!(j["config"]["poll_mode"], "hybrid");
    let w = j["warnings"].as_array().unwrap();
    assert!(
        w.iter()
            .any(|w| w.as_str().unwrap().contains("leave a core free")),
        "{w:?}"
    );
    assert_eq!(j["targets"][0]["emulator"]["shares_poller_cores"], true);
    assert!(
        stderr(&o).contains("kestrel perf: warning:"),
        "{}",
        stderr(&o)
    );
}

/// Every latency summary in a perf JSON report: percentiles within [min, max] and never
/// decreasing, the histogram adding up to the I/Os it summarises. Returns how many it saw.
fn check_latencies(v: &serde_json::Value, path: &str) -> usize {
    let mut seen = 0;
    match v {
        serde_json::Value::Object(m) => {
            if let Some(l) = m.get("latency_us").filter(|l| l.is_object()) {
                let (min, max) = (l["min"].as_f64().unwrap(), l["max"].as_f64().unwrap());
                assert!(l["stdev"].as_f64().unwrap() >= 0.0, "{path}: stdev");
                let mut prev = min;
                for k in [
                    "p1", "p5", "p10", "p20", "p30", "p40", "p50", "p60", "p70", "p80", "p90",
                    "p95", "p99", "p99_5", "p99_9", "p99_95", "p99_99", "p99_999", "p99_9999",
                ] {
                    let p = l[k]
                        .as_f64()
                        .unwrap_or_else(|| panic!("{path}.latency_us.{k}"));
                    assert!(p >= prev && p <= max, "{path}: {k} = {p} ({min}..{max})");
                    prev = p;
                }
                let hist = l["histogram"].as_array().expect("histogram");
                let n: u64 = hist.iter().map(|b| b["count"].as_u64().unwrap()).sum();
                if let Some(ios) = m.get("ios").and_then(|i| i.as_u64()) {
                    assert_eq!(n, ios, "{path}: histogram counts");
                }
                let last = hist.last().expect("a bucket");
                assert_eq!(last["cumulative_pct"].as_f64(), Some(100.0), "{path}");
                seen += 1;
            }
            for (k, x) in m {
                seen += check_latencies(x, &format!("{path}.{k}"));
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                seen += check_latencies(x, &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
    seen
}

/// A mixed workload reports reads and writes apart, in JSON and text, with the
/// progress samples, the placement and the run's conditions. Structure only: the figures
/// depend on how much CPU the run gets.
#[test]
fn perf_mixed_workload_reports_reads_and_writes_apart() {
    let j = json(&kestrel(&[
        "perf", "-t", "300ms", "--warmup", "0", "-q", "8", "-w", "randrw", "-M", "70", "--json",
        "--quiet",
    ]));
    let t = &j["total"];
    let (rd, wr) = (&t["read"], &t["write"]);
    assert_eq!(
        rd["ios"].as_u64().unwrap() + wr["ios"].as_u64().unwrap(),
        t["ios"].as_u64().unwrap()
    );
    assert_eq!(rd["ios"], t["reads"]);
    assert_eq!(wr["ios"], t["writes"]);
    let row = &j["per_core"][0]["targets"][0];
    assert!(row["read"]["latency_us"]["p50"].is_number(), "{row}");
    assert!(row["write"]["latency_us"]["p50"].is_number(), "{row}");
    assert_eq!(j["targets"][0]["total"]["ios"], t["ios"]);
    // total, its read and write, the row with its read and write, the core, the target
    // total with its read and write.
    let n = check_latencies(&j, "$");
    assert!(n >= 9, "{n} latency summaries");
    let prog = j["progress"].as_array().expect("progress samples");
    assert!(!prog.is_empty(), "at least the final sample");
    for p in prog {
        for k in ["t_s", "interval_s", "ios", "iops", "mib_per_s", "errors"] {
            assert!(p[k].is_number(), "progress.{k}: {p}");
        }
        assert!(["warmup", "running", "finishing"].contains(&p["phase"].as_str().unwrap()));
    }
    let pl = &j["placement"];
    assert_eq!(pl["poller_cores"], serde_json::json!([0]));
    assert_eq!(pl["emulators"][0]["target"], 0);
    let conds: Vec<&str> = j["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(conds.iter().any(|c| c.contains("null store")), "{conds:?}");
    // A read workload has no write figures.
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-q",
        "4",
        "--json",
        "--quiet",
    ]));
    assert!(j["total"]["write"].is_null());
    assert!(j["total"]["read"]["latency_us"].is_object());
    check_latencies(&j, "$");

    // Text: the read and write rows, the histogram (-L), the progress lines (--progress
    // prints them on a pipe too), no transport table unless asked.
    let o = kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-q",
        "8",
        "-w",
        "randrw",
        "-L",
        "--progress",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let rows = |what: &str| {
        out.lines()
            .filter(|l| l.split_whitespace().next() == Some(what))
            .count()
    };
    assert_eq!(
        rows("read"),
        2,
        "a read row under the core's and the Total's: {out}"
    );
    assert_eq!(rows("write"), 2, "{out}");
    for s in [
        "Latency histogram, Total:",
        "Latency histogram, Total, reads:",
        "Range in us",
        "Total read",
        "Conditions of this run:",
    ] {
        assert!(out.contains(s), "{s:?} missing: {out}");
    }
    assert!(
        !out.contains("SQ db"),
        "transport table only on request: {out}"
    );
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(" IOPS ")).collect();
    assert!(!lines.is_empty(), "progress lines: {err}");
    for l in lines {
        for w in ["MiB/s", "avg", "errors"] {
            assert!(l.contains(w), "{w} not in progress line {l:?}");
        }
    }
}

#[test]
fn count_syscalls_finds_none_in_a_polled_nvme_window_and_the_file_targets_enters() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("sys.img");
    std::fs::write(&img, vec![0u8; 8 << 20]).unwrap();
    let file = format!("file:{}", img.display());
    let mut counted = Vec::new();
    for target in ["emu", file.as_str()] {
        let o = kestrel(&[
            "perf",
            "-t",
            "60",
            "--number-ios",
            "20000",
            "--warmup",
            "100ms",
            "-q",
            "16",
            "--count-syscalls",
            "--json",
            "--quiet",
            "--target",
            target,
        ]);
        if !o.status.success() && stderr(&o).contains("seccomp user notification refused") {
            eprintln!("skipped: {}", stderr(&o).trim());
            return;
        }
        let j = json(&o);
        assert_eq!(j["config"]["count_syscalls"], true);
        let c = &j["per_core"][0];
        counted.push((
            c["syscalls_in_window"].as_u64().unwrap(),
            c["first_syscall_nr"].clone(),
        ));
    }
    // The NVMe queue pair (emulated: memory and doorbell stores, as MMIO to a device):
    // not one system call in 20000 I/Os.
    assert_eq!(counted[0], (0, serde_json::Value::Null), "{counted:?}");
    // The file target enters io_uring: counted, so the counter is in the path.
    assert!(counted[1].0 > 0, "{counted:?}");
    assert_eq!(counted[1].1, libc::SYS_io_uring_enter, "{counted:?}");
}

#[test]
fn busy_pollers_on_every_core_with_the_emulator_are_refused() {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    if ids.len() < 2 {
        eprintln!(
            "skipped: needs 2 cores available, this process has {}",
            ids.len()
        );
        return;
    }
    let all = ids
        .iter()
        .map(|c| c.id.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = kestrel(&["perf", "-t", "1", "-c", &all, "--quiet"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("leaving the emulator thread no core"), "{err}");
    assert!(err.contains("--poll-mode hybrid|interrupt"), "{err}");
}
