//! NVMe over Fabrics definitions (NVMe over Fabrics 1.1 and the Base Specification 2.0):
//! the Fabrics command set (Connect, Property Get/Set, Disconnect), SGL descriptors as a
//! fabrics command carries them, NQNs, properties, the discovery log page and the fabrics
//! fields of Identify Controller. Byte-level, no `unsafe`.

/// Opcode of every Fabrics command.
pub const FABRICS_OPC: u8 = 0x7F;
/// The well-known NQN of discovery subsystems.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Size of an NQN field (NUL terminated, at most 223 bytes of text).
pub const NQN_FIELD: usize = 256;
/// The longest NQN.
pub const NQN_MAX: usize = 223;
/// Size of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// The CNTLID a host asks for under the dynamic controller model.
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;
/// The highest controller ID a subsystem may allocate.
pub const CNTLID_MAX: u16 = 0xFFEF;

/// FCTYPE values of Fabrics commands.
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTH_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTH_RECV: u8 = 0x06;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// Command specific status codes of Connect (SCT 1h).
pub mod connect_sc {
    /// Connect Incompatible Format.
    pub const INCOMPATIBLE_FORMAT: u8 = 0x80;
    /// Connect Controller Busy.
    pub const CONTROLLER_BUSY: u8 = 0x81;
    /// Connect Invalid Parameters.
    pub const INVALID_PARAMETERS: u8 = 0x82;
    /// Connect Invalid Host.
    pub const INVALID_HOST: u8 = 0x84;
}

/// Byte offsets inside the Connect command (SQE).
pub mod connect_off {
    /// RECFMT.
    pub const RECFMT: usize = 40;
    /// QID.
    pub const QID: usize = 42;
    /// SQSIZE (0's based).
    pub const SQSIZE: usize = 44;
    /// CATTR.
    pub const CATTR: usize = 46;
    /// KATO (ms).
    pub const KATO: usize = 48;
}

/// Byte offsets inside the Connect data.
pub mod connect_data_off {
    /// HOSTID (16 bytes).
    pub const HOSTID: usize = 0;
    /// CNTLID.
    pub const CNTLID: usize = 16;
    /// SUBNQN (256 bytes).
    pub const SUBNQN: usize = 256;
    /// HOSTNQN (256 bytes).
    pub const HOSTNQN: usize = 512;
}

/// CATTR bit: the host disables SQ flow control (SQHD is then not reported).
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

fn rd16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn rd32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn rd64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn wr16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn wr32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn wr64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// FCTYPE of a Fabrics command (byte 4 of the SQE).
pub fn fctype_of(sqe: &[u8; 64]) -> u8 {
    sqe[4]
}

/// The Connect command's fields.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConnectCmd {
    /// RECFMT: record format (0).
    pub recfmt: u16,
    /// QID: 0 for the admin queue.
    pub qid: u16,
    /// SQSIZE: 0's based.
    pub sqsize: u16,
    /// CATTR.
    pub cattr: u8,
    /// KATO in milliseconds (admin queue).
    pub kato_ms: u32,
}

impl ConnectCmd {
    /// Decodes the fields from a Connect SQE.
    pub fn parse(sqe: &[u8; 64]) -> Self {
        use connect_off as o;
        ConnectCmd {
            recfmt: rd16(sqe, o::RECFMT),
            qid: rd16(sqe, o::QID),
            sqsize: rd16(sqe, o::SQSIZE),
            cattr: sqe[o::CATTR],
            kato_ms: rd32(sqe, o::KATO),
        }
    }
    /// Encodes a Connect SQE with command ID `cid` and a transport SGL for the data.
    pub fn encode(&self, cid: u16, sgl: Sgl) -> [u8; 64] {
        use connect_off as o;
        let mut s = [0u8; 64];
        s[0] = FABRICS_OPC;
        s[1] = 0x40;
        wr16(&mut s, 2, cid);
        s[4] = fctype::CONNECT;
        sgl.encode(&mut s);
        wr16(&mut s, o::RECFMT, self.recfmt);
        wr16(&mut s, o::QID, self.qid);
        wr16(&mut s, o::SQSIZE, self.sqsize);
        s[o::CATTR] = self.cattr;
        wr32(&mut s, o::KATO, self.kato_ms);
        s
    }
}

