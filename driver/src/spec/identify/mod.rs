//! Identify data structures (spec 5.15.2) and log pages (spec 5.14.1), parsed from and
//! encoded to their little-endian byte layouts.
//!
//! Parsing takes a fixed-size byte array and never panics: every field is read at a
//! constant offset inside the array, strings are decoded lossily, and counts that index
//! tables are clamped to the table size.
//!
//! Identify Controller and the byte helpers are here; Identify Namespace and the namespace
//! lists in `ns`, the log pages in `log`, all re-exported at this path.

/// Size of every Identify data structure.
pub const IDENTIFY_SIZE: usize = 4096;
/// Size of the SMART / Health Information log page.
pub const SMART_LOG_SIZE: usize = 512;
/// Size of one Error Information log entry.
pub const ERROR_LOG_ENTRY_SIZE: usize = 64;

mod log;
mod ns;
#[cfg(test)]
mod tests;

pub use log::{ErrorLogEntry, SmartLog};

/// CTRATT bit 6: Traffic Based Keep Alive Support (TBKAS): any Admin or I/O command the
/// controller processes restarts its Keep Alive Timer, not only Keep Alive.
pub const CTRATT_TBKAS: u32 = 1 << 6;
/// CTRATT bit 15: Extended LBA Formats Supported (ELBAS).
pub const CTRATT_ELBAS: u32 = 1 << 15;
pub use ns::{
    encode_active_ns_list, nidt, ns_off, nvm_elbaf_pif, parse_active_ns_list, IdentifyNamespace,
    LbaFormat, NsFormat, NsIdDescriptors, MAX_LBA_FORMATS, NVM_ELBAF_OFFSET,
};

