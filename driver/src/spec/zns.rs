//! The Zoned Namespace Command Set (NVM Express Zoned Namespace Command Set Specification,
//! CSI 02h): opcodes, zone states and actions, the zone descriptor and the Report Zones
//! header, and the command set specific Identify data structures.
//!
//! Pure data: no I/O, no `unsafe`. Every layout has compile-time size and offset
//! assertions; multi-byte fields are little-endian on the wire.

/// Zoned Namespace Command Set I/O opcodes (besides the NVM ones it shares).
pub mod zns_opc {
    /// Zone Management Send.
    pub const ZONE_MGMT_SEND: u8 = 0x79;
    /// Zone Management Receive.
    pub const ZONE_MGMT_RECV: u8 = 0x7A;
    /// Zone Append.
    pub const ZONE_APPEND: u8 = 0x7D;
}

use super::cmd::Sqe;

/// ZT: Zone Type.
pub mod zone_type {
    /// Sequential Write Required.
    pub const SEQUENTIAL_WRITE_REQUIRED: u8 = 0x2;
}

/// ZS: Zone State (bits 7:4 of byte 1 of a zone descriptor).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ZoneState {
    /// ZSE: Empty.
    Empty,
    /// ZSIO: Implicitly Opened.
    ImplicitlyOpened,
    /// ZSEO: Explicitly Opened.
    ExplicitlyOpened,
    /// ZSC: Closed.
    Closed,
    /// ZSRO: Read Only.
    ReadOnly,
    /// ZSF: Full.
    Full,
    /// ZSO: Offline.
    Offline,
}

impl ZoneState {
    /// The 4-bit code.
    pub const fn code(self) -> u8 {
        match self {
            ZoneState::Empty => 0x1,
            ZoneState::ImplicitlyOpened => 0x2,
            ZoneState::ExplicitlyOpened => 0x3,
            ZoneState::Closed => 0x4,
            ZoneState::ReadOnly => 0xD,
            ZoneState::Full => 0xE,
            ZoneState::Offline => 0xF,
        }
    }
    /// Decodes the 4-bit code (`None` for reserved values).
    pub const fn from_code(v: u8) -> Option<Self> {
        Some(match v {
            0x1 => ZoneState::Empty,
            0x2 => ZoneState::ImplicitlyOpened,
            0x3 => ZoneState::ExplicitlyOpened,
            0x4 => ZoneState::Closed,
            0xD => ZoneState::ReadOnly,
            0xE => ZoneState::Full,
            0xF => ZoneState::Offline,
            _ => return None,
        })
    }
    /// Whether the zone is open (implicitly or explicitly): it holds an open resource.
    pub const fn is_open(self) -> bool {
        matches!(
            self,
            ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened
        )
    }
    /// Whether the zone is active (open or closed): it holds an active resource.
    pub const fn is_active(self) -> bool {
        matches!(
            self,
            ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened | ZoneState::Closed
        )
    }
}

/// ZSA: Zone Send Action of Zone Management Send (CDW13 bits 7:0).
pub mod zsa {
    /// Close Zone.
    pub const CLOSE: u8 = 0x01;
    /// Finish Zone.
    pub const FINISH: u8 = 0x02;
    /// Open Zone.
    pub const OPEN: u8 = 0x03;
    /// Reset Zone.
    pub const RESET: u8 = 0x04;
    /// Offline Zone.
    pub const OFFLINE: u8 = 0x05;
    /// Set Zone Descriptor Extension.
    pub const SET_ZDE: u8 = 0x10;
    /// CDW13 bit 8: Select All.
    pub const SELECT_ALL: u32 = 1 << 8;
}

/// ZRA and ZRAS of Zone Management Receive (CDW13).
pub mod zra {
    /// ZRA 00h: Report Zones.
    pub const REPORT_ZONES: u8 = 0x00;
    /// ZRA 01h: Extended Report Zones (descriptors with their extensions).
    pub const EXTENDED_REPORT_ZONES: u8 = 0x01;
    /// ZRAS (CDW13 bits 15:8) 00h: list all zones.
    pub const ALL: u8 = 0x00;
    /// CDW13 bit 16: Partial Report (the header counts the descriptors returned).
    pub const PARTIAL: u32 = 1 << 16;

    /// The zone state a Reporting Option (ZRAS 01h..07h) selects.
    pub const fn state(zras: u8) -> Option<super::ZoneState> {
        use super::ZoneState as Z;
        Some(match zras {
            0x01 => Z::Empty,
            0x02 => Z::ImplicitlyOpened,
            0x03 => Z::ExplicitlyOpened,
            0x04 => Z::Closed,
            0x05 => Z::Full,
            0x06 => Z::ReadOnly,
            0x07 => Z::Offline,
            _ => return None,
        })
    }
}

