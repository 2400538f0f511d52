//! The client's wire format, written from the specifications alone (NVM Express TCP
//! Transport Specification 1.0, NVMe over Fabrics 1.1, NVMe Base): every PDU is built and
//! read byte by byte at the offsets those documents give, with a CRC-32C of its own. It
//! shares no code with the target (no `kestrel_nvmf::pdu` or `fabrics`).

/// PDU types (TCP transport, "PDU Type").
pub mod ty {
    pub const ICREQ: u8 = 0x00;
    pub const ICRESP: u8 = 0x01;
    pub const C2H_TERM: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header FLAGS bits.
pub mod fl {
    pub const HDGSTF: u8 = 1 << 0;
    pub const DDGSTF: u8 = 1 << 1;
    /// LAST_PDU of H2CData and C2HData.
    pub const LAST: u8 = 1 << 2;
    /// SUCCESS of C2HData.
    pub const SUCCESS: u8 = 1 << 3;
}

/// Header lengths (HLEN) per PDU type.
pub const IC_HLEN: usize = 128;
pub const CMD_HLEN: usize = 8 + 64;
pub const RESP_HLEN: usize = 8 + 16;
pub const DATA_HLEN: usize = 24;
pub const TERM_HLEN: usize = 24;

/// SGL Identifier byte (byte 15 of the descriptor): type in bits 7:4, subtype in 3:0.
pub mod sgl {
    /// SGL Data Block, subtype Offset: in-capsule data.
    pub const DATA_BLOCK_OFFSET: u8 = 0x01;
    /// SGL Data Block, subtype Address.
    pub const DATA_BLOCK_ADDRESS: u8 = 0x00;
    /// SGL Bit Bucket.
    pub const BIT_BUCKET: u8 = 0x10;
    /// SGL Last Segment, subtype Address.
    pub const LAST_SEGMENT: u8 = 0x30;
    /// Keyed SGL Data Block (RDMA).
    pub const KEYED: u8 = 0x40;
    /// Transport SGL Data Block, Transport specific subtype Ah.
    pub const TRANSPORT: u8 = 0x5A;
}

/// CRC-32C (Castagnoli, reflected, initial and final XOR FFFFFFFFh), bit by bit.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

pub fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
pub fn get16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub fn get32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// The ICReq PDU: PFV 0, HPDA 0, digests asked for, MAXR2T 0 (one R2T outstanding).
pub fn icreq(hdgst: bool, ddgst: bool) -> Vec<u8> {
    let mut b = vec![0u8; IC_HLEN];
    b[0] = ty::ICREQ;
    b[2] = IC_HLEN as u8;
    put32(&mut b, 4, IC_HLEN as u32);
    put16(&mut b, 8, 0); // PFV
    b[10] = 0; // HPDA
    b[11] = hdgst as u8 | ((ddgst as u8) << 1); // DGST
    put32(&mut b, 12, 0); // MAXR2T
    b
}

/// A PDU of a type that may carry digests: `hdr` is its header (HLEN bytes, common header
/// included, PLEN and PDO filled in here), then `data` right after the header (and its
/// digest: CPDA is 0, so no padding).
pub fn framed(mut hdr: Vec<u8>, data: &[u8], hdgst: bool, ddgst: bool) -> Vec<u8> {
    let hlen = hdr.len();
    let hd = if hdgst { 4 } else { 0 };
    let dd = if ddgst && !data.is_empty() { 4 } else { 0 };
    hdr[2] = hlen as u8;
    if hdgst {
        hdr[1] |= fl::HDGSTF;
    }
    if dd > 0 {
        hdr[1] |= fl::DDGSTF;
    }
    hdr[3] = if data.is_empty() {
        0
    } else {
        (hlen + hd) as u8
    };
    put32(&mut hdr, 4, (hlen + hd + data.len() + dd) as u32);
    let mut v = hdr;
    if hdgst {
        let c = crc32c(&v[..hlen]);
        v.extend_from_slice(&c.to_le_bytes());
    }
    v.extend_from_slice(data);
    if dd > 0 {
        v.extend_from_slice(&crc32c(data).to_le_bytes());
    }
    v
}

/// A CapsuleCmd PDU of `sqe` with in-capsule `data`.
pub fn capsule(sqe: &[u8; 64], data: &[u8], hdgst: bool, ddgst: bool) -> Vec<u8> {
    let mut h = vec![0u8; CMD_HLEN];
    h[0] = ty::CAPSULE_CMD;
    h[8..].copy_from_slice(sqe);
    framed(h, data, hdgst, ddgst)
}

/// The header of an H2CData PDU (framed with its data by [`framed`]).
pub fn h2c_data_hdr(cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) -> Vec<u8> {
    let mut h = vec![0u8; DATA_HLEN];
    h[0] = ty::H2C_DATA;
    h[1] = if last { fl::LAST } else { 0 };
    put16(&mut h, 8, cccid);
    put16(&mut h, 10, ttag);
    put32(&mut h, 12, datao);
    put32(&mut h, 16, data.len() as u32);
    h
}

/// Writes SGL1 (SQE bytes 24..40): address, length, identifier byte; PSDT 01b (SGL, as
/// both stock hosts set it).
pub fn set_sgl(sqe: &mut [u8; 64], id: u8, addr: u64, len: u32) {
    sqe[1] = (sqe[1] & 0x3f) | 0x40;
    sqe[24..40].fill(0);
    put64(sqe, 24, addr);
    put32(sqe, 32, len);
    sqe[39] = id;
}

/// An admin or I/O SQE: opcode, NSID, CDW10, CDW11 (the CID is set when sent).
pub fn sqe(opc: u8, nsid: u32, cdw10: u32, cdw11: u32) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = opc;
    put32(&mut s, 4, nsid);
    put32(&mut s, 40, cdw10);
    put32(&mut s, 44, cdw11);
    s
}

