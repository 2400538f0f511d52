//! `kestrel smart`: the SMART / Health Information log and the Error Information log.

use std::fmt::Write as _;

use kestrel::spec::{ErrorLogEntry, SmartLog};
use serde::Serialize;

use crate::cli::SmartArgs;
use crate::error::{AppError, Result};
use crate::targets::{self, OpenOptions, Opened};
use crate::units::{human_bytes, print_json};

/// Critical Warning bits (SMART log byte 0), by bit, with their names.
pub const CRITICAL_WARNINGS: [(u8, &str); 6] = [
    (1 << 0, "available spare below threshold"),
    (1 << 1, "temperature outside thresholds"),
    (1 << 2, "nvm subsystem reliability degraded"),
    (1 << 3, "media placed in read-only mode"),
    (1 << 4, "volatile memory backup device failed"),
    (1 << 5, "persistent memory region read-only or unreliable"),
];

/// One Data Unit is 1000 units of 512 bytes.
pub const DATA_UNIT_BYTES: u128 = 512_000;

/// The decoded SMART log.
#[derive(Serialize, Debug)]
pub struct SmartJson {
    /// Critical Warning, raw.
    pub critical_warning: u8,
    /// Critical Warning, by name.
    pub critical_warnings: Vec<&'static str>,
    /// Composite temperature, °C (null when not reported).
    pub temperature_celsius: Option<i32>,
    /// Composite temperature, K.
    pub temperature_kelvin: u16,
    /// Temperature sensors 1..8 that are implemented, °C.
    pub temperature_sensors_celsius: Vec<i32>,
    /// Available spare, %.
    pub available_spare_pct: u8,
    /// Available spare threshold, %.
    pub available_spare_threshold_pct: u8,
    /// Percentage used.
    pub percentage_used: u8,
    /// Data units read (thousands of 512-byte units).
    pub data_units_read: u128,
    /// The same in bytes.
    pub data_read_bytes: u128,
    /// Data units written.
    pub data_units_written: u128,
    /// The same in bytes.
    pub data_written_bytes: u128,
    /// Host read commands.
    pub host_read_commands: u128,
    /// Host write commands.
    pub host_write_commands: u128,
    /// Controller busy time, minutes.
    pub controller_busy_time_min: u128,
    /// Power cycles.
    pub power_cycles: u128,
    /// Power-on hours.
    pub power_on_hours: u128,
    /// Unsafe shutdowns.
    pub unsafe_shutdowns: u128,
    /// Media and data integrity errors.
    pub media_errors: u128,
    /// Number of error information log entries.
    pub error_log_entries: u128,
    /// Warning composite temperature time, minutes.
    pub warning_temp_time_min: u32,
    /// Critical composite temperature time, minutes.
    pub critical_temp_time_min: u32,
}

/// One error log entry.
#[derive(Serialize, Debug)]
pub struct ErrorEntryJson {
    /// Error count (unique, increasing).
    pub error_count: u64,
    /// SQ ID (65535: not queue specific).
    pub sqid: u16,
    /// Command ID (65535: not command specific).
    pub cid: u16,
    /// The status, decoded.
    pub status: String,
    /// Status code type.
    pub sct: u8,
    /// Status code.
    pub sc: u8,
    /// Parameter error location.
    pub param_error_location: u16,
    /// LBA.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
    /// Command specific information.
    pub command_specific: u64,
}

/// `smart --json` for one controller.
#[derive(Serialize, Debug)]
pub struct SmartReport {
    /// The `--target` spec.
    pub target: String,
    /// The controller.
    pub transport: String,
    /// The SMART log.
    pub smart: SmartJson,
    /// The valid error log entries, newest first.
    pub error_log: Vec<ErrorEntryJson>,
}

fn celsius(k: u16) -> Option<i32> {
    (k != 0).then(|| k as i32 - 273)
}

