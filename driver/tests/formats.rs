//! The format rule: the driver sends no I/O to a namespace whose format it does not
//! implement (32- and 64-bit guards, other command sets). Such a namespace is listed with
//! its format and the reason, opening it is an error naming the format, and every
//! submission path refuses it before the device — the emulator's command counters prove
//! nothing reached it. And the formats it implements beyond plain blocks do I/O: metadata
//! separate or extended, with or without PI, the caller's PI checked by the controller,
//! and 8-byte PI inserted and checked by the controller when the caller gives none.

mod common;

use std::sync::Arc;

use common::*;
use kestrel::emu::testkit::meta_format;
use kestrel::emu::{EmuConfig, EmuController, EmuFormat, EmuNamespace, EmuStore};
use kestrel::format::IoProtection;
use kestrel::io::{InvalidRequest, IoError, IoMeta, IoRequest};
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::spec::pi::{PiFormat, PiType};
use kestrel::spec::{csi, Sqe, Status};
use kestrel::target::TargetQueue;
use kestrel::{Controller, DmaSlice, IoQpair, NvmeNamespace, QpairOptions, SubmitError, Target};

/// The application tag the tests write with their PI.
const APP_TAG: u16 = 0x4B45;

/// A namespace of `bytes` in memory, in `format` with `lba`-byte blocks.
fn formatted(format: EmuFormat, bytes: u64, lba: u32) -> EmuNamespace {
    EmuNamespace {
        format,
        ..EmuNamespace::new(bytes, lba, EmuStore::Memory)
    }
}

/// An emulated controller with these namespaces, brought up by the driver.
fn emu_of(namespaces: Vec<EmuNamespace>) -> (Arc<EmuController>, Controller) {
    emu_with(EmuConfig {
        namespaces,
        ..Default::default()
    })
}

/// nsid 1: a plain 16 MiB namespace of 4 KiB blocks; nsid 2: 16 MiB in `format`.
fn beside_a_plain_namespace(format: EmuFormat, lba: u32) -> (Arc<EmuController>, Controller) {
    emu_of(vec![
        EmuNamespace::new(16 << 20, 4096, EmuStore::Memory),
        formatted(format, 16 << 20, lba),
    ])
}

/// The formats a real SSD can ship with that the driver does not implement, with words
/// the refusal must contain.
fn unsupported() -> Vec<(EmuFormat, u32, &'static [&'static str])> {
    let f = |ms, extended, pi_type, pi_first, csi| EmuFormat {
        csi,
        ..meta_format(ms, extended, pi_type, pi_first)
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
        let (emu, c) = beside_a_plain_namespace(format, lba);
        assert_listed_with_the_reason(&c, &format, words);
        assert_opening_names_the_format(&c, &format);

        // Every submission path refuses it before the device.
        let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
        let buf = lend(&mut qp, c.dma_pool(), 8192);
        assert_every_submission_path_refuses(&mut qp, &buf, &format, lba);
        qp.flush();
        assert_quiet(&mut qp);
        assert_eq!(io_commands(&emu), 0, "{format:?}: i/o reached the device");

        // The namespace the driver implements works beside it.
        let write = IoRequest::write(1, 0, 1, buf.slice(0, 4096).unwrap(), 7);
        let done = complete_one(&mut qp, write);
        assert!(done.is_ok(), "{done:?}");
        assert_eq!(emu.stats().writes, 1);
    }
}

/// nsid 2 is listed, with its format and the reason; nsid 1 alone is served.
fn assert_listed_with_the_reason(c: &Controller, format: &EmuFormat, words: &[&str]) {
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
}

/// Opening nsid 2 is an error that names the format.
fn assert_opening_names_the_format(c: &Controller, format: &EmuFormat) {
    match NvmeNamespace::new(c.clone(), 2) {
        Err(e @ CtrlrError::UnsupportedFormat { .. }) => {
            let m = e.to_string();
            assert!(m.contains("nsid 2") && m.contains("flbas"), "{m}");
        }
        Err(e) => panic!("{format:?}: wrong error {e}"),
        Ok(_) => panic!("{format:?}: nsid 2 opened for i/o"),
    }
}

/// Every kind of request to nsid 2, and a raw command, is refused as of an unsupported
/// format (`buf`: 8 KiB, lent to `qp`).
fn assert_every_submission_path_refuses(
    qp: &mut IoQpair,
    buf: &DmaSlice,
    format: &EmuFormat,
    lba: u32,
) {
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
        assert!(refused_as_unsupported(&got), "{format:?}: {got:?}");
    }
    // SAFETY: refused by the qpair before it reaches the device (the format rule); one
    // block into a lent 4 KiB slice otherwise.
    let raw = unsafe {
        qp.submit_raw(
            Sqe::read(2, 0, 1, 0, 0),
            Some(buf.slice(0, 4096).unwrap()),
            6,
        )
    };
    assert!(refused_as_unsupported(&raw), "{format:?}: {raw:?}");
}

