//! `perf`: its reports (JSON, text, latency plot), how a run ends (a count of I/Os,
//! Ctrl-C, nothing succeeding), pollers and qpairs, file targets, system calls counted.

use std::process::{Command, Output};

use crate::common::{assert_usage_error, file_target, kestrel, stderr, stdout, stdout_json};
use crate::perf_run::{array_at, f64_at, target_rows, u64_at, Perf};

#[test]
fn perf_json_is_consistent() {
    let j = Perf::timed("1").args(&["-q", "16"]).json();
    let t = &j["total"];
    let (ios, secs, iops) = (u64_at(t, "/ios"), f64_at(t, "/seconds"), f64_at(t, "/iops"));
    assert!(ios > 0, "{t}");
    // The window spans -t from the pollers' first and last loop iterations past the
    // marks; a descheduled poller can stretch or shrink it, so only a loose bound.
    assert!((0.5..10.0).contains(&secs), "window {secs} s for -t 1");
    assert!(
        (iops - ios as f64 / secs).abs() <= 0.01,
        "iops {iops} != {ios} / {secs}"
    );
    let mib = f64_at(t, "/mib_per_s");
    assert!((mib - iops * 4096.0 / 1048576.0).abs() <= 0.01 + mib * 1e-9);
    let l = &t["latency_us"];
    for k in ["avg", "min", "max", "p50", "p99", "p99_9", "p1", "p99_99"] {
        assert!(l[k].is_number(), "latency_us.{k}");
    }
    let (min, avg, max) = (f64_at(l, "/min"), f64_at(l, "/avg"), f64_at(l, "/max"));
    assert!(min > 0.0 && min <= avg && avg <= max, "{min} {avg} {max}");
    assert!(f64_at(l, "/p50") <= f64_at(l, "/p99"), "{l}");
    let ns_per_io = f64_at(t, "/ns_per_io_cpu");
    assert!(ns_per_io > 0.0, "{t}");
    assert!(f64_at(t, "/ns_per_io_cpu_p50") > 0.0, "{t}");
    let busy = u64_at(t, "/busy_ns");
    assert!(
        (ns_per_io - busy as f64 / ios as f64).abs() <= 0.06,
        "ns_per_io_cpu is busy_ns / ios: {ns_per_io} != {busy} / {ios}"
    );
    let tr = &j["transport"];
    // Completions counted by the transport over the window are the I/Os measured.
    assert_eq!(u64_at(tr, "/completed"), ios, "{tr}");
    let (sq, cq) = (
        u64_at(tr, "/sq_doorbell_writes"),
        u64_at(tr, "/cq_doorbell_writes"),
    );
    let per = f64_at(tr, "/doorbell_writes_per_io");
    assert!(
        (per - (sq + cq) as f64 / ios as f64).abs() < 1e-3,
        "{per} != ({sq} + {cq}) / {ios}"
    );
    let per_core = array_at(&j, "/per_core");
    assert_eq!(per_core.len(), 1);
    assert_eq!(per_core[0]["core"], 0);
    assert_eq!(u64_at(&per_core[0], "/ios"), ios);
    assert_eq!(target_rows(&j).len(), 1);
    assert_eq!(j["config"]["queue_depth"], 16);
    assert_eq!(j["config"]["io_queue_size"], 64);
    assert_eq!(j["config"]["io_size"], 4096);
    assert_eq!(j["config"]["workload"], "randread");
    assert_eq!(j["targets"][0]["emulator"]["store"], "null");
    assert!(j["verify"].is_null());
}

#[test]
fn perf_text_table() {
    let o = Perf::counted(2000)
        .args(&["-w", "randwrite", "-o", "8k", "-q", "4"])
        .args(&["--doorbell", "immediate", "--transport-stats"])
        .text_ok();
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
        let j = Perf::counted(777).args(&["-q", q, "-c", cores]).json();
        assert_eq!(j["config"]["number_ios"], 777);
        assert_eq!(j["total"]["ios"], 777, "{q}");
        let secs = f64_at(&j, "/total/seconds");
        assert!(secs > 0.0 && secs < 60.0, "{secs}");
    }
    let o = kestrel(&["perf", "--number-ios", "0"]);
    assert_usage_error(&o, &["--number-ios", "at least 1"]);
}

#[test]
fn latency_plot_is_an_svg() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("lat.svg");
    Perf::counted(2000)
        .args(&[
            "-q",
            "8",
            "--quiet",
            "--latency-plot",
            svg.to_str().unwrap(),
        ])
        .text_ok();
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg"), "{}", &s[..80.min(s.len())]);
    assert!(s.contains("Latency CDF") && s.contains("<rect") && s.contains("<polyline"));
}

