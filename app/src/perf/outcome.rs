//! How each I/O of a `kestrel perf` run ended: exactly one of success, error (with its NVMe
//! status or errno), timeout (aborted, or not resubmitted after a reset) or cancelled;
//! counted per poller and target without allocating, merged for the report.

use kestrel::io::IoError;
use kestrel::spec::{Sct, Status};
use serde::Serialize;

/// Distinct error kinds counted by name; more are counted in [`Outcomes::other_errors`].
pub const ERROR_KINDS_KEPT: usize = 16;

/// One kind of failed I/O, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKey {
    /// The controller completed the command with this status (SCT, SC; DNR, More and CRD
    /// are not part of the kind).
    Nvme {
        /// Status Code Type.
        sct: u8,
        /// Status Code.
        sc: u8,
    },
    /// The operating system failed the I/O (file target): this errno.
    Os(i32),
    /// The device is gone (surprise removal).
    DeviceRemoved,
    /// The controller failed and could not be reset.
    ControllerFailed,
    /// A short read or write.
    ShortTransfer,
}

impl ErrorKey {
    /// The kind of an error that is not a timeout or a cancel.
    fn of(e: IoError) -> ErrorKey {
        match e {
            IoError::Nvme(s) => ErrorKey::Nvme {
                sct: s.sct.code(),
                sc: s.sc,
            },
            IoError::Os(errno) => ErrorKey::Os(errno),
            IoError::DeviceRemoved => ErrorKey::DeviceRemoved,
            IoError::ShortTransfer { .. } => ErrorKey::ShortTransfer,
            // Timeout, Aborted and Cancelled are counted apart; Resetting is what an I/O
            // gets when the controller could not be brought back.
            _ => ErrorKey::ControllerFailed,
        }
    }
}

/// The outcome counts of a set of I/Os.
#[derive(Clone, Debug)]
pub struct Outcomes {
    /// I/Os the target accepted.
    pub submitted: u64,
    /// Completed successfully.
    pub succeeded: u64,
    /// Completed with an error (NVMe status, errno, device removed, ...).
    pub errors: u64,
    /// Timed out: aborted after the I/O timeout, or not resubmitted after a reset.
    pub timed_out: u64,
    /// Cancelled before reaching the device.
    pub cancelled: u64,
    /// Errors by kind, at most [`ERROR_KINDS_KEPT`] kinds (capacity reserved up front).
    pub by_error: Vec<(ErrorKey, u64)>,
    /// Errors of kinds beyond the first [`ERROR_KINDS_KEPT`].
    pub other_errors: u64,
}

impl Default for Outcomes {
    fn default() -> Self {
        Outcomes {
            submitted: 0,
            succeeded: 0,
            errors: 0,
            timed_out: 0,
            cancelled: 0,
            by_error: Vec::with_capacity(ERROR_KINDS_KEPT),
            other_errors: 0,
        }
    }
}

/// Which of the four outcomes a completion result is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Success.
    Success,
    /// An error with a status or errno.
    Error,
    /// Timed out (aborted, or not resubmitted after a reset).
    TimedOut,
    /// Cancelled.
    Cancelled,
}

/// The outcome class of a completion result.
pub fn classify(r: Result<(), IoError>) -> Class {
    match r {
        Ok(()) => Class::Success,
        Err(IoError::Timeout | IoError::Aborted) => Class::TimedOut,
        Err(IoError::Cancelled) => Class::Cancelled,
        Err(_) => Class::Error,
    }
}

impl Outcomes {
    /// Counts one completion. Never allocates.
    pub fn record(&mut self, r: Result<(), IoError>) {
        match (classify(r), r) {
            (Class::Success, _) => self.succeeded += 1,
            (Class::TimedOut, _) => self.timed_out += 1,
            (Class::Cancelled, _) => self.cancelled += 1,
            (Class::Error, Err(e)) => {
                self.errors += 1;
                self.count_error(ErrorKey::of(e), 1);
            }
            (Class::Error, Ok(())) => unreachable!("an Ok result is a success"),
        }
    }

    fn count_error(&mut self, key: ErrorKey, n: u64) {
        if let Some(e) = self.by_error.iter_mut().find(|(k, _)| *k == key) {
            e.1 += n;
        } else if self.by_error.len() < ERROR_KINDS_KEPT {
            self.by_error.push((key, n));
        } else {
            self.other_errors += n;
        }
    }

    /// I/Os that failed: errors, timeouts and cancels.
    pub fn failed(&self) -> u64 {
        self.errors + self.timed_out + self.cancelled
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, o: &Outcomes) {
        self.submitted += o.submitted;
        self.succeeded += o.succeeded;
        self.errors += o.errors;
        self.timed_out += o.timed_out;
        self.cancelled += o.cancelled;
        for &(k, n) in &o.by_error {
            self.count_error(k, n);
        }
        self.other_errors += o.other_errors;
    }
}