/// Decodes the SMART log.
pub fn decode(s: &SmartLog) -> SmartJson {
    SmartJson {
        critical_warning: s.critical_warning,
        critical_warnings: CRITICAL_WARNINGS
            .iter()
            .filter(|(b, _)| s.critical_warning & b != 0)
            .map(|(_, n)| *n)
            .collect(),
        temperature_celsius: celsius(s.composite_temperature_k),
        temperature_kelvin: s.composite_temperature_k,
        temperature_sensors_celsius: s
            .temperature_sensors_k
            .iter()
            .filter_map(|&k| celsius(k))
            .collect(),
        available_spare_pct: s.available_spare_pct,
        available_spare_threshold_pct: s.available_spare_threshold_pct,
        percentage_used: s.percentage_used,
        data_units_read: s.data_units_read,
        data_read_bytes: s.data_units_read.saturating_mul(DATA_UNIT_BYTES),
        data_units_written: s.data_units_written,
        data_written_bytes: s.data_units_written.saturating_mul(DATA_UNIT_BYTES),
        host_read_commands: s.host_read_commands,
        host_write_commands: s.host_write_commands,
        controller_busy_time_min: s.controller_busy_time_min,
        power_cycles: s.power_cycles,
        power_on_hours: s.power_on_hours,
        unsafe_shutdowns: s.unsafe_shutdowns,
        media_errors: s.media_errors,
        error_log_entries: s.num_error_log_entries,
        warning_temp_time_min: s.warning_temp_time_min,
        critical_temp_time_min: s.critical_temp_time_min,
    }
}

/// Decodes an error log entry.
pub fn decode_error(e: &ErrorLogEntry) -> ErrorEntryJson {
    let st = e.status();
    ErrorEntryJson {
        error_count: e.error_count,
        sqid: e.sqid,
        cid: e.cid,
        status: st.to_string(),
        sct: st.sct.code(),
        sc: st.sc,
        param_error_location: e.param_error_location,
        lba: e.lba,
        nsid: e.nsid,
        command_specific: e.cs,
    }
}

fn bytes_of(v: u128) -> String {
    match u64::try_from(v) {
        Ok(b) => human_bytes(b),
        Err(_) => format!("{v} B"),
    }
}

/// The text form.
pub fn render_text(r: &SmartReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "SMART / Health Information: {} ({})",
        r.transport, r.target
    );
    render_health(&mut s, &r.smart);
    render_counters(&mut s, &r.smart);
    render_error_log(&mut s, r);
    s
}

/// One row of the SMART table.
fn row(s: &mut String, k: &str, v: String) {
    let _ = writeln!(s, "  {k:<34} {v}");
}

/// Health: the critical warning, temperatures, spare and wear.
fn render_health(s: &mut String, m: &SmartJson) {
    row(
        s,
        "Critical warning",
        if m.critical_warnings.is_empty() {
            format!("{:#04x}: none", m.critical_warning)
        } else {
            format!(
                "{:#04x}: {}",
                m.critical_warning,
                m.critical_warnings.join(", ")
            )
        },
    );
    row(
        s,
        "Temperature",
        match m.temperature_celsius {
            Some(c) => format!("{c} °C ({} K)", m.temperature_kelvin),
            None => "not reported".into(),
        },
    );
    for (i, t) in m.temperature_sensors_celsius.iter().enumerate() {
        row(
            s,
            &format!("Temperature sensor {}", i + 1),
            format!("{t} °C"),
        );
    }
    row(s, "Available spare", format!("{} %", m.available_spare_pct));
    row(
        s,
        "Available spare threshold",
        format!("{} %", m.available_spare_threshold_pct),
    );
    row(s, "Percentage used", format!("{} %", m.percentage_used));
}

