//! Reads and writes in the form a namespace's format needs, and where a case may write.
//!
//! - **Metadata.** On a namespace formatted with metadata every read and write carries it
//!   (whether the format needs it or, PI alone, could let the controller insert it):
//!   separate (a buffer beside the data, MPTR) or interleaved with the data (extended
//!   LBAs). A block's metadata outside the PI is a function of its LBA and its data, so a
//!   block read back with another block's metadata (or stale metadata) is caught; the PI
//!   is generated with [`kestrel::spec::pi::PiFormat::fill`] (guard, application tag
//!   [`APP_TAG`], reference tag the low 32 bits of the LBA, counting up) and checked
//!   after every read with [`kestrel::spec::pi::PiFormat::check`], besides the
//!   controller's own checks (PRCHK).
//! - **Where to write.** [`Space`] hands out LBAs for writes that follow each other: on a
//!   conventional namespace from a base LBA, on a zoned one at the write pointer of a zone
//!   it reset first, moving to the next zone (reset in turn) when the current one lacks
//!   the capacity. Cases write what they read: nothing is read that the case did not
//!   write (never-written blocks of a PI format carry no valid PI on some controllers).

use kestrel::io::{IoMeta, IoRequest, ZoneAction};
use kestrel::spec::pi::{pi_offset, PiError, PI_SIZE};
use kestrel::spec::zns::parse_report;
use kestrel::target::TargetQueue;
use kestrel::{DmaPool, DmaSlice};

use crate::desc::NsDesc;
use crate::support::{contents, fill, must, put, run_one};
use crate::CaseError;

/// The application tag the suite writes into protection information ("HT").
pub(crate) const APP_TAG: u16 = 0x4854;

/// Buffers for up to `n` blocks of a namespace, lent to a queue: the data (with the
/// metadata interleaved on an extended format) and, separate, the metadata.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocks {
    pub data: DmaSlice,
    pub md: DmaSlice,
    pub n: usize,
}

impl Blocks {
    /// `n` blocks' buffers from `pool`, lent to `q`.
    pub(crate) fn lend(
        pool: &DmaPool,
        q: &mut dyn TargetQueue,
        ns: &NsDesc,
        n: usize,
    ) -> Result<Blocks, String> {
        Self::lend_bytes(pool, q, ns, n * ns.host_block(), n)
    }

    /// Buffers of `data_bytes` (at least `n` blocks' worth) and the separate metadata of
    /// `n` blocks, from `pool`, lent to `q`.
    pub(crate) fn lend_bytes(
        pool: &DmaPool,
        q: &mut dyn TargetQueue,
        ns: &NsDesc,
        data_bytes: usize,
        n: usize,
    ) -> Result<Blocks, String> {
        let buf = pool.alloc(data_bytes).map_err(|e| e.to_string())?;
        let data = q.lend(buf).map_err(|e| e.to_string())?;
        let md = match ns.md_block() * n {
            0 => DmaSlice::EMPTY,
            len => {
                let buf = pool.alloc(len).map_err(|e| e.to_string())?;
                q.lend(buf).map_err(|e| e.to_string())?
            }
        };
        Ok(Blocks { data, md, n })
    }

    /// Blocks `i..i + n` of these buffers.
    pub(crate) fn sub(&self, ns: &NsDesc, i: usize, n: usize) -> Result<Blocks, String> {
        ensure!(i + n <= self.n, "blocks {i}..{} of {}", i + n, self.n);
        let hb = ns.host_block();
        Ok(Blocks {
            data: self.data.slice(i * hb, n * hb).map_err(|e| e.to_string())?,
            md: sub_or_empty(&self.md, i * ns.md_block(), n * ns.md_block())?,
            n,
        })
    }

    /// `n` blocks whose data starts `off` bytes into the data buffer (the separate
    /// metadata at its start).
    pub(crate) fn at(&self, ns: &NsDesc, off: usize, n: usize) -> Result<Blocks, String> {
        Ok(Blocks {
            data: self
                .data
                .slice(off, n * ns.host_block())
                .map_err(|e| e.to_string())?,
            md: sub_or_empty(&self.md, 0, n * ns.md_block())?,
            n,
        })
    }
}

fn sub_or_empty(s: &DmaSlice, off: usize, len: usize) -> Result<DmaSlice, String> {
    if len == 0 {
        return Ok(DmaSlice::EMPTY);
    }
    s.slice(off, len).map_err(|e| e.to_string())
}

