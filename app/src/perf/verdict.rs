//! The verdict of a `kestrel perf` run: success, or the error (and exit status) that
//! says what went wrong.

use std::time::Duration;

use crate::error::AppError;

use super::report::{OutcomesJson, Report};

/// Why no I/O succeeded in the window, in words.
fn why_nothing_succeeded(o: &OutcomesJson, io_timeout: Duration) -> String {
    if o.submitted == 0 {
        return if o.removed {
            "the device was removed before any I/O was accepted".into()
        } else {
            "no I/O was accepted by the target".into()
        };
    }
    let mut parts = Vec::new();
    if o.removed {
        parts.push("the device was removed".to_string());
    }
    if o.errors > 0 {
        let top = o.errors_by_status.first().map_or(String::new(), |e| {
            format!(" (most: {} x {})", e.count, e.text())
        });
        parts.push(format!("{} of {} I/Os failed{top}", o.errors, o.submitted));
    }
    if o.timed_out + o.lost > 0 {
        parts.push(format!(
            "{} timed out and {} never completed (--io-timeout {io_timeout:?})",
            o.timed_out, o.lost
        ));
    }
    if o.cancelled > 0 {
        parts.push(format!("{} were cancelled", o.cancelled));
    }
    if parts.is_empty() {
        parts.push(format!(
            "{} I/Os succeeded, but none completed inside the measured window",
            o.succeeded
        ));
    }
    parts.join("; ")
}

/// The verdict: `None` when the run is a success.
pub(super) fn verdict(r: &Report, interrupted: bool, io_timeout: Duration) -> Option<AppError> {
    if let Some(v) = &r.verify {
        if v.mismatches > 0 {
            let first = v
                .first_mismatches
                .first()
                .map_or(String::new(), |m| format!(" (first: {m})"));
            return Some(AppError::VerifyFailed(format!(
                "verify: {} of {} blocks read back wrong{first}",
                v.mismatches, v.blocks_checked
            )));
        }
    }
    let o = &r.outcomes;
    if r.total.ios == 0 && !(interrupted && o.failed() == 0) {
        return Some(AppError::IoFailed(format!(
            "no I/O succeeded in the measured window: {}",
            why_nothing_succeeded(o, io_timeout)
        )));
    }
    if o.failed() > 0 {
        let mut parts = Vec::new();
        for (n, what) in [
            (o.errors, "failed with an error"),
            (o.timed_out, "timed out"),
            (o.cancelled, "were cancelled"),
            (o.lost, "never completed"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        return Some(AppError::IoFailed(format!(
            "{} of {} I/Os did not succeed: {}{}",
            o.failed(),
            o.submitted,
            parts.join(", "),
            r.errors
                .first()
                .map_or(String::new(), |e| format!(" (first: {e})"))
        )));
    }
    if o.timeouts > 0 || o.resets > 0 {
        let mut parts = Vec::new();
        if o.timeouts > 0 {
            parts.push(format!(
                "{} commands passed the {io_timeout:?} I/O timeout",
                o.timeouts
            ));
        }
        if o.resets > 0 {
            parts.push(format!(
                "the controller was reset {} time{} (after timeouts or a controller fatal status)",
                o.resets,
                if o.resets == 1 { "" } else { "s" }
            ));
        }
        return Some(AppError::IoFailed(format!(
            "every I/O succeeded in the end, but the device needed recovery: {}",
            parts.join(" and ")
        )));
    }
    if interrupted {
        return Some(AppError::Interrupted(format!(
            "interrupted: the report covers the {:.3} s measured before Ctrl-C",
            r.total.seconds
        )));
    }
    None
}
