//! Which namespace formats the driver implements, and the refusal of every other one.
//!
//! A namespace's format decides what crosses the wire with each command: metadata in a
//! separate buffer (MPTR), metadata interleaved with the data (extended LBAs, where the
//! transfer length counts both), protection information the controller checks or inserts
//! (PRINFO and the reference tags), or another command set with rules of its own (zoned
//! namespaces). A driver that sends plain reads and writes to such a namespace does not get
//! an error: the controller DMAs metadata to address 0 or fails writes with statuses the
//! caller cannot explain. So the rule is: I/O goes only to namespaces whose format is in
//! [`check`]'s list; every other namespace is listed with the reason and refused at open
//! (`NvmeNamespace::new`, in the target layer) and at submission (the qpair), before anything
//! reaches the device.
//!
//! Metadata crosses the wire with every Read and Write that carries it ([`IoMeta`]): in a
//! separate buffer (MPTR, one contiguous region per command) or interleaved with the data
//! (extended LBAs, where the data buffer, its PRPs and MDTS count data + metadata).
//!
//! Protection information (16-bit guard, types 1, 2 and 3, first or last bytes of the
//! metadata) is handled in one of two ways per request. With the caller's metadata, the PI
//! in it is sent as it is, without PRACT, and the controller checks it (PRCHK: the guard,
//! the reference tag for types 1 and 2 against the initial reference tag of the command —
//! the low 32 bits of its first LBA for type 1, the caller's for type 2 — and the
//! application tag under the caller's mask). Without metadata, on a namespace whose
//! metadata is exactly the 8-byte PI, every Read, Write and Write Zeroes carries PRACT, as
//! the Linux driver does when it has no integrity buffer: the controller generates the PI
//! on writes and checks and strips it on reads, and only data crosses the wire. See
//! [`IoProtection`].
//!
//! Pure policy over [`NsFormat`]: no I/O, no `unsafe`.

use crate::io::{IoMeta, MetaLayout};
use crate::spec::pi::{Prinfo, PI_SIZE};
use crate::spec::{csi, NsFormat};

/// The smallest LBA data size the driver does I/O with.
pub const MIN_DATA_SIZE: u32 = 512;
/// The largest LBA data size the driver does I/O with (one memory page).
pub const MAX_DATA_SIZE: u32 = 4096;

/// What the driver supports, for messages.
pub const SUPPORTED: &str = "kestrel does i/o only to namespaces of the NVM Command Set with \
    an lba data size of 512 to 4096 bytes, any metadata (separate or extended) and, within \
    it, protection information of type 1, 2 or 3 with a 16-bit guard, and to zoned namespaces \
    (Zoned Namespace Command Set) of such a size without metadata";

/// What every Read, Write and Write Zeroes to a namespace carries for its metadata and
/// protection information.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct IoProtection {
    /// The PI type (0: none).
    pub pi_type: u8,
    /// PRINFO for a request without the caller's metadata, placed in CDW12: PRACT and the
    /// checks (PI formats whose metadata is exactly the PI); 0 otherwise.
    pub prinfo: Prinfo,
    /// Whether CDW14 carries the expected initial reference tag (types 1 and 2).
    pub ref_tag: bool,
    /// MS: metadata bytes per block (0: none).
    pub ms: u16,
    /// The metadata is interleaved with the data (an extended LBA).
    pub extended: bool,
    /// The PI is the first bytes of the metadata (DPS bit 3).
    pub pi_first: bool,
}

impl IoProtection {
    /// No metadata, no protection information.
    pub const NONE: IoProtection = IoProtection {
        pi_type: 0,
        prinfo: Prinfo(0),
        ref_tag: false,
        ms: 0,
        extended: false,
        pi_first: false,
    };

    /// What `format` needs (call [`check`] first: this assumes a supported format).
    pub fn of(format: &NsFormat) -> IoProtection {
        let pi_type = if format.pi_type <= 3 {
            format.pi_type
        } else {
            0
        };
        let pract = pi_type != 0 && usize::from(format.ms) == PI_SIZE;
        let checks = match pi_type {
            1 | 2 => Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF,
            // Type 3: the reference tag is not defined; the guard is checked.
            3 => Prinfo::PRCHK_GUARD,
            _ => 0,
        };
        IoProtection {
            pi_type,
            prinfo: Prinfo(if pract { Prinfo::PRACT | checks } else { 0 }),
            ref_tag: matches!(pi_type, 1 | 2),
            ms: format.ms,
            extended: format.extended,
            pi_first: format.pi_first,
        }
    }

