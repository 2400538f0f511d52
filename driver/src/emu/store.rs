//! Backing stores of emulated namespaces: sparse memory, a file, or nothing.
//!
//! A store is owned by the controller thread; its methods move data between the store and
//! host memory reached through [`GuestSlice`]s (atomic accesses only).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::mem::{GuestSlice, Mem};
use super::prp::Seg;

/// Bytes per chunk of the memory store.
pub(super) const CHUNK: usize = 64 << 10;
/// Chunks per second-level table (64 MiB of namespace per first-level entry).
const L2_ENTRIES: usize = 1024;
/// Size of the file store's bounce buffer: the largest single pread/pwrite.
const BOUNCE: usize = 1 << 20;

/// Why a store operation failed.
#[derive(Debug)]
pub(super) enum StoreError {
    /// A segment did not translate (reported as Data Transfer Error).
    Dma,
    /// The backing file failed (reported as a media error).
    Io(#[allow(dead_code)] std::io::Error),
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(e)
}

/// The host slice of one segment.
fn seg<'a>(mem: &Mem<'a>, s: &Seg) -> Result<GuestSlice<'a>, StoreError> {
    mem.translate(s.iova, s.len as usize).ok_or(StoreError::Dma)
}

type Chunk = Box<[u8]>;

/// Sparse memory: 64 KiB chunks allocated on first write, found in O(1) through a
/// two-level table; unwritten and deallocated bytes read as zero.
pub(super) struct MemStore {
    l1: Vec<Option<Box<[Option<Chunk>]>>>,
    allocated: u64,
}

impl MemStore {
    fn new(size: u64) -> Self {
        let chunks = size.div_ceil(CHUNK as u64) as usize;
        let l1 = chunks.div_ceil(L2_ENTRIES);
        MemStore {
            l1: (0..l1).map(|_| None).collect(),
            allocated: 0,
        }
    }

    fn get(&self, idx: usize) -> Option<&[u8]> {
        self.l1.get(idx / L2_ENTRIES)?.as_ref()?[idx % L2_ENTRIES].as_deref()
    }

    fn get_mut(&mut self, idx: usize) -> Option<&mut [u8]> {
        self.l1.get_mut(idx / L2_ENTRIES)?.as_mut()?[idx % L2_ENTRIES].as_deref_mut()
    }

    fn get_or_alloc(&mut self, idx: usize) -> &mut [u8] {
        let l2 = self.l1[idx / L2_ENTRIES]
            .get_or_insert_with(|| (0..L2_ENTRIES).map(|_| None).collect());
        let slot = &mut l2[idx % L2_ENTRIES];
        if slot.is_none() {
            // vec! of zeroes becomes calloc: pages are only touched when written.
            *slot = Some(vec![0u8; CHUNK].into_boxed_slice());
            self.allocated += 1;
        }
        slot.as_deref_mut().expect("just allocated")
    }

    fn free(&mut self, idx: usize) {
        if let Some(Some(l2)) = self.l1.get_mut(idx / L2_ENTRIES) {
            if l2[idx % L2_ENTRIES].take().is_some() {
                self.allocated -= 1;
            }
        }
    }

    /// Calls `f(chunk index, offset in chunk, offset in the request, length)` for each
    /// piece of `off..off+len`.
    fn pieces(off: u64, len: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0usize;
        while done < len {
            let pos = off + done as u64;
            let idx = (pos / CHUNK as u64) as usize;
            let coff = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - coff).min(len - done);
            f(idx, coff, done, n);
            done += n;
        }
    }

    fn read(&self, off: u64, dst: &GuestSlice<'_>) {
        Self::pieces(off, dst.len(), |idx, coff, doff, n| match self.get(idx) {
            Some(c) => dst.copy_in(doff, &c[coff..coff + n]),
            None => dst.zero(doff, n),
        });
    }

    fn write(&mut self, off: u64, src: &GuestSlice<'_>) {
        Self::pieces(off, src.len(), |idx, coff, soff, n| {
            let c = self.get_or_alloc(idx);
            src.copy_out(soff, &mut c[coff..coff + n]);
        });
    }

    fn zero(&mut self, off: u64, len: u64, deallocate: bool) {
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let idx = (pos / CHUNK as u64) as usize;
            let coff = (pos % CHUNK as u64) as usize;
            let n = ((CHUNK - coff) as u64).min(end - pos) as usize;
            if n == CHUNK && deallocate {
                self.free(idx);
            } else if let Some(c) = self.get_mut(idx) {
                c[coff..coff + n].fill(0);
            }
            pos += n as u64;
        }
    }
}

