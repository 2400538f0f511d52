//! The format rule: the driver sends no I/O to a namespace whose format it does not
//! implement. Such a namespace is listed with its format and the reason, opening it is an
//! error naming the format, and every submission path refuses it before the device — the
//! emulator's command counters prove nothing reached it.

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
            f(8, false, 1, false, csi::NVM),
            4096,
            &[
                "type 1 in the last",
                "dps 0x01",
                "end-to-end protection (type 1)",
            ],
        ),
        (
            f(8, false, 2, true, csi::NVM),
            512,
            &["type 2 in the first", "dps 0x0a"],
        ),
        (
            f(16, true, 3, false, csi::NVM),
            4096,
            &["type 3", "extended"],
        ),
        (
            f(0, false, 0, false, csi::ZONED),
            4096,
            &["Zoned Namespace Command Set (csi 0x02)"],
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
                ms: 8,
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
