//! `kestrel write`: copy a file onto a byte range of a target (the namespace `/ns=N`
//! names, else the first one kestrel serves, or a file target) through the library's
//! queues, the counterpart of `kestrel read`: what another driver then reads back to
//! compare.

use std::io::Read as _;

use kestrel::IoRequest;

use crate::cli::WriteArgs;
use crate::error::{AppError, Result};
use crate::read::{geometry, one_spec, open_one, run_one, Chunks, IO_WAIT};

/// Runs `kestrel write`.
pub fn run(a: &WriteArgs) -> Result<()> {
    let spec = one_spec(&a.targets, "write")?;
    let os = |context: String| move |source| AppError::Os { context, source };
    let mut input =
        std::fs::File::open(&a.input).map_err(os(format!("opening {}", a.input.display())))?;
    let length = input
        .metadata()
        .map_err(os(format!("reading the size of {}", a.input.display())))?
        .len();
    let (_opened, t) = open_one(&spec, &a.targets)?;
    let info = t.info().clone();
    if info.read_only {
        return Err(AppError::usage(format!("{} is read-only", info.name)));
    }
    let (bs, cap) = geometry(&info)?;
    if a.offset % bs != 0 || length % bs != 0 || length == 0 {
        return Err(AppError::usage(format!(
            "--offset {} and the size of {} ({length} bytes) must be multiples of the block size {bs}, the size not 0",
            a.offset,
            a.input.display()
        )));
    }
    if a.offset.checked_add(length).is_none_or(|e| e > cap) {
        return Err(AppError::usage(format!(
            "--offset {} + {length} bytes of {} is past the end of {} ({cap} bytes)",
            a.offset,
            a.input.display(),
            info.name
        )));
    }
    let Chunks {
        len: chunk,
        mut q,
        md,
        buf,
    } = Chunks::new(&*t, &info)?;
    let mut copy = vec![0u8; chunk as usize];
    let mut off = a.offset;
    let end = a.offset + length;
    while off < end {
        let n = chunk.min(end - off);
        input
            .read_exact(&mut copy[..n as usize])
            .map_err(os(format!("reading {}", a.input.display())))?;
        md.write_data(&mut *q, &buf, &copy[..n as usize], off / bs, bs as usize)?;
        let (req, _) = md.request(
            IoRequest::write(info.nsid, off / bs, (n / bs) as u32, buf, off),
            &buf,
            bs as usize,
        )?;
        run_one(&mut *q, req, &format!("write at byte {off}"), IO_WAIT)?;
        off += n;
    }
    // Make it durable before another driver looks: Flush (NVMe) or fsync (file).
    let req = IoRequest::flush(info.nsid, u64::MAX);
    run_one(&mut *q, req, "flush", IO_WAIT)
}
