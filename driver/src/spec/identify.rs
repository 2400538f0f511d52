//! Identify data structures (spec 5.15.2) and log pages (spec 5.14.1), parsed from and
//! encoded to their little-endian byte layouts.
//!
//! Parsing takes a fixed-size byte array and never panics: every field is read at a
//! constant offset inside the array, strings are decoded lossily, and counts that index
//! tables are clamped to the table size.

/// Size of every Identify data structure.
pub const IDENTIFY_SIZE: usize = 4096;
/// Size of the SMART / Health Information log page.
pub const SMART_LOG_SIZE: usize = 512;
/// Size of one Error Information log entry.
pub const ERROR_LOG_ENTRY_SIZE: usize = 64;

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
    /// Whether a volatile write cache is present (VWC bit 0).
    pub fn has_volatile_write_cache(&self) -> bool {
        self.vwc & 1 != 0
    }
}

/// One LBA Format entry (Identify Namespace LBAF0..LBAF63).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct LbaFormat {
    /// MS: Metadata Size in bytes.
    pub ms: u16,
    /// LBADS: LBA Data Size as a power of two (9 = 512 B, 12 = 4 KiB).
    pub lbads: u8,
    /// RP: Relative Performance.
    pub rp: u8,
}

impl LbaFormat {
    /// Decodes a raw LBAF dword.
    pub const fn from_raw(v: u32) -> Self {
        LbaFormat {
            ms: v as u16,
            lbads: (v >> 16) as u8,
            rp: ((v >> 24) & 3) as u8,
        }
    }
    /// Encodes the LBAF dword.
    pub const fn to_raw(self) -> u32 {
        (self.ms as u32) | ((self.lbads as u32) << 16) | (((self.rp & 3) as u32) << 24)
    }
    /// Data size in bytes, or `None` if LBADS is out of the range the spec allows (9..=31
    /// for a format in use; 0 marks an unsupported format).
    pub fn data_size(self) -> Option<u32> {
        (9..32).contains(&self.lbads).then(|| 1u32 << self.lbads)
    }
}

/// Byte offsets in the Identify Namespace data structure.
pub mod ns_off {
    /// NSZE: Namespace Size (LBAs).
    pub const NSZE: usize = 0;
    /// NCAP: Namespace Capacity (LBAs).
    pub const NCAP: usize = 8;
    /// NUSE: Namespace Utilization (LBAs).
    pub const NUSE: usize = 16;
    /// NSFEAT: Namespace Features.
    pub const NSFEAT: usize = 24;
    /// NLBAF: Number of LBA Formats (zero-based).
    pub const NLBAF: usize = 25;
    /// FLBAS: Formatted LBA Size.
    pub const FLBAS: usize = 26;
    /// MC: Metadata Capabilities.
    pub const MC: usize = 27;
    /// DPC: End-to-end Data Protection Capabilities.
    pub const DPC: usize = 28;
    /// DPS: End-to-end Data Protection Type Settings.
    pub const DPS: usize = 29;
    /// NMIC: Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub const NMIC: usize = 30;
    /// DLFEAT: Deallocate Logical Block Features.
    pub const DLFEAT: usize = 33;
    /// NOIOB: Namespace Optimal I/O Boundary.
    pub const NOIOB: usize = 46;
    /// NGUID: Namespace Globally Unique Identifier.
    pub const NGUID: usize = 104;
    /// EUI64: IEEE Extended Unique Identifier.
    pub const EUI64: usize = 120;
    /// LBAF0: the first LBA Format.
    pub const LBAF: usize = 128;
}

/// Number of LBA format entries in Identify Namespace (LBAF0..LBAF63 in 2.0).
pub const MAX_LBA_FORMATS: usize = 64;

/// The fields of Identify Namespace (CNS 00h) the driver and tools use.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct IdentifyNamespace {
    /// NSZE (LBAs).
    pub nsze: u64,
    /// NCAP (LBAs).
    pub ncap: u64,
    /// NUSE (LBAs).
    pub nuse: u64,
    /// NSFEAT.
    pub nsfeat: u8,
    /// NLBAF (zero-based count of valid entries in `lbaf`).
    pub nlbaf: u8,
    /// FLBAS.
    pub flbas: u8,
    /// MC.
    pub mc: u8,
    /// DPC.
    pub dpc: u8,
    /// DPS.
    pub dps: u8,
    /// NMIC.
    pub nmic: u8,
    /// DLFEAT.
    pub dlfeat: u8,
    /// NOIOB.
    pub noiob: u16,
    /// NGUID.
    pub nguid: [u8; 16],
    /// EUI64.
    pub eui64: [u8; 8],
    /// LBAF0..LBAF63.
    pub lbaf: [LbaFormat; MAX_LBA_FORMATS],
}

