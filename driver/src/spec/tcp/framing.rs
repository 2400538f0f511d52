//! Framing: what a receiver accepts from a common header, and where the parts of a PDU
//! lie (header digest, padding, data, data digest).

use super::*;

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

/// Checks a common header against the rules and works out where the header digest, the
/// padding, the data and the data digest lie.
pub fn frame(ch: &CommonHeader, rules: &Rules) -> Result<Frame, PduError> {
    check_type_and_sequence(ch, rules)?;
    let hlen = expected_hlen(ch.pdu_type).unwrap_or(0);
    if ch.hlen as usize != hlen {
        return Err(PduError::field(
            ch_off::HLEN as u32,
            "hlen is not the length of this pdu type's header",
        ));
    }
    if is_ic(ch.pdu_type) || is_term(ch.pdu_type) {
        return frame_ic_or_term(ch, hlen);
    }
    check_flags(ch, rules)?;
    let hd = if ch.hdgst() { DIGEST_LEN } else { 0 };
    let header_end = hlen + hd;
    let plen = ch.plen as usize;
    if plen < header_end {
        return Err(PduError::field(
            ch_off::PLEN as u32,
            "plen is shorter than the header",
        ));
    }
    if plen == header_end {
        return frame_without_data(ch, header_end);
    }
    frame_with_data(ch, rules, header_end)
}

fn is_ic(t: u8) -> bool {
    matches!(t, pdu_type::ICREQ | pdu_type::ICRESP)
}

fn is_term(t: u8) -> bool {
    matches!(t, pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ)
}

/// A PDU type this end receives, in its place in the connection's life (ICReq/ICResp
/// once, first).
fn check_type_and_sequence(ch: &CommonHeader, rules: &Rules) -> Result<(), PduError> {
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
    let is_ic = is_ic(ch.pdu_type);
    if is_ic == rules.initialized && !is_term(ch.pdu_type) {
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
    Ok(())
}

/// ICReq/ICResp and TermReq: never digests; ICReq/ICResp have no data, TermReq carries
/// the header in error.
fn frame_ic_or_term(ch: &CommonHeader, hlen: usize) -> Result<Frame, PduError> {
    if ch.flags != 0 {
        return Err(PduError::field(
            ch_off::FLAGS as u32,
            "flags must be 0 in connection initialization and termination pdus",
        ));
    }
    let plen = ch.plen as usize;
    let ok = if is_ic(ch.pdu_type) {
        plen == IC_LEN && ch.pdo == 0
    } else {
        (TERM_HLEN..=MAX_TERM_PLEN).contains(&plen) && (ch.pdo == 0 || ch.pdo as usize == TERM_HLEN)
    };
    if !ok {
        return Err(PduError::field(
            ch_off::PLEN as u32,
            "plen or pdo out of range for this pdu type",
        ));
    }
    Ok(Frame {
        ch: *ch,
        header_rest: hlen - CH_LEN,
        hdgst: false,
        pad: 0,
        data_len: plen - hlen,
        ddgst: false,
    })
}

/// The flags of a PDU type that may carry digests: only those it defines, digests as
/// negotiated.
fn check_flags(ch: &CommonHeader, rules: &Rules) -> Result<(), PduError> {
    use pdu_type as t;
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
    Ok(())
}

/// A PDU that ends with its header (and header digest).
fn frame_without_data(ch: &CommonHeader, header_end: usize) -> Result<Frame, PduError> {
    if ch.pdo != 0 || ch.ddgst() {
        return Err(PduError::field(
            ch_off::PDO as u32,
            "pdo or a data digest flag in a pdu without data",
        ));
    }
    if matches!(ch.pdu_type, pdu_type::H2C_DATA | pdu_type::C2H_DATA) {
        return Err(PduError::field(
            ch_off::PLEN as u32,
            "a data pdu without data",
        ));
    }
    Ok(Frame {
        ch: *ch,
        header_rest: header_end - CH_LEN,
        hdgst: ch.hdgst(),
        pad: 0,
        data_len: 0,
        ddgst: false,
    })
}

/// A PDU with data after its header (and header digest): PDO, the data digest and the
/// data length against the rules.
fn frame_with_data(ch: &CommonHeader, rules: &Rules, header_end: usize) -> Result<Frame, PduError> {
    use pdu_type as t;
    if !matches!(ch.pdu_type, t::CAPSULE_CMD | t::H2C_DATA | t::C2H_DATA) {
        return Err(PduError::field(
            ch_off::PLEN as u32,
            "data in a pdu type that carries none",
        ));
    }
    let plen = ch.plen as usize;
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
        hdgst: ch.hdgst(),
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
pub(super) mod tests {
    use super::*;

    pub(in crate::spec::tcp) fn host_rules() -> Rules {
        Rules {
            receiver: Receiver::Host,
            initialized: true,
            hdgst: false,
            ddgst: false,
            max_data: 1 << 20,
        }
    }
    pub(in crate::spec::tcp) fn ctrl_rules(hdgst: bool, ddgst: bool) -> Rules {
        Rules {
            receiver: Receiver::Controller,
            initialized: true,
            hdgst,
            ddgst,
            max_data: 1 << 20,
        }
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