fn refused_as_unsupported<T>(got: &Result<T, SubmitError>) -> bool {
    matches!(
        got,
        Err(SubmitError::Invalid {
            reason: InvalidRequest::UnsupportedFormat { nsid: 2 },
            ..
        })
    )
}

#[test]
fn a_controller_whose_only_namespace_is_refused_still_comes_up_for_identify() {
    let (emu, c) = emu_of(vec![formatted(
        EmuFormat {
            pif: 2,
            ..meta_format(16, false, 1, false)
        },
        16 << 20,
        4096,
    )]);
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
    for pi_type in 1..=3u8 {
        for (extended, pi_first, lba) in [
            (false, false, 512u32),
            (true, true, 4096),
            (true, false, 512),
        ] {
            let what = format!("type {pi_type}, extended {extended}, {lba} B");
            let format = meta_format(8, extended, pi_type, pi_first);
            let (emu, c) = beside_a_plain_namespace(format, lba);
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
            let slba = ns.num_blocks / 2 + 1;
            let seed = u64::from(pi_type) << 8 | u64::from(extended);
            let r = assert_data_only_write_reads_back(&c, &mut qp, slba, nlb, lba, seed, &what);
            assert!(emu.stats().writes >= 2, "{what}: the write was split");

            // A block whose PI the medium corrupted: the read fails with its typed status.
            let read_one = || IoRequest::read(2, slba, 1, r.slice(0, lba as usize).unwrap(), 3);
            let faults = &medium_pi_faults(pi_type)[..2];
            assert_corrupted_pi_fails_the_read(&emu, &mut qp, faults, read_one, &what);

            assert_write_zeroes_reads_back_zeroes(&mut qp, &r, slba, lba, &what);
            assert_quiet(&mut qp);
        }
    }
}

/// Writes `nlb` blocks of a pattern at `slba` of nsid 2, data only, and reads them back
/// into the buffer (lent to `qp`) it returns.
fn assert_data_only_write_reads_back(
    c: &Controller,
    qp: &mut IoQpair,
    slba: u64,
    nlb: u32,
    lba: u32,
    seed: u64,
    what: &str,
) -> DmaSlice {
    let len = (nlb * lba) as usize;
    let w = lend(qp, c.dma_pool(), len);
    let data = pattern(len, seed);
    qp.write_lent(&w, 0, &data).unwrap();
    let write = IoRequest::write(2, slba, nlb, w.slice(0, len).unwrap(), 1);
    assert_eq!(complete_one(qp, write), Ok(()), "{what}: write");
    let r = lend(qp, c.dma_pool(), len);
    let read = IoRequest::read(2, slba, nlb, r.slice(0, len).unwrap(), 2);
    assert_eq!(complete_one(qp, read), Ok(()), "{what}: read");
    let mut got = vec![0u8; len];
    qp.read_lent(&r, 0, &mut got).unwrap();
    assert!(got == data, "{what}: read back other data");
    r
}

