//! The Status Field of a completion queue entry (spec 4.6.1), with the spec's names.

use core::fmt;

/// SCT: Status Code Type.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Sct {
    /// 0h: Generic Command Status.
    Generic,
    /// 1h: Command Specific Status.
    CommandSpecific,
    /// 2h: Media and Data Integrity Errors.
    MediaDataIntegrity,
    /// 3h: Path Related Status.
    Path,
    /// 4h–6h: reserved.
    Reserved(u8),
    /// 7h: Vendor Specific.
    VendorSpecific,
}

impl Sct {
    /// The 3-bit code.
    pub const fn code(self) -> u8 {
        match self {
            Sct::Generic => 0,
            Sct::CommandSpecific => 1,
            Sct::MediaDataIntegrity => 2,
            Sct::Path => 3,
            Sct::Reserved(v) => v & 7,
            Sct::VendorSpecific => 7,
        }
    }
    /// Decodes the 3-bit code.
    pub const fn from_code(v: u8) -> Self {
        match v & 7 {
            0 => Sct::Generic,
            1 => Sct::CommandSpecific,
            2 => Sct::MediaDataIntegrity,
            3 => Sct::Path,
            7 => Sct::VendorSpecific,
            r => Sct::Reserved(r),
        }
    }
}

/// A decoded Status Field: SCT, SC, CRD, M (more) and DNR.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// SCT: Status Code Type.
    pub sct: Sct,
    /// SC: Status Code.
    pub sc: u8,
    /// CRD: Command Retry Delay (index into the controller's CRDT1..3; 0 = no delay).
    pub crd: u8,
    /// M: More (more status information in the Error Information log page).
    pub more: bool,
    /// DNR: Do Not Retry.
    pub dnr: bool,
}

macro_rules! status_codes {
    ($( $sct:ident $sc:literal $konst:ident $name:literal ;)*) => {
        impl Status {
            $(
                #[doc = concat!($name, ".")]
                pub const $konst: Status = Status::new(Sct::$sct, $sc);
            )*
        }
        /// The spec's name for a status code, if it has one.
        pub fn status_name(sct: Sct, sc: u8) -> Option<&'static str> {
            match (sct, sc) {
                $( (Sct::$sct, $sc) => Some($name), )*
                _ => None,
            }
        }
    };
}