/// Why a field of a Connect (or other command) is refused: its byte offset and whether it
/// lies in the data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct InvalidParam {
    /// Byte offset of the field.
    pub offset: u16,
    /// The field is in the data (else in the command).
    pub in_data: bool,
    /// What is wrong.
    pub why: &'static str,
}

impl InvalidParam {
    /// Dword 0 of a Connect Invalid Parameters response: IPO in bits 15:0, IATTR bit 0 in
    /// bit 16.
    pub fn dw0(&self) -> u32 {
        self.offset as u32 | ((self.in_data as u32) << 16)
    }
}

/// The Connect command's data.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConnectData {
    /// HOSTID.
    pub hostid: [u8; 16],
    /// CNTLID (0xFFFF for the admin queue under the dynamic model).
    pub cntlid: u16,
    /// SUBNQN.
    pub subnqn: String,
    /// HOSTNQN.
    pub hostnqn: String,
}

/// Reads a NUL-terminated NQN out of a 256-byte field; `None` when it is not a valid NQN
/// (empty, unterminated, longer than 223 bytes, not printable ASCII, or without the
/// `nqn.` prefix).
pub fn read_nqn(field: &[u8]) -> Option<String> {
    let end = field.iter().position(|&b| b == 0)?;
    let s = &field[..end];
    if s.is_empty() || s.len() > NQN_MAX || !s.iter().all(|b| (0x21..0x7f).contains(b)) {
        return None;
    }
    let s = std::str::from_utf8(s).ok()?;
    valid_nqn(s).then(|| s.to_string())
}

/// Whether `s` is an NQN this target accepts: `nqn.` followed by a date and a name (or the
/// UUID form), printable ASCII without spaces, at most 223 bytes.
pub fn valid_nqn(s: &str) -> bool {
    s.len() <= NQN_MAX
        && s.len() > 4
        && s.starts_with("nqn.")
        && s.bytes().all(|b| (0x21..0x7f).contains(&b))
}

impl ConnectData {
    /// Decodes the Connect data.
    pub fn parse(d: &[u8]) -> Result<Self, InvalidParam> {
        use connect_data_off as o;
        if d.len() < CONNECT_DATA_LEN {
            return Err(InvalidParam {
                offset: 0,
                in_data: true,
                why: "connect data shorter than 1024 bytes",
            });
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&d[o::HOSTID..o::HOSTID + 16]);
        let subnqn = read_nqn(&d[o::SUBNQN..o::SUBNQN + NQN_FIELD]).ok_or(InvalidParam {
            offset: o::SUBNQN as u16,
            in_data: true,
            why: "subnqn is not a valid nqn",
        })?;
        let hostnqn = read_nqn(&d[o::HOSTNQN..o::HOSTNQN + NQN_FIELD]).ok_or(InvalidParam {
            offset: o::HOSTNQN as u16,
            in_data: true,
            why: "hostnqn is not a valid nqn",
        })?;
        Ok(ConnectData {
            hostid,
            cntlid: rd16(d, o::CNTLID),
            subnqn,
            hostnqn,
        })
    }
    /// Encodes the Connect data.
    pub fn encode(&self) -> Vec<u8> {
        use connect_data_off as o;
        let mut d = vec![0u8; CONNECT_DATA_LEN];
        d[o::HOSTID..o::HOSTID + 16].copy_from_slice(&self.hostid);
        wr16(&mut d, o::CNTLID, self.cntlid);
        let n = self.subnqn.len().min(NQN_FIELD - 1);
        d[o::SUBNQN..o::SUBNQN + n].copy_from_slice(&self.subnqn.as_bytes()[..n]);
        let n = self.hostnqn.len().min(NQN_FIELD - 1);
        d[o::HOSTNQN..o::HOSTNQN + n].copy_from_slice(&self.hostnqn.as_bytes()[..n]);
        d
    }
}