fn rd_u8(b: &[u8], o: usize) -> u8 {
    b[o]
}
fn rd_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn rd_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn rd_u64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn rd_u128(b: &[u8], o: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[o..o + 16]);
    u128::from_le_bytes(a)
}
/// ASCII fields are space padded on the right; non-ASCII bytes become U+FFFD.
fn rd_str(b: &[u8], o: usize, len: usize) -> String {
    String::from_utf8_lossy(&b[o..o + len])
        .trim_end_matches([' ', '\0'])
        .to_string()
}
fn wr_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn wr_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn wr_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
fn wr_u128(b: &mut [u8], o: usize, v: u128) {
    b[o..o + 16].copy_from_slice(&v.to_le_bytes());
}
fn wr_str(b: &mut [u8], o: usize, len: usize, s: &str) {
    let field = &mut b[o..o + len];
    field.fill(b' ');
    let n = s.len().min(len);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Byte offsets in the Identify Controller data structure.
pub mod ctrl_off {
    /// VID: PCI Vendor ID.
    pub const VID: usize = 0;
    /// SSVID: PCI Subsystem Vendor ID.
    pub const SSVID: usize = 2;
    /// SN: Serial Number (20 ASCII).
    pub const SN: usize = 4;
    /// MN: Model Number (40 ASCII).
    pub const MN: usize = 24;
    /// FR: Firmware Revision (8 ASCII).
    pub const FR: usize = 64;
    /// RAB: Recommended Arbitration Burst.
    pub const RAB: usize = 72;
    /// IEEE OUI Identifier.
    pub const IEEE: usize = 73;
    /// CMIC: Controller Multi-Path I/O and Namespace Sharing Capabilities.
    pub const CMIC: usize = 76;
    /// MDTS: Maximum Data Transfer Size (2 ^ n × CAP.MPSMIN; 0 = no limit).
    pub const MDTS: usize = 77;
    /// CNTLID: Controller ID.
    pub const CNTLID: usize = 78;
    /// VER: Version.
    pub const VER: usize = 80;
    /// OAES: Optional Asynchronous Events Supported.
    pub const OAES: usize = 92;
    /// CRDT1..CRDT3: Command Retry Delay Times (three u16, 100 ms units).
    pub const CRDT: usize = 134;
    /// CTRATT: Controller Attributes.
    pub const CTRATT: usize = 96;
    /// OACS: Optional Admin Command Support.
    pub const OACS: usize = 256;
    /// ACL: Abort Command Limit (zero-based).
    pub const ACL: usize = 258;
    /// AERL: Asynchronous Event Request Limit (zero-based).
    pub const AERL: usize = 259;
    /// FRMW: Firmware Updates.
    pub const FRMW: usize = 260;
    /// LPA: Log Page Attributes.
    pub const LPA: usize = 261;
    /// ELPE: Error Log Page Entries (zero-based).
    pub const ELPE: usize = 262;
    /// NPSS: Number of Power States Support (zero-based).
    pub const NPSS: usize = 263;
    /// WCTEMP: Warning Composite Temperature Threshold (Kelvin).
    pub const WCTEMP: usize = 266;
    /// CCTEMP: Critical Composite Temperature Threshold (Kelvin).
    pub const CCTEMP: usize = 268;
    /// TNVMCAP: Total NVM Capacity (bytes, 128 bit).
    pub const TNVMCAP: usize = 280;
    /// UNVMCAP: Unallocated NVM Capacity (bytes, 128 bit).
    pub const UNVMCAP: usize = 296;
    /// SQES: Submission Queue Entry Size (3:0 required, 7:4 maximum, as powers of two).
    pub const SQES: usize = 512;
    /// CQES: Completion Queue Entry Size.
    pub const CQES: usize = 513;
    /// MAXCMD: Maximum Outstanding Commands.
    pub const MAXCMD: usize = 514;
    /// NN: Number of Namespaces (the largest valid NSID).
    pub const NN: usize = 516;
    /// ONCS: Optional NVM Command Support.
    pub const ONCS: usize = 520;
    /// FUSES: Fused Operation Support.
    pub const FUSES: usize = 522;
    /// FNA: Format NVM Attributes.
    pub const FNA: usize = 524;
    /// VWC: Volatile Write Cache.
    pub const VWC: usize = 525;
    /// AWUN: Atomic Write Unit Normal.
    pub const AWUN: usize = 526;
    /// AWUPF: Atomic Write Unit Power Fail.
    pub const AWUPF: usize = 528;
    /// SGLS: SGL Support.
    pub const SGLS: usize = 536;
    /// SUBNQN: NVM Subsystem NVMe Qualified Name (256 bytes).
    pub const SUBNQN: usize = 768;
}

/// OACS bits.
pub mod oacs {
    /// Namespace Management and Attachment commands.
    pub const NS_MANAGEMENT: u16 = 1 << 3;
    /// Doorbell Buffer Config command.
    pub const DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
}

/// ONCS bits.
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

/// The fields of Identify Controller (CNS 01h) the driver and tools use.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct IdentifyController {
    /// VID.
    pub vid: u16,
    /// SSVID.
    pub ssvid: u16,
    /// SN, trimmed.
    pub sn: String,
    /// MN, trimmed.
    pub mn: String,
    /// FR, trimmed.
    pub fr: String,
    /// RAB.
    pub rab: u8,
    /// IEEE OUI.
    pub ieee: [u8; 3],
    /// CMIC.
    pub cmic: u8,
    /// MDTS (power of two of CAP.MPSMIN pages; 0 = no limit).
    pub mdts: u8,
    /// CNTLID.
    pub cntlid: u16,
    /// VER.
    pub ver: u32,
    /// OAES.
    pub oaes: u32,
    /// CTRATT.
    pub ctratt: u32,
    /// CRDT1..CRDT3 (100 ms units), indexed by a completion's CRD minus one.
    pub crdt: [u16; 3],
    /// OACS.
    pub oacs: u16,
    /// ACL (zero-based).
    pub acl: u8,
    /// AERL (zero-based).
    pub aerl: u8,
    /// FRMW.
    pub frmw: u8,
    /// LPA.
    pub lpa: u8,
    /// ELPE (zero-based).
    pub elpe: u8,
    /// NPSS (zero-based).
    pub npss: u8,
    /// WCTEMP (Kelvin).
    pub wctemp: u16,
    /// CCTEMP (Kelvin).
    pub cctemp: u16,
    /// TNVMCAP (bytes).
    pub tnvmcap: u128,
    /// UNVMCAP (bytes).
    pub unvmcap: u128,
    /// SQES.
    pub sqes: u8,
    /// CQES.
    pub cqes: u8,
    /// MAXCMD.
    pub maxcmd: u16,
    /// NN.
    pub nn: u32,
    /// ONCS.
    pub oncs: u16,
    /// FUSES.
    pub fuses: u16,
    /// FNA.
    pub fna: u8,
    /// VWC.
    pub vwc: u8,
    /// AWUN.
    pub awun: u16,
    /// AWUPF.
    pub awupf: u16,
    /// SGLS.
    pub sgls: u32,
    /// SUBNQN, trimmed.
    pub subnqn: String,
}