/// A Fabrics command SQE (opcode 7Fh, FCTYPE at byte 4).
pub fn fabrics(fctype: u8) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = 0x7f;
    s[4] = fctype;
    s
}

/// FCTYPE values.
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const DISCONNECT: u8 = 0x08;
}

/// Connect: RECFMT 0, QID, SQSIZE (0's based), CATTR, KATO (ms).
/// Connect Attributes bit 2: the host asks for SQ flow control disabled (NVMe over
/// Fabrics, Connect command, CATTR).
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

pub fn connect_sqe(qid: u16, sqsize: u16, cattr: u8, kato: u32) -> [u8; 64] {
    let mut s = fabrics(fctype::CONNECT);
    put16(&mut s, 40, 0);
    put16(&mut s, 42, qid);
    put16(&mut s, 44, sqsize);
    s[46] = cattr;
    put32(&mut s, 48, kato);
    s
}

/// The 1024 bytes of Connect data: HOSTID, CNTLID, SUBNQN, HOSTNQN (as given, NUL padded).
pub fn connect_data(hostid: [u8; 16], cntlid: u16, subnqn: &str, hostnqn: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; 1024];
    d[0..16].copy_from_slice(&hostid);
    put16(&mut d, 16, cntlid);
    d[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
    d[512..512 + hostnqn.len()].copy_from_slice(hostnqn);
    d
}

/// Property Get/Set: ATTRIB (size: 0 four bytes, 1 eight), OFST, VALUE.
pub fn property(fct: u8, ofst: u32, size8: bool, value: u64) -> [u8; 64] {
    let mut s = fabrics(fct);
    s[40] = size8 as u8;
    put32(&mut s, 44, ofst);
    put64(&mut s, 48, value);
    s
}

/// Controller property offsets.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
}

/// A completion queue entry as a response capsule carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub dw0: u32,
    pub dw1: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    /// Status Code Type.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    pub dnr: bool,
}