/// Bytes of a Report Zones header and of each zone descriptor.
pub const ZONE_DESCRIPTOR_SIZE: usize = 64;

/// The Report Zones data header (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ReportZonesHeader {
    /// NZ: Number of Zones (with Partial Report: the descriptors in this report; without:
    /// every matching zone from the starting zone on).
    pub nz: u64,
    /// Reserved.
    pub rsvd8: [u8; 56],
}

const _: () = assert!(core::mem::size_of::<ReportZonesHeader>() == ZONE_DESCRIPTOR_SIZE);

impl ReportZonesHeader {
    /// A header reporting `nz` zones.
    pub const fn new(nz: u64) -> Self {
        ReportZonesHeader { nz, rsvd8: [0; 56] }
    }
    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; ZONE_DESCRIPTOR_SIZE] {
        let mut b = [0u8; ZONE_DESCRIPTOR_SIZE];
        b[..8].copy_from_slice(&self.nz.to_le_bytes());
        b
    }
    /// Decodes a header.
    pub fn from_bytes(b: &[u8; ZONE_DESCRIPTOR_SIZE]) -> Self {
        ReportZonesHeader {
            nz: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            rsvd8: [0; 56],
        }
    }
}

/// A Zone Descriptor (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ZoneDescriptor {
    /// ZT: Zone Type (bits 3:0).
    pub zt: u8,
    /// ZS: Zone State (bits 7:4).
    pub zs: u8,
    /// ZA: Zone Attributes.
    pub za: u8,
    /// ZAI: Zone Attributes Information.
    pub zai: u8,
    /// Reserved.
    pub rsvd4: [u8; 4],
    /// ZCAP: Zone Capacity (logical blocks).
    pub zcap: u64,
    /// ZSLBA: Zone Start Logical Block Address.
    pub zslba: u64,
    /// WP: Write Pointer.
    pub wp: u64,
    /// Reserved.
    pub rsvd32: [u8; 32],
}

const _: () = {
    assert!(core::mem::size_of::<ZoneDescriptor>() == ZONE_DESCRIPTOR_SIZE);
    assert!(core::mem::offset_of!(ZoneDescriptor, zs) == 1);
    assert!(core::mem::offset_of!(ZoneDescriptor, za) == 2);
    assert!(core::mem::offset_of!(ZoneDescriptor, zcap) == 8);
    assert!(core::mem::offset_of!(ZoneDescriptor, zslba) == 16);
    assert!(core::mem::offset_of!(ZoneDescriptor, wp) == 24);
};

impl ZoneDescriptor {
    /// A descriptor of a Sequential Write Required zone.
    pub fn new(state: ZoneState, zslba: u64, zcap: u64, wp: u64) -> Self {
        ZoneDescriptor {
            zt: zone_type::SEQUENTIAL_WRITE_REQUIRED,
            zs: state.code() << 4,
            zcap,
            zslba,
            wp,
            ..Default::default()
        }
    }
    /// The zone state, if the code is not reserved.
    pub fn state(&self) -> Option<ZoneState> {
        ZoneState::from_code(self.zs >> 4)
    }
    /// Encodes the descriptor.
    pub fn to_bytes(&self) -> [u8; ZONE_DESCRIPTOR_SIZE] {
        let mut b = [0u8; ZONE_DESCRIPTOR_SIZE];
        b[0] = self.zt;
        b[1] = self.zs;
        b[2] = self.za;
        b[3] = self.zai;
        b[8..16].copy_from_slice(&self.zcap.to_le_bytes());
        b[16..24].copy_from_slice(&self.zslba.to_le_bytes());
        b[24..32].copy_from_slice(&self.wp.to_le_bytes());
        b
    }
    /// Decodes a descriptor. Never panics.
    pub fn from_bytes(b: &[u8; ZONE_DESCRIPTOR_SIZE]) -> Self {
        let q = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        ZoneDescriptor {
            zt: b[0],
            zs: b[1],
            za: b[2],
            zai: b[3],
            zcap: q(8),
            zslba: q(16),
            wp: q(24),
            ..Default::default()
        }
    }
}

/// Byte offsets in the I/O Command Set specific Identify Namespace data structure of the
/// Zoned Namespace Command Set (CNS 05h, CSI 02h).
pub mod id_ns_zoned_off {
    /// ZOC: Zone Operation Characteristics.
    pub const ZOC: usize = 0;
    /// OZCS: Optional Zoned Command Support (bit 0: Read Across Zone Boundaries).
    pub const OZCS: usize = 2;
    /// MAR: Maximum Active Resources (zero-based; FFFFFFFFh: no limit).
    pub const MAR: usize = 4;
    /// MOR: Maximum Open Resources (zero-based; FFFFFFFFh: no limit).
    pub const MOR: usize = 8;
    /// RRL: Reset Recommended Limit.
    pub const RRL: usize = 12;
    /// FRL: Finish Recommended Limit.
    pub const FRL: usize = 16;
    /// LBAFE0: the first LBA Format Extension (16 bytes each, one per LBA format).
    pub const LBAFE: usize = 2816;
    /// Bytes of one LBA Format Extension (ZSZE u64, ZDES u8, reserved).
    pub const LBAFE_SIZE: usize = 16;
}

