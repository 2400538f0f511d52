//! Reads and writes of namespaces with metadata: separate metadata (MPTR) or extended
//! LBAs, and end-to-end protection information checked, generated and stripped as PRINFO
//! asks (module doc of [`crate::emu`], "Namespace formats").
//!
//! A formatted transfer goes through the controller's own scratch buffers: a write
//! gathers the data and metadata from the host, checks (or generates) every block's PI,
//! and only then stores anything; a read loads data and metadata, checks the PI, and only
//! then copies to the host. So a command that fails a check moves nothing.

use super::{store_error, Dir, IoDone, Nvm};
use crate::emu::faults::PiField;
use crate::emu::mem::{GuestSlice, Mem};
use crate::emu::prp::{walk_prps, SegCursor};
use crate::emu::store::StoreError;
use crate::emu::EmuStats;
use crate::spec::pi::{GuardDigest, PiCommand, PiTuple, PI_SIZE};
use crate::spec::{Sqe, Status};

/// How one formatted command's blocks cross the wire.
#[derive(Clone, Copy)]
struct Layout {
    /// Data bytes per block.
    lba: usize,
    /// Metadata bytes per block (as stored).
    ms: usize,
    /// Metadata bytes per block that cross the wire: 0 when PRACT strips or inserts an
    /// 8-byte PI that is the whole metadata.
    host_ms: usize,
    /// Metadata interleaved with the data (extended LBA), else through MPTR.
    extended: bool,
    /// Offset of the PI in the metadata.
    pi_off: usize,
}

impl Layout {
    /// Bytes the data pointer (PRPs) describes.
    fn host_len(&self, nlb: usize) -> usize {
        nlb * (self.lba + if self.extended { self.host_ms } else { 0 })
    }
}

impl Nvm {
    /// The PI fields of `sqe` on namespace `i`, checked for consistency (Invalid
    /// Protection Information), or `None` when the namespace is not protected.
    pub(super) fn pi_command(
        &self,
        i: usize,
        sqe: &Sqe,
        slba: u64,
    ) -> Result<Option<PiCommand>, IoDone> {
        let Some(t) = self.ns[i].pi_type() else {
            return Ok(None);
        };
        let c = PiCommand::from_cdws(t, sqe.cdw12, sqe.cdw14, sqe.cdw15);
        c.validate(slba).map_err(|s| IoDone::err(s, slba))?;
        Ok(Some(c))
    }

    fn layout(&self, i: usize, pi: Option<&PiCommand>) -> Layout {
        let ns = &self.ns[i];
        let ms = ns.ms();
        let pract = pi.is_some_and(|c| c.prinfo.pract());
        Layout {
            lba: ns.lba_size(),
            ms,
            host_ms: if pract && ms == PI_SIZE { 0 } else { ms },
            extended: ns.format.extended,
            pi_off: ns.pi_off(),
        }
    }

