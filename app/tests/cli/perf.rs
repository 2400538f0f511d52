//! `perf`: its reports (JSON, text, latency plot), how a run ends (a count of I/Os,
//! Ctrl-C, nothing succeeding), pollers and qpairs, file targets, system calls counted.

use std::process::{Command, Output};

use crate::common::{
    assert_usage_error, file_target, json, kestrel, kestrel_cmd, stderr, stdout, stdout_json,
};

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
    let file = file_target(dir.path(), "f.img", "8M");
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

#[test]
fn ctrl_c_stops_the_run_and_still_reports() {
    let child = kestrel_cmd()
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
    let j = stdout_json(&o);
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

/// A run in which no I/O succeeds is a failure that says why, with no latency figures.
#[test]
fn a_run_where_nothing_succeeds_fails_and_says_why() {
    let spec = "emu:faults=status/read/read-error/dnr";
    let o = kestrel(&[
        "perf", "-t", "300ms", "--warmup", "0", "-q", "4", "--json", "--quiet", "--target", spec,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let j = stdout_json(&o);
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
    check_mixed_json(&j);
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
    check_mixed_text(&o);
}

/// The JSON of a mixed workload: reads and writes apart and adding up, in the total, the
/// rows and the targets; every latency summary sane; progress samples, placement,
/// conditions.
fn check_mixed_json(j: &serde_json::Value) {
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
    let n = check_latencies(j, "$");
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
}

/// The text of a mixed workload with -L and --progress: the read and write rows, the
/// histograms, no transport table, the progress lines on stderr.
fn check_mixed_text(o: &Output) {
    assert!(o.status.success(), "{}", stderr(o));
    let out = stdout(o);
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
    let err = stderr(o);
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