impl Default for IdentifyNamespace {
    fn default() -> Self {
        IdentifyNamespace {
            nsze: 0,
            ncap: 0,
            nuse: 0,
            nsfeat: 0,
            nlbaf: 0,
            flbas: 0,
            mc: 0,
            dpc: 0,
            dps: 0,
            nmic: 0,
            dlfeat: 0,
            noiob: 0,
            nguid: [0; 16],
            eui64: [0; 8],
            lbaf: [LbaFormat::default(); MAX_LBA_FORMATS],
        }
    }
}

impl IdentifyNamespace {
    /// Parses Identify Namespace data. Never panics.
    pub fn parse(b: &[u8; IDENTIFY_SIZE]) -> Self {
        use ns_off as o;
        let mut lbaf = [LbaFormat::default(); MAX_LBA_FORMATS];
        for (i, f) in lbaf.iter_mut().enumerate() {
            *f = LbaFormat::from_raw(rd_u32(b, o::LBAF + 4 * i));
        }
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[o::NGUID..o::NGUID + 16]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[o::EUI64..o::EUI64 + 8]);
        IdentifyNamespace {
            nsze: rd_u64(b, o::NSZE),
            ncap: rd_u64(b, o::NCAP),
            nuse: rd_u64(b, o::NUSE),
            nsfeat: b[o::NSFEAT],
            nlbaf: b[o::NLBAF],
            flbas: b[o::FLBAS],
            mc: b[o::MC],
            dpc: b[o::DPC],
            dps: b[o::DPS],
            nmic: b[o::NMIC],
            dlfeat: b[o::DLFEAT],
            noiob: rd_u16(b, o::NOIOB),
            nguid,
            eui64,
            lbaf,
        }
    }

    /// Encodes the structure (fields not modelled are zero).
    pub fn to_bytes(&self) -> Box<[u8; IDENTIFY_SIZE]> {
        use ns_off as o;
        let mut b = Box::new([0u8; IDENTIFY_SIZE]);
        wr_u64(&mut b[..], o::NSZE, self.nsze);
        wr_u64(&mut b[..], o::NCAP, self.ncap);
        wr_u64(&mut b[..], o::NUSE, self.nuse);
        b[o::NSFEAT] = self.nsfeat;
        b[o::NLBAF] = self.nlbaf;
        b[o::FLBAS] = self.flbas;
        b[o::MC] = self.mc;
        b[o::DPC] = self.dpc;
        b[o::DPS] = self.dps;
        b[o::NMIC] = self.nmic;
        b[o::DLFEAT] = self.dlfeat;
        wr_u16(&mut b[..], o::NOIOB, self.noiob);
        b[o::NGUID..o::NGUID + 16].copy_from_slice(&self.nguid);
        b[o::EUI64..o::EUI64 + 8].copy_from_slice(&self.eui64);
        for (i, f) in self.lbaf.iter().enumerate() {
            wr_u32(&mut b[..], o::LBAF + 4 * i, f.to_raw());
        }
        b
    }

    /// Index of the LBA format in use: FLBAS bits 3:0, with bits 6:5 as the upper two
    /// bits when more than 16 formats exist (NVMe 2.0).
    pub fn lba_format_index(&self) -> usize {
        let lo = (self.flbas & 0xF) as usize;
        if self.nlbaf >= 16 {
            lo | (((self.flbas >> 5) & 0x3) as usize) << 4
        } else {
            lo
        }
    }
    /// The LBA format in use.
    pub fn lba_format(&self) -> LbaFormat {
        self.lbaf[self.lba_format_index().min(MAX_LBA_FORMATS - 1)]
    }
    /// The logical block size in bytes, or `None` when the format in use is invalid.
    pub fn lba_size(&self) -> Option<u32> {
        if self.lba_format_index() > self.nlbaf as usize {
            return None;
        }
        self.lba_format().data_size()
    }
    /// Whether deallocated blocks read as zeroes (DLFEAT bits 2:0 = 001b).
    pub fn deallocated_reads_zeroes(&self) -> bool {
        self.dlfeat & 0x7 == 0x1
    }
    /// Whether Write Zeroes can deallocate (DLFEAT bit 3).
    pub fn write_zeroes_deallocates(&self) -> bool {
        self.dlfeat & 0x8 != 0
    }
}