const _: () = assert!(
    id_ns_zoned_off::LBAFE + 64 * id_ns_zoned_off::LBAFE_SIZE + 256
        == super::identify::IDENTIFY_SIZE
);

/// The value of MAR/MOR meaning "no limit".
pub const NO_LIMIT: u32 = 0xFFFF_FFFF;

/// OZCS bit 0: Read Across Zone Boundaries.
pub const OZCS_RAZB: u16 = 1 << 0;

/// The fields of the zoned Identify Namespace (CNS 05h, CSI 02h) that matter here.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct IdentifyNsZoned {
    /// ZOC.
    pub zoc: u16,
    /// OZCS.
    pub ozcs: u16,
    /// MAR (zero-based, [`NO_LIMIT`]).
    pub mar: u32,
    /// MOR (zero-based, [`NO_LIMIT`]).
    pub mor: u32,
    /// ZSZE of the LBA format in use: zone size in logical blocks.
    pub zsze: u64,
    /// ZDES of the LBA format in use: zone descriptor extension size in 64-byte units.
    pub zdes: u8,
}

impl IdentifyNsZoned {
    /// Encodes the structure with ZSZE/ZDES in LBA Format Extension `lbaf`.
    pub fn to_bytes(&self, lbaf: usize) -> Box<[u8; super::identify::IDENTIFY_SIZE]> {
        use id_ns_zoned_off as o;
        let mut b = Box::new([0u8; super::identify::IDENTIFY_SIZE]);
        b[o::ZOC..o::ZOC + 2].copy_from_slice(&self.zoc.to_le_bytes());
        b[o::OZCS..o::OZCS + 2].copy_from_slice(&self.ozcs.to_le_bytes());
        b[o::MAR..o::MAR + 4].copy_from_slice(&self.mar.to_le_bytes());
        b[o::MOR..o::MOR + 4].copy_from_slice(&self.mor.to_le_bytes());
        let e = o::LBAFE + (lbaf % 64) * o::LBAFE_SIZE;
        b[e..e + 8].copy_from_slice(&self.zsze.to_le_bytes());
        b[e + 8] = self.zdes;
        b
    }
    /// Decodes the structure, taking ZSZE/ZDES from LBA Format Extension `lbaf`. Never
    /// panics.
    pub fn parse(b: &[u8; super::identify::IDENTIFY_SIZE], lbaf: usize) -> Self {
        use id_ns_zoned_off as o;
        let d = |x: usize| u32::from_le_bytes(b[x..x + 4].try_into().expect("4 bytes"));
        let e = o::LBAFE + (lbaf % 64) * o::LBAFE_SIZE;
        IdentifyNsZoned {
            zoc: u16::from_le_bytes([b[o::ZOC], b[o::ZOC + 1]]),
            ozcs: u16::from_le_bytes([b[o::OZCS], b[o::OZCS + 1]]),
            mar: d(o::MAR),
            mor: d(o::MOR),
            zsze: u64::from_le_bytes(b[e..e + 8].try_into().expect("8 bytes")),
            zdes: b[e + 8],
        }
    }
}

/// Byte offset of ZASL (Zone Append Size Limit, a power of two of CAP.MPSMIN units; 0:
/// MDTS applies) in the zoned Identify Controller data structure (CNS 06h, CSI 02h).
pub const ID_CTRL_ZONED_ZASL: usize = 0;

/// The zone descriptors of a Report Zones answer in `buf` (header, then descriptors):
/// those the header counts and the buffer holds, in order. Never panics.
pub fn parse_report(buf: &[u8]) -> impl Iterator<Item = ZoneDescriptor> + '_ {
    let nz = buf.get(..ZONE_DESCRIPTOR_SIZE).map_or(0, |h| {
        ReportZonesHeader::from_bytes(h.try_into().expect("64 bytes")).nz
    });
    let room = (buf.len() / ZONE_DESCRIPTOR_SIZE).saturating_sub(1) as u64;
    buf.chunks_exact(ZONE_DESCRIPTOR_SIZE)
        .skip(1)
        .take(nz.min(room) as usize)
        .map(|d| ZoneDescriptor::from_bytes(d.try_into().expect("64 bytes")))
}