    /// Read, Write or Zone Append of `nlb` blocks at `lba` on a namespace with metadata.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn formatted(
        &mut self,
        mem: &Mem<'_>,
        sqe: &Sqe,
        i: usize,
        lba: u64,
        nlb: u32,
        dir: Dir,
        corrupt: Option<PiField>,
        st: &mut EmuStats,
    ) -> Result<(), IoDone> {
        let pi = self.pi_command(i, sqe, sqe.slba())?;
        let lay = self.layout(i, pi.as_ref());
        let n = nlb as usize;
        let host_len = lay.host_len(n);
        let err = |s: Status| IoDone::err(s, lba);
        if self.mdts_bytes.is_some_and(|m| host_len as u64 > m) {
            return Err(err(Status::INVALID_FIELD.with_dnr(true)));
        }
        walk_prps(mem, sqe.prp1, sqe.prp2, host_len, self.page, &mut self.segs).map_err(err)?;
        let mptr = if lay.extended || lay.host_ms == 0 {
            None
        } else {
            Some(metadata_buffer(mem, sqe.mptr, n * lay.host_ms).map_err(err)?)
        };
        if self.ns[i].store.is_null() {
            return Ok(());
        }
        grow(&mut self.data, n * lay.lba);
        grow(&mut self.meta, n * lay.ms);
        if dir == Dir::Read {
            self.load(i, lba, n, &lay)
                .map_err(|e| store_error(e, false, lba, st))?;
            if let (Some(f), Some(_)) = (corrupt, &pi) {
                corrupt_pi(&mut self.meta[lay.pi_off..lay.pi_off + PI_SIZE], f);
            }
            self.check_all(&lay, n, pi.as_ref(), false).map_err(err)?;
            self.scatter(mem, &lay, n, mptr).map_err(err)
        } else {
            self.gather(mem, &lay, n, mptr).map_err(err)?;
            self.check_all(&lay, n, pi.as_ref(), true).map_err(err)?;
            let fua = sqe.cdw12 & (1 << 30) != 0;
            self.store(i, lba, n, &lay, fua)
                .map_err(|e| store_error(e, true, lba, st))
        }
    }

    /// Copies the host's data and metadata into the scratch buffers (metadata not
    /// transferred reads as zeroes, for the PI the controller generates).
    fn gather(
        &mut self,
        mem: &Mem<'_>,
        lay: &Layout,
        n: usize,
        mptr: Option<GuestSlice<'_>>,
    ) -> Result<(), Status> {
        let (data, meta) = (&mut self.data[..n * lay.lba], &mut self.meta[..n * lay.ms]);
        let mut cur = SegCursor::new(&self.segs);
        if lay.host_ms == 0 {
            meta.fill(0);
        }
        if lay.extended {
            for b in 0..n {
                cur.read(mem, &mut data[b * lay.lba..(b + 1) * lay.lba])?;
                if lay.host_ms != 0 {
                    cur.read(mem, &mut meta[b * lay.ms..(b + 1) * lay.ms])?;
                }
            }
            return Ok(());
        }
        cur.read(mem, data)?;
        if let Some(m) = mptr {
            m.copy_out(0, meta);
        }
        Ok(())
    }

    /// Copies the scratch buffers to the host, leaving out metadata that does not cross
    /// the wire (PRACT stripping an 8-byte PI).
    fn scatter(
        &mut self,
        mem: &Mem<'_>,
        lay: &Layout,
        n: usize,
        mptr: Option<GuestSlice<'_>>,
    ) -> Result<(), Status> {
        let (data, meta) = (&self.data[..n * lay.lba], &self.meta[..n * lay.ms]);
        let mut cur = SegCursor::new(&self.segs);
        if lay.extended {
            for b in 0..n {
                cur.write(mem, &data[b * lay.lba..(b + 1) * lay.lba])?;
                if lay.host_ms != 0 {
                    cur.write(mem, &meta[b * lay.ms..(b + 1) * lay.ms])?;
                }
            }
            return Ok(());
        }
        cur.write(mem, data)?;
        if let Some(m) = mptr {
            m.copy_in(0, meta);
        }
        Ok(())
    }

    /// Checks every block's PI (a write with PRACT instead generates it). Does nothing on
    /// an unprotected namespace.
    fn check_all(
        &mut self,
        lay: &Layout,
        n: usize,
        pi: Option<&PiCommand>,
        write: bool,
    ) -> Result<(), Status> {
        let Some(c) = pi else {
            return Ok(());
        };
        let generate = write && c.prinfo.pract();
        if !generate && c.prinfo.0 & 0x7 == 0 {
            return Ok(());
        }
        for b in 0..n {
            let data = &self.data[b * lay.lba..(b + 1) * lay.lba];
            let meta = &mut self.meta[b * lay.ms..(b + 1) * lay.ms];
            let guard = guard_of(data, &meta[..lay.pi_off]);
            let at = &mut meta[lay.pi_off..lay.pi_off + PI_SIZE];
            if generate {
                at.copy_from_slice(&c.generate(guard, b as u32).to_bytes());
            } else {
                let t = PiTuple::from_bytes(&(*at).try_into().expect("8 bytes"));
                // DNR: the same command fails the same way again.
                c.check(&t, guard, b as u32)
                    .map_err(|e| e.status().with_dnr(true))?;
            }
        }
        Ok(())
    }

    /// Loads blocks `lba..lba + n` and their metadata into the scratch buffers.
    fn load(&mut self, i: usize, lba: u64, n: usize, lay: &Layout) -> Result<(), StoreError> {
        let ns = &mut self.ns[i];
        let (data, meta) = (&mut self.data[..n * lay.lba], &mut self.meta[..n * lay.ms]);
        ns.store.read_bytes(lba << ns.lba_shift, data)?;
        ns.store.read_bytes(ns.meta_off(lba), meta)?;
        ns.flip_pi(meta);
        Ok(())
    }

    /// Stores the scratch buffers as blocks `lba..lba + n` and their metadata.
    fn store(
        &mut self,
        i: usize,
        lba: u64,
        n: usize,
        lay: &Layout,
        fua: bool,
    ) -> Result<(), StoreError> {
        let ns = &mut self.ns[i];
        let (data, meta) = (&self.data[..n * lay.lba], &mut self.meta[..n * lay.ms]);
        ns.flip_pi(meta);
        ns.store.write_bytes(lba << ns.lba_shift, data, false)?;
        ns.store.write_bytes(ns.meta_off(lba), meta, fua)
    }

    /// Write Zeroes with PRACT on a protected namespace: the PI of the zeroed blocks
    /// (zero data and metadata), generated and stored, a bounded run at a time.
    pub(super) fn generate_zero_pi(
        &mut self,
        i: usize,
        slba: u64,
        nlb: u32,
        c: &PiCommand,
    ) -> Result<(), StoreError> {
        let ns = &mut self.ns[i];
        let (ms, pi_off) = (ns.ms(), ns.pi_off());
        let zero = vec![0u8; ns.lba_size()];
        let guard = guard_of(&zero, &vec![0u8; pi_off]);
        const RUN: usize = 256;
        grow(&mut self.meta, RUN * ms);
        let mut done = 0usize;
        while done < nlb as usize {
            let k = RUN.min(nlb as usize - done);
            let meta = &mut self.meta[..k * ms];
            meta.fill(0);
            for b in 0..k {
                let t = c.generate(guard, (done + b) as u32);
                meta[b * ms + pi_off..b * ms + pi_off + PI_SIZE].copy_from_slice(&t.to_bytes());
            }
            ns.flip_pi(meta);
            ns.store
                .write_bytes(ns.meta_off(slba + done as u64), meta, false)?;
            done += k;
        }
        Ok(())
    }
}

