//! Write, read back, compare: the data checks the cases share. A mismatch is reported at
//! its first differing byte, with its block and both values.

use kestrel::io::IoRequest;
use kestrel::{DmaSlice, IoQpair};

use crate::support::{fill, put, run_one};

/// Writes `data` at `lba` through `wbuf[off..]` and reads it back through `rbuf[off..]`
/// (both lent to `qp`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_read(
    qp: &mut IoQpair,
    nsid: u32,
    wbuf: &DmaSlice,
    rbuf: &DmaSlice,
    lba: u64,
    bs: usize,
    off: usize,
    data: &[u8],
) -> Result<(), String> {
    let nlb = (data.len() / bs) as u32;
    put(qp, wbuf, off, data)?;
    let w = wbuf.slice(off, data.len()).map_err(|e| e.to_string())?;
    let res = run_one(qp, IoRequest::write(nsid, lba, nlb, w, 1))?;
    ensure!(res.is_ok(), "write of {nlb} blocks at lba {lba}: {res:?}");
    let got = read_back(qp, nsid, rbuf, lba, bs, off, data.len())?;
    compare(&got, data, bs)
        .map_err(|e| format!("data mismatch: {nlb} blocks at lba {lba}, buffer offset {off}: {e}"))
}

/// Reads `want.len()` bytes at `lba` through the start of `rbuf` (lent to `qp`) with one
/// command and compares them with `want`; `what` (what the data is) leads the error.
pub(crate) fn read_compare(
    qp: &mut IoQpair,
    nsid: u32,
    rbuf: &DmaSlice,
    lba: u64,
    bs: usize,
    want: &[u8],
    what: &str,
) -> Result<(), String> {
    let got =
        read_back(qp, nsid, rbuf, lba, bs, 0, want.len()).map_err(|e| format!("{what}: {e}"))?;
    compare(&got, want, bs).map_err(|e| {
        format!(
            "{what}: {} blocks at lba {lba} differ: {e}",
            want.len() / bs
        )
    })
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

/// Reads `len` bytes at `lba` into `rbuf[off..]` (cleared first, so nothing of an
/// earlier read passes for this one) with one command, and returns them.
fn read_back(
    qp: &mut IoQpair,
    nsid: u32,
    rbuf: &DmaSlice,
    lba: u64,
    bs: usize,
    off: usize,
    len: usize,
) -> Result<Vec<u8>, String> {
    let nlb = (len / bs) as u32;
    fill(qp, rbuf, 0)?;
    let r = rbuf.slice(off, len).map_err(|e| e.to_string())?;
    let res = run_one(qp, IoRequest::read(nsid, lba, nlb, r, 2))?;
    ensure!(res.is_ok(), "read of {nlb} blocks at lba {lba}: {res:?}");
    let mut got = vec![0u8; len];
    qp.leases()
        .read(rbuf, off, &mut got)
        .map_err(|e| e.to_string())?;
    Ok(got)
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