/// The PI faults the emulator injects on the medium of one read, the End-to-end status
/// each must fail the read with, and whether PI of `pi_type` checks it (type 3 has no
/// reference tag to check).
fn medium_pi_faults(pi_type: u8) -> [(&'static str, Status, bool); 3] {
    [
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
    ]
}

/// For each fault, `read` fails with the fault's End-to-end status by name, or succeeds
/// where the PI type checks nothing the fault corrupts.
fn assert_corrupted_pi_fails_the_read(
    emu: &EmuController,
    qp: &mut IoQpair,
    faults: &[(&str, Status, bool)],
    read: impl Fn() -> IoRequest,
    what: &str,
) {
    for &(fault, status, checked) in faults {
        emu.faults().set_spec(fault).unwrap();
        let res = complete_one(qp, read());
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
}

/// Write Zeroes generates the PI too: the zeroed blocks read back clean.
fn assert_write_zeroes_reads_back_zeroes(
    qp: &mut IoQpair,
    r: &DmaSlice,
    slba: u64,
    lba: u32,
    what: &str,
) {
    let zeroes = IoRequest::write_zeroes(2, slba, 4, 4);
    assert_eq!(complete_one(qp, zeroes), Ok(()), "{what}: write zeroes");
    let read = IoRequest::read(2, slba, 4, r.slice(0, 4 * lba as usize).unwrap(), 5);
    assert_eq!(complete_one(qp, read), Ok(()), "{what}: read of zeroes");
    assert!(
        lent_bytes(qp, r)[..4 * lba as usize]
            .iter()
            .all(|&b| b == 0),
        "{what}"
    );
}

/// The same namespace through a command built without PRACT: the controller expects the
/// PI to cross the wire, which is exactly what the driver must never leave to chance. The
/// emulator refuses a type 1 command whose reference tag is not its LBA: proof that the
/// driver's tags above were checked, not ignored.
#[test]
fn a_type1_command_with_a_wrong_reference_tag_is_refused_by_the_controller() {
    use kestrel::spec::pi::Prinfo;
    let (_emu, c) = emu_of(vec![formatted(
        meta_format(8, false, 1, false),
        16 << 20,
        4096,
    )]);
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 4096);
    let mut sqe = Sqe::read(1, 9, 1, 0, 0);
    sqe.cdw12 |= Prinfo(Prinfo::PRACT | Prinfo::PRCHK_REF).to_cdw12();
    sqe.cdw14 = 8;
    // SAFETY: a read of one 4 KiB block into a lent 4 KiB slice, with PI inserted and
    // stripped by the controller (PRACT, no metadata pointer).
    unsafe { qp.submit_raw(sqe, Some(buf.slice(0, 4096).unwrap()), 1) }.unwrap();
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
        let format = meta_format(ms, extended, pi_type, pi_first);
        let (emu, c) = emu_of(vec![formatted(format, 16 << 20, lba)]);
        let ns = c.namespaces()[0].clone();
        assert!(ns.supported(), "{what}: {:?}", ns.unsupported);
        let t = NvmeNamespace::new(c.clone(), 1).expect("opens");
        let layout = t.info().metadata.expect("metadata layout");
        assert_eq!(
            (layout.ms, layout.extended, layout.pi_type),
            (ms, extended, pi_type)
        );

        let slba = ns.num_blocks / 2 + 1;
        let ref0 = if pi_type == 1 { slba as u32 } else { 0x5000 };
        let nlb = (256 << 10) / lba + 3;
        let seeds = (u64::from(ms) << 8 | u64::from(pi_type), 99);
        let io = MetaIo::new(&format, lba, nlb, ref0, seeds);
        let mut case = MetaCase::new(&c, emu, what, io, slba);
        case.assert_refused_before_the_sq(layout.required());
        case.assert_written_and_read_back();
        if let Some(f) = case.io.pif {
            case.assert_pi_checked_both_ways(f);
        }
        if (pi_type == 1 || pi_type == 3) && ms == 8 {
            case.assert_pract_read_strips_the_pi();
        }
        assert_quiet(&mut case.qp);
    }
}

/// An I/O of `nlb` blocks with the caller's metadata, laid out for a format: the data (and,
/// extended, the metadata interleaved with it) at 0 of its buffers, separate metadata at
/// `moff`; its contents a pattern, with PI generated in software where the format has PI.
struct MetaIo {
    lba: usize,
    ms: usize,
    extended: bool,
    pi_first: bool,
    pi_type: u8,
    nlb: u32,
    /// Bytes per block in the data buffer.
    hbs: usize,
    dlen: usize,
    mlen: usize,
    moff: usize,
    ref0: u32,
    pif: Option<PiFormat>,
    data: Vec<u8>,
    md: Vec<u8>,
}

impl MetaIo {
    /// The I/O for `format` with `lba`-byte blocks, its first reference tag `ref0`, its
    /// data and metadata patterns from `seeds`.
    fn new(format: &EmuFormat, lba: u32, nlb: u32, ref0: u32, seeds: (u64, u64)) -> Self {
        let (ms, extended, pi_first) = (usize::from(format.ms), format.extended, format.pi_first);
        let hbs = lba as usize + if extended { ms } else { 0 };
        let dlen = nlb as usize * hbs;
        let mlen = if extended { 0 } else { nlb as usize * ms };
        let pif = PiType::from_dps(format.pi_type).map(|t| PiFormat {
            data_size: lba as usize,
            ms,
            extended,
            pi_first,
            pi_type: t,
        });
        let mut data = pattern(dlen, seeds.0);
        let mut md = pattern(mlen, seeds.1);
        if let Some(f) = pif {
            f.fill(&mut data, &mut md, nlb as usize, ref0, APP_TAG);
        }
        MetaIo {
            lba: lba as usize,
            ms,
            extended,
            pi_first,
            pi_type: format.pi_type,
            nlb,
            hbs,
            dlen,
            mlen,
            moff: dlen.next_multiple_of(4096),
            ref0,
            pif,
            data,
            md,
        }
    }

