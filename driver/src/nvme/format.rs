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
//! Pure policy over [`NsFormat`]: no I/O, no `unsafe`.

use crate::spec::{csi, NsFormat};

/// The smallest LBA data size the driver does I/O with.
pub const MIN_DATA_SIZE: u32 = 512;
/// The largest LBA data size the driver does I/O with (one memory page).
pub const MAX_DATA_SIZE: u32 = 4096;

/// What the driver supports, for messages.
pub const SUPPORTED: &str = "kestrel does i/o only to namespaces of the NVM Command Set with \
    an lba data size of 512 to 4096 bytes, no metadata (ms 0) and no end-to-end protection \
    (dps 0)";

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
    if format.csi != csi::NVM {
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
    if format.ms != 0 {
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
    if format.pi_type != 0 {
        why.push(format!(
            "end-to-end protection (type {}) is not implemented",
            format.pi_type
        ));
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
                fmt(12, 8, false, 1, 0),
                &["type 1 in the last", "protection (type 1)"],
            ),
            (
                fmt(12, 64, false, 0x0B, 0),
                &["type 3 in the first", "protection (type 3)"],
            ),
            (
                fmt(12, 16, true, 2, 0),
                &["extended", "protection (type 2)"],
            ),
            (
                fmt(12, 0, false, 0, csi::ZONED),
                &["Zoned Namespace Command Set (csi 0x02)"],
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
