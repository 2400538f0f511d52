//! NVMe/TCP PDUs (NVM Express TCP Transport Specification 1.0, section 3.6): the common
//! header, every PDU type's header, header and data digests.
//!
//! Byte-level encoding and decoding, no `#[repr(C)]` and no `unsafe`: each header is read
//! and written at the offsets of the specification's figures, which the unit tests assert.
//! Parsers take the bytes they are given and return a [`PduError`] naming the Fatal Error
//! Status and the byte offset of the offending field (the FES and FEI of a TermReq); they
//! never panic.
//!
//! A PDU on the wire is: the header (`HLEN` bytes, beginning with the 8-byte common
//! header), an optional header digest (4 bytes, CRC32C of the header), padding up to the
//! data offset `PDO`, the data, and an optional data digest (CRC32C of the data), `PLEN`
//! bytes in all.

/// Length of the common header (CH).
pub const CH_LEN: usize = 8;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// HLEN (and PLEN) of ICReq and ICResp.
pub const IC_LEN: usize = 128;
/// HLEN of a CapsuleCmd: the CH and a 64-byte submission queue entry.
pub const CAPSULE_CMD_HLEN: usize = 72;
/// HLEN of a CapsuleResp: the CH and a 16-byte completion queue entry.
pub const CAPSULE_RESP_HLEN: usize = 24;
/// HLEN of H2CData and C2HData.
pub const DATA_HLEN: usize = 24;
/// HLEN of R2T.
pub const R2T_HLEN: usize = 24;
/// HLEN of H2CTermReq and C2HTermReq.
pub const TERM_HLEN: usize = 24;
/// The largest PLEN of a TermReq: its header and up to 128 bytes of the PDU header in error.
pub const MAX_TERM_PLEN: usize = 152;
/// The longest header a receiver ever buffers: ICReq/ICResp (digests never follow them).
pub const MAX_HLEN: usize = IC_LEN;
/// The smallest MAXH2CDATA a controller may state.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// PFV 0: the one PDU format version.
pub const PFV_1_0: u16 = 0;

/// PDU-Type values (Figure 19).
pub mod pdu_type {
    /// Initialize Connection Request.
    pub const ICREQ: u8 = 0x00;
    /// Initialize Connection Response.
    pub const ICRESP: u8 = 0x01;
    /// Host to Controller Terminate Connection Request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller to Host Terminate Connection Request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command Capsule.
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response Capsule.
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host to Controller Data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller to Host Data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to Transfer.
    pub const R2T: u8 = 0x09;
}

/// FLAGS bits of the common header.
pub mod flags {
    /// HDGSTF: a header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// DDGSTF: a data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// LAST_PDU (H2CData, C2HData): the last data PDU of the transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// SUCCESS (C2HData): the command completed successfully; no CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// The DGST field of ICReq/ICResp.
pub mod dgst {
    /// HDGST_ENABLE.
    pub const HEADER: u8 = 1 << 0;
    /// DDGST_ENABLE.
    pub const DATA: u8 = 1 << 1;
}

/// Fatal Error Status of a TermReq (Figure 26).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Fes {
    /// 01h: Invalid PDU Header Field (FEI: its byte offset).
    InvalidHeaderField,
    /// 02h: PDU Sequence Error.
    PduSequenceError,
    /// 03h: Header Digest Error.
    HeaderDigestError,
    /// 04h: Data Transfer Out of Range.
    DataOutOfRange,
    /// 05h: Data Transfer Limit Exceeded (R2T Limit Exceeded for a controller).
    DataLimitExceeded,
    /// 06h: Unsupported Parameter (FEI: its byte offset).
    UnsupportedParameter,
}