impl IdentifyController {
    /// Parses Identify Controller data. Never panics.
    pub fn parse(b: &[u8; IDENTIFY_SIZE]) -> Self {
        use ctrl_off as o;
        IdentifyController {
            vid: rd_u16(b, o::VID),
            ssvid: rd_u16(b, o::SSVID),
            sn: rd_str(b, o::SN, 20),
            mn: rd_str(b, o::MN, 40),
            fr: rd_str(b, o::FR, 8),
            rab: rd_u8(b, o::RAB),
            ieee: [b[o::IEEE], b[o::IEEE + 1], b[o::IEEE + 2]],
            cmic: rd_u8(b, o::CMIC),
            mdts: rd_u8(b, o::MDTS),
            cntlid: rd_u16(b, o::CNTLID),
            ver: rd_u32(b, o::VER),
            oaes: rd_u32(b, o::OAES),
            ctratt: rd_u32(b, o::CTRATT),
            crdt: [
                rd_u16(b, o::CRDT),
                rd_u16(b, o::CRDT + 2),
                rd_u16(b, o::CRDT + 4),
            ],
            oacs: rd_u16(b, o::OACS),
            acl: rd_u8(b, o::ACL),
            aerl: rd_u8(b, o::AERL),
            frmw: rd_u8(b, o::FRMW),
            lpa: rd_u8(b, o::LPA),
            elpe: rd_u8(b, o::ELPE),
            npss: rd_u8(b, o::NPSS),
            wctemp: rd_u16(b, o::WCTEMP),
            cctemp: rd_u16(b, o::CCTEMP),
            tnvmcap: rd_u128(b, o::TNVMCAP),
            unvmcap: rd_u128(b, o::UNVMCAP),
            sqes: rd_u8(b, o::SQES),
            cqes: rd_u8(b, o::CQES),
            maxcmd: rd_u16(b, o::MAXCMD),
            nn: rd_u32(b, o::NN),
            oncs: rd_u16(b, o::ONCS),
            fuses: rd_u16(b, o::FUSES),
            fna: rd_u8(b, o::FNA),
            vwc: rd_u8(b, o::VWC),
            awun: rd_u16(b, o::AWUN),
            awupf: rd_u16(b, o::AWUPF),
            sgls: rd_u32(b, o::SGLS),
            subnqn: rd_str(b, o::SUBNQN, 256),
        }
    }

