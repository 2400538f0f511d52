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

/// Which end receives: each accepts only the PDU types sent its way.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Receiver {
    /// The controller: ICReq, H2CTermReq, CapsuleCmd, H2CData.
    Controller,
    /// The host: ICResp, C2HTermReq, CapsuleResp, C2HData, R2T.
    Host,
}

/// What a receiver knows when a header arrives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Rules {
    /// Which end is receiving.
    pub receiver: Receiver,
    /// Whether connection initialization (ICReq/ICResp) is done.
    pub initialized: bool,
    /// Header digests enabled.
    pub hdgst: bool,
    /// Data digests enabled.
    pub ddgst: bool,
    /// The most data bytes one PDU may carry.
    pub max_data: u32,
}

/// Where the parts of a PDU lie, from its common header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Frame {
    /// The common header.
    pub ch: CommonHeader,
    /// Header bytes to receive after the common header's 8 (rest of the header and its
    /// digest).
    pub header_rest: usize,
    /// Whether a header digest follows the header.
    pub hdgst: bool,
    /// Padding bytes between the header (and digest) and the data.
    pub pad: usize,
    /// Data bytes.
    pub data_len: usize,
    /// Whether a data digest follows the data.
    pub ddgst: bool,
}

impl Frame {
    /// Bytes of header and header digest.
    pub fn header_len(&self) -> usize {
        CH_LEN + self.header_rest
    }
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

/// Checks a common header against the rules and works out where the header digest, the
/// padding, the data and the data digest lie.
pub fn frame(ch: &CommonHeader, rules: &Rules) -> Result<Frame, PduError> {
    use pdu_type as t;
    let ours = match rules.receiver {
        Receiver::Controller => matches!(
            ch.pdu_type,
            t::ICREQ | t::H2C_TERM_REQ | t::CAPSULE_CMD | t::H2C_DATA
        ),
        Receiver::Host => matches!(
            ch.pdu_type,
            t::ICRESP | t::C2H_TERM_REQ | t::CAPSULE_RESP | t::C2H_DATA | t::R2T
        ),
    };
    if !ours {
        return Err(PduError::field(
            ch_off::PDU_TYPE as u32,
            "a pdu type this end does not receive",
        ));
    }
    let is_ic = matches!(ch.pdu_type, t::ICREQ | t::ICRESP);
    let is_term = matches!(ch.pdu_type, t::H2C_TERM_REQ | t::C2H_TERM_REQ);
    if is_ic == rules.initialized && !is_term {
        return Err(PduError {
            fes: Fes::PduSequenceError,
            fei: 0,
            why: if is_ic {
                "a second connection initialization pdu"
            } else {
                "a pdu before connection initialization"
            },
        });
    }
    let hlen = expected_hlen(ch.pdu_type).unwrap_or(0);
    if ch.hlen as usize != hlen {
        return Err(PduError::field(
            ch_off::HLEN as u32,
            "hlen is not the length of this pdu type's header",
        ));
    }
    let plen = ch.plen as usize;
    if is_ic || is_term {
        // Never digests; ICReq/ICResp have no data, TermReq carries the header in error.
        if ch.flags != 0 {
            return Err(PduError::field(
                ch_off::FLAGS as u32,
                "flags must be 0 in connection initialization and termination pdus",
            ));
        }
        let ok = if is_ic {
            plen == IC_LEN && ch.pdo == 0
        } else {
            (TERM_HLEN..=MAX_TERM_PLEN).contains(&plen)
                && (ch.pdo == 0 || ch.pdo as usize == TERM_HLEN)
        };
        if !ok {
            return Err(PduError::field(
                ch_off::PLEN as u32,
                "plen or pdo out of range for this pdu type",
            ));
        }
        return Ok(Frame {
            ch: *ch,
            header_rest: hlen - CH_LEN,
            hdgst: false,
            pad: 0,
            data_len: plen - hlen,
            ddgst: false,
        });
    }
    let data_pdu = matches!(ch.pdu_type, t::H2C_DATA | t::C2H_DATA);
    let known = flags::HDGSTF
        | flags::DDGSTF
        | if data_pdu { flags::LAST_PDU } else { 0 }
        | if ch.pdu_type == t::C2H_DATA {
            flags::SUCCESS
        } else {
            0
        };
    if ch.flags & !known != 0 {
        return Err(PduError::field(
            ch_off::FLAGS as u32,
            "a flag this pdu type does not define",
        ));
    }
    if ch.hdgst() != rules.hdgst {
        return Err(PduError::field(
            ch_off::FLAGS as u32,
            "the header digest flag does not match what was negotiated",
        ));
    }
    if ch.ddgst() && !rules.ddgst {
        return Err(PduError::field(
            ch_off::FLAGS as u32,
            "a data digest that was not negotiated",
        ));
    }
    let hd = if ch.hdgst() { DIGEST_LEN } else { 0 };
    let header_end = hlen + hd;
    if plen < header_end {
        return Err(PduError::field(
            ch_off::PLEN as u32,
            "plen is shorter than the header",
        ));
    }
    if plen == header_end {
        if ch.pdo != 0 || ch.ddgst() {
            return Err(PduError::field(
                ch_off::PDO as u32,
                "pdo or a data digest flag in a pdu without data",
            ));
        }
        if data_pdu {
            return Err(PduError::field(
                ch_off::PLEN as u32,
                "a data pdu without data",
            ));
        }
        return Ok(Frame {
            ch: *ch,
            header_rest: header_end - CH_LEN,
            hdgst: hd != 0,
            pad: 0,
            data_len: 0,
            ddgst: false,
        });
    }
    if !matches!(ch.pdu_type, t::CAPSULE_CMD | t::H2C_DATA | t::C2H_DATA) {
        return Err(PduError::field(
            ch_off::PLEN as u32,
            "data in a pdu type that carries none",
        ));
    }
    let pdo = ch.pdo as usize;
    if pdo < header_end || pdo % 4 != 0 || pdo >= plen {
        return Err(PduError::field(
            ch_off::PDO as u32,
            "pdo is not a dword-aligned offset between the header and the end of the pdu",
        ));
    }
    if rules.ddgst != ch.ddgst() {
        return Err(PduError::field(
            ch_off::FLAGS as u32,
            "the data digest flag does not match what was negotiated",
        ));
    }
    let dd = if ch.ddgst() { DIGEST_LEN } else { 0 };
    if plen < pdo + dd + 1 {
        return Err(PduError::field(
            ch_off::PLEN as u32,
            "plen leaves no room for the data and its digest",
        ));
    }
    let data_len = plen - pdo - dd;
    if data_len > rules.max_data as usize {
        return Err(PduError {
            fes: Fes::DataLimitExceeded,
            fei: ch_off::PLEN as u32,
            why: "the pdu carries more data than allowed",
        });
    }
    Ok(Frame {
        ch: *ch,
        header_rest: header_end - CH_LEN,
        hdgst: hd != 0,
        pad: pdo - header_end,
        data_len,
        ddgst: dd != 0,
    })
}

/// Checks the header digest of a received header: `hdr` holds the header and its digest.
pub fn check_header_digest(hdr: &[u8], hlen: usize) -> Result<(), PduError> {
    if hdr.len() < hlen + DIGEST_LEN {
        return Err(PduError::field(
            ch_off::HLEN as u32,
            "no room for the header digest",
        ));
    }
    if crc32c(&hdr[..hlen]) != rd32(hdr, hlen) {
        return Err(PduError {
            fes: Fes::HeaderDigestError,
            fei: 0,
            why: "the header digest does not match the header",
        });
    }
    Ok(())
}

impl Pdu {
    /// Decodes the PDU-specific header from `hdr` (the `HLEN` bytes of the header, common
    /// header included), whose common header [`frame`] accepted.
    pub fn decode(hdr: &[u8]) -> Result<Pdu, PduError> {
        let ch = CommonHeader::parse(hdr).ok_or(PduError::field(0, "a truncated header"))?;
        let need = expected_hlen(ch.pdu_type).ok_or(PduError::field(0, "an unknown pdu type"))?;
        if hdr.len() < need {
            return Err(PduError::field(ch_off::HLEN as u32, "a truncated header"));
        }
        use pdu_type as t;
        Ok(match ch.pdu_type {
            t::ICREQ | t::ICRESP => {
                let pfv = rd16(hdr, ic_off::PFV);
                if pfv != PFV_1_0 {
                    return Err(PduError {
                        fes: Fes::UnsupportedParameter,
                        fei: ic_off::PFV as u32,
                        why: "a pdu format version other than 0",
                    });
                }
                if ch.pdu_type == t::ICREQ {
                    let hpda = hdr[ic_off::PDA];
                    if hpda > 31 {
                        return Err(PduError::field(ic_off::PDA as u32, "hpda above 31"));
                    }
                    Pdu::IcReq(IcReq {
                        pfv,
                        hpda,
                        dgst: hdr[ic_off::DGST],
                        maxr2t: rd32(hdr, ic_off::MAX),
                    })
                } else {
                    Pdu::IcResp(IcResp {
                        pfv,
                        cpda: hdr[ic_off::PDA],
                        dgst: hdr[ic_off::DGST],
                        maxh2cdata: rd32(hdr, ic_off::MAX),
                    })
                }
            }
            t::H2C_TERM_REQ | t::C2H_TERM_REQ => {
                let tr = TermReq {
                    fes: rd16(hdr, term_off::FES),
                    fei: rd32(hdr, term_off::FEI),
                };
                if ch.pdu_type == t::H2C_TERM_REQ {
                    Pdu::H2CTermReq(tr)
                } else {
                    Pdu::C2HTermReq(tr)
                }
            }
            t::CAPSULE_CMD => {
                let mut sqe = [0u8; 64];
                sqe.copy_from_slice(&hdr[CH_LEN..CH_LEN + 64]);
                Pdu::CapsuleCmd(sqe)
            }
            t::CAPSULE_RESP => {
                let mut cqe = [0u8; 16];
                cqe.copy_from_slice(&hdr[CH_LEN..CH_LEN + 16]);
                Pdu::CapsuleResp(cqe)
            }
            t::H2C_DATA | t::C2H_DATA => {
                let d = DataHeader {
                    cccid: rd16(hdr, data_off::CCCID),
                    ttag: rd16(hdr, data_off::TTAG),
                    datao: rd32(hdr, data_off::OFFSET),
                    datal: rd32(hdr, data_off::LENGTH),
                };
                if ch.pdu_type == t::H2C_DATA {
                    Pdu::H2CData(d)
                } else {
                    Pdu::C2HData(d)
                }
            }
            t::R2T => Pdu::R2t(R2t {
                cccid: rd16(hdr, data_off::CCCID),
                ttag: rd16(hdr, data_off::TTAG),
                r2to: rd32(hdr, data_off::OFFSET),
                r2tl: rd32(hdr, data_off::LENGTH),
            }),
            _ => return Err(PduError::field(0, "an unknown pdu type")),
        })
    }