/// Property offsets (the controller registers, as properties).
pub mod prop {
    /// CAP (8 bytes).
    pub const CAP: u32 = 0x00;
    /// VS.
    pub const VS: u32 = 0x08;
    /// CC.
    pub const CC: u32 = 0x14;
    /// CSTS.
    pub const CSTS: u32 = 0x1C;
    /// NSSR.
    pub const NSSR: u32 = 0x20;
}

/// Property Get or Property Set.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PropertyCmd {
    /// ATTRIB size: 8 bytes (else 4).
    pub size8: bool,
    /// OFST.
    pub ofst: u32,
    /// VALUE (Property Set).
    pub value: u64,
}

impl PropertyCmd {
    /// Decodes Property Get/Set fields (ATTRIB at 40, OFST at 44, VALUE at 48).
    pub fn parse(sqe: &[u8; 64]) -> Result<Self, InvalidParam> {
        let size = sqe[40] & 7;
        if size > 1 {
            return Err(InvalidParam {
                offset: 40,
                in_data: false,
                why: "property size other than 4 or 8 bytes",
            });
        }
        Ok(PropertyCmd {
            size8: size == 1,
            ofst: rd32(sqe, 44),
            value: rd64(sqe, 48),
        })
    }
    /// Encodes a Property Get (`set` false) or Set SQE.
    pub fn encode(&self, cid: u16, set: bool) -> [u8; 64] {
        let mut s = [0u8; 64];
        s[0] = FABRICS_OPC;
        s[1] = 0x40;
        wr16(&mut s, 2, cid);
        s[4] = if set {
            fctype::PROPERTY_SET
        } else {
            fctype::PROPERTY_GET
        };
        s[40] = self.size8 as u8;
        wr32(&mut s, 44, self.ofst);
        wr64(&mut s, 48, self.value);
        s
    }
}

