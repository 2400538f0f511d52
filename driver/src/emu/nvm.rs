//! The NVM command set of the emulated controller (Read, Write, Flush, Write Zeroes,
//! Dataset Management).

use super::mem::Mem;
use super::ns::Ns;
use super::prp::{from_host, walk_prps, Seg};
use super::store::StoreError;
use super::EmuStats;
use crate::spec::cmd::DsmRange;
use crate::spec::{nvm_opc, Sqe, Status, NSID_ALL};

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
    /// The namespaces, with scratch space for the largest transfer MDTS allows.
    pub(super) fn new(ns: Vec<Ns>, mdts_bytes: Option<u64>) -> Self {
        // Enough segments for the largest transfer: one per page plus a partial first.
        let max_segs = match mdts_bytes {
            Some(b) => b as usize / 4096 + 2,
            None => (65536usize * 4096) / 4096 + 2,
        };
        Nvm {
            ns,
            segs: Vec::with_capacity(max_segs),
            mdts_bytes,
            page: 4096,
        }
    }

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
