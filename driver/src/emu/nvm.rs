//! The NVM command set of the emulated controller (Read, Write, Flush, Write Zeroes,
//! Dataset Management) and the PRP walk every data-moving command uses.

use std::sync::atomic::Ordering;

use super::mem::Mem;
use super::store::{Store, StoreError};
use super::EmuStats;
use crate::spec::cmd::DsmRange;
use crate::spec::{nvm_opc, Sqe, Status, NSID_ALL};

/// One PRP-described piece of a data transfer: never crosses a memory page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Seg {
    pub iova: u64,
    pub len: u32,
}

/// Translates every segment, or fails with Data Transfer Error (an IOMMU fault).
fn check_seg(mem: &Mem<'_>, out: &mut Vec<Seg>, iova: u64, len: usize) -> Result<(), Status> {
    if mem.translate(iova, len).is_none() {
        return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
    }
    out.push(Seg {
        iova,
        len: len as u32,
    });
    Ok(())
}

/// Walks the PRPs of a `len`-byte transfer with memory page size `page` (spec 4.3):
/// PRP1 may start at any dword-aligned offset; when the rest fits in one page PRP2 is
/// that page; otherwise PRP2 points to a PRP list (dword aligned), whose entries are page
/// aligned and whose last entry, when more are needed than the page holds, points to the
/// next list page. Every entry is translated, so a bad pointer fails the command before
/// any data moves. `out` is cleared and filled with the segments.
pub(super) fn walk_prps(
    mem: &Mem<'_>,
    prp1: u64,
    prp2: u64,
    len: usize,
    page: usize,
    out: &mut Vec<Seg>,
) -> Result<(), Status> {
    let bad_offset = Status::PRP_OFFSET_INVALID.with_dnr(true);
    out.clear();
    if len == 0 {
        return Ok(());
    }
    let mask = page as u64 - 1;
    if prp1 & 3 != 0 {
        return Err(bad_offset);
    }
    let first = (page - (prp1 & mask) as usize).min(len);
    check_seg(mem, out, prp1, first)?;
    let mut left = len - first;
    if left == 0 {
        return Ok(());
    }
    if left <= page {
        if prp2 & mask != 0 {
            return Err(bad_offset);
        }
        return check_seg(mem, out, prp2, left);
    }
    let mut list = prp2;
    // Every list page but a degenerate one yields at least one data entry; the bound stops
    // a list that chains to itself.
    let mut list_pages_left = left.div_ceil(page) + 1;
    loop {
        if list & 3 != 0 {
            return Err(bad_offset);
        }
        let slots = (page - (list & mask) as usize) / 8;
        if slots == 0 || list_pages_left == 0 {
            return Err(bad_offset);
        }
        list_pages_left -= 1;
        let Some(ls) = mem.translate(list, slots * 8) else {
            return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
        };
        let needed = left.div_ceil(page);
        let data = if needed <= slots { needed } else { slots - 1 };
        for i in 0..data {
            // Relaxed: the list was written before the doorbell, which we acquired.
            let e = ls.load_u64(i * 8, Ordering::Relaxed);
            if e & mask != 0 {
                return Err(bad_offset);
            }
            let n = left.min(page);
            check_seg(mem, out, e, n)?;
            left -= n;
        }
        if left == 0 {
            return Ok(());
        }
        list = ls.load_u64((slots - 1) * 8, Ordering::Relaxed);
    }
}

/// Copies `data` to the host through the PRPs of `sqe`, zero-filling up to `len` bytes.
pub(super) fn to_host(
    mem: &Mem<'_>,
    sqe: &Sqe,
    data: &[u8],
    len: usize,
    page: usize,
    segs: &mut Vec<Seg>,
) -> Result<(), Status> {
    walk_prps(mem, sqe.prp1, sqe.prp2, len, page, segs)?;
    let mut pos = 0usize;
    for s in segs.iter() {
        let g = mem
            .translate(s.iova, s.len as usize)
            .ok_or(Status::DATA_TRANSFER_ERROR.with_dnr(true))?;
        let n = s.len as usize;
        let have = data.len().saturating_sub(pos).min(n);
        if have > 0 {
            g.copy_in(0, &data[pos..pos + have]);
        }
        if have < n {
            g.zero(have, n - have);
        }
        pos += n;
    }
    Ok(())
}