/// The data pointer of a fabrics command: one SGL descriptor (SQE bytes 24..40).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sgl {
    /// SGL Data Block, subtype Offset (type 0h, subtype 1h): in-capsule data at `offset`
    /// of the capsule's data.
    InCapsule {
        /// Offset into the in-capsule data (ICDOFF-relative).
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Transport SGL Data Block (type 5h, subtype Ah): data moved by the transport (R2T
    /// and H2CData, or C2HData); length 0 means no data.
    Transport {
        /// Length.
        len: u32,
    },
    /// Keyed SGL Data Block (type 4h): remote memory keys, an RDMA form; not for TCP.
    Keyed {
        /// Length.
        len: u32,
    },
    /// Any other descriptor type/subtype byte.
    Other(u8),
}

/// SGL Identifier byte values.
pub mod sgl_id {
    /// Data Block, Offset.
    pub const DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Transport SGL Data Block, Transport specific A.
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5A;
}

impl Sgl {
    /// Decodes SGL1 of an SQE.
    pub fn parse(sqe: &[u8; 64]) -> Self {
        let addr = rd64(sqe, 24);
        let len = rd32(sqe, 32);
        let id = sqe[39];
        match id {
            sgl_id::DATA_BLOCK_OFFSET => Sgl::InCapsule { offset: addr, len },
            sgl_id::TRANSPORT_DATA_BLOCK => Sgl::Transport { len },
            x if x >> 4 == 4 => Sgl::Keyed {
                len: u32::from_le_bytes([sqe[32], sqe[33], sqe[34], 0]),
            },
            x => Sgl::Other(x),
        }
    }
    /// Encodes into SGL1 of an SQE.
    pub fn encode(&self, sqe: &mut [u8; 64]) {
        sqe[24..40].fill(0);
        match *self {
            Sgl::InCapsule { offset, len } => {
                wr64(sqe, 24, offset);
                wr32(sqe, 32, len);
                sqe[39] = sgl_id::DATA_BLOCK_OFFSET;
            }
            Sgl::Transport { len } => {
                wr32(sqe, 32, len);
                sqe[39] = sgl_id::TRANSPORT_DATA_BLOCK;
            }
            Sgl::Keyed { len } => {
                sqe[32..35].copy_from_slice(&len.to_le_bytes()[..3]);
                sqe[39] = 0x40;
            }
            Sgl::Other(id) => sqe[39] = id,
        }
    }
    /// The data length it describes.
    pub fn len(&self) -> u32 {
        match *self {
            Sgl::InCapsule { len, .. } | Sgl::Transport { len } | Sgl::Keyed { len } => len,
            Sgl::Other(_) => 0,
        }
    }
    /// Whether it describes no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Fabrics fields of Identify Controller (offsets 1792..) and CNTRLTYPE.
pub mod ctrl_off {
    /// CNTRLTYPE: 1 I/O controller, 2 discovery controller.
    pub const CNTRLTYPE: usize = 111;
    /// KAS: Keep Alive Support granularity (100 ms units).
    pub const KAS: usize = 320;
    /// IOCCSZ: I/O Queue Command Capsule Supported Size (16-byte units).
    pub const IOCCSZ: usize = 1792;
    /// IORCSZ: I/O Queue Response Capsule Supported Size (16-byte units).
    pub const IORCSZ: usize = 1796;
    /// ICDOFF: In Capsule Data Offset (16-byte units).
    pub const ICDOFF: usize = 1800;
    /// FCATT: Fabrics Controller Attributes (bit 0: static controller model).
    pub const FCATT: usize = 1802;
    /// MSDBD: Maximum SGL Data Block Descriptors.
    pub const MSDBD: usize = 1803;
    /// OFCS: Optional Fabric Commands Support (bit 0: Disconnect).
    pub const OFCS: usize = 1804;
}

/// CNTRLTYPE values.
pub mod cntrltype {
    /// I/O controller.
    pub const IO: u8 = 1;
    /// Discovery controller.
    pub const DISCOVERY: u8 = 2;
}

/// The Discovery log page (Log Identifier 70h).
pub const LID_DISCOVERY: u8 = 0x70;
/// Size of the discovery log page header and of each entry.
pub const DISC_RECORD_LEN: usize = 1024;

/// SUBTYPE of a discovery log entry.
pub mod subtype {
    /// A referral to another discovery service.
    pub const REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVM: u8 = 2;
    /// The discovery subsystem the log was read from.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// One Discovery Log Page Entry (Figure "Discovery Log Page Entry").
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DiscEntry {
    /// TRTYPE (3: TCP).
    pub trtype: u8,
    /// ADRFAM (1: IPv4, 2: IPv6).
    pub adrfam: u8,
    /// SUBTYPE.
    pub subtype: u8,
    /// TREQ.
    pub treq: u8,
    /// PORTID.
    pub portid: u16,
    /// CNTLID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// ASQSZ: the largest admin submission queue.
    pub asqsz: u16,
    /// TRSVCID (the port, as text).
    pub trsvcid: String,
    /// SUBNQN.
    pub subnqn: String,
    /// TRADDR (the address, as text).
    pub traddr: String,
    /// TSAS byte 0 for TCP: SECTYPE (0: none).
    pub sectype: u8,
}

/// TRTYPE of TCP.
pub const TRTYPE_TCP: u8 = 3;
/// ADRFAM of IPv4.
pub const ADRFAM_IPV4: u8 = 1;
/// ADRFAM of IPv6.
pub const ADRFAM_IPV6: u8 = 2;
/// TREQ bit 2: SQ flow control may be disabled.
pub const TREQ_DISABLE_SQFLOW: u8 = 1 << 2;

/// Byte offsets inside a discovery log entry.
pub mod disc_off {
    /// TRTYPE.
    pub const TRTYPE: usize = 0;
    /// ADRFAM.
    pub const ADRFAM: usize = 1;
    /// SUBTYPE.
    pub const SUBTYPE: usize = 2;
    /// TREQ.
    pub const TREQ: usize = 3;
    /// PORTID.
    pub const PORTID: usize = 4;
    /// CNTLID.
    pub const CNTLID: usize = 6;
    /// ASQSZ.
    pub const ASQSZ: usize = 8;
    /// TRSVCID (32 bytes).
    pub const TRSVCID: usize = 32;
    /// SUBNQN (256 bytes).
    pub const SUBNQN: usize = 256;
    /// TRADDR (256 bytes).
    pub const TRADDR: usize = 512;
    /// TSAS (256 bytes).
    pub const TSAS: usize = 768;
}

fn put_padded(b: &mut [u8], s: &str, pad: u8) {
    b.fill(pad);
    let n = s.len().min(b.len());
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

impl DiscEntry {
    /// Encodes the 1024-byte entry. TRSVCID and TRADDR are space padded, SUBNQN NUL padded.
    pub fn encode(&self, b: &mut [u8]) {
        use disc_off as o;
        b[..DISC_RECORD_LEN].fill(0);
        b[o::TRTYPE] = self.trtype;
        b[o::ADRFAM] = self.adrfam;
        b[o::SUBTYPE] = self.subtype;
        b[o::TREQ] = self.treq;
        wr16(b, o::PORTID, self.portid);
        wr16(b, o::CNTLID, self.cntlid);
        wr16(b, o::ASQSZ, self.asqsz);
        put_padded(&mut b[o::TRSVCID..o::TRSVCID + 32], &self.trsvcid, b' ');
        put_padded(&mut b[o::SUBNQN..o::SUBNQN + 256], &self.subnqn, 0);
        put_padded(&mut b[o::TRADDR..o::TRADDR + 256], &self.traddr, b' ');
        b[o::TSAS] = self.sectype;
    }
    /// Decodes an entry (strings trimmed of padding).
    pub fn parse(b: &[u8]) -> Option<Self> {
        use disc_off as o;
        if b.len() < DISC_RECORD_LEN {
            return None;
        }
        let text = |r: &[u8]| {
            String::from_utf8_lossy(r)
                .trim_end_matches(['\0', ' '])
                .to_string()
        };
        Some(DiscEntry {
            trtype: b[o::TRTYPE],
            adrfam: b[o::ADRFAM],
            subtype: b[o::SUBTYPE],
            treq: b[o::TREQ],
            portid: rd16(b, o::PORTID),
            cntlid: rd16(b, o::CNTLID),
            asqsz: rd16(b, o::ASQSZ),
            trsvcid: text(&b[o::TRSVCID..o::TRSVCID + 32]),
            subnqn: text(&b[o::SUBNQN..o::SUBNQN + 256]),
            traddr: text(&b[o::TRADDR..o::TRADDR + 256]),
            sectype: b[o::TSAS],
        })
    }
}

/// Encodes a whole discovery log page: the header (GENCTR at 0, NUMREC at 8, RECFMT at
/// 16) and the entries.
pub fn encode_discovery_log(genctr: u64, entries: &[DiscEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISC_RECORD_LEN * (1 + entries.len())];
    wr64(&mut b, 0, genctr);
    wr64(&mut b, 8, entries.len() as u64);
    wr16(&mut b, 16, 0);
    for (i, e) in entries.iter().enumerate() {
        e.encode(&mut b[DISC_RECORD_LEN * (i + 1)..]);
    }
    b
}

/// Decodes a discovery log page: (GENCTR, entries present in `b`).
pub fn parse_discovery_log(b: &[u8]) -> Option<(u64, u64, Vec<DiscEntry>)> {
    if b.len() < DISC_RECORD_LEN {
        return None;
    }
    let genctr = rd64(b, 0);
    let numrec = rd64(b, 8);
    let entries = b[DISC_RECORD_LEN..]
        .chunks_exact(DISC_RECORD_LEN)
        .take(numrec.min(1 << 16) as usize)
        .filter_map(DiscEntry::parse)
        .collect();
    Some((genctr, numrec, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_round_trip_and_offsets() {
        let c = ConnectCmd {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: CATTR_DISABLE_SQFLOW,
            kato_ms: 5000,
        };
        let s = c.encode(
            9,
            Sgl::InCapsule {
                offset: 0,
                len: 1024,
            },
        );
        assert_eq!(s[0], 0x7f);
        assert_eq!(s[4], fctype::CONNECT);
        assert_eq!(&s[42..44], &[3, 0]);
        assert_eq!(&s[44..46], &[127, 0]);
        assert_eq!(s[46], 4);
        assert_eq!(&s[48..52], &5000u32.to_le_bytes());
        assert_eq!(s[39], 0x01);
        assert_eq!(&s[32..36], &1024u32.to_le_bytes());
        assert_eq!(ConnectCmd::parse(&s), c);
        assert_eq!(
            Sgl::parse(&s),
            Sgl::InCapsule {
                offset: 0,
                len: 1024
            }
        );

        let d = ConnectData {
            hostid: [7; 16],
            cntlid: 0xffff,
            subnqn: "nqn.2026-12.io.kestrel:disk0".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:0000".into(),
        };
        let b = d.encode();
        assert_eq!(b.len(), 1024);
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(&b[512..516], b"nqn.");
        assert_eq!(ConnectData::parse(&b).unwrap(), d);
        let mut bad = b.clone();
        bad[512 + 255] = b'x';
        bad[512..512 + 255].fill(b'x');
        assert_eq!(ConnectData::parse(&bad).unwrap_err().offset, 512);
        assert_eq!(ConnectData::parse(&b[..100]).unwrap_err().offset, 0);
    }

    #[test]
    fn nqn_rules() {
        assert!(valid_nqn("nqn.2014-08.org.nvmexpress.discovery"));
        assert!(!valid_nqn("nqn."));
        assert!(!valid_nqn("iqn.2014-08.x"));
        assert!(!valid_nqn("nqn.2014-08.a b"));
        assert!(!valid_nqn(&format!("nqn.{}", "a".repeat(220))));
        assert_eq!(read_nqn(b"nqn.x\0zzz").as_deref(), Some("nqn.x"));
        assert_eq!(read_nqn(b"nqn.xyz"), None);
    }

    #[test]
    fn sgl_forms() {
        let mut s = [0u8; 64];
        Sgl::Transport { len: 8192 }.encode(&mut s);
        assert_eq!(s[39], 0x5a);
        assert_eq!(Sgl::parse(&s), Sgl::Transport { len: 8192 });
        Sgl::Keyed { len: 4096 }.encode(&mut s);
        assert_eq!(Sgl::parse(&s), Sgl::Keyed { len: 4096 });
        s[39] = 0x20;
        assert_eq!(Sgl::parse(&s), Sgl::Other(0x20));
    }

    #[test]
    fn property_fields() {
        let p = PropertyCmd {
            size8: true,
            ofst: prop::CAP,
            value: 0,
        };
        let s = p.encode(1, false);
        assert_eq!((s[4], s[40]), (fctype::PROPERTY_GET, 1));
        assert_eq!(PropertyCmd::parse(&s).unwrap(), p);
        let mut s = PropertyCmd {
            size8: false,
            ofst: prop::CC,
            value: 0x460001,
        }
        .encode(2, true);
        assert_eq!(&s[44..48], &0x14u32.to_le_bytes());
        assert_eq!(&s[48..56], &0x460001u64.to_le_bytes());
        s[40] = 2;
        assert_eq!(PropertyCmd::parse(&s).unwrap_err().offset, 40);
    }

    #[test]
    fn discovery_log_layout() {
        let e = DiscEntry {
            trtype: TRTYPE_TCP,
            adrfam: ADRFAM_IPV4,
            subtype: subtype::NVM,
            treq: TREQ_DISABLE_SQFLOW,
            portid: 1,
            cntlid: 0xffff,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-12.io.kestrel:a".into(),
            traddr: "127.0.0.1".into(),
            sectype: 0,
        };
        let b = encode_discovery_log(5, &[e.clone(), e.clone()]);
        assert_eq!(b.len(), 3 * 1024);
        assert_eq!(&b[0..8], &5u64.to_le_bytes());
        assert_eq!(&b[8..16], &2u64.to_le_bytes());
        let r = &b[1024..2048];
        assert_eq!(&r[..4], &[3, 1, 2, 4]);
        assert_eq!(&r[4..10], &[1, 0, 0xff, 0xff, 32, 0]);
        assert_eq!(&r[32..37], b"4420 ");
        assert_eq!(&r[512..522], b"127.0.0.1 ");
        assert_eq!(r[256 + 24], 0);
        let (g, n, es) = parse_discovery_log(&b).unwrap();
        assert_eq!((g, n), (5, 2));
        assert_eq!(es, vec![e.clone(), e]);
    }
}
