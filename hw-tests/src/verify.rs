//! Write, read back, compare: the data checks the cases share, in the form the
//! namespace's format needs ([`crate::blocks`]). A mismatch is reported at its first
//! differing byte, with its block and both values.

use kestrel::target::TargetQueue;

use crate::blocks::Blocks;
use crate::desc::NsDesc;

/// Writes `data` at `lba` through `w` and reads it back through `r` (both lent to `q`),
/// each with one request; the data and the metadata must come back.
pub(crate) fn write_read(
    q: &mut dyn TargetQueue,
    ns: &NsDesc,
    w: &Blocks,
    r: &Blocks,
    lba: u64,
    data: &[u8],
) -> Result<(), String> {
    let n = data.len() / ns.block_size;
    ns.write(q, w, lba, data)?;
    read_compare(
        q,
        ns,
        r,
        lba,
        data,
        &format!("{n} blocks written at lba {lba}"),
    )
}

/// Reads `want.len()` bytes of data at `lba` through `r` (lent to `q`) with one request
/// and compares them with `want`; `what` (what the data is) leads the error.
pub(crate) fn read_compare(
    q: &mut dyn TargetQueue,
    ns: &NsDesc,
    r: &Blocks,
    lba: u64,
    want: &[u8],
    what: &str,
) -> Result<(), String> {
    let n = want.len() / ns.block_size;
    let got = ns.read(q, r, lba, n).map_err(|e| format!("{what}: {e}"))?;
    compare(&got, want, ns.block_size)
        .map_err(|e| format!("{what}: {n} blocks at lba {lba} differ: {e}"))
}

/// `got` against `want` (blocks of `bs` bytes): where they first differ.
pub(crate) fn compare(got: &[u8], want: &[u8], bs: usize) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} bytes, want {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(first) => Err(format!(
            "first bad byte {first} (block {}): got {:#04x} want {:#04x}",
            first / bs,
            got[first],
            want[first]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::compare;

    #[test]
    fn compare_names_the_first_differing_byte_and_its_block() {
        let want = vec![7u8; 1024];
        assert_eq!(compare(&want, &want, 512), Ok(()));
        let mut got = want.clone();
        got[600] = 8;
        got[900] = 9;
        assert_eq!(
            compare(&got, &want, 512).unwrap_err(),
            "first bad byte 600 (block 1): got 0x08 want 0x07"
        );
        assert_eq!(
            compare(&want[..512], &want, 512).unwrap_err(),
            "512 bytes, want 1024"
        );
    }
}