impl Completion {
    pub fn parse(c: &[u8]) -> Completion {
        let sf = get16(c, 14) >> 1;
        Completion {
            dw0: get32(c, 0),
            dw1: get32(c, 4),
            sqhd: get16(c, 8),
            sqid: get16(c, 10),
            cid: get16(c, 12),
            sc: sf as u8,
            sct: ((sf >> 8) & 7) as u8,
            dnr: sf & (1 << 14) != 0,
        }
    }
    pub fn ok(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }
    /// Whether it is (SCT, SC).
    pub fn is(&self, sct: u8, sc: u8) -> bool {
        self.sct == sct && self.sc == sc
    }
}

/// Generic status codes (SCT 0) used here.
pub mod sc {
    pub const INVALID_FIELD: u8 = 0x02;
    pub const DATA_SGL_LENGTH_INVALID: u8 = 0x0f;
    pub const SGL_DESCRIPTOR_TYPE_INVALID: u8 = 0x11;
    pub const SGL_OFFSET_INVALID: u8 = 0x16;
    pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0c;
    /// Command specific (SCT 1): Connect Invalid Parameters.
    pub const CONNECT_INVALID_PARAMETERS: u8 = 0x82;
    /// Command specific: Asynchronous Event Request Limit Exceeded.
    pub const AER_LIMIT_EXCEEDED: u8 = 0x05;
}

/// Fatal Error Status of a C2HTermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// A PDU received: the common header's fields, the whole header and the data.
#[derive(Debug, Clone)]
pub struct Rx {
    pub ty: u8,
    pub flags: u8,
    pub hdr: Vec<u8>,
    pub data: Vec<u8>,
}

/// Splits a whole PDU (`b`, PLEN bytes) into header and data, checking HLEN, PDO, PLEN
/// and the digests its flags announce. `Err` says what is wrong.
pub fn split(b: &[u8]) -> Result<Rx, String> {
    let (t, flags, hlen, pdo) = (b[0], b[1], b[2] as usize, b[3] as usize);
    let plen = get32(b, 4) as usize;
    if plen != b.len() || hlen > plen || hlen < 8 {
        return Err(format!(
            "type {t:#x}: hlen {hlen}, plen {plen}, {} bytes",
            b.len()
        ));
    }
    let want_hlen = match t {
        ty::ICRESP => IC_HLEN,
        ty::C2H_TERM => TERM_HLEN,
        ty::CAPSULE_RESP => RESP_HLEN,
        ty::C2H_DATA | ty::R2T => DATA_HLEN,
        _ => return Err(format!("a pdu type a host does not receive: {t:#x}")),
    };
    if hlen != want_hlen {
        return Err(format!("type {t:#x}: hlen {hlen}, expected {want_hlen}"));
    }
    let digests = !matches!(t, ty::ICRESP | ty::C2H_TERM);
    let hd = if digests && flags & fl::HDGSTF != 0 {
        4
    } else {
        0
    };
    if hd > 0 && get32(b, hlen) != crc32c(&b[..hlen]) {
        return Err(format!("type {t:#x}: header digest mismatch"));
    }
    let (start, end) = if t == ty::C2H_TERM {
        (hlen, plen)
    } else if pdo == 0 {
        (plen, plen)
    } else {
        let dd = if flags & fl::DDGSTF != 0 { 4 } else { 0 };
        if pdo < hlen + hd || pdo + dd > plen {
            return Err(format!("type {t:#x}: pdo {pdo} outside the pdu"));
        }
        if dd > 0 && get32(b, plen - 4) != crc32c(&b[pdo..plen - 4]) {
            return Err(format!("type {t:#x}: data digest mismatch"));
        }
        (pdo, plen - dd)
    };
    Ok(Rx {
        ty: t,
        flags,
        hdr: b[..hlen].to_vec(),
        data: b[start..end].to_vec(),
    })
}

#[test]
fn crc32c_check_value() {
    // The CRC-32C check value (RFC 3720, appendix B.4).
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
}