impl Sqe {
    /// Zone Append of `nlb` blocks (1..=65536) to the zone starting at `zslba`.
    pub fn zone_append(nsid: u32, zslba: u64, nlb: u32, prp1: u64, prp2: u64) -> Self {
        let mut c = Sqe::write(nsid, zslba, nlb, prp1, prp2);
        c.cdw0 = (c.cdw0 & !0xFF) | zns_opc::ZONE_APPEND as u32;
        c
    }
    /// Zone Management Send: `action` ([`zsa`]) on the zone starting at `zslba`, or on
    /// every zone it applies to with `select_all`.
    pub fn zone_mgmt_send(nsid: u32, zslba: u64, action: u8, select_all: bool) -> Self {
        let mut c = Sqe::new(zns_opc::ZONE_MGMT_SEND);
        c.nsid = nsid;
        c.cdw10 = zslba as u32;
        c.cdw11 = (zslba >> 32) as u32;
        c.cdw13 = action as u32 | if select_all { zsa::SELECT_ALL } else { 0 };
        c
    }
    /// Zone Management Receive, Report Zones from the zone holding `slba` into `bytes`
    /// (a multiple of 4) at `prp1`/`prp2`, zones in state `zras` ([`zra`]), with Partial
    /// Report as given.
    pub fn report_zones(
        nsid: u32,
        slba: u64,
        bytes: u32,
        zras: u8,
        partial: bool,
        prp1: u64,
        prp2: u64,
    ) -> Self {
        let mut c = Sqe::new(zns_opc::ZONE_MGMT_RECV);
        c.nsid = nsid;
        c.prp1 = prp1;
        c.prp2 = prp2;
        c.cdw10 = slba as u32;
        c.cdw11 = (slba >> 32) as u32;
        c.cdw12 = (bytes / 4).saturating_sub(1);
        c.cdw13 =
            zra::REPORT_ZONES as u32 | (zras as u32) << 8 | if partial { zra::PARTIAL } else { 0 };
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trip_and_layout() {
        let d = ZoneDescriptor::new(ZoneState::ImplicitlyOpened, 0x1000, 0x800, 0x1234);
        let b = d.to_bytes();
        assert_eq!(b[0], 0x2, "sequential write required");
        assert_eq!(b[1], 0x20, "state in bits 7:4");
        assert_eq!(&b[8..16], &0x800u64.to_le_bytes());
        assert_eq!(&b[16..24], &0x1000u64.to_le_bytes());
        assert_eq!(&b[24..32], &0x1234u64.to_le_bytes());
        assert_eq!(ZoneDescriptor::from_bytes(&b), d);
        assert_eq!(d.state(), Some(ZoneState::ImplicitlyOpened));
        let h = ReportZonesHeader::new(7);
        assert_eq!(ReportZonesHeader::from_bytes(&h.to_bytes()), h);
    }

    #[test]
    fn states_and_resources() {
        for s in [
            ZoneState::Empty,
            ZoneState::ImplicitlyOpened,
            ZoneState::ExplicitlyOpened,
            ZoneState::Closed,
            ZoneState::ReadOnly,
            ZoneState::Full,
            ZoneState::Offline,
        ] {
            assert_eq!(ZoneState::from_code(s.code()), Some(s));
        }
        assert_eq!(ZoneState::from_code(0), None);
        assert!(ZoneState::Closed.is_active() && !ZoneState::Closed.is_open());
        assert!(ZoneState::ExplicitlyOpened.is_open());
        assert!(!ZoneState::Full.is_active());
        assert_eq!(zra::state(0x05), Some(ZoneState::Full));
        assert_eq!(zra::state(0x00), None);
    }

    #[test]
    fn report_parsing_takes_what_header_and_buffer_allow() {
        let mut b = vec![0u8; 4 * ZONE_DESCRIPTOR_SIZE];
        b[..64].copy_from_slice(&ReportZonesHeader::new(5).to_bytes());
        for i in 0..3u64 {
            let d = ZoneDescriptor::new(ZoneState::Empty, i * 16, 16, i * 16);
            b[64 * (i as usize + 1)..][..64].copy_from_slice(&d.to_bytes());
        }
        let got: Vec<_> = parse_report(&b).map(|d| d.zslba).collect();
        assert_eq!(got, vec![0, 16, 32], "5 counted, room for 3");
        b[..64].copy_from_slice(&ReportZonesHeader::new(1).to_bytes());
        assert_eq!(parse_report(&b).count(), 1);
        assert_eq!(parse_report(&b[..10]).count(), 0);
    }

    #[test]
    fn identify_zoned_round_trip() {
        let z = IdentifyNsZoned {
            zoc: 0,
            ozcs: OZCS_RAZB,
            mar: 3,
            mor: NO_LIMIT,
            zsze: 4096,
            zdes: 0,
        };
        let b = z.to_bytes(2);
        assert_eq!(&b[2816 + 32..2816 + 40], &4096u64.to_le_bytes());
        assert_eq!(IdentifyNsZoned::parse(&b, 2), z);
    }
}
