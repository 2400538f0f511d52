//! The format rule: the driver sends no I/O to a namespace whose format it does not
//! implement. Such a namespace is listed with its format and the reason, opening it is an
//! error naming the format, and every submission path refuses it before the device — the
//! emulator's command counters prove nothing reached it. And the formats it implements
//! beyond plain blocks (metadata that is exactly the protection information) do I/O with
//! the controller inserting and checking the PI.

mod common;

use common::*;
use kestrel::emu::{EmuConfig, EmuFormat, EmuNamespace, EmuStore};
use kestrel::io::{InvalidRequest, IoRequest};
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::spec::{csi, Sqe};
use kestrel::{NvmeNamespace, QpairOptions, SubmitError};

/// The formats a real SSD can ship with that the driver does not implement yet, with words
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
            f(8, false, 0, false, csi::NVM),
            4096,
            &[
                "lba format 2",
                "ms 8 B in a separate buffer",
                "separate metadata",
            ],
        ),
        (f(64, false, 0, false, csi::NVM), 512, &["512 B", "ms 64 B"]),
        (
            f(8, true, 0, false, csi::NVM),
            512,
            &["extended lba", "flbas 0x12"],
        ),
        (
            f(16, false, 1, false, csi::NVM),
            4096,
            &[
                "type 1 in the last",
                "dps 0x01",
                "end-to-end protection (type 1) with 16 bytes of metadata",
            ],
        ),
        (
            f(64, false, 2, true, csi::NVM),
            512,
            &["type 2 in the first", "dps 0x0a"],
        ),
        (
            f(16, true, 3, false, csi::NVM),
            4096,
            &["type 3", "extended"],
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
        let reqs = [
            IoRequest::read(2, 0, 1, buf.slice(0, lba as usize).unwrap(), 1),
            IoRequest::write(2, 0, 1, buf.slice(0, lba as usize).unwrap(), 2),
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