/// Copies `out.len()` bytes from the host through the PRPs of `sqe`.
pub(super) fn from_host(
    mem: &Mem<'_>,
    sqe: &Sqe,
    out: &mut [u8],
    page: usize,
    segs: &mut Vec<Seg>,
) -> Result<(), Status> {
    walk_prps(mem, sqe.prp1, sqe.prp2, out.len(), page, segs)?;
    let mut pos = 0usize;
    for s in segs.iter() {
        let g = mem
            .translate(s.iova, s.len as usize)
            .ok_or(Status::DATA_TRANSFER_ERROR.with_dnr(true))?;
        g.copy_out(0, &mut out[pos..pos + s.len as usize]);
        pos += s.len as usize;
    }
    Ok(())
}

/// One emulated namespace.
pub(super) struct Ns {
    pub nsid: u32,
    /// log2 of the LBA size.
    pub lba_shift: u32,
    /// NSZE in blocks.
    pub nsze: u64,
    pub store: Store,
    /// Metadata, protection and command set as reported.
    pub format: super::EmuFormat,
}

/// The result of an NVM command: its status and, for the error log, the LBA involved.
pub(super) struct IoDone {
    pub status: Status,
    pub lba: u64,
}

impl IoDone {
    fn ok() -> Self {
        IoDone {
            status: Status::SUCCESS,
            lba: 0,
        }
    }
    fn err(status: Status, lba: u64) -> Self {
        IoDone { status, lba }
    }
}

/// Namespaces and scratch space for executing NVM commands.
pub(super) struct Nvm {
    pub ns: Vec<Ns>,
    /// PRP segments of the command being executed (capacity for MDTS, preallocated).
    pub segs: Vec<Seg>,
    /// Maximum data transfer in bytes (None: unlimited).
    pub mdts_bytes: Option<u64>,
    /// Memory page size (CC.MPS).
    pub page: usize,
}

impl Nvm {
    fn ns_index(&self, nsid: u32) -> Option<usize> {
        let i = (nsid as usize).checked_sub(1)?;
        (i < self.ns.len()).then_some(i)
    }

