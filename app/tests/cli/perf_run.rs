//! A `kestrel perf` run on the emulator as the perf and verify tests build it: how it
//! ends (a count of I/Os or a time), what it is given, and the exit status it must end
//! with; and reading the numbers of its JSON report with a message naming what was read.

use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{kestrel_cmd, stderr, stdout_json};

/// The arguments of one `kestrel perf` run, without warm-up unless asked.
pub struct Perf {
    seconds: String,
    number_ios: Option<u32>,
    warmup: String,
    args: Vec<String>,
    targets: Vec<String>,
}

impl Perf {
    /// `perf -t 60 --number-ios n --warmup 0`: the window ends after exactly `n` I/Os
    /// (a minute at most), however much CPU the run gets.
    pub fn counted(n: u32) -> Self {
        Self::new("60", Some(n))
    }

    /// `perf -t t --warmup 0`: the window lasts `t` (`1`, `300ms`, ...).
    pub fn timed(t: &str) -> Self {
        Self::new(t, None)
    }

    fn new(t: &str, number_ios: Option<u32>) -> Self {
        Self {
            seconds: t.to_owned(),
            number_ios,
            warmup: "0".to_owned(),
            args: Vec::new(),
            targets: Vec::new(),
        }
    }

    /// A warm-up of `w` instead of none.
    pub fn warmup(mut self, w: &str) -> Self {
        self.warmup = w.to_owned();
        self
    }

    /// More options, in this order (`-q 8`, `-w randrw`, ...).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// `--target spec`, after the targets given before it.
    pub fn target(mut self, spec: &str) -> Self {
        self.targets.push(spec.to_owned());
        self
    }

    /// The command line after `kestrel`; with `--json --quiet` when `json`.
    fn argv(&self, json: bool) -> Vec<String> {
        let mut v: Vec<String> = vec!["perf".into(), "-t".into(), self.seconds.clone()];
        if let Some(n) = self.number_ios {
            v.extend(["--number-ios".into(), n.to_string()]);
        }
        v.extend(["--warmup".into(), self.warmup.clone()]);
        v.extend(self.args.iter().cloned());
        if json {
            v.extend(["--json".into(), "--quiet".into()]);
        }
        for t in &self.targets {
            v.extend(["--target".into(), t.clone()]);
        }
        v
    }

    /// The command of the run with a JSON report, to start and stop by hand.
    pub fn json_command(&self) -> Command {
        let mut c = kestrel_cmd();
        c.args(self.argv(true));
        c
    }

    /// Runs it with the text report, to its end, whatever its exit status.
    pub fn run(&self) -> Output {
        kestrel_cmd()
            .args(self.argv(false))
            .output()
            .expect("run kestrel perf")
    }

    /// Runs it with a JSON report (`--json --quiet`), to its end, whatever its exit status.
    pub fn run_json(&self) -> Output {
        self.json_command().output().expect("run kestrel perf")
    }

    /// Runs it with the text report; it must succeed.
    pub fn text_ok(&self) -> Output {
        self.text_exit(0)
    }

    /// Runs it with the text report; it must end with exit status `code`.
    pub fn text_exit(&self, code: i32) -> Output {
        let o = self.run();
        self.assert_exit(&o, false, code);
        o
    }

    /// Runs it with a JSON report; it must succeed. The report.
    pub fn json(&self) -> Value {
        self.report(0).0
    }

    /// Runs it with a JSON report; it must end with exit status `code`. The report and
    /// what the run said on stderr.
    pub fn report(&self, code: i32) -> (Value, String) {
        let o = self.run_json();
        self.assert_exit(&o, true, code);
        (stdout_json(&o), stderr(&o))
    }

    /// `o`, a run of this one (with a JSON report when `json`), ended with exit status
    /// `code`: the message names the command line and what it said on stderr.
    pub fn assert_exit(&self, o: &Output, json: bool, code: i32) {
        assert_eq!(
            o.status.code(),
            Some(code),
            "kestrel {}: stderr: {}",
            self.argv(json).join(" "),
            stderr(o)
        );
    }
}

/// The value at `pointer` (`/total/ios`) in `v`, an unsigned integer.
pub fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} is not an unsigned integer in {v}"))
}

/// The value at `pointer` (`/total/seconds`) in `v`, a number.
pub fn f64_at(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{pointer} is not a number in {v}"))
}

/// The value at `pointer` (`/per_core`) in `v`, an array.
pub fn array_at<'a>(v: &'a Value, pointer: &str) -> &'a Vec<Value> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{pointer} is not an array in {v}"))
}

/// The rows of the first poller's report, one per target (`/per_core/0/targets`).
pub fn target_rows(j: &Value) -> &Vec<Value> {
    array_at(j, "/per_core/0/targets")
}