/// A file: pread/pwrite through a bounce buffer, created sparse at the namespace size, so
/// an emulated namespace persists across runs.
pub(super) struct FileStore {
    file: File,
    path: PathBuf,
    bounce: Vec<u8>,
}

impl FileStore {
    fn open(path: &Path, size: u64) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < size {
            file.set_len(size)?;
        }
        Ok(FileStore {
            file,
            path: path.to_path_buf(),
            bounce: Vec::new(),
        })
    }

    fn read_exact_or_zero(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => {
                    // Past the end of a file someone truncated: reads as unwritten.
                    buf[done..].fill(0);
                    return Ok(());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn zero(&mut self, off: u64, len: u64, deallocate: bool) -> std::io::Result<()> {
        let mode = if deallocate {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        if super::mem::fallocate(&self.file, mode, off, len).is_ok() {
            return Ok(());
        }
        // The filesystem cannot punch or zero ranges: write zeroes instead.
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let n = ((end - pos) as usize).min(BOUNCE);
            let buf = bounce(&mut self.bounce, n);
            buf.fill(0);
            self.file.write_all_at(buf, pos)?;
            pos += n as u64;
        }
        Ok(())
    }
}

/// The bounce buffer grown to at least `n` bytes (it grows only on the first large
/// transfers, then stays).
fn bounce(buf: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if buf.len() < n {
        buf.resize(n.max(64 << 10), 0);
    }
    &mut buf[..n]
}

/// `segs` in runs that each fit one bounce buffer (at least one segment a run), each with
/// the namespace offset it starts at (from `off` on) and its bytes.
fn batches(segs: &[Seg], off: u64) -> impl Iterator<Item = (&[Seg], u64, usize)> {
    let (mut i, mut pos) = (0usize, off);
    std::iter::from_fn(move || {
        if i == segs.len() {
            return None;
        }
        let mut n = 0usize;
        let mut j = i;
        while j < segs.len() && (j == i || n + segs[j].len as usize <= BOUNCE) {
            n += segs[j].len as usize;
            j += 1;
        }
        let run = (&segs[i..j], pos, n);
        pos += n as u64;
        i = j;
        Some(run)
    })
}

/// The store of one namespace.
pub(super) enum Store {
    Memory(MemStore),
    File(FileStore),
    /// No data movement: writes are dropped, reads leave the host buffer untouched.
    Null,
}

impl Store {
    pub(super) fn memory(size: u64) -> Self {
        Store::Memory(MemStore::new(size))
    }

    pub(super) fn file(path: &Path, size: u64) -> std::io::Result<Self> {
        Ok(Store::File(FileStore::open(path, size)?))
    }

    /// Copies namespace bytes `off..` into the host segments, in order.
    pub(super) fn read(&mut self, off: u64, mem: &Mem<'_>, segs: &[Seg]) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                let mut pos = off;
                for s in segs {
                    m.read(pos, &seg(mem, s)?);
                    pos += s.len as u64;
                }
                Ok(())
            }
            Store::File(f) => {
                // Coalesce segments into bounce-sized preads.
                for (run, pos, n) in batches(segs, off) {
                    let buf = bounce(&mut f.bounce, n);
                    FileStore::read_exact_or_zero(&f.file, buf, pos).map_err(io)?;
                    let mut b = 0;
                    for s in run {
                        let g = seg(mem, s)?;
                        g.copy_in(0, &buf[b..b + g.len()]);
                        b += g.len();
                    }
                }
                Ok(())
            }
            Store::Null => Ok(()),
        }
    }

    /// Copies the host segments, in order, to namespace bytes `off..`.
    pub(super) fn write(
        &mut self,
        off: u64,
        mem: &Mem<'_>,
        segs: &[Seg],
        fua: bool,
    ) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                let mut pos = off;
                for s in segs {
                    m.write(pos, &seg(mem, s)?);
                    pos += s.len as u64;
                }
                Ok(())
            }
            Store::File(f) => {
                for (run, pos, n) in batches(segs, off) {
                    let buf = bounce(&mut f.bounce, n);
                    let mut b = 0;
                    for s in run {
                        let g = seg(mem, s)?;
                        g.copy_out(0, &mut buf[b..b + g.len()]);
                        b += g.len();
                    }
                    f.file.write_all_at(buf, pos).map_err(io)?;
                }
                if fua {
                    f.file.sync_data().map_err(io)?;
                }
                Ok(())
            }
            Store::Null => Ok(()),
        }
    }

    /// Copies namespace bytes `off..off + dst.len()` into `dst` (the controller's own
    /// memory: metadata, and data that is checked before it reaches the host).
    pub(super) fn read_bytes(&mut self, off: u64, dst: &mut [u8]) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                MemStore::pieces(off, dst.len(), |idx, coff, doff, n| match m.get(idx) {
                    Some(c) => dst[doff..doff + n].copy_from_slice(&c[coff..coff + n]),
                    None => dst[doff..doff + n].fill(0),
                });
                Ok(())
            }
            Store::File(f) => FileStore::read_exact_or_zero(&f.file, dst, off).map_err(io),
            Store::Null => Ok(()),
        }
    }

    /// Copies `src` to namespace bytes `off..`.
    pub(super) fn write_bytes(
        &mut self,
        off: u64,
        src: &[u8],
        fua: bool,
    ) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                MemStore::pieces(off, src.len(), |idx, coff, soff, n| {
                    m.get_or_alloc(idx)[coff..coff + n].copy_from_slice(&src[soff..soff + n])
                });
                Ok(())
            }
            Store::File(f) => {
                f.file.write_all_at(src, off).map_err(io)?;
                if fua {
                    f.file.sync_data().map_err(io)?;
                }
                Ok(())
            }
            Store::Null => Ok(()),
        }
    }

    /// Whether the store moves no data at all.
    pub(super) fn is_null(&self) -> bool {
        matches!(self, Store::Null)
    }

    /// Zeroes `len` bytes at `off`; with `deallocate`, releases the space where it can
    /// (deallocated bytes read as zero either way).
    pub(super) fn zero(&mut self, off: u64, len: u64, deallocate: bool) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.zero(off, len, deallocate);
                Ok(())
            }
            Store::File(f) => f.zero(off, len, deallocate).map_err(io),
            Store::Null => Ok(()),
        }
    }

    /// Makes completed writes durable.
    pub(super) fn flush(&mut self) -> Result<(), StoreError> {
        match self {
            Store::File(f) => f.file.sync_data().map_err(io),
            _ => Ok(()),
        }
    }

    /// Bytes of backing space in use, or `None` when the store does not track it.
    pub(super) fn used_bytes(&self) -> Option<u64> {
        match self {
            Store::Memory(m) => Some(m.allocated * CHUNK as u64),
            Store::File(f) => f.file.metadata().ok().map(|md| md.blocks() * 512),
            Store::Null => None,
        }
    }

    /// Whether space is allocated on write (thin provisioning).
    pub(super) fn thin(&self) -> bool {
        !matches!(self, Store::Null)
    }

    /// The backing file, if any.
    #[allow(dead_code)]
    pub(super) fn path(&self) -> Option<&Path> {
        match self {
            Store::File(f) => Some(&f.path),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_fill_bounce_buffers_in_order() {
        // 600 pages: two full bounce buffers of 256 pages, then the last 88.
        let segs: Vec<Seg> = (0..600)
            .map(|i| Seg {
                iova: 0x10_0000 + i * 4096,
                len: 4096,
            })
            .collect();
        let runs: Vec<(usize, u64, usize)> = batches(&segs, 512)
            .map(|(run, pos, n)| (run.len(), pos, n))
            .collect();
        assert_eq!(
            runs,
            [
                (256, 512, BOUNCE),
                (256, 512 + BOUNCE as u64, BOUNCE),
                (88, 512 + 2 * BOUNCE as u64, 88 * 4096)
            ]
        );
        // A segment larger than a bounce buffer is a run of its own.
        let big = [
            Seg { iova: 0, len: 4096 },
            Seg {
                iova: 0x1000,
                len: (BOUNCE + 4096) as u32,
            },
            Seg { iova: 0, len: 4096 },
        ];
        let runs: Vec<(usize, u64, usize)> = batches(&big, 0)
            .map(|(run, pos, n)| (run.len(), pos, n))
            .collect();
        assert_eq!(
            runs,
            [
                (1, 0, 4096),
                (1, 4096, BOUNCE + 4096),
                (1, BOUNCE as u64 + 8192, 4096)
            ]
        );
        assert_eq!(batches(&[], 0).count(), 0);
    }
}