    /// The metadata argument of a request on `b`, with the tags to check.
    fn meta(&self, b: &DmaSlice) -> IoMeta {
        let m = if self.extended {
            IoMeta::extended()
        } else {
            IoMeta::separate(b.slice(self.moff, self.mlen).unwrap())
        };
        m.with_tags(self.ref0, APP_TAG, 0xFFFF)
    }

    /// Puts the data and the separate metadata into `w` (lent to `qp`).
    fn store(&self, qp: &mut IoQpair, w: &DmaSlice) {
        qp.write_lent(w, 0, &self.data).unwrap();
        qp.write_lent(w, self.moff, &self.md).unwrap();
    }

    fn write(&self, slba: u64, w: &DmaSlice, token: u64) -> IoRequest {
        let data = w.slice(0, self.dlen).unwrap();
        IoRequest::write(1, slba, self.nlb, data, token).with_meta(self.meta(w))
    }

    fn read(&self, slba: u64, r: &DmaSlice, token: u64) -> IoRequest {
        let data = r.slice(0, self.dlen).unwrap();
        IoRequest::read(1, slba, self.nlb, data, token).with_meta(self.meta(r))
    }

    /// `got`, a buffer read back, holds the data and the metadata as written.
    fn assert_read_back(&self, got: &[u8], what: &str) {
        assert!(
            got[..self.dlen] == self.data[..],
            "{what}: data read back differs"
        );
        assert!(
            got[self.moff..self.moff + self.mlen] == self.md[..],
            "{what}: metadata read back differs"
        );
    }
}

/// One metadata format under test: a queue on its namespace (nsid 1), the I/O it does at
/// `slba`, and the buffers (lent to the queue) it writes from and reads into.
struct MetaCase {
    what: String,
    emu: Arc<EmuController>,
    qp: IoQpair,
    io: MetaIo,
    slba: u64,
    w: DmaSlice,
    r: DmaSlice,
}

impl MetaCase {
    fn new(c: &Controller, emu: Arc<EmuController>, what: String, io: MetaIo, slba: u64) -> Self {
        let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
        let w = lend(&mut qp, c.dma_pool(), io.dlen + io.mlen + 4096);
        io.store(&mut qp, &w);
        let r = lend(&mut qp, c.dma_pool(), io.dlen + io.mlen + 4096);
        MetaCase {
            what,
            emu,
            qp,
            io,
            slba,
            w,
            r,
        }
    }