    /// The PDU-Type.
    pub fn pdu_type(&self) -> u8 {
        use pdu_type as t;
        match self {
            Pdu::IcReq(_) => t::ICREQ,
            Pdu::IcResp(_) => t::ICRESP,
            Pdu::H2CTermReq(_) => t::H2C_TERM_REQ,
            Pdu::C2HTermReq(_) => t::C2H_TERM_REQ,
            Pdu::CapsuleCmd(_) => t::CAPSULE_CMD,
            Pdu::CapsuleResp(_) => t::CAPSULE_RESP,
            Pdu::H2CData(_) => t::H2C_DATA,
            Pdu::C2HData(_) => t::C2H_DATA,
            Pdu::R2t(_) => t::R2T,
        }
    }

    /// HLEN of this PDU type.
    pub fn hlen(&self) -> usize {
        expected_hlen(self.pdu_type()).unwrap_or(0)
    }

    /// Writes the header of this PDU into `out` and returns the bytes written: the header,
    /// then its digest when `hdgst` (never for ICReq/ICResp/TermReq), then zero padding up
    /// to a data offset aligned to `(pda + 1) * 4` bytes when `data_len` is not 0. The
    /// common header's FLAGS get HDGSTF/DDGSTF as asked plus `extra_flags`; PDO and PLEN
    /// are computed. `out` must hold [`Pdu::encoded_len`] bytes.
    pub fn encode(
        &self,
        out: &mut [u8],
        hdgst: bool,
        ddgst: bool,
        extra_flags: u8,
        data_len: u32,
        pda: u8,
    ) -> usize {
        let hlen = self.hlen();
        let digests_allowed = !matches!(
            self,
            Pdu::IcReq(_) | Pdu::IcResp(_) | Pdu::H2CTermReq(_) | Pdu::C2HTermReq(_)
        );
        let hd = if hdgst && digests_allowed {
            DIGEST_LEN
        } else {
            0
        };
        let dd = if ddgst && digests_allowed && data_len > 0 {
            DIGEST_LEN
        } else {
            0
        };
        let header_end = hlen + hd;
        let pdo = if data_len > 0 {
            if digests_allowed {
                header_end.next_multiple_of((pda as usize + 1) * 4)
            } else {
                header_end
            }
        } else {
            0
        };
        let total_hdr = if data_len > 0 { pdo } else { header_end };
        out[..total_hdr].fill(0);
        let mut fl = extra_flags;
        if hd != 0 {
            fl |= flags::HDGSTF;
        }
        if dd != 0 {
            fl |= flags::DDGSTF;
        }
        let plen = total_hdr + data_len as usize + dd;
        CommonHeader {
            pdu_type: self.pdu_type(),
            flags: fl,
            hlen: hlen as u8,
            pdo: pdo as u8,
            plen: plen as u32,
        }
        .encode(out);
        match self {
            Pdu::IcReq(r) => {
                wr16(out, ic_off::PFV, r.pfv);
                out[ic_off::PDA] = r.hpda;
                out[ic_off::DGST] = r.dgst;
                wr32(out, ic_off::MAX, r.maxr2t);
            }
            Pdu::IcResp(r) => {
                wr16(out, ic_off::PFV, r.pfv);
                out[ic_off::PDA] = r.cpda;
                out[ic_off::DGST] = r.dgst;
                wr32(out, ic_off::MAX, r.maxh2cdata);
            }
            Pdu::H2CTermReq(r) | Pdu::C2HTermReq(r) => {
                wr16(out, term_off::FES, r.fes);
                wr32(out, term_off::FEI, r.fei);
            }
            Pdu::CapsuleCmd(sqe) => out[CH_LEN..CH_LEN + 64].copy_from_slice(sqe),
            Pdu::CapsuleResp(cqe) => out[CH_LEN..CH_LEN + 16].copy_from_slice(cqe),
            Pdu::H2CData(d) | Pdu::C2HData(d) => {
                wr16(out, data_off::CCCID, d.cccid);
                wr16(out, data_off::TTAG, d.ttag);
                wr32(out, data_off::OFFSET, d.datao);
                wr32(out, data_off::LENGTH, d.datal);
            }
            Pdu::R2t(r) => {
                wr16(out, data_off::CCCID, r.cccid);
                wr16(out, data_off::TTAG, r.ttag);
                wr32(out, data_off::OFFSET, r.r2to);
                wr32(out, data_off::LENGTH, r.r2tl);
            }
        }
        if hd != 0 {
            let d = crc32c(&out[..hlen]);
            wr32(out, hlen, d);
        }
        total_hdr
    }