status_codes! {
    Generic 0x00 SUCCESS "Successful Completion";
    Generic 0x01 INVALID_OPCODE "Invalid Command Opcode";
    Generic 0x02 INVALID_FIELD "Invalid Field in Command";
    Generic 0x03 CID_CONFLICT "Command ID Conflict";
    Generic 0x04 DATA_TRANSFER_ERROR "Data Transfer Error";
    Generic 0x05 ABORTED_POWER_LOSS "Commands Aborted due to Power Loss Notification";
    Generic 0x06 INTERNAL_ERROR "Internal Error";
    Generic 0x07 ABORT_REQUESTED "Command Abort Requested";
    Generic 0x08 ABORTED_SQ_DELETION "Command Aborted due to SQ Deletion";
    Generic 0x09 ABORTED_FAILED_FUSED "Command Aborted due to Failed Fused Command";
    Generic 0x0A ABORTED_MISSING_FUSED "Command Aborted due to Missing Fused Command";
    Generic 0x0B INVALID_NAMESPACE_OR_FORMAT "Invalid Namespace or Format";
    Generic 0x0C COMMAND_SEQUENCE_ERROR "Command Sequence Error";
    Generic 0x0D INVALID_SGL_SEGMENT_DESCRIPTOR "Invalid SGL Segment Descriptor";
    Generic 0x0E INVALID_NUMBER_OF_SGL_DESCRIPTORS "Invalid Number of SGL Descriptors";
    Generic 0x0F DATA_SGL_LENGTH_INVALID "Data SGL Length Invalid";
    Generic 0x10 METADATA_SGL_LENGTH_INVALID "Metadata SGL Length Invalid";
    Generic 0x11 SGL_DESCRIPTOR_TYPE_INVALID "SGL Descriptor Type Invalid";
    Generic 0x12 INVALID_USE_OF_CMB "Invalid Use of Controller Memory Buffer";
    Generic 0x13 PRP_OFFSET_INVALID "PRP Offset Invalid";
    Generic 0x14 ATOMIC_WRITE_UNIT_EXCEEDED "Atomic Write Unit Exceeded";
    Generic 0x15 OPERATION_DENIED "Operation Denied";
    Generic 0x16 SGL_OFFSET_INVALID "SGL Offset Invalid";
    Generic 0x18 HOST_ID_INCONSISTENT_FORMAT "Host Identifier Inconsistent Format";
    Generic 0x19 KEEP_ALIVE_TIMER_EXPIRED "Keep Alive Timer Expired";
    Generic 0x1A KEEP_ALIVE_TIMEOUT_INVALID "Keep Alive Timeout Invalid";
    Generic 0x1B ABORTED_PREEMPT_ABORT "Command Aborted due to Preempt and Abort";
    Generic 0x1C SANITIZE_FAILED "Sanitize Failed";
    Generic 0x1D SANITIZE_IN_PROGRESS "Sanitize In Progress";
    Generic 0x1E SGL_DATA_BLOCK_GRANULARITY_INVALID "SGL Data Block Granularity Invalid";
    Generic 0x1F CMD_NOT_SUPPORTED_FOR_QUEUE_IN_CMB "Command Not Supported for Queue in CMB";
    Generic 0x20 NAMESPACE_WRITE_PROTECTED "Namespace is Write Protected";
    Generic 0x21 COMMAND_INTERRUPTED "Command Interrupted";
    Generic 0x22 TRANSIENT_TRANSPORT_ERROR "Transient Transport Error";
    Generic 0x2B IO_COMMAND_SET_COMBINATION_REJECTED "I/O Command Set Combination Rejected";
    Generic 0x2C INVALID_IO_COMMAND_SET "Invalid I/O Command Set";
    Generic 0x80 LBA_OUT_OF_RANGE "LBA Out of Range";
    Generic 0x81 CAPACITY_EXCEEDED "Capacity Exceeded";
    Generic 0x82 NAMESPACE_NOT_READY "Namespace Not Ready";
    Generic 0x83 RESERVATION_CONFLICT "Reservation Conflict";
    Generic 0x84 FORMAT_IN_PROGRESS "Format In Progress";
    CommandSpecific 0x00 COMPLETION_QUEUE_INVALID "Completion Queue Invalid";
    CommandSpecific 0x01 INVALID_QUEUE_IDENTIFIER "Invalid Queue Identifier";
    CommandSpecific 0x02 INVALID_QUEUE_SIZE "Invalid Queue Size";
    CommandSpecific 0x03 ABORT_COMMAND_LIMIT_EXCEEDED "Abort Command Limit Exceeded";
    CommandSpecific 0x05 ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED "Asynchronous Event Request Limit Exceeded";
    CommandSpecific 0x06 INVALID_FIRMWARE_SLOT "Invalid Firmware Slot";
    CommandSpecific 0x07 INVALID_FIRMWARE_IMAGE "Invalid Firmware Image";
    CommandSpecific 0x08 INVALID_INTERRUPT_VECTOR "Invalid Interrupt Vector";
    CommandSpecific 0x09 INVALID_LOG_PAGE "Invalid Log Page";
    CommandSpecific 0x0A INVALID_FORMAT "Invalid Format";
    CommandSpecific 0x0B FW_ACTIVATION_REQUIRES_CONVENTIONAL_RESET "Firmware Activation Requires Conventional Reset";
    CommandSpecific 0x0C INVALID_QUEUE_DELETION "Invalid Queue Deletion";
    CommandSpecific 0x0D FEATURE_ID_NOT_SAVEABLE "Feature Identifier Not Saveable";
    CommandSpecific 0x0E FEATURE_NOT_CHANGEABLE "Feature Not Changeable";
    CommandSpecific 0x0F FEATURE_NOT_NAMESPACE_SPECIFIC "Feature Not Namespace Specific";
    CommandSpecific 0x10 FW_ACTIVATION_REQUIRES_NVM_SUBSYSTEM_RESET "Firmware Activation Requires NVM Subsystem Reset";
    CommandSpecific 0x11 FW_ACTIVATION_REQUIRES_CONTROLLER_RESET "Firmware Activation Requires Controller Level Reset";
    CommandSpecific 0x12 FW_ACTIVATION_REQUIRES_MAX_TIME_VIOLATION "Firmware Activation Requires Maximum Time Violation";
    CommandSpecific 0x13 FW_ACTIVATION_PROHIBITED "Firmware Activation Prohibited";
    CommandSpecific 0x14 OVERLAPPING_RANGE "Overlapping Range";
    CommandSpecific 0x15 NAMESPACE_INSUFFICIENT_CAPACITY "Namespace Insufficient Capacity";
    CommandSpecific 0x16 NAMESPACE_ID_UNAVAILABLE "Namespace Identifier Unavailable";
    CommandSpecific 0x18 NAMESPACE_ALREADY_ATTACHED "Namespace Already Attached";
    CommandSpecific 0x19 NAMESPACE_IS_PRIVATE "Namespace Is Private";
    CommandSpecific 0x1A NAMESPACE_NOT_ATTACHED "Namespace Not Attached";
    CommandSpecific 0x1B THIN_PROVISIONING_NOT_SUPPORTED "Thin Provisioning Not Supported";
    CommandSpecific 0x1C CONTROLLER_LIST_INVALID "Controller List Invalid";
    CommandSpecific 0x1D DEVICE_SELF_TEST_IN_PROGRESS "Device Self-test In Progress";
    CommandSpecific 0x1E BOOT_PARTITION_WRITE_PROHIBITED "Boot Partition Write Prohibited";
    CommandSpecific 0x1F INVALID_CONTROLLER_IDENTIFIER "Invalid Controller Identifier";
    CommandSpecific 0x20 INVALID_SECONDARY_CONTROLLER_STATE "Invalid Secondary Controller State";
    CommandSpecific 0x21 INVALID_NUMBER_OF_CONTROLLER_RESOURCES "Invalid Number of Controller Resources";
    CommandSpecific 0x22 INVALID_RESOURCE_IDENTIFIER "Invalid Resource Identifier";
    CommandSpecific 0x80 CONFLICTING_ATTRIBUTES "Conflicting Attributes";
    CommandSpecific 0x81 INVALID_PROTECTION_INFORMATION "Invalid Protection Information";
    CommandSpecific 0x82 ATTEMPTED_WRITE_TO_READ_ONLY_RANGE "Attempted Write to Read Only Range";
    CommandSpecific 0xB8 ZONE_BOUNDARY_ERROR "Zone Boundary Error";
    CommandSpecific 0xB9 ZONE_IS_FULL "Zone Is Full";
    CommandSpecific 0xBA ZONE_IS_READ_ONLY "Zone Is Read Only";
    CommandSpecific 0xBB ZONE_IS_OFFLINE "Zone Is Offline";
    CommandSpecific 0xBC ZONE_INVALID_WRITE "Zone Invalid Write";
    CommandSpecific 0xBD TOO_MANY_ACTIVE_ZONES "Too Many Active Zones";
    CommandSpecific 0xBE TOO_MANY_OPEN_ZONES "Too Many Open Zones";
    CommandSpecific 0xBF INVALID_ZONE_STATE_TRANSITION "Invalid Zone State Transition";
    MediaDataIntegrity 0x80 WRITE_FAULT "Write Fault";
    MediaDataIntegrity 0x81 UNRECOVERED_READ_ERROR "Unrecovered Read Error";
    MediaDataIntegrity 0x82 E2E_GUARD_CHECK_ERROR "End-to-end Guard Check Error";
    MediaDataIntegrity 0x83 E2E_APPLICATION_TAG_CHECK_ERROR "End-to-end Application Tag Check Error";
    MediaDataIntegrity 0x84 E2E_REFERENCE_TAG_CHECK_ERROR "End-to-end Reference Tag Check Error";
    MediaDataIntegrity 0x85 COMPARE_FAILURE "Compare Failure";
    MediaDataIntegrity 0x86 ACCESS_DENIED "Access Denied";
    MediaDataIntegrity 0x87 DEALLOCATED_OR_UNWRITTEN_BLOCK "Deallocated or Unwritten Logical Block";
    Path 0x00 INTERNAL_PATH_ERROR "Internal Path Error";
    Path 0x01 ASYMMETRIC_ACCESS_PERSISTENT_LOSS "Asymmetric Access Persistent Loss";
    Path 0x02 ASYMMETRIC_ACCESS_INACCESSIBLE "Asymmetric Access Inaccessible";
    Path 0x03 ASYMMETRIC_ACCESS_TRANSITION "Asymmetric Access Transition";
    Path 0x60 CONTROLLER_PATHING_ERROR "Controller Pathing Error";
    Path 0x70 HOST_PATHING_ERROR "Host Pathing Error";
    Path 0x71 COMMAND_ABORTED_BY_HOST "Command Aborted By Host";
}