impl Fes {
    /// The 16-bit FES value.
    pub const fn code(self) -> u16 {
        match self {
            Fes::InvalidHeaderField => 1,
            Fes::PduSequenceError => 2,
            Fes::HeaderDigestError => 3,
            Fes::DataOutOfRange => 4,
            Fes::DataLimitExceeded => 5,
            Fes::UnsupportedParameter => 6,
        }
    }
    /// Decodes a FES value.
    pub const fn from_code(v: u16) -> Option<Self> {
        Some(match v {
            1 => Fes::InvalidHeaderField,
            2 => Fes::PduSequenceError,
            3 => Fes::HeaderDigestError,
            4 => Fes::DataOutOfRange,
            5 => Fes::DataLimitExceeded,
            6 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
    /// The specification's name.
    pub const fn name(self) -> &'static str {
        match self {
            Fes::InvalidHeaderField => "Invalid PDU Header Field",
            Fes::PduSequenceError => "PDU Sequence Error",
            Fes::HeaderDigestError => "Header Digest Error",
            Fes::DataOutOfRange => "Data Transfer Out of Range",
            Fes::DataLimitExceeded => "Data Transfer Limit Exceeded",
            Fes::UnsupportedParameter => "Unsupported Parameter",
        }
    }
}

/// A PDU that cannot be accepted: what a TermReq reports, and why in words.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{} (fes {:#x}) at byte {fei}: {why}", fes.name(), fes.code())]
pub struct PduError {
    /// Fatal Error Status.
    pub fes: Fes,
    /// Fatal Error Information: the byte offset of the field in error, where it has one.
    pub fei: u32,
    /// What is wrong.
    pub why: &'static str,
}

impl PduError {
    const fn field(fei: u32, why: &'static str) -> Self {
        PduError {
            fes: Fes::InvalidHeaderField,
            fei,
            why,
        }
    }
}

/// CRC32C of `data`, as the digests carry it (initial value and final XOR all ones; stored
/// little endian).
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a CRC32C over more data (`crc` is what the previous call returned; start with
/// 0 or with [`crc32c`] of the first piece).
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

fn rd16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn rd32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn wr16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn wr32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// The common header (Figure 20): PDU-Type, FLAGS, HLEN, PDO, PLEN.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CommonHeader {
    /// PDU-Type.
    pub pdu_type: u8,
    /// FLAGS.
    pub flags: u8,
    /// HLEN: header length, digest excluded.
    pub hlen: u8,
    /// PDO: offset of the data from the start of the PDU (0: no data).
    pub pdo: u8,
    /// PLEN: the whole PDU's length.
    pub plen: u32,
}

/// Byte offsets of the common header's fields.
pub mod ch_off {
    /// PDU-Type.
    pub const PDU_TYPE: usize = 0;
    /// FLAGS.
    pub const FLAGS: usize = 1;
    /// HLEN.
    pub const HLEN: usize = 2;
    /// PDO.
    pub const PDO: usize = 3;
    /// PLEN.
    pub const PLEN: usize = 4;
}

impl CommonHeader {
    /// Decodes the first 8 bytes of `b` (`None` when there are fewer).
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < CH_LEN {
            return None;
        }
        Some(CommonHeader {
            pdu_type: b[ch_off::PDU_TYPE],
            flags: b[ch_off::FLAGS],
            hlen: b[ch_off::HLEN],
            pdo: b[ch_off::PDO],
            plen: rd32(b, ch_off::PLEN),
        })
    }
    /// Encodes into the first 8 bytes of `b` (at least 8 bytes long).
    pub fn encode(&self, b: &mut [u8]) {
        b[ch_off::PDU_TYPE] = self.pdu_type;
        b[ch_off::FLAGS] = self.flags;
        b[ch_off::HLEN] = self.hlen;
        b[ch_off::PDO] = self.pdo;
        wr32(b, ch_off::PLEN, self.plen);
    }
    /// Whether the header digest flag is set.
    pub fn hdgst(&self) -> bool {
        self.flags & flags::HDGSTF != 0
    }
    /// Whether the data digest flag is set.
    pub fn ddgst(&self) -> bool {
        self.flags & flags::DDGSTF != 0
    }
}

/// ICReq (Figure 21).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct IcReq {
    /// PFV: PDU format version.
    pub pfv: u16,
    /// HPDA: host PDU data alignment, 0's based dwords (the controller pads C2H data to it).
    pub hpda: u8,
    /// DGST: digests the host asks for ([`dgst`] bits).
    pub dgst: u8,
    /// MAXR2T: R2Ts outstanding per command the host supports, 0's based.
    pub maxr2t: u32,
}

