//! The metadata of `kestrel perf`'s I/Os on namespaces formatted with it: the bytes outside
//! the protection information (a pattern of LBA and generation, checked under `--verify`),
//! the reference and application tags written into the PI, and PI check failures reported
//! as mismatches named after the spec's checks.

use kestrel::io::MetaLayout;
use kestrel::spec::pi::{PiError, PiFormat, PiType};

use crate::perf::verify::Mismatch;

/// The application tag `kestrel perf` writes into protection information ("KS").
pub(super) const APP_TAG: u16 = 0x4B53;

/// The reference tag of the first block of an I/O at `lba`: the low 32 bits of the LBA for
/// type 1 (as the spec requires); for type 2, the caller's own numbering (the LBA offset
/// by 2^31, so a controller that used the LBA instead would fail the check); for type 3,
/// not checked, the LBA.
pub(super) fn ref_tag(f: &PiFormat, lba: u64) -> u32 {
    match f.pi_type {
        PiType::Type2 => (lba as u32).wrapping_add(1 << 31),
        _ => lba as u32,
    }
}

/// The metadata bytes outside the PI of block `i` of an I/O, within the buffers:
/// interleaved in `data` (extended) or in `md`.
pub(super) fn md_block<'a>(
    m: &MetaLayout,
    data_size: usize,
    data: &'a mut [u8],
    md: &'a mut [u8],
    i: usize,
) -> &'a mut [u8] {
    let ms = m.ms as usize;
    if m.extended {
        &mut data[i * (data_size + ms) + data_size..][..ms]
    } else {
        &mut md[i * ms..][..ms]
    }
}

/// The byte range of the PI inside a block's metadata (empty without PI).
pub(super) fn pi_range(m: &MetaLayout) -> std::ops::Range<usize> {
    if m.pi_type == 0 {
        0..0
    } else {
        m.pi_offset()..m.pi_offset() + kestrel::spec::pi::PI_SIZE
    }
}

/// Byte `k` of the metadata of generation `gen` of `lba` (outside the PI).
pub(super) fn md_byte(lba: u64, gen: u64, k: usize) -> u8 {
    (lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ gen.rotate_left(17)).rotate_left(k as u32 % 64) as u8
        ^ k as u8
}

/// Fills the metadata of every block of an I/O at `lba` outside the PI.
pub(super) fn fill_metadata(
    m: &MetaLayout,
    data_size: usize,
    data: &mut [u8],
    md: &mut [u8],
    lba: u64,
    gen: u64,
) {
    let n = data.len() / m.host_block_size(data_size as u32, true) as usize;
    let pi = pi_range(m);
    for i in 0..n {
        for (k, b) in md_block(m, data_size, data, md, i).iter_mut().enumerate() {
            if !pi.contains(&k) {
                *b = md_byte(lba + i as u64, gen, k);
            }
        }
    }
}

/// Checks the metadata outside the PI of block `i` (at `lba`), written as generation `gen`.
pub(super) fn check_metadata(
    m: &MetaLayout,
    data_size: usize,
    data: &[u8],
    md: &[u8],
    i: usize,
    lba: u64,
    gen: u64,
) -> Result<(), Mismatch> {
    let pi = pi_range(m);
    let ms = m.ms as usize;
    let blk = if m.extended {
        &data[i * (data_size + ms) + data_size..][..ms]
    } else {
        &md[i * ms..][..ms]
    };
    for (k, &b) in blk.iter().enumerate() {
        let want = md_byte(lba, gen, k);
        if !pi.contains(&k) && b != want {
            return Err(Mismatch {
                lba,
                field: "metadata",
                expected: u64::from(want),
                actual: u64::from(b),
                expect: None,
                found: None,
            });
        }
    }
    Ok(())
}

/// A protection information check that failed in software, as a mismatch named after the
/// spec's check.
pub(super) fn pi_mismatch(lba: u64, e: PiError) -> Mismatch {
    let (field, expected, actual) = match e {
        PiError::Guard { found, computed } => ("end-to-end guard", computed.into(), found.into()),
        PiError::AppTag {
            found, expected, ..
        } => ("end-to-end application tag", expected.into(), found.into()),
        PiError::RefTag { found, expected } => {
            ("end-to-end reference tag", expected.into(), found.into())
        }
    };
    Mismatch {
        lba,
        field,
        expected,
        actual,
        expect: None,
        found: None,
    }
}