/// Byte `k` of the metadata (outside the PI) of a block at `lba` whose data starts with
/// `head`.
fn md_byte(lba: u64, head: u64, k: usize) -> u8 {
    (lba.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ head).rotate_left((k as u32 * 7) % 64) as u8
        ^ k as u8
}

fn head_of(block: &[u8]) -> u64 {
    let mut h = [0u8; 8];
    let n = block.len().min(8);
    h[..n].copy_from_slice(&block[..n]);
    u64::from_le_bytes(h)
}

/// How a read's blocks are checked beyond their data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Check {
    /// As the suite wrote them: the metadata outside the PI, and the PI with its
    /// application tag.
    Written,
    /// Written by the controller (Write Zeroes, deallocated, the PI it inserted): only the
    /// PI's guard and reference tag, and an escaped PI passes.
    Controller,
}

impl NsDesc {
    /// The reference tag of the block at `lba`: its low 32 bits (type 1 requires it; the
    /// suite numbers types 2 and 3 the same way, as the controller does for blocks it
    /// writes itself).
    pub(crate) fn ref_tag(lba: u64) -> u32 {
        lba as u32
    }

    /// The metadata argument of a read or write of `b` at `lba`: none without metadata;
    /// else separate or extended, with the tags to check (the application tag only when
    /// `app`).
    pub(crate) fn meta(&self, b: &Blocks, lba: u64, app: bool) -> IoMeta {
        match &self.meta {
            None => IoMeta::NONE,
            Some(m) => IoMeta::for_layout(m, b.md).with_tags(
                Self::ref_tag(lba),
                APP_TAG,
                if app { 0xFFFF } else { 0 },
            ),
        }
    }

    /// A write of `b` (all its blocks) at `lba`, with its metadata.
    pub(crate) fn write_req(&self, lba: u64, b: &Blocks, token: u64) -> IoRequest {
        IoRequest::write(self.nsid, lba, b.n as u32, b.data, token)
            .with_meta(self.meta(b, lba, true))
    }

    /// A read of `b.n` blocks at `lba` into `b`, with their metadata (the application tag
    /// checked when `app`).
    pub(crate) fn read_req(&self, lba: u64, b: &Blocks, app: bool, token: u64) -> IoRequest {
        IoRequest::read(self.nsid, lba, b.n as u32, b.data, token).with_meta(self.meta(b, lba, app))
    }

    /// What `data` (whole blocks) written at `lba` puts in a data buffer and a separate
    /// metadata buffer: each block's metadata generated, PI included.
    pub(crate) fn image(&self, lba: u64, data: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let Some(m) = self.meta else {
            return (data.to_vec(), Vec::new());
        };
        let (bs, ms) = (self.block_size, m.ms as usize);
        let n = data.len() / bs;
        let pi = if m.pi_type != 0 {
            let o = pi_offset(ms, m.pi_first);
            o..o + PI_SIZE
        } else {
            0..0
        };
        let mut host = Vec::with_capacity(n * self.host_block());
        let mut md = Vec::with_capacity(n * self.md_block());
        for (i, blk) in data.chunks(bs).enumerate() {
            let head = head_of(blk);
            let bytes = (0..ms).map(|k| {
                if pi.contains(&k) {
                    0
                } else {
                    md_byte(lba + i as u64, head, k)
                }
            });
            host.extend_from_slice(blk);
            if m.extended {
                host.extend(bytes);
            } else {
                md.extend(bytes);
            }
        }
        if let Some(f) = &self.pi {
            f.fill(&mut host, &mut md, n, Self::ref_tag(lba), APP_TAG);
        }
        (host, md)
    }