impl Status {
    /// A status with CRD, M and DNR clear.
    pub const fn new(sct: Sct, sc: u8) -> Self {
        Status {
            sct,
            sc,
            crd: 0,
            more: false,
            dnr: false,
        }
    }
    /// Returns the same status with DNR set as given.
    pub const fn with_dnr(mut self, dnr: bool) -> Self {
        self.dnr = dnr;
        self
    }
    /// Returns the same status with CRD set as given (0..=3).
    pub const fn with_crd(mut self, crd: u8) -> Self {
        self.crd = crd & 3;
        self
    }
    /// Decodes the 16-bit phase + status halfword of a CQE (phase in bit 0 is ignored).
    pub const fn from_cqe_status(raw: u16) -> Self {
        Status {
            sc: ((raw >> 1) & 0xFF) as u8,
            sct: Sct::from_code(((raw >> 9) & 0x7) as u8),
            crd: ((raw >> 12) & 0x3) as u8,
            more: raw & (1 << 14) != 0,
            dnr: raw & (1 << 15) != 0,
        }
    }
    /// Encodes the status into bits 15:1 of the CQE halfword (phase bit 0 left clear).
    pub const fn to_cqe_status(self) -> u16 {
        ((self.sc as u16) << 1)
            | ((self.sct.code() as u16) << 9)
            | (((self.crd & 3) as u16) << 12)
            | ((self.more as u16) << 14)
            | ((self.dnr as u16) << 15)
    }
    /// Successful Completion (SCT 0, SC 0).
    pub const fn is_success(self) -> bool {
        matches!(self.sct, Sct::Generic) && self.sc == 0
    }
    /// Whether the command may be retried: an error with DNR clear (spec 4.6.1.2: the
    /// command may succeed if resubmitted). Vendor specific statuses are not retried.
    pub const fn is_retryable(self) -> bool {
        !self.is_success() && !self.dnr && !matches!(self.sct, Sct::VendorSpecific)
    }
    /// Whether SCT and SC are equal (ignoring CRD, M and DNR).
    pub const fn same_code(self, other: Status) -> bool {
        self.sct.code() == other.sct.code() && self.sc == other.sc
    }
    /// The spec's name of this status code, if it has one.
    pub fn name(self) -> Option<&'static str> {
        status_name(self.sct, self.sc)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n)?,
            None if matches!(self.sct, Sct::VendorSpecific) => f.write_str("Vendor Specific")?,
            None => f.write_str("Unknown Status")?,
        }
        write!(f, " (sct {:#x}, sc {:#04x}", self.sct.code(), self.sc)?;
        if self.dnr {
            f.write_str(", dnr")?;
        }
        if self.more {
            f.write_str(", more")?;
        }
        if self.crd != 0 {
            write!(f, ", crd {}", self.crd)?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_status() {
        assert_eq!(
            Status::INVALID_FIELD.to_string(),
            "Invalid Field in Command (sct 0x0, sc 0x02)"
        );
        assert_eq!(
            Status::INVALID_QUEUE_IDENTIFIER.with_dnr(true).to_string(),
            "Invalid Queue Identifier (sct 0x1, sc 0x01, dnr)"
        );
        assert_eq!(
            Status::UNRECOVERED_READ_ERROR.to_string(),
            "Unrecovered Read Error (sct 0x2, sc 0x81)"
        );
        assert_eq!(
            Status::ZONE_INVALID_WRITE.to_string(),
            "Zone Invalid Write (sct 0x1, sc 0xbc)"
        );
        assert_eq!(
            Status::E2E_REFERENCE_TAG_CHECK_ERROR.to_string(),
            "End-to-end Reference Tag Check Error (sct 0x2, sc 0x84)"
        );
    }

    #[test]
    fn encode_decode_round_trip_all_fields() {
        for raw in 0..=u16::MAX {
            let s = Status::from_cqe_status(raw);
            assert_eq!(s.to_cqe_status(), raw & !1, "raw {raw:#x}");
        }
    }

    #[test]
    fn retryable_follows_dnr() {
        assert!(!Status::SUCCESS.is_retryable());
        assert!(Status::INTERNAL_ERROR.is_retryable());
        assert!(!Status::INTERNAL_ERROR.with_dnr(true).is_retryable());
        assert!(Status::from_cqe_status(0x0001).is_success());
    }
}