/// The counters: data moved, commands, busy time, power, errors, time at temperature.
fn render_counters(s: &mut String, m: &SmartJson) {
    row(
        s,
        "Data units read",
        format!("{} ({})", m.data_units_read, bytes_of(m.data_read_bytes)),
    );
    row(
        s,
        "Data units written",
        format!(
            "{} ({})",
            m.data_units_written,
            bytes_of(m.data_written_bytes)
        ),
    );
    row(s, "Host read commands", m.host_read_commands.to_string());
    row(s, "Host write commands", m.host_write_commands.to_string());
    row(
        s,
        "Controller busy time",
        format!("{} min", m.controller_busy_time_min),
    );
    row(s, "Power cycles", m.power_cycles.to_string());
    row(s, "Power-on hours", m.power_on_hours.to_string());
    row(s, "Unsafe shutdowns", m.unsafe_shutdowns.to_string());
    row(
        s,
        "Media and data integrity errors",
        m.media_errors.to_string(),
    );
    row(s, "Error log entries", m.error_log_entries.to_string());
    row(
        s,
        "Warning / critical temp. time",
        format!(
            "{} / {} min",
            m.warning_temp_time_min, m.critical_temp_time_min
        ),
    );
}

/// The Error Information log entries.
fn render_error_log(s: &mut String, r: &SmartReport) {
    if r.error_log.is_empty() {
        let _ = writeln!(s, "Error Information log: no entries");
    } else {
        let _ = writeln!(s, "Error Information log ({} entries):", r.error_log.len());
        let _ = writeln!(
            s,
            "  {:>8}  {:>5}  {:>5}  {:>6}  {:>12}  status",
            "count", "sqid", "cid", "nsid", "lba"
        );
        for e in &r.error_log {
            let _ = writeln!(
                s,
                "  {:>8}  {:>5}  {:>5}  {:>6}  {:>12}  {} (parameter at {:#06x}, info {:#x})",
                e.error_count,
                e.sqid,
                e.cid,
                e.nsid,
                e.lba,
                e.status,
                e.param_error_location,
                e.command_specific
            );
        }
    }
}

/// Runs `kestrel smart`.
pub fn run(args: &SmartArgs) -> Result<()> {
    let opts = OpenOptions {
        // Ask for as many as there are, so identify shows what the controller grants.
        io_queues: 0xFFFE,
        noiommu: args.targets.noiommu,
        ..OpenOptions::default()
    };
    let opened = targets::open_all(&args.targets.targets, &opts)?;
    let mut reports = Vec::new();
    for o in &opened {
        let Opened::Nvme(n) = o else {
            return Err(AppError::usage(format!(
                "smart: {} is a file target; the SMART log exists only on NVMe targets (pci: or emu)",
                o.spec()
            )));
        };
        let smart = n.ctrlr.smart_log()?;
        let errors = n.ctrlr.error_log()?;
        reports.push(SmartReport {
            target: n.spec.to_string(),
            transport: n.ctrlr.describe().to_string(),
            smart: decode(&smart),
            error_log: errors.iter().map(decode_error).collect(),
        });
    }
    if args.json {
        if reports.len() == 1 {
            print_json(&reports[0])?;
        } else {
            print_json(&reports)?;
        }
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", render_text(r));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_warnings_and_units() {
        let s = SmartLog {
            critical_warning: 0b1001,
            composite_temperature_k: 310,
            data_units_read: 2,
            temperature_sensors_k: [300, 0, 0, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        let d = decode(&s);
        assert_eq!(
            d.critical_warnings,
            vec![
                "available spare below threshold",
                "media placed in read-only mode"
            ]
        );
        assert_eq!(d.temperature_celsius, Some(37));
        assert_eq!(d.temperature_sensors_celsius, vec![27]);
        assert_eq!(d.data_read_bytes, 1_024_000);
        assert!(render_text(&SmartReport {
            target: "emu".into(),
            transport: "emulator".into(),
            smart: d,
            error_log: vec![]
        })
        .contains("media placed in read-only mode"));
        assert_eq!(decode(&SmartLog::default()).temperature_celsius, None);
    }
}