    /// The data of `n` blocks read at `lba` (their data buffer `host`, separate metadata
    /// `md`), after checking block `i`'s metadata as `check(i)` says: the PI in software,
    /// and, for blocks the suite wrote, the metadata outside it. The error names the
    /// block, its LBA and what failed.
    pub(crate) fn unimage(
        &self,
        lba: u64,
        host: &[u8],
        md: &[u8],
        n: usize,
        check: &dyn Fn(usize) -> Option<Check>,
    ) -> Result<Vec<u8>, String> {
        let Some(m) = self.meta else {
            return Ok(host[..n * self.block_size].to_vec());
        };
        let (bs, ms, hb) = (self.block_size, m.ms as usize, self.host_block());
        let mut data = Vec::with_capacity(n * bs);
        let pi = if m.pi_type != 0 {
            let o = pi_offset(ms, m.pi_first);
            o..o + PI_SIZE
        } else {
            0..0
        };
        for i in 0..n {
            let blk = &host[i * hb..i * hb + bs];
            data.extend_from_slice(blk);
            let Some(how) = check(i) else {
                continue;
            };
            let bl = lba + i as u64;
            let (one_host, one_md) = if m.extended {
                (&host[i * hb..(i + 1) * hb], &[][..])
            } else {
                (blk, &md[i * ms..(i + 1) * ms])
            };
            let meta = if m.extended { &one_host[bs..] } else { one_md };
            if how == Check::Written {
                let head = head_of(blk);
                if let Some(k) =
                    (0..ms).find(|&k| !pi.contains(&k) && meta[k] != md_byte(bl, head, k))
                {
                    return Err(format!(
                        "block {i} (lba {bl}): metadata byte {k} read back is {:#04x}, want {:#04x} (another block's metadata, or none, was transferred)",
                        meta[k],
                        md_byte(bl, head, k)
                    ));
                }
            }
            if let Some(f) = &self.pi {
                let app = if how == Check::Written { 0xFFFF } else { 0 };
                f.check(one_host, one_md, 1, Self::ref_tag(bl), APP_TAG, app)
                    .map_err(|(_, e)| format!("block {i} (lba {bl}): {}", pi_text(e)))?;
            }
        }
        Ok(data)
    }

    /// Puts what `data` written at `lba` needs into `b` (lent to `q`).
    pub(crate) fn stage(
        &self,
        q: &mut dyn TargetQueue,
        b: &Blocks,
        lba: u64,
        data: &[u8],
    ) -> Result<(), String> {
        let (host, md) = self.image(lba, data);
        put(q, &b.data, 0, &host)?;
        if !md.is_empty() {
            put(q, &b.md, 0, &md)?;
        }
        Ok(())
    }

    /// The data read into `b` (lent to `q`) from `lba`, every block checked as written by
    /// the suite.
    pub(crate) fn fetch(
        &self,
        q: &dyn TargetQueue,
        b: &Blocks,
        lba: u64,
    ) -> Result<Vec<u8>, String> {
        self.fetch_with(q, b, lba, &|_| Some(Check::Written))
    }

    /// [`NsDesc::fetch`], each block checked as `check` says.
    pub(crate) fn fetch_with(
        &self,
        q: &dyn TargetQueue,
        b: &Blocks,
        lba: u64,
        check: &dyn Fn(usize) -> Option<Check>,
    ) -> Result<Vec<u8>, String> {
        let host = contents(q, &b.data)?;
        let md = contents(q, &b.md)?;
        self.unimage(lba, &host, &md, b.n, check)
    }

    /// Writes `data` at `lba` from `b` (lent to `q`) with one request (the driver splits
    /// it past MDTS), and waits for it. On a zoned namespace, whose writes the driver does
    /// not split, a write of more than one command's blocks is written a command at a
    /// time, in order.
    pub(crate) fn write(
        &self,
        q: &mut dyn TargetQueue,
        b: &Blocks,
        lba: u64,
        data: &[u8],
    ) -> Result<(), String> {
        let n = data.len() / self.block_size;
        let b = b.sub(self, 0, n)?;
        self.stage(q, &b, lba, data)?;
        let step = if self.zoned() { self.chunk_blocks() } else { n };
        let mut i = 0;
        while i < n {
            let k = step.min(n - i);
            must(
                q,
                self.write_req(lba + i as u64, &b.sub(self, i, k)?, 1),
                &format!("write of {k} blocks at lba {}", lba + i as u64),
            )?;
            i += k;
        }
        Ok(())
    }

    /// Reads `n` blocks at `lba` into `b` (lent to `q`; cleared first, so nothing of an
    /// earlier read passes for this one) with one request, and returns their data, checked
    /// as the suite wrote them.
    pub(crate) fn read(
        &self,
        q: &mut dyn TargetQueue,
        b: &Blocks,
        lba: u64,
        n: usize,
    ) -> Result<Vec<u8>, String> {
        self.read_with(q, b, lba, n, &|_| Some(Check::Written))
    }

