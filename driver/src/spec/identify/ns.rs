//! Identify Namespace (CNS 00h), its LBA formats and the format in use, the Namespace
//! Identification Descriptor list (CNS 03h) and the active namespace ID list (CNS 02h).

use super::{rd_u16, rd_u32, rd_u64, wr_u16, wr_u32, wr_u64, IDENTIFY_SIZE};

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
    /// The protection information format of the LBA format in use (ELBAF PIF of the NVM
    /// Command Set Identify Namespace, CNS 05h): 0 the 16-bit guard, 1 the 32-bit guard,
    /// 2 the 64-bit guard. 0 when the controller does not report extended LBA formats.
    pub pif: u8,
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
            pif: 0,
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
            t @ 1..=3 => {
                write!(
                    f,
                    "protection information type {t} in the {} bytes of the metadata",
                    if self.pi_first { "first" } else { "last" }
                )?;
                match self.pif {
                    0 => {}
                    1 => write!(f, ", 32-bit guard (pif 1)")?,
                    2 => write!(f, ", 64-bit guard (pif 2)")?,
                    p => write!(f, ", reserved guard format (pif {p})")?,
                }
            }
            t => write!(f, "reserved protection type {t}")?,
        }
        write!(
            f,
            "; csi {:#04x}, {})",
            self.csi,
            crate::spec::cmd::csi::name(self.csi)
        )
    }
}

/// The Protection Information Format (PIF, bits 8:7) of extended LBA format `index` in the
/// NVM Command Set specific Identify Namespace data structure (CNS 05h, CSI 00h): LBSTM
/// (bytes 7:0), PIC (byte 8), reserved (11:9), then ELBAF0..ELBAF63, 4 bytes each from byte
/// 12. 0: 16-bit guard, 1: 32-bit guard, 2: 64-bit guard.
pub fn nvm_elbaf_pif(b: &[u8; 4096], index: usize) -> u8 {
    let off = NVM_ELBAF_OFFSET + 4 * index.min(63);
    let e = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
    ((e >> 7) & 0x3) as u8
}

/// Byte offset of ELBAF0 in the NVM Command Set specific Identify Namespace data structure.
pub const NVM_ELBAF_OFFSET: usize = 12;

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