#[test]
fn perf_on_a_file_target_and_two_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_target(dir.path(), "f.img", "8M");
    // Enough I/Os that the slowest target (the file, a hundredth of the emulator's rate
    // or less) sees reads and writes.
    let j = Perf::counted(300000)
        .args(&["-q", "4", "-w", "randrw"])
        .target(&file)
        .target("emu:namespaces=2,size=16M")
        .json();
    let targets = array_at(&j, "/targets");
    assert_eq!(targets.len(), 3);
    assert_eq!(targets[0]["kind"], "file");
    assert_eq!(targets[2]["name"], "emulator ns2");
    let rows = target_rows(&j);
    assert_eq!(rows.len(), 3);
    let sum: u64 = rows.iter().map(|r| u64_at(r, "/ios")).sum();
    assert_eq!(
        sum,
        u64_at(&j, "/total/ios"),
        "the rows add up to the total"
    );
    for r in rows {
        assert!(u64_at(r, "/ios") > 0, "{r}");
        assert!(u64_at(r, "/reads") > 0 && u64_at(r, "/writes") > 0, "{r}");
    }
}

#[test]
fn ctrl_c_stops_the_run_and_still_reports() {
    let child = Perf::timed("60")
        .args(&["-q", "4"])
        .json_command()
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
    let secs = f64_at(&j, "/total/seconds");
    assert!(secs > 0.0 && secs < 60.0, "{secs}");
    assert!(u64_at(&j, "/total/ios") > 0, "{}", j["total"]);
    assert!(stderr(&o).contains("interrupted"), "{}", stderr(&o));
}

#[test]
fn two_pollers_with_two_qpairs_each_split_the_lba_space() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        eprintln!("skipped: needs 2 cores, this machine has {cores}");
        return;
    }
    let j = Perf::counted(2000)
        .args(&["-q", "4", "-c", "0-1", "--qpairs-per-core", "2"])
        // Both cores poll: the emulator shares them (unpinned), as asked.
        .target("emu:size=64M,core=none")
        .json();
    let pc = array_at(&j, "/per_core");
    assert_eq!(pc.len(), 2);
    assert_eq!(pc[0]["core"], 0);
    assert_eq!(pc[1]["core"], 1);
    let (r0, r1) = (&pc[0]["targets"][0], &pc[1]["targets"][0]);
    let (f0, n0) = (u64_at(r0, "/lba_first"), u64_at(r0, "/lba_count"));
    let (f1, n1) = (u64_at(r1, "/lba_first"), u64_at(r1, "/lba_count"));
    assert_eq!((f0, f0 + n0), (0, f1), "disjoint and adjacent");
    assert_eq!(f1 + n1, (64 << 20) / 4096, "together the whole namespace");
    let total: u64 = pc.iter().map(|c| u64_at(c, "/ios")).sum();
    assert_eq!(
        total,
        u64_at(&j, "/total/ios"),
        "the cores add up to the total"
    );
    // Two queue pairs per core, each filled to the queue depth at the start.
    for c in pc {
        assert!(u64_at(c, "/transport/submitted") > 0, "{}", c["transport"]);
    }
}

/// A run in which no I/O succeeds is a failure that says why, with no latency figures.
#[test]
fn a_run_where_nothing_succeeds_fails_and_says_why() {
    let spec = "emu:faults=status/read/read-error/dnr";
    let run = Perf::timed("300ms").args(&["-q", "4"]).target(spec);
    let (j, err) = run.report(3);
    assert_eq!(j["total"]["ios"], 0);
    assert_eq!(j["total"]["iops"], 0.0);
    assert_eq!(j["total"]["mib_per_s"], 0.0);
    assert!(j["total"]["latency_us"].is_null(), "{}", j["total"]);
    assert!(j["total"]["ns_per_io_cpu"].is_null());
    let out = &j["outcomes"];
    assert!(u64_at(out, "/errors") > 0, "{out}");
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
    assert!(err.contains("kestrel: error: no I/O succeeded"), "{err}");
    assert!(err.contains("Unrecovered Read Error"), "{err}");
    // The text report has no percentiles of zero.
    let text = stdout(&run.args(&["--quiet"]).text_exit(3));
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
    let (j, err) = Perf::counted(200)
        .args(&["-q", "2", "-c", &cores])
        // Busy pollers on every core are refused (below); sleeping ones may share.
        .args(&["--poll-mode", "hybrid"])
        .target("emu:size=64M")
        .report(0);
    assert_eq!(j["config"]["poll_mode"], "hybrid");
    let w = array_at(&j, "/warnings");
    assert!(
        w.iter()
            .any(|w| w.as_str().unwrap().contains("leave a core free")),
        "{w:?}"
    );
    assert_eq!(j["targets"][0]["emulator"]["shares_poller_cores"], true);
    assert!(err.contains("kestrel perf: warning:"), "{err}");
}