    /// [`NsDesc::read`], each block checked as `check` says (the controller checks the
    /// application tag only when every block is checked as written).
    pub(crate) fn read_with(
        &self,
        q: &mut dyn TargetQueue,
        b: &Blocks,
        lba: u64,
        n: usize,
        check: &dyn Fn(usize) -> Option<Check>,
    ) -> Result<Vec<u8>, String> {
        let b = b.sub(self, 0, n)?;
        fill(q, &b.data, 0xEE)?;
        fill(q, &b.md, 0xEE)?;
        let app = (0..n).all(|i| check(i) == Some(Check::Written));
        must(
            q,
            self.read_req(lba, &b, app, 2),
            &format!("read of {n} blocks at lba {lba}"),
        )?;
        self.fetch_with(q, &b, lba, check)
            .map_err(|e| format!("read of {n} blocks at lba {lba}: {e}"))
    }
}

/// A PI check failure with the spec's name.
pub(crate) fn pi_text(e: PiError) -> String {
    match e {
        PiError::Guard { found, computed } => format!(
            "end-to-end guard check: the pi's guard is {found:#06x}, the data's crc {computed:#06x}"
        ),
        PiError::AppTag {
            found, expected, ..
        } => format!("end-to-end application tag check: {found:#06x}, want {expected:#06x}"),
        PiError::RefTag { found, expected } => {
            format!("end-to-end reference tag check: {found:#010x}, want {expected:#010x}")
        }
    }
}

/// Where a case writes: LBAs for writes that follow each other (module doc).
pub(crate) struct Space<'n> {
    ns: &'n NsDesc,
    /// Conventional: the next LBA, and where the space began. Zoned: the write pointer in
    /// the current zone.
    next: u64,
    first: u64,
    /// The first LBA past the scratch area (conventional), or past the current zone's
    /// capacity (zoned; 0 before the first zone).
    end: u64,
    /// Zoned: the index of the zone to use next (modulo the zones of the scratch area),
    /// and how many this space has used.
    zone: u64,
    used: u64,
    report: Option<DmaSlice>,
}

impl<'n> Space<'n> {
    /// From LBA `base` (modulo the scratch area) on a conventional namespace; from the
    /// zone holding `base` (modulo the zones of the scratch area) on a zoned one.
    pub(crate) fn at(ns: &'n NsDesc, base: u64) -> Self {
        let zone = ns.zones.map_or(0, |z| base / z.geometry.zone_size.max(1));
        // Within the scratch area of a small namespace too.
        let next = if ns.zoned() {
            base
        } else {
            base % ns.scratch_blocks.max(1)
        };
        Space {
            ns,
            next,
            first: next,
            end: if ns.zoned() { 0 } else { ns.scratch_blocks },
            zone,
            used: 0,
            report: None,
        }
    }

    /// The first LBA of `n` blocks to write one after the other (zoned: within one zone,
    /// reset before its first write). A skip when they cannot fit: the scratch area, or a
    /// zone's capacity.
    pub(crate) fn take(
        &mut self,
        pool: &DmaPool,
        q: &mut dyn TargetQueue,
        n: u64,
    ) -> Result<u64, CaseError> {
        if self.next + n <= self.end {
            let lba = self.next;
            self.next += n;
            return Ok(lba);
        }
        if !self.ns.zoned() && n <= self.first && self.end > self.first {
            // A small namespace: the blocks below where this space began (nothing it
            // wrote), from LBA 0.
            self.next = n;
            self.end = self.first;
            return Ok(0);
        }
        let Some(z) = self.ns.zones else {
            return Err(CaseError::Skip(format!(
                "nsid {}: the case writes {n} blocks at lba {}, past the {} blocks it may overwrite (the first 64 MiB, or the namespace)",
                self.ns.nsid, self.next, self.ns.scratch_blocks
            )));
        };
        let zs = z.geometry.zone_size.max(1);
        let zones = self
            .ns
            .scratch_blocks
            .div_ceil(zs)
            .clamp(1, z.geometry.zones);
        if self.used >= zones {
            return Err(CaseError::Skip(format!(
                "nsid {}: the case writes more than the {zones} zone(s) of the scratch area hold",
                self.ns.nsid
            )));
        }
        // A fresh zone: reset, its capacity read.
        let zslba = (self.zone % zones) * zs;
        self.zone += 1;
        self.used += 1;
        let cap = self.reset(pool, q, zslba)?;
        if n > cap {
            return Err(CaseError::Skip(format!(
                "nsid {}: a write of {n} blocks does not fit a zone's capacity ({cap} blocks)",
                self.ns.nsid
            )));
        }
        self.next = zslba + n;
        self.end = zslba + cap;
        Ok(zslba)
    }