/// The guard of a block: CRC over its data, then the metadata bytes before its PI.
fn guard_of(data: &[u8], meta_before_pi: &[u8]) -> u16 {
    let mut g = GuardDigest::new();
    g.update(data);
    g.update(meta_before_pi);
    g.finish()
}

/// The metadata buffer MPTR points to: dword aligned (else Invalid Field) and inside one
/// registered mapping (else Data Transfer Error, as an IOMMU fault).
fn metadata_buffer<'a>(mem: &Mem<'a>, mptr: u64, len: usize) -> Result<GuestSlice<'a>, Status> {
    if mptr & 3 != 0 {
        return Err(Status::INVALID_FIELD.with_dnr(true));
    }
    mem.translate(mptr, len)
        .ok_or(Status::DATA_TRANSFER_ERROR.with_dnr(true))
}

/// Flips the low bit of one field of a PI tuple.
fn corrupt_pi(pi: &mut [u8], f: PiField) {
    let at = match f {
        PiField::Guard => 1,
        PiField::AppTag => 3,
        PiField::RefTag => 7,
    };
    pi[at] ^= 1;
}

/// Grows a scratch buffer to at least `n` bytes (only on the first large transfers).
fn grow(buf: &mut Vec<u8>, n: usize) {
    if buf.len() < n {
        buf.resize(n, 0);
    }
}