    /// Encodes the structure (fields not modelled are zero).
    pub fn to_bytes(&self) -> Box<[u8; IDENTIFY_SIZE]> {
        use ctrl_off as o;
        let mut b = Box::new([0u8; IDENTIFY_SIZE]);
        wr_u16(&mut b[..], o::VID, self.vid);
        wr_u16(&mut b[..], o::SSVID, self.ssvid);
        wr_str(&mut b[..], o::SN, 20, &self.sn);
        wr_str(&mut b[..], o::MN, 40, &self.mn);
        wr_str(&mut b[..], o::FR, 8, &self.fr);
        b[o::RAB] = self.rab;
        b[o::IEEE..o::IEEE + 3].copy_from_slice(&self.ieee);
        b[o::CMIC] = self.cmic;
        b[o::MDTS] = self.mdts;
        wr_u16(&mut b[..], o::CNTLID, self.cntlid);
        wr_u32(&mut b[..], o::VER, self.ver);
        wr_u32(&mut b[..], o::OAES, self.oaes);
        wr_u32(&mut b[..], o::CTRATT, self.ctratt);
        for (i, t) in self.crdt.iter().enumerate() {
            wr_u16(&mut b[..], o::CRDT + 2 * i, *t);
        }
        wr_u16(&mut b[..], o::OACS, self.oacs);
        b[o::ACL] = self.acl;
        b[o::AERL] = self.aerl;
        b[o::FRMW] = self.frmw;
        b[o::LPA] = self.lpa;
        b[o::ELPE] = self.elpe;
        b[o::NPSS] = self.npss;
        wr_u16(&mut b[..], o::WCTEMP, self.wctemp);
        wr_u16(&mut b[..], o::CCTEMP, self.cctemp);
        wr_u128(&mut b[..], o::TNVMCAP, self.tnvmcap);
        wr_u128(&mut b[..], o::UNVMCAP, self.unvmcap);
        b[o::SQES] = self.sqes;
        b[o::CQES] = self.cqes;
        wr_u16(&mut b[..], o::MAXCMD, self.maxcmd);
        wr_u32(&mut b[..], o::NN, self.nn);
        wr_u16(&mut b[..], o::ONCS, self.oncs);
        wr_u16(&mut b[..], o::FUSES, self.fuses);
        b[o::FNA] = self.fna;
        b[o::VWC] = self.vwc;
        wr_u16(&mut b[..], o::AWUN, self.awun);
        wr_u16(&mut b[..], o::AWUPF, self.awupf);
        wr_u32(&mut b[..], o::SGLS, self.sgls);
        // SUBNQN is NUL padded, not space padded.
        let n = self.subnqn.len().min(256);
        b[o::SUBNQN..o::SUBNQN + n].copy_from_slice(&self.subnqn.as_bytes()[..n]);
        b
    }

    /// Maximum data transfer size in bytes for a memory page size of `2^(12+mpsmin)`,
    /// or `None` when the controller sets no limit (MDTS = 0). Saturates for absurd values.
    pub fn max_transfer_bytes(&self, mpsmin: u8) -> Option<u64> {
        if self.mdts == 0 {
            return None;
        }
        let shift = 12u32 + mpsmin as u32 + self.mdts as u32;
        Some(if shift >= 63 { u64::MAX } else { 1u64 << shift })
    }
    /// Whether Doorbell Buffer Config is supported (OACS bit 8).
    pub fn supports_shadow_doorbells(&self) -> bool {
        self.oacs & oacs::DOORBELL_BUFFER_CONFIG != 0
    }
    /// Whether Write Zeroes is supported (ONCS bit 3).
    pub fn supports_write_zeroes(&self) -> bool {
        self.oncs & oncs::WRITE_ZEROES != 0
    }
    /// Whether Dataset Management is supported (ONCS bit 2).
    pub fn supports_dsm(&self) -> bool {
        self.oncs & oncs::DATASET_MANAGEMENT != 0
    }
    /// Whether the controller reports extended LBA formats (CTRATT bit 15, ELBAS): the NVM
    /// Command Set Identify Namespace (CNS 05h) then says each format's protection
    /// information format (16-, 32- or 64-bit guard).
    pub fn extended_lba_formats(&self) -> bool {
        self.ctratt & CTRATT_ELBAS != 0
    }
    /// Whether a volatile write cache is present (VWC bit 0).
    pub fn has_volatile_write_cache(&self) -> bool {
        self.vwc & 1 != 0
    }
}