    /// Resets the zone at `zslba` and returns its capacity (Report Zones).
    fn reset(
        &mut self,
        pool: &DmaPool,
        q: &mut dyn TargetQueue,
        zslba: u64,
    ) -> Result<u64, String> {
        let nsid = self.ns.nsid;
        must(
            q,
            IoRequest::zone_send(nsid, zslba, ZoneAction::Reset, 8),
            &format!("reset of the zone at lba {zslba}"),
        )?;
        let rep = match self.report {
            Some(r) => r,
            None => {
                let buf = pool.alloc(4096).map_err(|e| e.to_string())?;
                let r = q.lend(buf).map_err(|e| e.to_string())?;
                self.report = Some(r);
                r
            }
        };
        let r = run_one(q, IoRequest::report_zones(nsid, zslba, rep, 9))?;
        ensure!(r.is_ok(), "report zones from lba {zslba}: {r:?}");
        let bytes = contents(q, &rep)?;
        let d = parse_report(&bytes)
            .next()
            .ok_or_else(|| format!("report zones from lba {zslba} returned no descriptor"))?;
        ensure!(
            d.zslba == zslba && d.wp == zslba,
            "the zone at lba {zslba} after a reset: zslba {} write pointer {}",
            d.zslba,
            d.wp
        );
        Ok(d.zcap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel::io::MetaLayout;
    use kestrel::spec::pi::{PiFormat, PiType};

    fn ns(ms: u16, extended: bool, pi_type: u8, pi_first: bool, bs: usize) -> NsDesc {
        let meta = (ms != 0).then_some(MetaLayout {
            ms,
            extended,
            pi_type,
            pi_first,
        });
        NsDesc {
            nsid: 1,
            format: String::new(),
            refused: None,
            block_size: bs,
            num_blocks: 1 << 20,
            scratch_blocks: 1 << 16,
            meta,
            pi: PiType::from_dps(pi_type).map(|t| PiFormat {
                data_size: bs,
                ms: ms as usize,
                extended,
                pi_first,
                pi_type: t,
            }),
            zones: None,
            write_zeroes: true,
            deallocate: true,
            deallocated_reads_zeroes: true,
            max_command_bytes: 128 << 10,
        }
    }

    #[test]
    fn an_image_reads_back_and_a_moved_or_stale_block_is_caught() {
        for (ms, ext, pi, first, bs) in [
            (0, false, 0, false, 512),
            (8, false, 0, false, 4096),
            (8, false, 1, false, 512),
            (16, true, 2, true, 512),
            (64, false, 3, false, 4096),
            (8, true, 0, false, 512),
        ] {
            let n = ns(ms, ext, pi, first, bs);
            let data = crate::support::pattern(4 * bs, 7);
            let (host, md) = n.image(100, &data);
            let all = |_| Some(Check::Written);
            assert_eq!(n.unimage(100, &host, &md, 4, &all).unwrap(), data);
            if ms == 0 {
                continue;
            }
            // The same bytes read as if from lba 101: each block's metadata (or its PI's
            // reference tag) names another block.
            let e = n.unimage(101, &host, &md, 4, &all).unwrap_err();
            assert!(e.contains("block 0 (lba 101)"), "{e}");
            // Blocks 2 and 3 given block 0's metadata (a metadata pointer not advanced).
            let (mut host2, mut md2) = (host.clone(), md.clone());
            if ext {
                let hb = bs + ms as usize;
                let m0 = host[bs..hb].to_vec();
                host2[2 * hb + bs..3 * hb].copy_from_slice(&m0);
            } else {
                let m0 = md[..ms as usize].to_vec();
                md2[2 * ms as usize..3 * ms as usize].copy_from_slice(&m0);
            }
            let e = n.unimage(100, &host2, &md2, 4, &all).unwrap_err();
            assert!(e.starts_with("block 2 (lba 102)"), "{e}");
        }
    }
}
