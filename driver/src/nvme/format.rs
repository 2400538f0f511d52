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
//! Protection information is implemented the way the Linux driver does it when it has no
//! integrity buffer to offer: for a namespace whose metadata is exactly the 8-byte
//! protection information (type 1, 2 or 3; extended or separate), every Read, Write and
//! Write Zeroes carries PRACT, so the controller generates the PI on writes and checks and
//! strips it on reads. Only data crosses the wire (no MPTR, no interleaved metadata); the
//! controller still checks the guard (and, for types 1 and 2, the reference tag, which the
//! driver sets to the low 32 bits of the command's first LBA) and fails a command whose
//! check fails with the End-to-end ... Check Error statuses. See [`IoProtection`].
//!
//! Pure policy over [`NsFormat`]: no I/O, no `unsafe`.

use crate::spec::pi::{Prinfo, PI_SIZE};
use crate::spec::{csi, NsFormat};

/// The smallest LBA data size the driver does I/O with.
pub const MIN_DATA_SIZE: u32 = 512;
/// The largest LBA data size the driver does I/O with (one memory page).
pub const MAX_DATA_SIZE: u32 = 4096;

/// What the driver supports, for messages.
pub const SUPPORTED: &str = "kestrel does i/o only to namespaces of the NVM Command Set with \
    an lba data size of 512 to 4096 bytes and either no metadata (ms 0, dps 0) or metadata \
    that is exactly the 8-byte protection information of type 1, 2 or 3 (ms 8, which the \
    controller inserts and checks), and to zoned namespaces (Zoned Namespace Command Set) \
    of such a size without metadata";

/// What every Read, Write and Write Zeroes to a namespace carries for its protection
/// information: nothing for a namespace without metadata; PRACT, the checks and the
/// reference tag for one whose 8 bytes of metadata are the PI.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct IoProtection {
    /// The PI type (0: none).
    pub pi_type: u8,
    /// PRINFO, placed in CDW12.
    pub prinfo: Prinfo,
    /// Whether CDW14 carries the expected initial reference tag: the low 32 bits of the
    /// command's first LBA (types 1 and 2).
    pub ref_tag: bool,
}

impl IoProtection {
    /// No protection information.
    pub const NONE: IoProtection = IoProtection {
        pi_type: 0,
        prinfo: Prinfo(0),
        ref_tag: false,
    };

    /// What `format` needs (call [`check`] first: this assumes a supported format).
    pub fn of(format: &NsFormat) -> IoProtection {
        match format.pi_type {
            1 | 2 => IoProtection {
                pi_type: format.pi_type,
                prinfo: Prinfo(Prinfo::PRACT | Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF),
                ref_tag: true,
            },
            // Type 3: the reference tag is not defined; the guard is checked.
            3 => IoProtection {
                pi_type: 3,
                prinfo: Prinfo(Prinfo::PRACT | Prinfo::PRCHK_GUARD),
                ref_tag: false,
            },
            _ => IoProtection::NONE,
        }
    }

    /// CDW12 bits for a Read or Write of `lba`, and the CDW14 value (the initial
    /// reference tag).
    #[inline]
    pub fn command_dwords(&self, lba: u64) -> (u32, u32) {
        (
            self.prinfo.to_cdw12(),
            if self.ref_tag { lba as u32 } else { 0 },
        )
    }

    /// The same for a Write Zeroes: PRACT (the controller generates the zeroed blocks' PI
    /// from the reference tag) without checks, since no data comes from the host to check
    /// (controllers such as QEMU's refuse PRCHK on Write Zeroes).
    #[inline]
    pub fn write_zeroes_dwords(&self, lba: u64) -> (u32, u32) {
        let (_, cdw14) = self.command_dwords(lba);
        (Prinfo(self.prinfo.0 & Prinfo::PRACT).to_cdw12(), cdw14)
    }

    /// In words, for reports: "none", or what the controller does.
    pub fn describe(&self) -> String {
        match self.pi_type {
            0 => "none".into(),
            t => format!(
                "pi type {t} inserted and checked by the controller (PRACT; guard{} checked)",
                if self.ref_tag {
                    " and reference tag"
                } else {
                    ""
                }
            ),
        }
    }
}

/// A namespace whose format the driver does not implement.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error(
    "nsid {nsid}: {format} is not supported ({why}); {SUPPORTED}: choose such an lba format \
     (for example `nvme format /dev/nvmeXnY --lbaf=N` under the kernel driver) or another \
     namespace; see docs/formats.md"
)]
pub struct UnsupportedFormat {
    /// The namespace.
    pub nsid: u32,
    /// Its format.
    pub format: NsFormat,
    /// What about it the driver does not implement, most important first.
    pub why: String,
}

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
    let pi_only = format.pi_type != 0 && usize::from(format.ms) == PI_SIZE;
    if format.pi_type > 3 {
        why.push(format!(
            "end-to-end protection of reserved type {} is not implemented",
            format.pi_type
        ));
    } else if format.pi_type != 0 && !pi_only {
        why.push(format!(
            "end-to-end protection (type {}) with {} bytes of metadata is not implemented: only \
             metadata that is exactly the 8-byte protection information is ({} metadata \
             beyond it would have to cross the wire)",
            format.pi_type,
            format.ms,
            if format.extended {
                "extended-lba"
            } else {
                "separate"
            }
        ));
    } else if format.ms != 0 && format.pi_type == 0 {
        why.push(if format.extended {
            format!(
                "extended-lba metadata ({} bytes per block) is not implemented",
                format.ms
            )
        } else {
            format!(
                "separate metadata ({} bytes per block) is not implemented",
                format.ms
            )
        });
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(UnsupportedFormat {
            nsid,
            format: *format,
            why: why.join("; "),
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
    fn every_other_format_is_refused_with_its_reason() {
        let cases: &[(NsFormat, &[&str])] = &[
            (
                fmt(12, 8, false, 0, 0),
                &["ms 8 B in a separate buffer", "separate metadata"],
            ),
            (
                fmt(9, 8, true, 0, 0),
                &["extended lba", "extended-lba metadata (8 bytes"],
            ),
            (
                fmt(12, 64, false, 0x0B, 0),
                &["type 3 in the first", "protection (type 3) with 64 bytes"],
            ),
            (
                fmt(12, 16, true, 2, 0),
                &[
                    "extended",
                    "protection (type 2) with 16 bytes",
                    "extended-lba metadata beyond",
                ],
            ),
            (fmt(12, 8, false, 5, 0), &["reserved type 5"]),
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