/// Every latency summary in a perf JSON report: percentiles within [min, max] and never
/// decreasing, the histogram adding up to the I/Os it summarises. Returns how many it saw.
fn check_latencies(v: &serde_json::Value, path: &str) -> usize {
    let mut seen = 0;
    match v {
        serde_json::Value::Object(m) => {
            if let Some(l) = m.get("latency_us").filter(|l| l.is_object()) {
                let (min, max) = (f64_at(l, "/min"), f64_at(l, "/max"));
                assert!(f64_at(l, "/stdev") >= 0.0, "{path}: stdev");
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
                let n: u64 = hist.iter().map(|b| u64_at(b, "/count")).sum();
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
    let j = Perf::timed("300ms")
        .args(&["-q", "8", "-w", "randrw", "-M", "70"])
        .json();
    check_mixed_json(&j);
    // A read workload has no write figures.
    let j = Perf::counted(2000).args(&["-q", "4"]).json();
    assert!(j["total"]["write"].is_null());
    assert!(j["total"]["read"]["latency_us"].is_object());
    check_latencies(&j, "$");

    // Text: the read and write rows, the histogram (-L), the progress lines (--progress
    // prints them on a pipe too), no transport table unless asked.
    let o = Perf::counted(2000)
        .args(&["-q", "8", "-w", "randrw", "-L", "--progress"])
        .text_ok();
    check_mixed_text(&o);
}

/// The JSON of a mixed workload: reads and writes apart and adding up, in the total, the
/// rows and the targets; every latency summary sane; progress samples, placement,
/// conditions.
fn check_mixed_json(j: &serde_json::Value) {
    let t = &j["total"];
    let (rd, wr) = (&t["read"], &t["write"]);
    assert_eq!(
        u64_at(rd, "/ios") + u64_at(wr, "/ios"),
        u64_at(t, "/ios"),
        "reads and writes add up to the total"
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
        let run = Perf::counted(20000)
            .warmup("100ms")
            .args(&["-q", "16", "--count-syscalls"])
            .target(target);
        let o = run.run_json();
        if !o.status.success() && stderr(&o).contains("seccomp user notification refused") {
            eprintln!("skipped: {}", stderr(&o).trim());
            return;
        }
        run.assert_exit(&o, true, 0);
        let j = stdout_json(&o);
        assert_eq!(j["config"]["count_syscalls"], true);
        let c = &j["per_core"][0];
        counted.push((
            u64_at(c, "/syscalls_in_window"),
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

/// A guest whose CPUID does not call the TSC invariant (QEMU's TCG; forced here with
/// `KESTREL_TSC_INVARIANT=0`) still times with the TSC: not one system call in the window
/// at QD 1, where nearly every loop iteration is a poll that finds nothing. (On the
/// kernel clock under the HPET clocksource each of those polls was a `clock_gettime`
/// system call.)
#[test]
fn a_tsc_cpuid_does_not_call_invariant_times_the_window_without_a_system_call() {
    let run = Perf::counted(3000).args(&["-q", "1", "--count-syscalls"]);
    let o = run
        .json_command()
        .env("KESTREL_TSC_INVARIANT", "0")
        .env_remove("KESTREL_CLOCK")
        .output()
        .expect("run kestrel perf");
    if !o.status.success() && stderr(&o).contains("seccomp user notification refused") {
        eprintln!("skipped: {}", stderr(&o).trim());
        return;
    }
    run.assert_exit(&o, true, 0);
    let j = stdout_json(&o);
    assert_eq!(j["config"]["clock"], "tsc", "{}", j["config"]);
    assert_eq!(j["config"]["tsc_invariant"], false, "{}", j["config"]);
    let conditions = j["conditions"].to_string();
    assert!(
        conditions.contains("CPUID does not call invariant"),
        "{conditions}"
    );
    let c = &j["per_core"][0];
    assert_eq!(u64_at(c, "/ios"), 3000, "{c}");
    assert!(
        u64_at(c, "/iterations") > u64_at(c, "/ios"),
        "polls that found nothing were made: {c}"
    );
    assert_eq!(u64_at(c, "/syscalls_in_window"), 0, "{c}");
    assert_eq!(c["first_syscall_nr"], serde_json::Value::Null, "{c}");
}
