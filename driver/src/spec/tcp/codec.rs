//! Encoding and decoding of the PDU-specific headers, at the offsets of the specification's
//! figures.

use super::*;

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
        self.write_fields(out);
        if hd != 0 {
            let d = crc32c(&out[..hlen]);
            wr32(out, hlen, d);
        }
        total_hdr
    }

    /// Writes the PDU-specific fields of the header (after the common header).
    fn write_fields(&self, out: &mut [u8]) {
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

#[cfg(test)]
mod tests {
    use super::super::framing::tests::{ctrl_rules, host_rules};
    use super::*;

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
}