/// One row of `errors_by_status` in the JSON.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorCountJson {
    /// `nvme`, `os`, `device_removed`, `controller_failed`, `short_transfer` or `other`.
    pub kind: &'static str,
    /// The spec's name of the status, the errno's text, or what happened.
    pub error: String,
    /// NVMe Status Code Type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sct: Option<u8>,
    /// NVMe Status Code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sc: Option<u8>,
    /// The errno (file target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// I/Os that ended so.
    pub count: u64,
}

impl ErrorCountJson {
    fn new(key: ErrorKey, count: u64) -> Self {
        let row = |kind, error: String| ErrorCountJson {
            kind,
            error,
            sct: None,
            sc: None,
            errno: None,
            count,
        };
        match key {
            ErrorKey::Nvme { sct, sc } => {
                let s = Status::new(Sct::from_code(sct), sc);
                let name = match s.name() {
                    Some(n) => n.to_string(),
                    None => format!("Unknown Status (sct {sct:#x}, sc {sc:#04x})"),
                };
                ErrorCountJson {
                    sct: Some(sct),
                    sc: Some(sc),
                    ..row("nvme", name)
                }
            }
            ErrorKey::Os(errno) => ErrorCountJson {
                errno: Some(errno),
                ..row("os", std::io::Error::from_raw_os_error(errno).to_string())
            },
            ErrorKey::DeviceRemoved => row("device_removed", "device removed".into()),
            ErrorKey::ControllerFailed => row(
                "controller_failed",
                "controller failed and could not be reset".into(),
            ),
            ErrorKey::ShortTransfer => row("short_transfer", "short transfer".into()),
        }
    }

    /// A line for the text report.
    pub fn text(&self) -> String {
        match (self.sct, self.sc, self.errno) {
            (Some(sct), Some(sc), _) => format!("{} (sct {sct:#x}, sc {sc:#04x})", self.error),
            (_, _, Some(e)) => format!("{} (errno {e})", self.error),
            _ => self.error.clone(),
        }
    }
}

/// The rows of `errors_by_status`, most frequent first.
pub fn error_rows(o: &Outcomes) -> Vec<ErrorCountJson> {
    let mut v: Vec<ErrorCountJson> = o
        .by_error
        .iter()
        .map(|&(k, n)| ErrorCountJson::new(k, n))
        .collect();
    if o.other_errors > 0 {
        v.push(ErrorCountJson {
            kind: "other",
            error: format!("errors of more than {ERROR_KINDS_KEPT} other kinds"),
            sct: None,
            sc: None,
            errno: None,
            count: o.other_errors,
        });
    }
    v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.error.cmp(&b.error)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_result_is_one_outcome() {
        let mut o = Outcomes::default();
        let read_err = Status::UNRECOVERED_READ_ERROR.with_dnr(true);
        for r in [
            Ok(()),
            Err(IoError::Nvme(read_err)),
            Err(IoError::Nvme(Status::UNRECOVERED_READ_ERROR)),
            Err(IoError::Timeout),
            Err(IoError::Aborted),
            Err(IoError::Cancelled),
            Err(IoError::DeviceRemoved),
            Err(IoError::Os(5)), // EIO
            Err(IoError::Resetting),
        ] {
            o.record(r);
        }
        assert_eq!(
            (o.succeeded, o.errors, o.timed_out, o.cancelled),
            (1, 5, 2, 1)
        );
        assert_eq!(o.failed(), 8);
        let rows = error_rows(&o);
        assert_eq!(rows[0].count, 2, "dnr is not part of the kind: {rows:?}");
        assert_eq!(rows[0].error, "Unrecovered Read Error");
        assert_eq!((rows[0].sct, rows[0].sc), (Some(2), Some(0x81)));
        assert!(rows.iter().any(|r| r.kind == "device_removed"));
        assert!(rows.iter().any(|r| r.errno == Some(5)));
        assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), o.errors);
    }

    #[test]
    fn kinds_are_bounded_and_merge() {
        let mut a = Outcomes::default();
        for e in 1..=(ERROR_KINDS_KEPT as i32 + 3) {
            a.record(Err(IoError::Os(e)));
        }
        assert_eq!(a.by_error.len(), ERROR_KINDS_KEPT);
        assert_eq!(a.other_errors, 3);
        let mut b = Outcomes::default();
        b.record(Err(IoError::Os(1)));
        b.merge(&a);
        assert_eq!(b.errors, ERROR_KINDS_KEPT as u64 + 4);
        assert_eq!(
            b.by_error
                .iter()
                .find(|(k, _)| *k == ErrorKey::Os(1))
                .unwrap()
                .1,
            2
        );
        assert_eq!(
            error_rows(&b).iter().map(|r| r.count).sum::<u64>(),
            b.errors
        );
    }
}