    /// The metadata layout, or `None` without metadata.
    pub fn layout(&self) -> Option<MetaLayout> {
        (self.ms != 0).then_some(MetaLayout {
            ms: self.ms,
            extended: self.extended,
            pi_type: self.pi_type,
            pi_first: self.pi_first,
        })
    }

    /// Whether every read and write must carry the caller's metadata (all but the 8-byte
    /// PI, which PRACT can insert and strip).
    pub fn required(&self) -> bool {
        self.ms != 0 && !self.prinfo.pract()
    }

    /// Bytes per block in the data buffer of a request with or without metadata.
    #[inline]
    pub fn host_block_size(&self, data_size: u32, with_metadata: bool) -> u32 {
        if self.extended && with_metadata {
            data_size + u32::from(self.ms)
        } else {
            data_size
        }
    }

    /// CDW12 bits for a Read or Write of `lba` without the caller's metadata, and the CDW14
    /// value (the initial reference tag).
    #[inline]
    pub fn command_dwords(&self, lba: u64) -> (u32, u32) {
        (
            self.prinfo.to_cdw12(),
            if self.ref_tag { lba as u32 } else { 0 },
        )
    }

    /// CDW12 bits, CDW14 and CDW15 of a Read or Write of `lba`, block `blk_off` of a
    /// request that carries the caller's metadata `meta`: no PRACT; PRCHK the guard, the
    /// reference tag (types 1 and 2) and the application tag when the mask asks; the
    /// initial reference tag (type 1: the LBA, type 2: the caller's, counted on by
    /// `blk_off`; type 3: none); the application tag and mask.
    #[inline]
    pub fn caller_dwords(&self, lba: u64, blk_off: u32, meta: &IoMeta) -> (u32, u32, u32) {
        let (mut chk, ilbrt) = match self.pi_type {
            1 => (Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF, lba as u32),
            2 => (
                Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF,
                meta.ref_tag.wrapping_add(blk_off),
            ),
            3 => (Prinfo::PRCHK_GUARD, 0),
            _ => return (0, 0, 0),
        };
        if meta.app_mask != 0 {
            chk |= Prinfo::PRCHK_APP;
        }
        (
            Prinfo(chk).to_cdw12(),
            ilbrt,
            u32::from(meta.app_tag) | u32::from(meta.app_mask) << 16,
        )
    }

    /// The same for a Write Zeroes: PRACT (the controller generates the zeroed blocks' PI
    /// from the reference tag) without checks, since no data comes from the host to check
    /// (controllers such as QEMU's refuse PRCHK on Write Zeroes).
    #[inline]
    pub fn write_zeroes_dwords(&self, lba: u64) -> (u32, u32) {
        let cdw14 = if self.ref_tag { lba as u32 } else { 0 };
        let pract = if self.pi_type != 0 { Prinfo::PRACT } else { 0 };
        (Prinfo(pract).to_cdw12(), cdw14)
    }

    /// In words, for reports: how the metadata and PI are served.
    pub fn describe(&self) -> String {
        let checks = if self.ref_tag {
            "guard and reference tag"
        } else {
            "guard"
        };
        let md = if self.extended {
            format!("{} bytes of metadata per block interleaved with the data (extended lba: data buffers carry {} more bytes per block)", self.ms, self.ms)
        } else {
            format!(
                "{} bytes of metadata per block in a separate buffer (mptr)",
                self.ms
            )
        };
        match (self.ms, self.pi_type, self.prinfo.pract()) {
            (0, _, _) => "none".into(),
            (_, 0, _) => format!("{md}, required with every read and write; no protection information"),
            (_, t, true) => format!(
                "pi type {t}: inserted and checked by the controller (PRACT; {checks} checked) when the caller gives no metadata, else {md} with the caller's PI checked by the controller (PRCHK)"
            ),
            (_, t, false) => format!(
                "{md}, required with every read and write; pi type {t} in its {} 8 bytes, from the caller, checked by the controller (PRCHK {checks})",
                if self.pi_first { "first" } else { "last" }
            ),
        }
    }
}

/// A namespace whose format the driver does not implement, or whose Identify data it
/// cannot use (`identify_fault`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UnsupportedFormat {
    /// The namespace.
    pub nsid: u32,
    /// Its format.
    pub format: NsFormat,
    /// What about it the driver does not implement, most important first.
    pub why: String,
    /// The refusal is not about the format but about what the controller reports of the
    /// namespace (a size in bytes that does not fit in 64 bits): no other format helps.
    pub identify_fault: bool,
}