/// ICResp (Figure 22).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct IcResp {
    /// PFV.
    pub pfv: u16,
    /// CPDA: controller PDU data alignment, 0's based dwords.
    pub cpda: u8,
    /// DGST: digests enabled.
    pub dgst: u8,
    /// MAXH2CDATA: the most data one H2CData PDU may carry.
    pub maxh2cdata: u32,
}

/// Byte offsets inside ICReq and ICResp.
pub mod ic_off {
    /// PFV.
    pub const PFV: usize = 8;
    /// HPDA (ICReq) or CPDA (ICResp).
    pub const PDA: usize = 10;
    /// DGST.
    pub const DGST: usize = 11;
    /// MAXR2T (ICReq) or MAXH2CDATA (ICResp).
    pub const MAX: usize = 12;
}

/// H2CTermReq and C2HTermReq (Figures 23 and 24), without the PDU header in error that
/// follows as data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TermReq {
    /// FES: the raw Fatal Error Status.
    pub fes: u16,
    /// FEI: Fatal Error Information.
    pub fei: u32,
}

/// Byte offsets inside a TermReq.
pub mod term_off {
    /// FES.
    pub const FES: usize = 8;
    /// FEI.
    pub const FEI: usize = 10;
}

/// Data PDU header fields: H2CData (Figure 27) and C2HData (Figure 28).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DataHeader {
    /// CCCID: the command's CID.
    pub cccid: u16,
    /// TTAG: the transfer tag of the R2T (H2CData; reserved in C2HData).
    pub ttag: u16,
    /// DATAO: offset of this data in the command's data.
    pub datao: u32,
    /// DATAL: bytes of data in this PDU.
    pub datal: u32,
}

/// R2T (Figure 29).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct R2t {
    /// CCCID: the command's CID.
    pub cccid: u16,
    /// TTAG: chosen by the controller, echoed in the H2CData PDUs.
    pub ttag: u16,
    /// R2TO: offset of the requested data.
    pub r2to: u32,
    /// R2TL: bytes requested.
    pub r2tl: u32,
}

/// Byte offsets inside data PDUs and R2T (same layout).
pub mod data_off {
    /// CCCID.
    pub const CCCID: usize = 8;
    /// TTAG.
    pub const TTAG: usize = 10;
    /// DATAO or R2TO.
    pub const OFFSET: usize = 12;
    /// DATAL or R2TL.
    pub const LENGTH: usize = 16;
}

/// The PDU-specific header of one PDU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pdu {
    /// ICReq.
    IcReq(IcReq),
    /// ICResp.
    IcResp(IcResp),
    /// H2CTermReq.
    H2CTermReq(TermReq),
    /// C2HTermReq.
    C2HTermReq(TermReq),
    /// CapsuleCmd: the submission queue entry.
    CapsuleCmd([u8; 64]),
    /// CapsuleResp: the completion queue entry.
    CapsuleResp([u8; 16]),
    /// H2CData.
    H2CData(DataHeader),
    /// C2HData.
    C2HData(DataHeader),
    /// R2T.
    R2t(R2t),
}

fn expected_hlen(t: u8) -> Option<usize> {
    Some(match t {
        pdu_type::ICREQ | pdu_type::ICRESP => IC_LEN,
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => TERM_HLEN,
        pdu_type::CAPSULE_CMD => CAPSULE_CMD_HLEN,
        pdu_type::CAPSULE_RESP => CAPSULE_RESP_HLEN,
        pdu_type::H2C_DATA | pdu_type::C2H_DATA => DATA_HLEN,
        pdu_type::R2T => R2T_HLEN,
        _ => return None,
    })
}

mod codec;
mod framing;

pub use framing::{check_header_digest, frame, parse, Frame, Parsed, Receiver, Rules};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_the_castagnoli_crc() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        // 32 bytes of 0xff.
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        // Incrementing bytes 0..31.
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46dd_794e);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        let a = crc32c(&inc[..7]);
        assert_eq!(crc32c_append(a, &inc[7..]), 0x46dd_794e);
    }
}
