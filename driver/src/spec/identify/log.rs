//! Log pages: SMART / Health Information (02h) and Error Information (01h).

use super::{
    rd_u128, rd_u16, rd_u32, rd_u64, wr_u128, wr_u16, wr_u32, wr_u64, ERROR_LOG_ENTRY_SIZE,
    SMART_LOG_SIZE,
};

/// SMART / Health Information log page (Log Identifier 02h).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SmartLog {
    /// Critical Warning bits (0: spare below threshold, 1: temperature, 2: reliability
    /// degraded, 3: read-only, 4: volatile memory backup failed, 5: PMR read-only).
    pub critical_warning: u8,
    /// Composite Temperature in Kelvin.
    pub composite_temperature_k: u16,
    /// Available Spare, percent.
    pub available_spare_pct: u8,
    /// Available Spare Threshold, percent.
    pub available_spare_threshold_pct: u8,
    /// Percentage Used (may exceed 100).
    pub percentage_used: u8,
    /// Endurance Group Critical Warning Summary.
    pub endurance_group_critical_warning: u8,
    /// Data Units Read (thousands of 512-byte units).
    pub data_units_read: u128,
    /// Data Units Written (thousands of 512-byte units).
    pub data_units_written: u128,
    /// Host Read Commands.
    pub host_read_commands: u128,
    /// Host Write Commands.
    pub host_write_commands: u128,
    /// Controller Busy Time (minutes).
    pub controller_busy_time_min: u128,
    /// Power Cycles.
    pub power_cycles: u128,
    /// Power On Hours.
    pub power_on_hours: u128,
    /// Unsafe Shutdowns.
    pub unsafe_shutdowns: u128,
    /// Media and Data Integrity Errors.
    pub media_errors: u128,
    /// Number of Error Information Log Entries.
    pub num_error_log_entries: u128,
    /// Warning Composite Temperature Time (minutes).
    pub warning_temp_time_min: u32,
    /// Critical Composite Temperature Time (minutes).
    pub critical_temp_time_min: u32,
    /// Temperature Sensors 1..8 in Kelvin (0: not implemented).
    pub temperature_sensors_k: [u16; 8],
}

impl SmartLog {
    /// Parses the 512-byte log page. Never panics.
    pub fn parse(b: &[u8; SMART_LOG_SIZE]) -> Self {
        let mut sensors = [0u16; 8];
        for (i, s) in sensors.iter_mut().enumerate() {
            *s = rd_u16(b, 200 + 2 * i);
        }
        SmartLog {
            critical_warning: b[0],
            composite_temperature_k: rd_u16(b, 1),
            available_spare_pct: b[3],
            available_spare_threshold_pct: b[4],
            percentage_used: b[5],
            endurance_group_critical_warning: b[6],
            data_units_read: rd_u128(b, 32),
            data_units_written: rd_u128(b, 48),
            host_read_commands: rd_u128(b, 64),
            host_write_commands: rd_u128(b, 80),
            controller_busy_time_min: rd_u128(b, 96),
            power_cycles: rd_u128(b, 112),
            power_on_hours: rd_u128(b, 128),
            unsafe_shutdowns: rd_u128(b, 144),
            media_errors: rd_u128(b, 160),
            num_error_log_entries: rd_u128(b, 176),
            warning_temp_time_min: rd_u32(b, 192),
            critical_temp_time_min: rd_u32(b, 196),
            temperature_sensors_k: sensors,
        }
    }