impl std::fmt::Display for UnsupportedFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (nsid, format, why) = (self.nsid, &self.format, &self.why);
        if self.identify_fault {
            write!(
                f,
                "nsid {nsid} is refused: {why}; kestrel does no i/o to it: check the \
                 controller's firmware (or the transport) and use another namespace"
            )
        } else {
            write!(
                f,
                "nsid {nsid}: {format} is not supported ({why}); {SUPPORTED}: choose such an \
                 lba format (for example `nvme format /dev/nvmeXnY --lbaf=N` under the kernel \
                 driver) or another namespace; see docs/formats.md"
            )
        }
    }
}

impl std::error::Error for UnsupportedFormat {}

/// Checks that the driver implements `format`; the error says what it does not.
pub fn check(nsid: u32, format: &NsFormat) -> Result<(), UnsupportedFormat> {
    let mut why: Vec<String> = Vec::new();
    let zoned = format.csi == csi::ZONED;
    if zoned && (format.ms != 0 || format.pi_type != 0) {
        why.push(format!(
            "a zoned namespace with metadata (ms {}, dps {:#04x}) is not implemented: only \
             zoned namespaces without metadata are",
            format.ms, format.dps
        ));
    } else if format.csi != csi::NVM && !zoned {
        why.push(format!(
            "the {} (csi {:#04x}) is not implemented",
            csi::name(format.csi),
            format.csi
        ));
    }
    match format.data_size() {
        None => why.push("the lba format in use is invalid".into()),
        Some(d) if !(MIN_DATA_SIZE..=MAX_DATA_SIZE).contains(&d) => {
            why.push(format!("an lba data size of {d} bytes is not implemented"))
        }
        Some(_) => {}
    }
    if format.pi_type > 3 {
        why.push(format!(
            "end-to-end protection of reserved type {} is not implemented",
            format.pi_type
        ));
    } else if format.pi_type != 0 && usize::from(format.ms) < PI_SIZE {
        why.push(format!(
            "end-to-end protection (type {}) in {} bytes of metadata is invalid: the \
             protection information takes 8",
            format.pi_type, format.ms
        ));
    } else if format.pi_type != 0 && format.pif != 0 {
        why.push(match format.pif {
            1 => "protection information with a 32-bit guard (pif 1) is not implemented".into(),
            2 => "protection information with a 64-bit guard (pif 2) is not implemented".into(),
            p => format!(
                "the protection information format (pif {p}) is reserved or could not be read \
                 (NVM Command Set Identify Namespace)"
            ),
        });
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(UnsupportedFormat {
            nsid,
            format: *format,
            why: why.join("; "),
            identify_fault: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{IdentifyNamespace, LbaFormat};

    fn fmt(lbads: u8, ms: u16, flbas_ext: bool, dps: u8, csi: u8) -> NsFormat {
        let mut ns = IdentifyNamespace {
            nsze: 1024,
            nlbaf: 1,
            flbas: 1 | if flbas_ext { 0x10 } else { 0 },
            dps,
            ..Default::default()
        };
        ns.lbaf[1] = LbaFormat { ms, lbads, rp: 0 };
        NsFormat::of(&ns, csi)
    }

    #[test]
    fn plain_formats_are_accepted() {
        for lbads in 9..=12 {
            assert_eq!(check(1, &fmt(lbads, 0, false, 0, csi::NVM)), Ok(()));
        }
        // FLBAS bit 4 means nothing without metadata.
        assert_eq!(check(1, &fmt(12, 0, true, 0, csi::NVM)), Ok(()));
        // Zoned namespaces without metadata.
        for lbads in [9, 12] {
            assert_eq!(check(1, &fmt(lbads, 0, false, 0, csi::ZONED)), Ok(()));
        }
    }

    #[test]
    fn pi_only_metadata_is_accepted_with_pract() {
        for ext in [false, true] {
            for (dps, checks) in [
                (1, Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF),
                (2, Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF),
                (3, Prinfo::PRCHK_GUARD),
                // The PI's place in the metadata means nothing when it is all of it.
                (0x9, Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF),
            ] {
                for lbads in [9, 12] {
                    let f = fmt(lbads, 8, ext, dps, csi::NVM);
                    assert_eq!(check(1, &f), Ok(()), "{f}");
                    let p = IoProtection::of(&f);
                    assert!(!p.required(), "{f}: PRACT serves requests without metadata");
                    assert_eq!(p.prinfo, Prinfo(Prinfo::PRACT | checks), "{f}");
                    assert_eq!(p.pi_type, dps & 7);
                    let (cdw12, cdw14) = p.command_dwords(0x1_2345_6789);
                    assert_eq!(Prinfo::from_cdw12(cdw12), p.prinfo);
                    assert_eq!(cdw14, if dps & 7 == 3 { 0 } else { 0x2345_6789 });
                }
            }
        }
        assert_eq!(
            IoProtection::of(&fmt(12, 0, false, 0, csi::NVM)),
            IoProtection::NONE
        );
        assert_eq!(IoProtection::NONE.command_dwords(77), (0, 0));
        let p = IoProtection::of(&fmt(12, 8, false, 1, csi::NVM));
        assert_eq!(
            p.write_zeroes_dwords(5),
            (Prinfo(Prinfo::PRACT).to_cdw12(), 5),
            "write zeroes: PRACT and the tag, no checks"
        );
    }

    #[test]
    fn metadata_formats_are_accepted_with_the_caller_s_metadata() {
        for ext in [false, true] {
            for (ms, dps) in [(8, 0), (16, 0), (64, 0), (16, 1), (16, 0x0A), (64, 3)] {
                let f = fmt(12, ms, ext, dps, csi::NVM);
                assert_eq!(check(1, &f), Ok(()), "{f}");
                let p = IoProtection::of(&f);
                assert!(p.required(), "{f}: only the 8-byte PI can be left to PRACT");
                assert!(!p.prinfo.pract());
                assert_eq!(
                    p.host_block_size(4096, true),
                    4096 + if ext { ms as u32 } else { 0 }
                );
                assert_eq!(p.host_block_size(4096, false), 4096);
                assert_eq!(p.layout().map(|l| l.ms), Some(ms));
            }
        }
        // The caller's PI: no PRACT, PRCHK as the type allows, tags per type.
        let m = IoMeta::extended().with_tags(500, 0xAB, 0xFF);
        for (dps, chk, ilbrt) in [
            (
                1,
                Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF | Prinfo::PRCHK_APP,
                0x2345_6789,
            ),
            (
                2,
                Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF | Prinfo::PRCHK_APP,
                503,
            ),
            (3, Prinfo::PRCHK_GUARD | Prinfo::PRCHK_APP, 0),
        ] {
            let p = IoProtection::of(&fmt(12, 16, false, dps, csi::NVM));
            let (c12, c14, c15) = p.caller_dwords(0x1_2345_6789, 3, &m);
            assert_eq!(Prinfo::from_cdw12(c12), Prinfo(chk), "type {dps}");
            assert_eq!(
                c14,
                if dps == 1 { 0x2345_6789 } else { ilbrt },
                "type {dps}"
            );
            assert_eq!(c15, 0x00FF_00AB);
        }
        // No application tag check without a mask.
        let p = IoProtection::of(&fmt(12, 16, false, 1, csi::NVM));
        let (c12, _, _) = p.caller_dwords(0, 0, &IoMeta::extended());
        assert!(!Prinfo::from_cdw12(c12).check_app());
    }

    #[test]
    fn every_other_format_is_refused_with_its_reason() {
        let mut g64 = fmt(12, 16, false, 1, csi::NVM);
        g64.pif = 2;
        let mut g32 = fmt(12, 16, true, 3, csi::NVM);
        g32.pif = 1;
        let mut unknown = fmt(12, 16, false, 2, csi::NVM);
        unknown.pif = 3;
        let cases: &[(NsFormat, &[&str])] = &[
            (g64, &["64-bit guard (pif 2)", "is not implemented"]),
            (g32, &["32-bit guard (pif 1)", "is not implemented"]),
            (unknown, &["pif 3", "could not be read"]),
            (fmt(12, 8, false, 5, 0), &["reserved type 5"]),
            (
                fmt(12, 4, false, 1, 0),
                &["in 4 bytes of metadata is invalid"],
            ),
            (
                fmt(12, 8, false, 1, csi::ZONED),
                &["a zoned namespace with metadata (ms 8, dps 0x01)"],
            ),
            (
                fmt(12, 0, false, 0, csi::KEY_VALUE),
                &["Key Value Command Set"],
            ),
            (
                fmt(12, 0, false, 0, 0x30),
                &["unknown command set (csi 0x30)"],
            ),
            (fmt(13, 0, false, 0, 0), &["lba data size of 8192 bytes"]),
            (fmt(16, 0, false, 0, 0), &["lba data size of 65536 bytes"]),
            (
                fmt(4, 0, false, 0, 0),
                &["invalid lbads 4", "lba format in use is invalid"],
            ),
        ];
        for (f, wants) in cases {
            let e = check(7, f).expect_err("refused");
            let msg = e.to_string();
            for w in wants
                .iter()
                .chain(&["nsid 7", "docs/formats.md", "dps", "flbas"])
            {
                assert!(msg.contains(w), "{msg:?} lacks {w:?}");
            }
        }
    }
}