/// How the blocks of a namespace look on the wire: the LBA format in use, its metadata and
/// its end-to-end protection settings, and the command set the namespace belongs to.
/// Decoded from Identify Namespace (FLBAS, LBAF, DPS) and the Command Set Identifier.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct NsFormat {
    /// Index of the LBA format in use (FLBAS bits 3:0, and 6:5 above 16 formats).
    pub lbaf_index: u8,
    /// NLBAF: the highest valid format index.
    pub nlbaf: u8,
    /// LBADS of the format in use (the data size is `1 << lbads` bytes).
    pub lbads: u8,
    /// MS: metadata bytes per logical block.
    pub ms: u16,
    /// FLBAS bit 4: metadata is transferred at the end of each block's data (an extended
    /// LBA) rather than in a separate buffer.
    pub extended: bool,
    /// DPS bits 2:0: the protection information type (0: none, 1..=3).
    pub pi_type: u8,
    /// DPS bit 3: the protection information is the first bytes of the metadata (else the
    /// last).
    pub pi_first: bool,
    /// FLBAS as reported.
    pub flbas: u8,
    /// DPS as reported.
    pub dps: u8,
    /// The Command Set Identifier ([`crate::spec::csi`]).
    pub csi: u8,
}

impl NsFormat {
    /// The format of `ns`, which belongs to command set `csi`.
    pub fn of(ns: &IdentifyNamespace, csi: u8) -> Self {
        let f = ns.lba_format();
        NsFormat {
            lbaf_index: ns.lba_format_index() as u8,
            nlbaf: ns.nlbaf,
            lbads: f.lbads,
            ms: f.ms,
            extended: ns.flbas & 0x10 != 0,
            pi_type: ns.dps & 0x7,
            pi_first: ns.dps & 0x8 != 0,
            flbas: ns.flbas,
            dps: ns.dps,
            csi,
        }
    }
    /// The LBA data size in bytes, or `None` when the format index is past NLBAF or LBADS
    /// is outside 9..=31.
    pub fn data_size(&self) -> Option<u32> {
        if self.lbaf_index > self.nlbaf {
            return None;
        }
        (9..32).contains(&self.lbads).then(|| 1u32 << self.lbads)
    }
}

impl std::fmt::Display for NsFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lba format {}", self.lbaf_index)?;
        match self.data_size() {
            Some(d) => write!(f, " (lba data size {d} B")?,
            None if self.lbaf_index > self.nlbaf => write!(f, " (past nlbaf {}", self.nlbaf)?,
            None => write!(f, " (invalid lbads {}", self.lbads)?,
        }
        if self.ms == 0 {
            write!(f, ", no metadata")?;
        } else {
            let how = if self.extended {
                "extended lba, inline with the data"
            } else {
                "in a separate buffer"
            };
            write!(f, ", ms {} B {how}", self.ms)?;
        }
        write!(f, ", flbas {:#04x}, dps {:#04x}: ", self.flbas, self.dps)?;
        match self.pi_type {
            0 => write!(f, "no protection information")?,
            t @ 1..=3 => write!(
                f,
                "protection information type {t} in the {} bytes of the metadata",
                if self.pi_first { "first" } else { "last" }
            )?,
            t => write!(f, "reserved protection type {t}")?,
        }
        write!(
            f,
            "; csi {:#04x}, {})",
            self.csi,
            super::cmd::csi::name(self.csi)
        )
    }
}

/// The Namespace Identification Descriptor list (CNS 03h), as parsed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct NsIdDescriptors {
    /// NIDT 01h: IEEE Extended Unique Identifier.
    pub eui64: Option<[u8; 8]>,
    /// NIDT 02h: Namespace Globally Unique Identifier.
    pub nguid: Option<[u8; 16]>,
    /// NIDT 03h: Namespace UUID.
    pub uuid: Option<[u8; 16]>,
    /// NIDT 04h: Command Set Identifier.
    pub csi: Option<u8>,
}

/// Namespace Identification Descriptor types (NIDT).
pub mod nidt {
    /// IEEE Extended Unique Identifier (NIDL 8).
    pub const EUI64: u8 = 0x01;
    /// Namespace Globally Unique Identifier (NIDL 16).
    pub const NGUID: u8 = 0x02;
    /// Namespace UUID (NIDL 16).
    pub const UUID: u8 = 0x03;
    /// Command Set Identifier (NIDL 1).
    pub const CSI: u8 = 0x04;
}

