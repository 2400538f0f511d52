//! The format rule: the driver sends no I/O to a namespace whose format it does not
//! implement (32- and 64-bit guards, other command sets). Such a namespace is listed with
//! its format and the reason, opening it is an error naming the format, and every
//! submission path refuses it before the device — the emulator's command counters prove
//! nothing reached it. And the formats it implements beyond plain blocks do I/O: metadata
//! separate or extended, with or without PI, the caller's PI checked by the controller,
//! and 8-byte PI inserted and checked by the controller when the caller gives none.

mod common;

use common::*;
use kestrel::emu::{EmuConfig, EmuFormat, EmuNamespace, EmuStore};
use kestrel::io::{InvalidRequest, IoMeta, IoRequest};
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::spec::{csi, Sqe};
use kestrel::{NvmeNamespace, QpairOptions, SubmitError};

/// The formats a real SSD can ship with that the driver does not implement, with words
/// the refusal must contain.
fn unsupported() -> Vec<(EmuFormat, u32, &'static [&'static str])> {
    let f = |ms, extended, pi_type, pi_first, csi| EmuFormat {
        ms,
        extended,
        pi_type,
        pi_first,
        csi,
        ..Default::default()
    };
    vec![
        (
            EmuFormat {
                pif: 2,
                ..f(16, false, 1, false, csi::NVM)
            },
            4096,
            &[
                "lba format 2",
                "ms 16 B in a separate buffer",
                "type 1 in the last",
                "64-bit guard (pif 2)",
            ],
        ),
        (
            EmuFormat {
                pif: 2,
                ..f(16, true, 3, true, csi::NVM)
            },
            512,
            &["extended lba", "type 3 in the first", "64-bit guard"],
        ),
        (
            EmuFormat {
                pif: 1,
                ..f(64, false, 2, false, csi::NVM)
            },
            4096,
            &["dps 0x02", "32-bit guard (pif 1)"],
        ),
        (
            f(8, false, 1, false, csi::ZONED),
            4096,
            &["a zoned namespace with metadata (ms 8, dps 0x01)"],
        ),
        (
            f(0, false, 0, false, csi::KEY_VALUE),
            4096,
            &["Key Value Command Set"],
        ),
        (
            f(0, false, 0, false, 0x07),
            4096,
            &["unknown command set (csi 0x07)"],
        ),
    ]
}

fn io_commands(emu: &kestrel::emu::EmuController) -> u64 {
    let s = emu.stats();
    s.reads + s.writes + s.flushes + s.write_zeroes + s.dsm + s.io_invalid
}