    /// Refused before the SQ: no metadata (where the format needs it), a short buffer.
    fn assert_refused_before_the_sq(&mut self, required: bool) {
        let (what, io, w, slba) = (&self.what, &self.io, &self.w, self.slba);
        let writes_before = self.emu.stats().writes;
        if required {
            let data = w.slice(0, io.dlen).unwrap();
            let no_md = self.qp.submit(IoRequest::write(1, slba, io.nlb, data, 9));
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
        if !io.extended {
            let short = IoMeta::separate(w.slice(io.moff, io.mlen - 1).unwrap());
            let data = w.slice(0, io.dlen).unwrap();
            let write = IoRequest::write(1, slba, io.nlb, data, 9).with_meta(short);
            let e = self.qp.submit(write).unwrap_err();
            assert!(
                e.to_string().contains("smaller than nlb x ms"),
                "{what}: {e}"
            );
        } else {
            // The data buffer must hold the interleaved metadata too.
            let data = w.slice(0, io.nlb as usize * io.lba).unwrap();
            let write = IoRequest::write(1, slba, io.nlb, data, 9).with_meta(io.meta(w));
            let e = self.qp.submit(write).unwrap_err();
            assert!(e.to_string().contains("needs"), "{what}: {e}");
        }
        self.qp.flush();
        assert_eq!(
            self.emu.stats().writes,
            writes_before,
            "{what}: a refused request reached the device"
        );
    }

    /// The write, larger than MDTS, is split; the read returns the data and the metadata.
    fn assert_written_and_read_back(&mut self) {
        let (what, io, slba) = (&self.what, &self.io, self.slba);
        let writes_before = self.emu.stats().writes;
        let write = io.write(slba, &self.w, 1);
        assert_eq!(complete_one(&mut self.qp, write), Ok(()), "{what}: write");
        assert!(
            self.emu.stats().writes >= writes_before + 2,
            "{what}: the write was split"
        );
        let read = io.read(slba, &self.r, 2);
        assert_eq!(complete_one(&mut self.qp, read), Ok(()), "{what}: read");
        io.assert_read_back(&lent_bytes(&self.qp, &self.r), what);
    }

    /// The PI read back passes a software check; PI corrupted on the medium fails the read
    /// by name; PI written wrong by the caller is refused by the controller on the write.
    fn assert_pi_checked_both_ways(&mut self, f: PiFormat) {
        let (what, io, slba) = (&self.what, &self.io, self.slba);
        let got = lent_bytes(&self.qp, &self.r);
        assert_eq!(
            f.check(
                &got[..io.dlen],
                &got[io.moff..io.moff + io.mlen],
                io.nlb as usize,
                io.ref0,
                APP_TAG,
                0xFFFF
            ),
            Ok(()),
            "{what}: software check of the PI read back"
        );
        // Corrupted on the medium: the controller's check fails the read by name.
        let read = || io.read(slba, &self.r, 3);
        let faults = &medium_pi_faults(io.pi_type);
        assert_corrupted_pi_fails_the_read(&self.emu, &mut self.qp, faults, read, what);

        // The first block's guard, flipped.
        let pi_at = if io.pi_first { 0 } else { io.ms - 8 };
        if io.extended {
            let mut bad = io.data.clone();
            bad[io.lba + pi_at] ^= 0xFF;
            self.qp.write_lent(&self.w, 0, &bad).unwrap();
        } else {
            let mut badmd = io.md.clone();
            badmd[pi_at] ^= 0xFF;
            self.qp.write_lent(&self.w, io.moff, &badmd).unwrap();
        }
        let one = self.w.slice(0, io.hbs).unwrap();
        let write = IoRequest::write(1, slba, 1, one, 4).with_meta(io.meta(&self.w));
        match complete_one(&mut self.qp, write) {
            Err(IoError::Nvme(s)) => {
                assert!(s.same_code(Status::E2E_GUARD_CHECK_ERROR), "{what}: {s}")
            }
            other => panic!("{what}: bad guard written: {other:?}"),
        }
    }

    /// 8-byte PI: without metadata the controller checks and strips it on a read (PRACT,
    /// whose type 2 reference tag is the LBA, not this test's 0x5000: type 1 and 3 only).
    fn assert_pract_read_strips_the_pi(&mut self) {
        let (what, io) = (&self.what, &self.io);
        let data = self.r.slice(0, io.nlb as usize * io.lba).unwrap();
        let read = IoRequest::read(1, self.slba, io.nlb, data, 5);
        assert_eq!(
            complete_one(&mut self.qp, read),
            Ok(()),
            "{what}: PRACT read"
        );
        let plain = lent_bytes(&self.qp, &self.r);
        for b in 0..io.nlb as usize {
            assert!(
                plain[b * io.lba..(b + 1) * io.lba] == io.data[b * io.hbs..b * io.hbs + io.lba],
                "{what}: PRACT read of block {b}"
            );
        }
    }
}

/// A command carrying the caller's metadata keeps it through a retry: the SQE written
/// again from the tracker carries the same MPTR, initial reference tag (type 2: the
/// caller's) and application tag and mask, so the retried write and read pass the
/// controller's PI checks and move the same data and metadata.
#[test]
fn a_retried_metadata_command_carries_its_metadata_again() {
    use kestrel::nvme::qpair::ErrorInjection;
    use kestrel::spec::nvm_opc;
    for extended in [false, true] {
        let what = format!("type 2, ms 16, extended {extended}");
        let (lba, nlb) = (512u32, 8u32);
        let format = meta_format(16, extended, 2, false);
        let (_emu, c) = emu_of(vec![formatted(format, 4 << 20, lba)]);
        let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
        let io = MetaIo::new(&format, lba, nlb, 0x5000, (7, 8));
        let w = lend(&mut qp, c.dma_pool(), io.moff + io.mlen.max(1));
        io.store(&mut qp, &w);
        let r = lend(&mut qp, c.dma_pool(), io.moff + io.mlen.max(1));
        for (opc, buf, token) in [(nvm_opc::WRITE, &w, 1), (nvm_opc::READ, &r, 2)] {
            // Submitted, then completed with a retryable status: resubmitted once.
            assert!(qp.inject_error(ErrorInjection {
                opcode: Some(opc),
                status: Status::NAMESPACE_NOT_READY,
                count: 1,
                submit: true,
            }));
            let req = if opc == nvm_opc::WRITE {
                io.write(100, buf, token)
            } else {
                io.read(100, buf, token)
            };
            assert_eq!(complete_one(&mut qp, req), Ok(()), "{what}: opcode {opc}");
        }
        assert_eq!(qp.stats().retries, 2, "{what}: both commands were retried");
        io.assert_read_back(&lent_bytes(&qp, &r), &what);
    }
}