    /// Executes one command from an I/O submission queue.
    pub(super) fn exec(&mut self, mem: &Mem<'_>, sqe: &Sqe, st: &mut EmuStats) -> IoDone {
        let opc = sqe.opc();
        let counter = match opc {
            nvm_opc::READ => &mut st.reads,
            nvm_opc::WRITE => &mut st.writes,
            nvm_opc::FLUSH => &mut st.flushes,
            nvm_opc::WRITE_ZEROES => &mut st.write_zeroes,
            nvm_opc::DATASET_MANAGEMENT => &mut st.dsm,
            _ => &mut st.io_invalid,
        };
        *counter += 1;
        // A namespace whose format the controller reports but does not model (metadata,
        // protection, another command set) takes no I/O: see `EmuFormat`.
        if self
            .ns_index(sqe.nsid)
            .is_some_and(|i| !self.ns[i].format.executes_io())
        {
            return IoDone::err(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), 0);
        }
        match opc {
            nvm_opc::READ | nvm_opc::WRITE => self.read_write(mem, sqe, opc == nvm_opc::WRITE, st),
            nvm_opc::FLUSH => self.flush(sqe),
            nvm_opc::WRITE_ZEROES => self.write_zeroes(sqe),
            nvm_opc::DATASET_MANAGEMENT => self.dsm(mem, sqe),
            _ => IoDone::err(Status::INVALID_OPCODE.with_dnr(true), 0),
        }
    }

    /// Common checks of a command addressing an LBA range: namespace, SGL, range.
    fn range(&self, sqe: &Sqe) -> Result<(usize, u64, u32), IoDone> {
        let Some(i) = self.ns_index(sqe.nsid) else {
            return Err(IoDone::err(
                Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true),
                0,
            ));
        };
        if sqe.psdt() != 0 || sqe.fuse() != 0 {
            return Err(IoDone::err(Status::INVALID_FIELD.with_dnr(true), 0));
        }
        let slba = sqe.slba();
        let nlb = sqe.nlb();
        match slba.checked_add(nlb as u64) {
            Some(end) if end <= self.ns[i].nsze => Ok((i, slba, nlb)),
            _ => Err(IoDone::err(Status::LBA_OUT_OF_RANGE.with_dnr(true), slba)),
        }
    }

    fn read_write(&mut self, mem: &Mem<'_>, sqe: &Sqe, write: bool, st: &mut EmuStats) -> IoDone {
        let (i, slba, nlb) = match self.range(sqe) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let shift = self.ns[i].lba_shift;
        let bytes = (nlb as u64) << shift;
        if self.mdts_bytes.is_some_and(|m| bytes > m) {
            return IoDone::err(Status::INVALID_FIELD.with_dnr(true), slba);
        }
        if let Err(s) = walk_prps(
            mem,
            sqe.prp1,
            sqe.prp2,
            bytes as usize,
            self.page,
            &mut self.segs,
        ) {
            return IoDone::err(s, slba);
        }
        let ns = &mut self.ns[i];
        let off = slba << shift;
        let r = if write {
            let fua = sqe.cdw12 & (1 << 30) != 0;
            ns.store.write(off, mem, &self.segs, fua)
        } else {
            ns.store.read(off, mem, &self.segs)
        };
        match r {
            Ok(()) => {}
            Err(StoreError::Dma) => {
                return IoDone::err(Status::DATA_TRANSFER_ERROR.with_dnr(true), slba)
            }
            Err(StoreError::Io(_)) => {
                st.media_errors += 1;
                let s = if write {
                    Status::WRITE_FAULT
                } else {
                    Status::UNRECOVERED_READ_ERROR
                };
                return IoDone::err(s, slba);
            }
        }
        if write {
            st.bytes_written += bytes;
        } else {
            st.bytes_read += bytes;
        }
        IoDone::ok()
    }

    fn flush(&mut self, sqe: &Sqe) -> IoDone {
        if sqe.psdt() != 0 || sqe.fuse() != 0 {
            return IoDone::err(Status::INVALID_FIELD.with_dnr(true), 0);
        }
        let r = if sqe.nsid == NSID_ALL {
            self.ns.iter_mut().try_for_each(|n| n.store.flush())
        } else {
            match self.ns_index(sqe.nsid) {
                Some(i) => self.ns[i].store.flush(),
                None => return IoDone::err(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), 0),
            }
        };
        match r {
            Ok(()) => IoDone::ok(),
            Err(_) => IoDone::err(Status::WRITE_FAULT, 0),
        }
    }

    fn write_zeroes(&mut self, sqe: &Sqe) -> IoDone {
        let (i, slba, nlb) = match self.range(sqe) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let deac = sqe.cdw12 & (1 << 25) != 0;
        let ns = &mut self.ns[i];
        let shift = ns.lba_shift;
        match ns.store.zero(slba << shift, (nlb as u64) << shift, deac) {
            Ok(()) => IoDone::ok(),
            Err(_) => IoDone::err(Status::WRITE_FAULT, slba),
        }
    }

    fn dsm(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> IoDone {
        let Some(i) = self.ns_index(sqe.nsid) else {
            return IoDone::err(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), 0);
        };
        if sqe.psdt() != 0 || sqe.fuse() != 0 {
            return IoDone::err(Status::INVALID_FIELD.with_dnr(true), 0);
        }
        let nr = (sqe.cdw10 & 0xFF) as usize + 1;
        let deallocate = sqe.cdw11 & (1 << 2) != 0;
        let mut buf = [0u8; 256 * 16];
        let ranges = &mut buf[..nr * 16];
        if let Err(s) = from_host(mem, sqe, ranges, self.page, &mut self.segs) {
            return IoDone::err(s, 0);
        }
        let ns = &mut self.ns[i];
        let parse = |k: usize| {
            let mut b = [0u8; 16];
            b.copy_from_slice(&ranges[k * 16..k * 16 + 16]);
            DsmRange::from_bytes(&b)
        };
        // Check every range before acting on any.
        for k in 0..nr {
            let r = parse(k);
            if r.slba.checked_add(r.nlb as u64).is_none_or(|e| e > ns.nsze) {
                return IoDone::err(Status::LBA_OUT_OF_RANGE.with_dnr(true), r.slba);
            }
        }
        if deallocate {
            for k in 0..nr {
                let r = parse(k);
                if r.nlb == 0 {
                    continue;
                }
                let shift = ns.lba_shift;
                if ns
                    .store
                    .zero(r.slba << shift, (r.nlb as u64) << shift, true)
                    .is_err()
                {
                    return IoDone::err(Status::WRITE_FAULT, r.slba);
                }
            }
        }
        IoDone::ok()
    }
}