#[test]
fn unsupported_formats_are_listed_refused_and_never_reach_the_device() {
    for (format, lba, words) in unsupported() {
        let (emu, c) = emu_with(EmuConfig {
            namespaces: vec![
                EmuNamespace::new(16 << 20, 4096, EmuStore::Memory),
                EmuNamespace {
                    format,
                    ..EmuNamespace::new(16 << 20, lba, EmuStore::Memory)
                },
            ],
            ..Default::default()
        });
        // Listed, with its format and the reason.
        let all = c.namespaces();
        assert_eq!(all.iter().map(|n| n.nsid).collect::<Vec<_>>(), [1, 2]);
        assert!(all[0].supported());
        let why = all[1]
            .unsupported
            .as_ref()
            .expect("nsid 2 refused")
            .to_string();
        for w in words
            .iter()
            .chain(&["nsid 2", "is not supported", "docs/formats.md"])
        {
            assert!(why.contains(w), "{format:?}: {why:?} lacks {w:?}");
        }
        assert_eq!(c.io_namespaces().map(|n| n.nsid).collect::<Vec<_>>(), [1]);

        // Opening it is an error that names the format.
        match NvmeNamespace::new(c.clone(), 2) {
            Err(e @ CtrlrError::UnsupportedFormat { .. }) => {
                let m = e.to_string();
                assert!(m.contains("nsid 2") && m.contains("flbas"), "{m}");
            }
            Err(e) => panic!("{format:?}: wrong error {e}"),
            Ok(_) => panic!("{format:?}: nsid 2 opened for i/o"),
        }

        // Every submission path refuses it before the device.
        let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
        let buf = c.dma_pool().alloc(8192).unwrap();
        let md = IoMeta::separate(buf.slice(4096, 256).unwrap());
        let reqs = [
            IoRequest::read(2, 0, 1, buf.slice(0, lba as usize).unwrap(), 1),
            IoRequest::write(2, 0, 1, buf.slice(0, lba as usize).unwrap(), 2),
            IoRequest::write(2, 0, 1, buf.slice(0, lba as usize).unwrap(), 2).with_meta(md),
            IoRequest::read(2, 0, 1, buf.slice(0, 4096).unwrap(), 2).with_meta(IoMeta::extended()),
            IoRequest::flush(2, 3),
            IoRequest::write_zeroes(2, 0, 1, 4),
            IoRequest::deallocate(2, 0, 1, 5),
        ];
        for r in reqs {
            let got = qp.submit(r);
            assert!(
                matches!(
                    got,
                    Err(SubmitError::Invalid {
                        reason: InvalidRequest::UnsupportedFormat { nsid: 2 },
                        ..
                    })
                ),
                "{format:?}: {got:?}"
            );
        }
        let raw = qp.submit_raw(
            Sqe::read(2, 0, 1, 0, 0),
            Some(buf.slice(0, 4096).unwrap()),
            6,
        );
        assert!(
            matches!(
                raw,
                Err(SubmitError::Invalid {
                    reason: InvalidRequest::UnsupportedFormat { nsid: 2 },
                    ..
                })
            ),
            "{format:?}: {raw:?}"
        );
        qp.flush();
        assert_quiet(&mut qp);
        assert_eq!(io_commands(&emu), 0, "{format:?}: i/o reached the device");

        // The namespace the driver implements works beside it.
        qp.submit(IoRequest::write(1, 0, 1, buf.slice(0, 4096).unwrap(), 7))
            .unwrap();
        let done = reap(&mut qp, 1);
        assert!(done[0].result.is_ok(), "{done:?}");
        assert_eq!(emu.stats().writes, 1);
    }
}

#[test]
fn a_controller_whose_only_namespace_is_refused_still_comes_up_for_identify() {
    let (emu, c) = emu_with(EmuConfig {
        namespaces: vec![EmuNamespace {
            format: EmuFormat {
                ms: 16,
                pi_type: 1,
                pif: 2,
                ..Default::default()
            },
            ..EmuNamespace::new(16 << 20, 4096, EmuStore::Memory)
        }],
        ..Default::default()
    });
    assert_eq!(c.namespaces().len(), 1);
    assert_eq!(c.io_namespaces().count(), 0);
    assert!(NvmeNamespace::new(c.clone(), 1).is_err());
    assert_eq!(io_commands(&emu), 0);
}