impl NsIdDescriptors {
    /// Parses the list: descriptors of 4 header bytes (NIDT, NIDL, 2 reserved) then NIDL
    /// bytes, until a descriptor of NIDL 0 or the end of the page. A descriptor whose NIDL
    /// does not match its type's is skipped; unknown types are skipped. Never panics.
    pub fn parse(b: &[u8; IDENTIFY_SIZE]) -> Self {
        let mut out = NsIdDescriptors::default();
        let mut o = 0usize;
        while o + 4 <= IDENTIFY_SIZE {
            let (t, l) = (b[o], b[o + 1] as usize);
            if l == 0 || o + 4 + l > IDENTIFY_SIZE {
                break;
            }
            let v = &b[o + 4..o + 4 + l];
            match (t, l) {
                (nidt::EUI64, 8) => out.eui64 = v.try_into().ok(),
                (nidt::NGUID, 16) => out.nguid = v.try_into().ok(),
                (nidt::UUID, 16) => out.uuid = v.try_into().ok(),
                (nidt::CSI, 1) => out.csi = Some(v[0]),
                _ => {}
            }
            o += 4 + l;
        }
        out
    }

    /// Encodes the descriptors present, in type order.
    pub fn to_bytes(&self) -> Box<[u8; IDENTIFY_SIZE]> {
        let mut b = Box::new([0u8; IDENTIFY_SIZE]);
        let mut o = 0usize;
        let mut put = |t: u8, v: &[u8]| {
            b[o] = t;
            b[o + 1] = v.len() as u8;
            b[o + 4..o + 4 + v.len()].copy_from_slice(v);
            o += 4 + v.len();
        };
        if let Some(v) = &self.eui64 {
            put(nidt::EUI64, v);
        }
        if let Some(v) = &self.nguid {
            put(nidt::NGUID, v);
        }
        if let Some(v) = &self.uuid {
            put(nidt::UUID, v);
        }
        if let Some(v) = self.csi {
            put(nidt::CSI, &[v]);
        }
        b
    }
}

/// Parses the Active Namespace ID list (CNS 02h): increasing NSIDs, terminated by 0.
/// Entries that are not strictly increasing end the list (a malformed list is cut there).
pub fn parse_active_ns_list(b: &[u8; IDENTIFY_SIZE]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut last = 0u32;
    for i in 0..IDENTIFY_SIZE / 4 {
        let id = rd_u32(b, 4 * i);
        if id == 0 || id <= last || id == crate::spec::NSID_ALL {
            break;
        }
        out.push(id);
        last = id;
    }
    out
}