    /// Bytes [`Pdu::encode`] writes for these parameters.
    pub fn encoded_len(&self, hdgst: bool, data_len: u32, pda: u8) -> usize {
        let hlen = self.hlen();
        let digests_allowed = !matches!(
            self,
            Pdu::IcReq(_) | Pdu::IcResp(_) | Pdu::H2CTermReq(_) | Pdu::C2HTermReq(_)
        );
        let header_end = hlen
            + if hdgst && digests_allowed {
                DIGEST_LEN
            } else {
                0
            };
        if data_len > 0 && digests_allowed {
            header_end.next_multiple_of((pda as usize + 1) * 4)
        } else {
            header_end
        }
    }
}

/// A whole PDU parsed from one buffer: what a fuzzer or a test feeds in.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Parsed<'a> {
    /// The PDU-specific header.
    pub pdu: Pdu,
    /// Where its parts lie.
    pub frame: Frame,
    /// The data.
    pub data: &'a [u8],
    /// Whether the data digest matched (true when there is none).
    pub data_digest_ok: bool,
}

/// Parses one PDU at the start of `buf`: the common header, the header (and its digest),
/// the data and its digest. Returns the PDU and the bytes it took, `Ok(None)` when `buf`
/// holds only part of it.
pub fn parse<'a>(buf: &'a [u8], rules: &Rules) -> Result<Option<(Parsed<'a>, usize)>, PduError> {
    let Some(ch) = CommonHeader::parse(buf) else {
        return Ok(None);
    };
    let fr = frame(&ch, rules)?;
    let plen = ch.plen as usize;
    if buf.len() < fr.header_len() {
        return Ok(None);
    }
    let hlen = ch.hlen as usize;
    if fr.hdgst {
        check_header_digest(&buf[..fr.header_len()], hlen)?;
    }
    let pdu = Pdu::decode(&buf[..hlen])?;
    if buf.len() < plen {
        return Ok(None);
    }
    let start = fr.header_len() + fr.pad;
    let data = &buf[start..start + fr.data_len];
    let data_digest_ok = !fr.ddgst || crc32c(data) == rd32(buf, start + fr.data_len);
    Ok(Some((
        Parsed {
            pdu,
            frame: fr,
            data,
            data_digest_ok,
        },
        plen,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_rules() -> Rules {
        Rules {
            receiver: Receiver::Host,
            initialized: true,
            hdgst: false,
            ddgst: false,
            max_data: 1 << 20,
        }
    }
    fn ctrl_rules(hdgst: bool, ddgst: bool) -> Rules {
        Rules {
            receiver: Receiver::Controller,
            initialized: true,
            hdgst,
            ddgst,
            max_data: 1 << 20,
        }
    }

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

    #[test]
    fn icreq_layout() {
        // Figure 21: PFV at 8 (2 bytes), HPDA at 10, DGST at 11, MAXR2T at 12 (4 bytes),
        // reserved to 127.
        let mut b = [0u8; 128];
        let p = Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 3,
            dgst: dgst::HEADER | dgst::DATA,
            maxr2t: 0x0102_0304,
        });
        assert_eq!(p.encode(&mut b, true, true, 0, 0, 0), 128);
        assert_eq!(&b[..8], &[0x00, 0x00, 128, 0, 128, 0, 0, 0]);
        assert_eq!(&b[8..16], &[0, 0, 3, 3, 4, 3, 2, 1]);
        assert!(b[16..].iter().all(|&x| x == 0));
        let rules = Rules {
            receiver: Receiver::Controller,
            initialized: false,
            hdgst: false,
            ddgst: false,
            max_data: 0,
        };
        let (got, n) = parse(&b, &rules).unwrap().unwrap();
        assert_eq!(n, 128);
        assert_eq!(got.pdu, p);
    }

    #[test]
    fn icresp_layout() {
        let mut b = [0u8; 128];
        let p = Pdu::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            dgst: dgst::DATA,
            maxh2cdata: 0x20000,
        });
        assert_eq!(p.encode(&mut b, false, false, 0, 0, 0), 128);
        assert_eq!(&b[..8], &[0x01, 0x00, 128, 0, 128, 0, 0, 0]);
        assert_eq!(&b[8..16], &[0, 0, 0, 2, 0, 0, 2, 0]);
        let rules = Rules {
            initialized: false,
            ..host_rules()
        };
        assert_eq!(parse(&b, &rules).unwrap().unwrap().0.pdu, p);
    }

    #[test]
    fn capsule_cmd_layout_with_in_capsule_data_and_digests() {
        let mut sqe = [0u8; 64];
        for (i, b) in sqe.iter_mut().enumerate() {
            *b = i as u8;
        }
        let data = [0xabu8; 100];
        let p = Pdu::CapsuleCmd(sqe);
        let mut b = vec![0u8; 256];
        let n = p.encode(&mut b, true, true, 0, data.len() as u32, 0);
        // HLEN 72, header digest at 72..76, PDO 76, data, data digest.
        assert_eq!(n, 76);
        assert_eq!(b[0], pdu_type::CAPSULE_CMD);
        assert_eq!(b[1], flags::HDGSTF | flags::DDGSTF);
        assert_eq!(b[2], 72);
        assert_eq!(b[3], 76);
        assert_eq!(rd32(&b, 4), 76 + 100 + 4);
        assert_eq!(&b[8..72], &sqe[..]);
        assert_eq!(rd32(&b, 72), crc32c(&b[..72]));
        b.truncate(n);
        b.extend_from_slice(&data);
        b.extend_from_slice(&crc32c(&data).to_le_bytes());
        let (got, used) = parse(&b, &ctrl_rules(true, true)).unwrap().unwrap();
        assert_eq!(used, b.len());
        assert_eq!(got.pdu, p);
        assert_eq!(got.data, &data[..]);
        assert!(got.data_digest_ok);
        assert_eq!(got.frame.header_rest, 68);
        // A flipped header bit fails the header digest.
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert_eq!(
            parse(&bad, &ctrl_rules(true, true)).unwrap_err().fes,
            Fes::HeaderDigestError
        );
        // A flipped data bit fails only the data digest.
        let mut bad = b.clone();
        bad[80] ^= 1;
        assert!(
            !parse(&bad, &ctrl_rules(true, true))
                .unwrap()
                .unwrap()
                .0
                .data_digest_ok
        );
    }

    #[test]
    fn capsule_cmd_without_data_has_pdo_zero() {
        let p = Pdu::CapsuleCmd([7u8; 64]);
        let mut b = [0u8; 80];
        assert_eq!(p.encode(&mut b, false, false, 0, 0, 0), 72);
        assert_eq!(&b[..8], &[4, 0, 72, 0, 72, 0, 0, 0]);
        let (got, n) = parse(&b[..72], &ctrl_rules(false, true)).unwrap().unwrap();
        assert_eq!((got.pdu, n, got.data.len()), (p, 72, 0));
    }

    #[test]
    fn capsule_resp_layout() {
        let cqe: [u8; 16] = core::array::from_fn(|i| 0x10 + i as u8);
        let p = Pdu::CapsuleResp(cqe);
        let mut b = [0u8; 28];
        assert_eq!(p.encode(&mut b, true, false, 0, 0, 0), 28);
        assert_eq!(&b[..8], &[5, 1, 24, 0, 28, 0, 0, 0]);
        assert_eq!(&b[8..24], &cqe);
        let rules = Rules {
            hdgst: true,
            ..host_rules()
        };
        assert_eq!(parse(&b, &rules).unwrap().unwrap().0.pdu, p);
    }

    #[test]
    fn data_and_r2t_layouts() {
        // Figures 27-29: CCCID at 8, TTAG at 10, DATAO/R2TO at 12, DATAL/R2TL at 16,
        // reserved 20..24.
        let d = DataHeader {
            cccid: 0x1122,
            ttag: 0x3344,
            datao: 0x5566_7788,
            datal: 8,
        };
        let mut b = [0u8; 64];
        let n =
            Pdu::C2HData(d).encode(&mut b, false, false, flags::LAST_PDU | flags::SUCCESS, 8, 0);
        assert_eq!(n, 24);
        assert_eq!(
            &b[..24],
            &[
                7, 0x0c, 24, 24, 32, 0, 0, 0, 0x22, 0x11, 0x44, 0x33, 0x88, 0x77, 0x66, 0x55, 8, 0,
                0, 0, 0, 0, 0, 0
            ]
        );
        let r = R2t {
            cccid: 1,
            ttag: 2,
            r2to: 3,
            r2tl: 4,
        };
        let n = Pdu::R2t(r).encode(&mut b, false, false, 0, 0, 0);
        assert_eq!(n, 24);
        assert_eq!(
            &b[..24],
            &[9, 0, 24, 0, 24, 0, 0, 0, 1, 0, 2, 0, 3, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            parse(&b[..24], &host_rules()).unwrap().unwrap().0.pdu,
            Pdu::R2t(r)
        );
        // H2CData with a host PDU data alignment of 8 dwords: the header digest ends at
        // 28, data starts at 32.
        let h = Pdu::H2CData(d);
        let n = h.encode(&mut b, true, false, flags::LAST_PDU, 8, 7);
        assert_eq!(n, 32);
        assert_eq!(b[3], 32);
        assert!(b[28..32].iter().all(|&x| x == 0));
    }

    #[test]
    fn term_req_layout() {
        let t = TermReq {
            fes: 2,
            fei: 0x0a0b_0c0d,
        };
        let mut b = [0u8; 24];
        assert_eq!(Pdu::C2HTermReq(t).encode(&mut b, true, true, 0, 0, 0), 24);
        assert_eq!(
            &b[..16],
            &[3, 0, 24, 0, 24, 0, 0, 0, 2, 0, 0x0d, 0x0c, 0x0b, 0x0a, 0, 0]
        );
        let mut with_hdr = b.to_vec();
        with_hdr[4] = 24 + 8;
        with_hdr.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let (got, n) = parse(&with_hdr, &host_rules()).unwrap().unwrap();
        assert_eq!((got.pdu, n, got.data.len()), (Pdu::C2HTermReq(t), 32, 8));
    }

    #[test]
    fn refuses_bad_headers_with_fes_and_fei() {
        let r = ctrl_rules(false, false);
        let cases: &[(&[u8], Fes, u32)] = &[
            // A host-bound type sent to the controller.
            (&[5, 0, 24, 0, 24, 0, 0, 0], Fes::InvalidHeaderField, 0),
            // Unknown type.
            (&[8, 0, 24, 0, 24, 0, 0, 0], Fes::InvalidHeaderField, 0),
            // Wrong HLEN for a capsule.
            (&[4, 0, 70, 0, 70, 0, 0, 0], Fes::InvalidHeaderField, 2),
            // Header digest flag not negotiated.
            (&[4, 1, 72, 0, 76, 0, 0, 0], Fes::InvalidHeaderField, 1),
            // PLEN shorter than the header.
            (&[4, 0, 72, 0, 60, 0, 0, 0], Fes::InvalidHeaderField, 4),
            // PDO inside the header.
            (&[4, 0, 72, 8, 100, 0, 0, 0], Fes::InvalidHeaderField, 3),
            // Data without PDO.
            (&[4, 0, 72, 0, 100, 0, 0, 0], Fes::InvalidHeaderField, 3),
            // An ICReq after initialization.
            (&[0, 0, 128, 0, 128, 0, 0, 0], Fes::PduSequenceError, 0),
            // H2CData without data.
            (&[6, 4, 24, 0, 24, 0, 0, 0], Fes::InvalidHeaderField, 4),
            // More data than allowed.
            (&[6, 4, 24, 24, 0, 0, 0, 1], Fes::DataLimitExceeded, 4),
        ];
        for (bytes, fes, fei) in cases {
            let e = parse(bytes, &r).unwrap_err();
            assert_eq!((e.fes, e.fei), (*fes, *fei), "{bytes:?}: {e}");
        }
        // A capsule before ICReq.
        let e = parse(
            &[4, 0, 72, 0, 72, 0, 0, 0],
            &Rules {
                initialized: false,
                ..r
            },
        )
        .unwrap_err();
        assert_eq!(e.fes, Fes::PduSequenceError);
        // PFV 1.
        let mut icreq = [0u8; 128];
        Pdu::IcReq(IcReq::default()).encode(&mut icreq, false, false, 0, 0, 0);
        icreq[8] = 1;
        let e = parse(
            &icreq,
            &Rules {
                initialized: false,
                ..r
            },
        )
        .unwrap_err();
        assert_eq!((e.fes, e.fei), (Fes::UnsupportedParameter, 8));
    }

    #[test]
    fn partial_input_asks_for_more() {
        let mut b = [0u8; 72];
        Pdu::CapsuleCmd([0; 64]).encode(&mut b, false, false, 0, 0, 0);
        for n in 0..72 {
            assert_eq!(
                parse(&b[..n], &ctrl_rules(false, false)).unwrap(),
                None,
                "{n}"
            );
        }
    }
}