/// Namespaces whose metadata is exactly the 8-byte PI, of every type, separate or extended,
/// PI first or last, 512 B and 4 KiB blocks: the driver does I/O with PRACT, so only data
/// crosses the wire, the controller generates the PI on writes and checks it on reads, and
/// a PI the medium corrupted fails the read with the End-to-end status, never with data.
#[test]
fn pi_only_namespaces_do_io_with_the_controller_inserting_and_checking() {
    use kestrel::format::IoProtection;
    use kestrel::io::IoError;
    use kestrel::spec::Status;
    for pi_type in 1..=3u8 {
        for (extended, pi_first, lba) in [
            (false, false, 512u32),
            (true, true, 4096),
            (true, false, 512),
        ] {
            let format = EmuFormat {
                ms: 8,
                extended,
                pi_type,
                pi_first,
                ..Default::default()
            };
            let what = format!("type {pi_type}, extended {extended}, {lba} B");
            let (emu, c) = emu_with(EmuConfig {
                namespaces: vec![
                    EmuNamespace::new(16 << 20, 4096, EmuStore::Memory),
                    EmuNamespace {
                        format,
                        ..EmuNamespace::new(16 << 20, lba, EmuStore::Memory)
                    },
                ],
                ..Default::default()
            });
            let ns = &c.namespaces()[1];
            assert!(ns.supported(), "{what}: {:?}", ns.unsupported);
            assert_eq!(ns.block_size, lba, "{what}: data only, no metadata");
            assert_eq!(ns.protection, IoProtection::of(&ns.format), "{what}");
            assert_eq!(ns.protection.pi_type, pi_type);
            NvmeNamespace::new(c.clone(), 2).expect("opens for i/o");

            let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
            // More than one command's worth (MDTS), at an LBA where a wrong reference tag
            // in any piece fails type 1's command check and the read's tag check.
            let nlb = (256 << 10) / lba + 3;
            let len = (nlb * lba) as usize;
            let slba = ns.num_blocks / 2 + 1;
            let mut w = c.dma_pool().alloc(len).unwrap();
            let data = pattern(len, u64::from(pi_type) << 8 | u64::from(extended));
            w.write_at(0, &data).unwrap();
            qp.submit(IoRequest::write(2, slba, nlb, w.slice(0, len).unwrap(), 1))
                .unwrap();
            let done = reap(&mut qp, 1);
            assert_eq!(done[0].result, Ok(()), "{what}: write");
            let r = c.dma_pool().alloc(len).unwrap();
            qp.submit(IoRequest::read(2, slba, nlb, r.slice(0, len).unwrap(), 2))
                .unwrap();
            let done = reap(&mut qp, 1);
            assert_eq!(done[0].result, Ok(()), "{what}: read");
            assert!(r.to_vec() == data, "{what}: read back other data");
            assert!(emu.stats().writes >= 2, "{what}: the write was split");

            // A block whose PI the medium corrupted: the read fails with its typed status.
            for (fault, status, checked) in [
                ("pi-guard/read/max1", Status::E2E_GUARD_CHECK_ERROR, true),
                (
                    "pi-ref/read/max1",
                    Status::E2E_REFERENCE_TAG_CHECK_ERROR,
                    pi_type != 3,
                ),
            ] {
                emu.faults().set_spec(fault).unwrap();
                qp.submit(IoRequest::read(
                    2,
                    slba,
                    1,
                    r.slice(0, lba as usize).unwrap(),
                    3,
                ))
                .unwrap();
                let got = reap(&mut qp, 1)[0].result;
                if checked {
                    match got {
                        Err(IoError::Nvme(s)) => {
                            assert!(s.same_code(status), "{what} {fault}: {s}")
                        }
                        other => panic!("{what} {fault}: {other:?}"),
                    }
                } else {
                    // Type 3 has no reference tag to check.
                    assert_eq!(got, Ok(()), "{what} {fault}");
                }
                emu.faults().clear();
            }

            // Write Zeroes generates the PI too: the zeroed blocks read back clean.
            qp.submit(IoRequest::write_zeroes(2, slba, 4, 4)).unwrap();
            assert_eq!(reap(&mut qp, 1)[0].result, Ok(()), "{what}: write zeroes");
            qp.submit(IoRequest::read(
                2,
                slba,
                4,
                r.slice(0, 4 * lba as usize).unwrap(),
                5,
            ))
            .unwrap();
            assert_eq!(reap(&mut qp, 1)[0].result, Ok(()), "{what}: read of zeroes");
            assert!(
                r.to_vec()[..4 * lba as usize].iter().all(|&b| b == 0),
                "{what}"
            );
            assert_quiet(&mut qp);
        }
    }
}

/// The same namespace through a command built without PRACT: the controller expects the
/// PI to cross the wire, which is exactly what the driver must never leave to chance. The
/// emulator refuses a type 1 command whose reference tag is not its LBA: proof that the
/// driver's tags above were checked, not ignored.
#[test]
fn a_type1_command_with_a_wrong_reference_tag_is_refused_by_the_controller() {
    use kestrel::io::IoError;
    use kestrel::spec::pi::Prinfo;
    use kestrel::spec::Status;
    let (_emu, c) = emu_with(EmuConfig {
        namespaces: vec![EmuNamespace {
            format: EmuFormat {
                ms: 8,
                pi_type: 1,
                ..Default::default()
            },
            ..EmuNamespace::new(16 << 20, 4096, EmuStore::Memory)
        }],
        ..Default::default()
    });
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = c.dma_pool().alloc(4096).unwrap();
    let mut sqe = Sqe::read(1, 9, 1, 0, 0);
    sqe.cdw12 |= Prinfo(Prinfo::PRACT | Prinfo::PRCHK_REF).to_cdw12();
    sqe.cdw14 = 8;
    qp.submit_raw(sqe, Some(buf.slice(0, 4096).unwrap()), 1)
        .unwrap();
    match reap(&mut qp, 1)[0].result {
        Err(IoError::Nvme(s)) => {
            assert!(s.same_code(Status::INVALID_PROTECTION_INFORMATION), "{s}")
        }
        other => panic!("{other:?}"),
    }
}