/// Encodes an Active Namespace ID list (at most 1024 entries).
pub fn encode_active_ns_list(ids: &[u32]) -> Box<[u8; IDENTIFY_SIZE]> {
    let mut b = Box::new([0u8; IDENTIFY_SIZE]);
    for (i, id) in ids.iter().take(IDENTIFY_SIZE / 4).enumerate() {
        wr_u32(&mut b[..], 4 * i, *id);
    }
    b
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_round_trip() {
        let c = IdentifyController {
            vid: 0x1b36,
            sn: "kestrel0".into(),
            mn: "QEMU NVMe Ctrl".into(),
            fr: "8.0.0".into(),
            mdts: 7,
            ver: 0x0001_0400,
            oacs: oacs::DOORBELL_BUFFER_CONFIG,
            sqes: 0x66,
            cqes: 0x44,
            nn: 256,
            oncs: oncs::WRITE_ZEROES | oncs::DATASET_MANAGEMENT,
            vwc: 1,
            subnqn: "nqn.2019-08.org.qemu:kestrel0".into(),
            ..Default::default()
        };
        let b = c.to_bytes();
        assert_eq!(&b[24..38], b"QEMU NVMe Ctrl");
        assert_eq!(b[38], b' ');
        let p = IdentifyController::parse(&b);
        assert_eq!(p, c);
        assert_eq!(p.max_transfer_bytes(0), Some(512 * 1024));
        assert!(p.supports_shadow_doorbells());
    }

    #[test]
    fn namespace_round_trip_and_lba_size() {
        let mut ns = IdentifyNamespace {
            nsze: 1 << 18,
            ncap: 1 << 18,
            nlbaf: 1,
            flbas: 1,
            dlfeat: 0x9,
            ..Default::default()
        };
        ns.lbaf[0] = LbaFormat {
            ms: 0,
            lbads: 9,
            rp: 0,
        };
        ns.lbaf[1] = LbaFormat {
            ms: 0,
            lbads: 12,
            rp: 0,
        };
        let p = IdentifyNamespace::parse(&ns.to_bytes());
        assert_eq!(p, ns);
        assert_eq!(p.lba_size(), Some(4096));
        assert!(p.deallocated_reads_zeroes());
        assert!(p.write_zeroes_deallocates());
        // FLBAS pointing past NLBAF is invalid.
        let bad = IdentifyNamespace {
            flbas: 5,
            ..ns.clone()
        };
        assert_eq!(bad.lba_size(), None);
    }

    #[test]
    fn ns_id_descriptors_round_trip_and_hostile_input() {
        let d = NsIdDescriptors {
            eui64: Some([1, 2, 3, 4, 5, 6, 7, 8]),
            nguid: Some([9; 16]),
            uuid: None,
            csi: Some(crate::spec::csi::ZONED),
        };
        assert_eq!(NsIdDescriptors::parse(&d.to_bytes()), d);
        // A wrong length for a known type is skipped, the walk goes on.
        let mut b = [0u8; IDENTIFY_SIZE];
        b[0] = nidt::CSI;
        b[1] = 2;
        b[6] = nidt::CSI;
        b[7] = 1;
        b[10] = 2;
        assert_eq!(NsIdDescriptors::parse(&b).csi, Some(2));
        // A descriptor running past the page ends the list.
        let mut b = [0u8; IDENTIFY_SIZE];
        b[IDENTIFY_SIZE - 4] = nidt::NGUID;
        b[IDENTIFY_SIZE - 3] = 16;
        assert_eq!(NsIdDescriptors::parse(&b), NsIdDescriptors::default());
    }

    #[test]
    fn ns_format_decodes_flbas_and_dps() {
        let mut ns = IdentifyNamespace {
            nsze: 8,
            nlbaf: 2,
            flbas: 0x12,
            dps: 0x09,
            ..Default::default()
        };
        ns.lbaf[2] = LbaFormat {
            ms: 8,
            lbads: 12,
            rp: 0,
        };
        let f = NsFormat::of(&ns, 0);
        assert_eq!((f.lbaf_index, f.ms, f.extended), (2, 8, true));
        assert_eq!(
            (f.pi_type, f.pi_first, f.data_size()),
            (1, true, Some(4096))
        );
        let s = f.to_string();
        for want in [
            "lba format 2",
            "4096 B",
            "ms 8 B extended",
            "flbas 0x12",
            "dps 0x09",
            "type 1 in the first",
            "NVM Command Set",
        ] {
            assert!(s.contains(want), "{s:?} lacks {want:?}");
        }
        ns.flbas = 3; // past NLBAF
        assert_eq!(NsFormat::of(&ns, 0).data_size(), None);
        assert!(NsFormat::of(&ns, 0).to_string().contains("past nlbaf 2"));
    }

    #[test]
    fn parsers_take_any_bytes() {
        let mut b = [0u8; IDENTIFY_SIZE];
        for seed in 0..64u32 {
            let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *v = x as u8;
            }
            let _ = IdentifyController::parse(&b);
            let ns = IdentifyNamespace::parse(&b);
            let _ = ns.lba_size();
            let _ = NsFormat::of(&ns, b[0]).to_string();
            let _ = NsIdDescriptors::parse(&b);
            let list = parse_active_ns_list(&b);
            assert!(list.windows(2).all(|w| w[0] < w[1]));
            let mut s = [0u8; SMART_LOG_SIZE];
            s.copy_from_slice(&b[..SMART_LOG_SIZE]);
            let _ = SmartLog::parse(&s);
            let _ = ErrorLogEntry::parse_page(&b);
        }
        let ones = [0xFFu8; IDENTIFY_SIZE];
        assert!(IdentifyNamespace::parse(&ones).lba_size().is_none());
        assert!(parse_active_ns_list(&ones).is_empty());
    }

    #[test]
    fn smart_and_error_log_round_trip() {
        let s = SmartLog {
            composite_temperature_k: 310,
            available_spare_pct: 100,
            data_units_written: 12345,
            power_on_hours: 42,
            ..Default::default()
        };
        let p = SmartLog::parse(&s.to_bytes());
        assert_eq!(p, s);
        assert_eq!(p.temperature_celsius(), 37);
        let e = ErrorLogEntry {
            error_count: 3,
            sqid: 1,
            cid: 7,
            status: crate::spec::Status::LBA_OUT_OF_RANGE.to_cqe_status(),
            lba: 99,
            nsid: 1,
            ..Default::default()
        };
        let mut page = vec![0u8; 4 * ERROR_LOG_ENTRY_SIZE];
        page[..64].copy_from_slice(&e.to_bytes());
        let entries = ErrorLogEntry::parse_page(&page);
        assert_eq!(entries, vec![e]);
        assert!(entries[0]
            .status()
            .same_code(crate::spec::Status::LBA_OUT_OF_RANGE));
    }
}
