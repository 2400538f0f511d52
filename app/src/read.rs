//! `kestrel read`: copy a byte range of a target (the namespace `/ns=N` names, else the first
//! one kestrel serves, or a file target) to a file or stdout, through the library's queues:
//! what a test reads back to compare.

use std::io::Write;
use std::time::{Duration, Instant};

use kestrel::{IoRequest, QueueOptions, TargetQueue};

use crate::cli::ReadArgs;
use crate::error::{AppError, Result};
use crate::targets::{self, OpenOptions};

/// Runs `kestrel read`.
pub fn run(a: &ReadArgs) -> Result<()> {
    let specs = targets::specs_or_default(&a.targets.targets);
    if specs.len() != 1 {
        return Err(AppError::usage("kestrel read takes one --target"));
    }
    let opts = OpenOptions {
        noiommu: a.targets.noiommu,
        ..OpenOptions::default()
    };
    let opened = targets::open(&specs[0], &opts)?;
    let t = opened.block_targets()?.remove(0);
    let info = t.info().clone();
    let bs = info.block_size as u64;
    let cap = info.num_blocks * bs;
    if a.offset % bs != 0 || a.length % bs != 0 {
        return Err(AppError::usage(format!(
            "--offset {} and --length {} must be multiples of the block size {bs}",
            a.offset, a.length
        )));
    }
    if a.offset.checked_add(a.length).is_none_or(|e| e > cap) {
        return Err(AppError::usage(format!(
            "--offset {} + --length {} is past the end of {} ({cap} bytes)",
            a.offset, a.length, info.name
        )));
    }
    let chunk = (128u64 << 10).min(info.max_transfer_bytes.max(bs)) / bs * bs;
    let mut q = t.create_queue(&QueueOptions {
        depth: 4,
        sw_queue_depth: 4,
        ..QueueOptions::default()
    })?;
    let buf = t
        .dma_pool()
        .alloc(chunk as usize)
        .map_err(kestrel::Error::from)?;
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |source| AppError::Os {
                context: format!("creating {}", p.display()),
                source,
            },
        )?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut copy = vec![0u8; chunk as usize];
    let mut off = a.offset;
    let end = a.offset + a.length;
    while off < end {
        let n = chunk.min(end - off);
        let nlb = (n / bs) as u32;
        let slice = buf.slice(0, n as usize).map_err(kestrel::Error::from)?;
        let req = IoRequest::read(info.nsid, off / bs, nlb, slice, off);
        run_one(&mut *q, req, &format!("read at byte {off}"))?;
        buf.read_at(0, &mut copy[..n as usize])
            .map_err(kestrel::Error::from)?;
        out.write_all(&copy[..n as usize])
            .map_err(|source| AppError::Os {
                context: "writing the output".into(),
                source,
            })?;
        off += n;
    }
    out.flush().map_err(|source| AppError::Os {
        context: "writing the output".into(),
        source,
    })?;
    Ok(())
}

/// Submits one request, rings its doorbell and polls until it completes (at most 30 s);
/// errors are named by `what` ("read at byte N", "flush").
pub(crate) fn run_one(q: &mut dyn TargetQueue, req: IoRequest, what: &str) -> Result<()> {
    q.submit(req)
        .map_err(|e| AppError::runtime(format!("{what}: {e}")))?;
    q.flush();
    let start = Instant::now();
    let mut result = None;
    while result.is_none() {
        q.poll(1, &mut |c| result = Some(c.result));
        if start.elapsed() > Duration::from_secs(30) {
            return Err(AppError::runtime(format!(
                "{what} did not complete in 30 s"
            )));
        }
    }
    if let Some(Err(e)) = result {
        return Err(AppError::runtime(format!("{what}: {e}")));
    }
    Ok(())
}