/// Every metadata format the driver serves, with the caller's metadata: separate (MPTR) and
/// extended, without PI and with PI of types 1 to 3, first or last, 512 B and 4 KiB. A
/// write larger than MDTS is split (each piece's MPTR and reference tag advance with it);
/// the read returns the data and the metadata as written; PI generated in software passes
/// the controller's checks and is checked again in software on the way back; a PI the
/// medium corrupted fails with the End-to-end status by name; and a request without the
/// metadata its format needs, or with too small a buffer, never reaches the controller.
#[test]
fn metadata_formats_do_io_with_the_caller_s_metadata() {
    use kestrel::io::IoError;
    use kestrel::spec::pi::{PiFormat, PiType};
    use kestrel::spec::Status;
    let cases: &[(u16, bool, u8, bool, u32)] = &[
        (8, false, 0, false, 4096),
        (64, false, 0, false, 512),
        (8, true, 0, false, 512),
        (16, true, 0, false, 4096),
        (8, false, 1, false, 4096),
        (16, false, 1, false, 4096),
        (16, false, 2, true, 512),
        (64, false, 3, false, 512),
        (8, true, 2, false, 512),
        (16, true, 1, true, 4096),
        (16, true, 3, false, 512),
    ];
    for &(ms, extended, pi_type, pi_first, lba) in cases {
        let what = format!("ms {ms} ext {extended} pi {pi_type} first {pi_first} {lba} B");
        let (emu, c) = emu_with(EmuConfig {
            namespaces: vec![EmuNamespace {
                format: EmuFormat {
                    ms,
                    extended,
                    pi_type,
                    pi_first,
                    ..Default::default()
                },
                ..EmuNamespace::new(16 << 20, lba, EmuStore::Memory)
            }],
            ..Default::default()
        });
        let ns = c.namespaces()[0].clone();
        assert!(ns.supported(), "{what}: {:?}", ns.unsupported);
        let t = NvmeNamespace::new(c.clone(), 1).expect("opens");
        use kestrel::Target;
        let layout = t.info().metadata.expect("metadata layout");
        assert_eq!(
            (layout.ms, layout.extended, layout.pi_type),
            (ms, extended, pi_type)
        );
        let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();

        let nlb = (256 << 10) / lba + 3;
        let hbs = (lba + if extended { ms as u32 } else { 0 }) as usize;
        let dlen = nlb as usize * hbs;
        let mlen = if extended {
            0
        } else {
            nlb as usize * ms as usize
        };
        let slba = ns.num_blocks / 2 + 1;
        let ref0 = if pi_type == 1 { slba as u32 } else { 0x5000 };
        let mut data = pattern(dlen, u64::from(ms) << 8 | u64::from(pi_type));
        let mut md = pattern(mlen, 99);
        let pif = PiType::from_dps(pi_type).map(|t| PiFormat {
            data_size: lba as usize,
            ms: ms as usize,
            extended,
            pi_first,
            pi_type: t,
        });
        if let Some(f) = pif {
            f.fill(&mut data, &mut md, nlb as usize, ref0, 0x4B45);
        }
        let mut w = c.dma_pool().alloc(dlen + mlen + 4096).unwrap();
        w.write_at(0, &data).unwrap();
        let moff = dlen.next_multiple_of(4096);
        w.write_at(moff, &md).unwrap();
        let meta = |b: &kestrel::DmaBuf| {
            let m = if extended {
                IoMeta::extended()
            } else {
                IoMeta::separate(b.slice(moff, mlen).unwrap())
            };
            m.with_tags(ref0, 0x4B45, 0xFFFF)
        };

        // Refused before the SQ: no metadata, a short buffer.
        let writes_before = emu.stats().writes;
        if layout.required() {
            let no_md = qp.submit(IoRequest::write(1, slba, nlb, w.slice(0, dlen).unwrap(), 9));
            assert!(
                matches!(
                    no_md,
                    Err(SubmitError::Invalid {
                        reason: InvalidRequest::Metadata { .. },
                        ..
                    })
                ),
                "{what}: {no_md:?}"
            );
        }
        if !extended {
            let short = IoMeta::separate(w.slice(moff, mlen - 1).unwrap());
            let e = qp
                .submit(
                    IoRequest::write(1, slba, nlb, w.slice(0, dlen).unwrap(), 9).with_meta(short),
                )
                .unwrap_err();
            assert!(
                e.to_string().contains("smaller than nlb x ms"),
                "{what}: {e}"
            );
        } else {
            // The data buffer must hold the interleaved metadata too.
            let e = qp
                .submit(
                    IoRequest::write(
                        1,
                        slba,
                        nlb,
                        w.slice(0, nlb as usize * lba as usize).unwrap(),
                        9,
                    )
                    .with_meta(meta(&w)),
                )
                .unwrap_err();
            assert!(e.to_string().contains("needs"), "{what}: {e}");
        }
        qp.flush();
        assert_eq!(
            emu.stats().writes,
            writes_before,
            "{what}: a refused request reached the device"
        );

        qp.submit(IoRequest::write(1, slba, nlb, w.slice(0, dlen).unwrap(), 1).with_meta(meta(&w)))
            .unwrap();
        assert_eq!(reap(&mut qp, 1)[0].result, Ok(()), "{what}: write");
        assert!(
            emu.stats().writes >= writes_before + 2,
            "{what}: the write was split"
        );

        let r = c.dma_pool().alloc(dlen + mlen + 4096).unwrap();
        qp.submit(IoRequest::read(1, slba, nlb, r.slice(0, dlen).unwrap(), 2).with_meta(meta(&r)))
            .unwrap();
        assert_eq!(reap(&mut qp, 1)[0].result, Ok(()), "{what}: read");
        let got = r.to_vec();
        assert!(got[..dlen] == data[..], "{what}: data read back differs");
        assert!(
            got[moff..moff + mlen] == md[..],
            "{what}: metadata read back differs"
        );
        if let Some(f) = pif {
            assert_eq!(
                f.check(
                    &got[..dlen],
                    &got[moff..moff + mlen],
                    nlb as usize,
                    ref0,
                    0x4B45,
                    0xFFFF
                ),
                Ok(()),
                "{what}: software check of the PI read back"
            );
            // Corrupted on the medium: the controller's check fails the read by name.
            for (fault, status, checked) in [
                ("pi-guard/read/max1", Status::E2E_GUARD_CHECK_ERROR, true),
                (
                    "pi-ref/read/max1",
                    Status::E2E_REFERENCE_TAG_CHECK_ERROR,
                    pi_type != 3,
                ),
                (
                    "pi-app/read/max1",
                    Status::E2E_APPLICATION_TAG_CHECK_ERROR,
                    true,
                ),
            ] {
                emu.faults().set_spec(fault).unwrap();
                qp.submit(
                    IoRequest::read(1, slba, nlb, r.slice(0, dlen).unwrap(), 3).with_meta(meta(&r)),
                )
                .unwrap();
                let res = reap(&mut qp, 1)[0].result;
                emu.faults().clear();
                match (checked, res) {
                    (true, Err(IoError::Nvme(s))) => {
                        assert!(s.same_code(status), "{what} {fault}: {s}");
                        assert!(s.to_string().contains("End-to-end"), "{what}: {s}");
                    }
                    (false, Ok(())) => {}
                    (_, other) => panic!("{what} {fault}: {other:?}"),
                }
            }
            // PI written wrong by the caller is refused by the controller on the write.
            let mut bad = data.clone();
            let at = if extended {
                lba as usize + if pi_first { 0 } else { ms as usize - 8 }
            } else {
                0
            };
            if extended {
                bad[at] ^= 0xFF; // the first block's guard
                w.write_at(0, &bad).unwrap();
            } else {
                let mut badmd = md.clone();
                badmd[if pi_first { 0 } else { ms as usize - 8 }] ^= 0xFF;
                w.write_at(moff, &badmd).unwrap();
            }
            qp.submit(
                IoRequest::write(1, slba, 1, w.slice(0, hbs).unwrap(), 4).with_meta(meta(&w)),
            )
            .unwrap();
            match reap(&mut qp, 1)[0].result {
                Err(IoError::Nvme(s)) => {
                    assert!(s.same_code(Status::E2E_GUARD_CHECK_ERROR), "{what}: {s}")
                }
                other => panic!("{what}: bad guard written: {other:?}"),
            }
        }
        // 8-byte PI: without metadata the controller checks and strips it on a read (PRACT,
        // whose type 2 reference tag is the LBA, not this test's 0x5000: type 1 and 3 only).
        if (pi_type == 1 || pi_type == 3) && ms == 8 {
            qp.submit(IoRequest::read(
                1,
                slba,
                nlb,
                r.slice(0, nlb as usize * lba as usize).unwrap(),
                5,
            ))
            .unwrap();
            assert_eq!(reap(&mut qp, 1)[0].result, Ok(()), "{what}: PRACT read");
            let plain = r.to_vec();
            for b in 0..nlb as usize {
                assert!(
                    plain[b * lba as usize..(b + 1) * lba as usize]
                        == data[b * hbs..b * hbs + lba as usize],
                    "{what}: PRACT read of block {b}"
                );
            }
        }
        assert_quiet(&mut qp);
    }
}

