//! `kestrel read`: copy a byte range of a target (the namespace `/ns=N` names, else the first
//! one kestrel serves, or a file target) to a file or stdout, through the library's queues:
//! what a test reads back to compare.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::target::TargetInfo;
use kestrel::{DmaSlice, IoRequest, QueueOptions, Target, TargetQueue};

use crate::cli::{ReadArgs, TargetArgs};
use crate::error::{AppError, Result};
use crate::parse::TargetSpec;
use crate::targets::{self, OpenOptions, Opened};

/// Runs `kestrel read`.
pub fn run(a: &ReadArgs) -> Result<()> {
    let spec = one_spec(&a.targets, "read")?;
    let (_opened, t) = open_one(&spec, &a.targets)?;
    let info = t.info().clone();
    let (bs, cap) = geometry(&info)?;
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
    let Chunks {
        len: chunk,
        mut q,
        md,
        buf,
    } = Chunks::new(&*t, &info)?;
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
        let (req, data_len) = md.request(
            IoRequest::read(info.nsid, off / bs, nlb, buf, off),
            &buf,
            bs as usize,
        )?;
        run_one(&mut *q, req, &format!("read at byte {off}"), IO_WAIT)?;
        md.read_data(&*q, &buf, data_len, bs as usize, &mut copy[..n as usize])?;
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

/// The block size and the capacity in bytes of a target, checked: a target whose block
/// size is 0 or whose blocks x block size does not fit in 64 bits is an error (the
/// library refuses such a namespace when it opens it; this does not rely on that).
pub(crate) fn geometry(info: &TargetInfo) -> Result<(u64, u64)> {
    let bs = u64::from(info.block_size);
    match info.num_blocks.checked_mul(bs) {
        Some(cap) if bs != 0 => Ok((bs, cap)),
        _ => Err(AppError::runtime(format!(
            "{} (nsid {}) reports {} blocks of {bs} bytes, which is not a size kestrel can \
             address (zero-byte blocks, or more than 2^64 bytes); its identify data is wrong",
            info.name, info.nsid, info.num_blocks
        ))),
    }
}

/// The one target `kestrel read` or `kestrel write` (`cmd`) takes, or a usage error.
pub(crate) fn one_spec(a: &TargetArgs, cmd: &str) -> Result<TargetSpec> {
    let mut specs = targets::specs_or_default(&a.targets);
    if specs.len() != 1 {
        return Err(AppError::usage(format!("kestrel {cmd} takes one --target")));
    }
    Ok(specs.remove(0))
}

/// Opens `spec` and takes its block target: the namespace `/ns=N` names, else the first
/// one kestrel serves, or the file (with what was opened, kept alive beside it).
pub(crate) fn open_one(spec: &TargetSpec, a: &TargetArgs) -> Result<(Opened, Arc<dyn Target>)> {
    let opts = OpenOptions {
        noiommu: a.noiommu,
        ..OpenOptions::default()
    };
    let opened = targets::open(spec, &opts)?;
    let t = opened.block_targets()?.remove(0);
    Ok((opened, t))
}

/// What `kestrel read` and `kestrel write` copy through: a queue of depth 4, the metadata
/// the format needs and a buffer for one chunk (at most 128 KiB, whole blocks, no more
/// than the target transfers at once), lent to the queue (which frees it when dropped).
pub(crate) struct Chunks {
    /// Bytes of a chunk.
    pub(crate) len: u64,
    pub(crate) q: Box<dyn TargetQueue>,
    pub(crate) md: Meta,
    /// The chunk buffer, lent to `q`: its bytes are reached through `q`.
    pub(crate) buf: DmaSlice,
}

impl Chunks {
    pub(crate) fn new(t: &dyn Target, info: &TargetInfo) -> Result<Self> {
        let bs = info.block_size as u64;
        let len = (128u64 << 10).min(info.max_transfer_bytes.max(bs)) / bs * bs;
        let mut q = t.create_queue(&QueueOptions {
            depth: 4,
            sw_queue_depth: 4,
            ..QueueOptions::default()
        })?;
        let md = Meta::of(info);
        let buf = t
            .dma_pool()
            .alloc(md.buf_len(len as usize / bs as usize, bs as usize))
            .map_err(kestrel::Error::from)?;
        let buf = q.lend(buf)?;
        Ok(Chunks { len, q, md, buf })
    }
}

/// How long `kestrel read` and `kestrel write` wait for one request (the queue's default
/// I/O timeout).
pub(crate) const IO_WAIT: Duration = Duration::from_secs(30);

/// Submits one request, rings its doorbell and polls until it completes (at most `limit`);
/// errors are named by `what` ("read at byte N", "flush").
pub(crate) fn run_one(
    q: &mut dyn TargetQueue,
    req: IoRequest,
    what: &str,
    limit: Duration,
) -> Result<()> {
    q.submit(req)
        .map_err(|e| AppError::runtime(format!("{what}: {e}")))?;
    q.flush();
    let start = Instant::now();
    let mut result = None;
    while result.is_none() {
        q.poll(1, &mut |c| result = Some(c.result));
        if start.elapsed() > limit {
            return Err(AppError::runtime(format!(
                "{what} did not complete in {} s",
                limit.as_secs()
            )));
        }
    }
    if let Some(Err(e)) = result {
        return Err(AppError::runtime(format!("{what}: {e}")));
    }
    Ok(())
}

/// The metadata `kestrel read` and `kestrel write` carry on a namespace whose format needs
/// it: zeroes outside the protection information, PI generated in software on writes (the
/// reference tag of type 1 and 2 is the LBA, the application tag 0) and checked by the
/// controller; none on other namespaces (an 8-byte PI is then inserted and checked by the
/// controller). One buffer holds the data (interleaved with the metadata for extended
/// LBAs) and, after it, the separate metadata.
pub(crate) struct Meta {
    layout: Option<kestrel::io::MetaLayout>,
    pi: Option<kestrel::spec::pi::PiFormat>,
}

impl Meta {
    pub(crate) fn of(info: &kestrel::target::TargetInfo) -> Self {
        let layout = info.metadata.filter(|m| m.required());
        let pi = layout.and_then(|m| {
            kestrel::spec::pi::PiType::from_dps(m.pi_type).map(|t| kestrel::spec::pi::PiFormat {
                data_size: info.block_size as usize,
                ms: m.ms as usize,
                extended: m.extended,
                pi_first: m.pi_first,
                pi_type: t,
            })
        });
        Meta { layout, pi }
    }

    /// Bytes of the buffer for `nlb` blocks of `bs` bytes: data (+ interleaved metadata),
    /// then separate metadata.
    pub(crate) fn buf_len(&self, nlb: usize, bs: usize) -> usize {
        match self.layout {
            None => nlb * bs,
            Some(m) => nlb * (bs + m.ms as usize),
        }
    }

    /// `req` (whose data is all of `buf`, a lent slice) with its data and metadata placed
    /// in `buf`, and the bytes of its data part.
    pub(crate) fn request(
        &self,
        req: IoRequest,
        buf: &DmaSlice,
        bs: usize,
    ) -> Result<(IoRequest, usize)> {
        let nlb = req.nlb as usize;
        let e = |e: kestrel::hw::dma::DmaError| AppError::from(kestrel::Error::from(e));
        let Some(m) = self.layout else {
            let slice = buf.slice(0, nlb * bs).map_err(e)?;
            return Ok((
                IoRequest {
                    data: kestrel::io::Segments::one(slice),
                    ..req
                },
                nlb * bs,
            ));
        };
        let ms = m.ms as usize;
        let data_len = nlb * m.host_block_size(bs as u32, true) as usize;
        let data = buf.slice(0, data_len).map_err(e)?;
        let meta = if m.extended {
            kestrel::io::IoMeta::extended()
        } else {
            kestrel::io::IoMeta::separate(buf.slice(data_len, nlb * ms).map_err(e)?)
        };
        let first = req.lba as u32;
        Ok((
            IoRequest {
                data: kestrel::io::Segments::one(data),
                ..req
            }
            .with_meta(meta.with_tags(first, 0, 0)),
            data_len,
        ))
    }

    /// Copies the data of the blocks in `buf` (lent to `q`; without interleaved metadata)
    /// into `out`.
    pub(crate) fn read_data(
        &self,
        q: &dyn TargetQueue,
        buf: &DmaSlice,
        data_len: usize,
        bs: usize,
        out: &mut [u8],
    ) -> Result<()> {
        match self.layout {
            Some(m) if m.extended => {
                let hbs = bs + m.ms as usize;
                let mut all = vec![0u8; data_len];
                q.read_lent(buf, 0, &mut all)?;
                for (o, b) in out.chunks_exact_mut(bs).zip(all.chunks_exact(hbs)) {
                    o.copy_from_slice(&b[..bs]);
                }
                Ok(())
            }
            _ => Ok(q.read_lent(buf, 0, out)?),
        }
    }

    /// Places `data` (whole blocks of `bs` bytes, at `lba`) into `buf` (lent to `q`) with
    /// zeroed metadata and, on a PI format, PI generated in software.
    pub(crate) fn write_data(
        &self,
        q: &mut dyn TargetQueue,
        buf: &DmaSlice,
        data: &[u8],
        lba: u64,
        bs: usize,
    ) -> Result<()> {
        let Some(m) = self.layout else {
            return Ok(q.write_lent(buf, 0, data)?);
        };
        let nlb = data.len() / bs;
        let ms = m.ms as usize;
        let (mut d, mut md) = if m.extended {
            let mut d = vec![0u8; nlb * (bs + ms)];
            for (dst, src) in d.chunks_exact_mut(bs + ms).zip(data.chunks_exact(bs)) {
                dst[..bs].copy_from_slice(src);
            }
            (d, Vec::new())
        } else {
            (data.to_vec(), vec![0u8; nlb * ms])
        };
        if let Some(f) = self.pi {
            f.fill(&mut d, &mut md, nlb, lba as u32, 0);
        }
        q.write_lent(buf, 0, &d)?;
        Ok(q.write_lent(buf, d.len(), &md)?)
    }
}