    /// Encodes the log page.
    pub fn to_bytes(&self) -> [u8; SMART_LOG_SIZE] {
        let mut b = [0u8; SMART_LOG_SIZE];
        b[0] = self.critical_warning;
        wr_u16(&mut b, 1, self.composite_temperature_k);
        b[3] = self.available_spare_pct;
        b[4] = self.available_spare_threshold_pct;
        b[5] = self.percentage_used;
        b[6] = self.endurance_group_critical_warning;
        wr_u128(&mut b, 32, self.data_units_read);
        wr_u128(&mut b, 48, self.data_units_written);
        wr_u128(&mut b, 64, self.host_read_commands);
        wr_u128(&mut b, 80, self.host_write_commands);
        wr_u128(&mut b, 96, self.controller_busy_time_min);
        wr_u128(&mut b, 112, self.power_cycles);
        wr_u128(&mut b, 128, self.power_on_hours);
        wr_u128(&mut b, 144, self.unsafe_shutdowns);
        wr_u128(&mut b, 160, self.media_errors);
        wr_u128(&mut b, 176, self.num_error_log_entries);
        wr_u32(&mut b, 192, self.warning_temp_time_min);
        wr_u32(&mut b, 196, self.critical_temp_time_min);
        for (i, s) in self.temperature_sensors_k.iter().enumerate() {
            wr_u16(&mut b, 200 + 2 * i, *s);
        }
        b
    }

    /// Composite temperature in degrees Celsius.
    pub fn temperature_celsius(&self) -> i32 {
        self.composite_temperature_k as i32 - 273
    }
}

/// One Error Information log entry (Log Identifier 01h).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ErrorLogEntry {
    /// Error Count: a unique, increasing identifier of the error (0: entry invalid).
    pub error_count: u64,
    /// Submission Queue ID (FFFFh: not specific to a queue).
    pub sqid: u16,
    /// Command ID (FFFFh: not specific to a command).
    pub cid: u16,
    /// Status Field (bits 15:1) with phase tag in bit 0.
    pub status: u16,
    /// Parameter Error Location.
    pub param_error_location: u16,
    /// LBA of the first failing block.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
    /// Vendor Specific Information Available.
    pub vs: u8,
    /// Transport Type.
    pub trtype: u8,
    /// Command Specific Information.
    pub cs: u64,
}

impl ErrorLogEntry {
    /// Parses one 64-byte entry. Never panics.
    pub fn parse(b: &[u8; ERROR_LOG_ENTRY_SIZE]) -> Self {
        ErrorLogEntry {
            error_count: rd_u64(b, 0),
            sqid: rd_u16(b, 8),
            cid: rd_u16(b, 10),
            status: rd_u16(b, 12),
            param_error_location: rd_u16(b, 14),
            lba: rd_u64(b, 16),
            nsid: rd_u32(b, 24),
            vs: b[28],
            trtype: b[29],
            cs: rd_u64(b, 32),
        }
    }
    /// Encodes the entry.
    pub fn to_bytes(&self) -> [u8; ERROR_LOG_ENTRY_SIZE] {
        let mut b = [0u8; ERROR_LOG_ENTRY_SIZE];
        wr_u64(&mut b, 0, self.error_count);
        wr_u16(&mut b, 8, self.sqid);
        wr_u16(&mut b, 10, self.cid);
        wr_u16(&mut b, 12, self.status);
        wr_u16(&mut b, 14, self.param_error_location);
        wr_u64(&mut b, 16, self.lba);
        wr_u32(&mut b, 24, self.nsid);
        b[28] = self.vs;
        b[29] = self.trtype;
        wr_u64(&mut b, 32, self.cs);
        b
    }
    /// The decoded status of the failed command.
    pub fn status(&self) -> crate::spec::Status {
        crate::spec::Status::from_cqe_status(self.status)
    }
    /// Parses a whole Error Information log page, keeping entries with a non-zero count.
    pub fn parse_page(b: &[u8]) -> Vec<ErrorLogEntry> {
        b.chunks_exact(ERROR_LOG_ENTRY_SIZE)
            .filter_map(|c| {
                let mut a = [0u8; ERROR_LOG_ENTRY_SIZE];
                a.copy_from_slice(c);
                let e = ErrorLogEntry::parse(&a);
                (e.error_count != 0).then_some(e)
            })
            .collect()
    }
}