/// A command carrying the caller's metadata keeps it through a retry: the SQE written
/// again from the tracker carries the same MPTR, initial reference tag (type 2: the
/// caller's) and application tag and mask, so the retried write and read pass the
/// controller's PI checks and move the same data and metadata.
#[test]
fn a_retried_metadata_command_carries_its_metadata_again() {
    use kestrel::nvme::qpair::ErrorInjection;
    use kestrel::spec::pi::{PiFormat, PiType};
    use kestrel::spec::{nvm_opc, Status};
    for extended in [false, true] {
        let what = format!("type 2, ms 16, extended {extended}");
        let (ms, lba, nlb) = (16u16, 512u32, 8u32);
        let (_emu, c) = emu_with(EmuConfig {
            namespaces: vec![EmuNamespace {
                format: EmuFormat {
                    ms,
                    extended,
                    pi_type: 2,
                    ..Default::default()
                },
                ..EmuNamespace::new(4 << 20, lba, EmuStore::Memory)
            }],
            ..Default::default()
        });
        let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
        let hbs = (lba + if extended { u32::from(ms) } else { 0 }) as usize;
        let dlen = nlb as usize * hbs;
        let mlen = if extended {
            0
        } else {
            nlb as usize * ms as usize
        };
        let mut data = pattern(dlen, 7);
        let mut md = pattern(mlen, 8);
        let f = PiFormat {
            data_size: lba as usize,
            ms: ms as usize,
            extended,
            pi_first: false,
            pi_type: PiType::from_dps(2).unwrap(),
        };
        let (ref0, app) = (0x5000, 0x4B45);
        f.fill(&mut data, &mut md, nlb as usize, ref0, app);
        let moff = dlen.next_multiple_of(4096);
        let mut w = c.dma_pool().alloc(moff + mlen.max(1)).unwrap();
        w.write_at(0, &data).unwrap();
        w.write_at(moff, &md).unwrap();
        let r = c.dma_pool().alloc(moff + mlen.max(1)).unwrap();
        let meta = |b: &kestrel::DmaBuf| {
            let m = if extended {
                IoMeta::extended()
            } else {
                IoMeta::separate(b.slice(moff, mlen).unwrap())
            };
            m.with_tags(ref0, app, 0xFFFF)
        };
        for (opc, buf, token) in [(nvm_opc::WRITE, &w, 1), (nvm_opc::READ, &r, 2)] {
            // Submitted, then completed with a retryable status: resubmitted once.
            assert!(qp.inject_error(ErrorInjection {
                opcode: Some(opc),
                status: Status::NAMESPACE_NOT_READY,
                count: 1,
                submit: true,
            }));
            let d = buf.slice(0, dlen).unwrap();
            let req = if opc == nvm_opc::WRITE {
                IoRequest::write(1, 100, nlb, d, token)
            } else {
                IoRequest::read(1, 100, nlb, d, token)
            };
            qp.submit(req.with_meta(meta(buf))).unwrap();
            assert_eq!(reap(&mut qp, 1)[0].result, Ok(()), "{what}: opcode {opc}");
        }
        assert_eq!(qp.stats().retries, 2, "{what}: both commands were retried");
        let got = r.to_vec();
        assert!(got[..dlen] == data[..], "{what}: data read back differs");
        assert!(
            got[moff..moff + mlen] == md[..],
            "{what}: metadata read back differs"
        );
    }
}
