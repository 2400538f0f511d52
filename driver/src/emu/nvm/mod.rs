//! The I/O commands of the emulated controller: Read, Write, Flush, Write Zeroes and
//! Dataset Management of the NVM Command Set, and Zone Append, Zone Management Send and
//! Receive of the Zoned Namespace Command Set. Transfers of formats with metadata and
//! protection information go through `blocks`; the zone commands are in `zones`, over the
//! zone state of [`super::zns`].

mod blocks;
mod zones;

use super::faults::PiField;
use super::mem::Mem;
use super::ns::Ns;
use super::prp::{from_host, walk_prps, Seg};
use super::store::StoreError;
use super::EmuStats;
use crate::spec::cmd::DsmRange;
use crate::spec::zns::zns_opc;
use crate::spec::{nvm_opc, Sqe, Status, NSID_ALL};

/// The result of an I/O command: its status, command specific dwords 0 and 1 (the LBA a
/// Zone Append wrote), and, for the error log, the LBA involved.
pub(super) struct IoDone {
    pub status: Status,
    pub dw: u64,
    pub lba: u64,
}

impl IoDone {
    pub(super) fn ok() -> Self {
        IoDone {
            status: Status::SUCCESS,
            dw: 0,
            lba: 0,
        }
    }
    pub(super) fn err(status: Status, lba: u64) -> Self {
        IoDone { status, dw: 0, lba }
    }
}

/// What a data-moving command does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Dir {
    Read,
    Write,
    /// Zone Append: a write at the zone's write pointer.
    Append,
}

/// Namespaces and scratch space for executing I/O commands.
pub(super) struct Nvm {
    pub ns: Vec<Ns>,
    /// PRP segments of the command being executed (capacity for MDTS, preallocated).
    pub segs: Vec<Seg>,
    /// Maximum data transfer in bytes (None: unlimited).
    pub mdts_bytes: Option<u64>,
    /// Memory page size (CC.MPS).
    pub page: usize,
    /// CC.CSS selects all supported I/O command sets (110b): the Zoned Namespace
    /// commands are available (with CC.CSS = NVM they are Invalid Command Opcode).
    pub all_io_sets: bool,
    /// Data of a formatted transfer, checked before it moves on (grown on first use).
    pub data: Vec<u8>,
    /// Metadata of a formatted transfer.
    pub meta: Vec<u8>,
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
            all_io_sets: false,
            data: Vec::new(),
            meta: Vec::new(),
        }
    }

    pub(super) fn ns_index(&self, nsid: u32) -> Option<usize> {
        let i = (nsid as usize).checked_sub(1)?;
        (i < self.ns.len()).then_some(i)
    }

    /// Executes one command from an I/O submission queue; `corrupt` is an injected
    /// corruption of the protection information a Read returns.
    pub(super) fn exec(
        &mut self,
        mem: &Mem<'_>,
        sqe: &Sqe,
        st: &mut EmuStats,
        corrupt: Option<PiField>,
    ) -> IoDone {
        let opc = sqe.opc();
        *Self::counter(opc, st) += 1;
        let ns = self.ns_index(sqe.nsid).map(|i| &self.ns[i]);
        // A namespace of a command set the controller does not model takes no I/O.
        if ns.is_some_and(|n| !n.executes_io()) {
            return IoDone::err(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), 0);
        }
        let zoned = self.all_io_sets && ns.is_some_and(|n| n.zones.is_some());
        let r = match opc {
            nvm_opc::READ => self.read_write(mem, sqe, Dir::Read, corrupt, st),
            nvm_opc::WRITE => self.read_write(mem, sqe, Dir::Write, None, st),
            zns_opc::ZONE_APPEND if zoned => self.read_write(mem, sqe, Dir::Append, None, st),
            nvm_opc::FLUSH => return self.flush(sqe),
            nvm_opc::WRITE_ZEROES => self.write_zeroes(sqe),
            nvm_opc::DATASET_MANAGEMENT => return self.dsm(mem, sqe),
            zns_opc::ZONE_MGMT_SEND if zoned => self.zone_send(sqe),
            zns_opc::ZONE_MGMT_RECV if zoned => self.zone_receive(mem, sqe),
            _ => return IoDone::err(Status::INVALID_OPCODE.with_dnr(true), 0),
        };
        if let Err(e) = &r {
            let pi = [
                Status::E2E_GUARD_CHECK_ERROR,
                Status::E2E_APPLICATION_TAG_CHECK_ERROR,
                Status::E2E_REFERENCE_TAG_CHECK_ERROR,
            ];
            if pi.iter().any(|&s| e.status.same_code(s)) {
                st.pi_errors += 1;
            }
        }
        r.unwrap_or_else(|e| e)
    }

    fn counter(opc: u8, st: &mut EmuStats) -> &mut u64 {
        match opc {
            nvm_opc::READ => &mut st.reads,
            nvm_opc::WRITE => &mut st.writes,
            nvm_opc::FLUSH => &mut st.flushes,
            nvm_opc::WRITE_ZEROES => &mut st.write_zeroes,
            nvm_opc::DATASET_MANAGEMENT => &mut st.dsm,
            zns_opc::ZONE_APPEND => &mut st.zone_appends,
            zns_opc::ZONE_MGMT_SEND => &mut st.zone_mgmt_sends,
            zns_opc::ZONE_MGMT_RECV => &mut st.zone_mgmt_receives,
            _ => &mut st.io_invalid,
        }
    }

    /// Common checks of a command addressing an LBA range: namespace, SGL, range.
    pub(super) fn range(&self, sqe: &Sqe) -> Result<(usize, u64, u32), IoDone> {
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
        // MDTS before the range, as QEMU checks them: a transfer larger than MDTS is
        // Invalid Field even where it also runs past the end. The transfer counts the
        // metadata of an extended LBA, unless PRACT inserts or strips all of it (MS 8).
        if matches!(
            sqe.opc(),
            nvm_opc::READ | nvm_opc::WRITE | zns_opc::ZONE_APPEND
        ) {
            let ns = &self.ns[i];
            let pract_only = ns.pi_type().is_some()
                && ns.ms() == crate::spec::pi::PI_SIZE
                && crate::spec::pi::Prinfo::from_cdw12(sqe.cdw12).pract();
            let md = if ns.format.extended && !pract_only {
                ns.ms() as u64
            } else {
                0
            };
            let bytes = nlb as u64 * ((1u64 << ns.lba_shift) + md);
            if self.mdts_bytes.is_some_and(|m| bytes > m) {
                return Err(IoDone::err(Status::INVALID_FIELD.with_dnr(true), slba));
            }
        }
        match slba.checked_add(nlb as u64) {
            Some(end) if end <= self.ns[i].nsze => Ok((i, slba, nlb)),
            _ => Err(IoDone::err(Status::LBA_OUT_OF_RANGE.with_dnr(true), slba)),
        }
    }

    /// Read, Write and Zone Append: the zone rules (writes to a zoned namespace), then
    /// the transfer (plain, or with metadata), then the zone's write pointer.
    fn read_write(
        &mut self,
        mem: &Mem<'_>,
        sqe: &Sqe,
        dir: Dir,
        corrupt: Option<PiField>,
        st: &mut EmuStats,
    ) -> Result<IoDone, IoDone> {
        let (i, slba, nlb) = self.range(sqe)?;
        let zw = match (&self.ns[i].zones, dir) {
            (Some(z), Dir::Write | Dir::Append) => Some(
                z.check_write(slba, nlb, dir == Dir::Append)
                    .map_err(|s| IoDone::err(s, slba))?,
            ),
            _ => None,
        };
        let lba = zw.map_or(slba, |w| w.lba);
        if self.ns[i].ms() == 0 {
            self.plain(mem, sqe, i, lba, nlb, dir != Dir::Read, st)?;
        } else {
            self.formatted(mem, sqe, i, lba, nlb, dir, corrupt, st)?;
        }
        let bytes = (nlb as u64) << self.ns[i].lba_shift;
        if dir == Dir::Read {
            st.bytes_read += bytes;
        } else {
            st.bytes_written += bytes;
        }
        if let (Some(w), Some(z)) = (zw, self.ns[i].zones.as_mut()) {
            z.commit_write(w, nlb);
        }
        Ok(IoDone {
            dw: if dir == Dir::Append { lba } else { 0 },
            ..IoDone::ok()
        })
    }

    /// A transfer without metadata: the PRPs straight to and from the store.
    #[allow(clippy::too_many_arguments)]
    fn plain(
        &mut self,
        mem: &Mem<'_>,
        sqe: &Sqe,
        i: usize,
        lba: u64,
        nlb: u32,
        write: bool,
        st: &mut EmuStats,
    ) -> Result<(), IoDone> {
        let shift = self.ns[i].lba_shift;
        let bytes = (nlb as u64) << shift;
        if self.mdts_bytes.is_some_and(|m| bytes > m) {
            return Err(IoDone::err(Status::INVALID_FIELD.with_dnr(true), lba));
        }
        let page = self.page;
        walk_prps(
            mem,
            sqe.prp1,
            sqe.prp2,
            bytes as usize,
            page,
            &mut self.segs,
        )
        .map_err(|s| IoDone::err(s, lba))?;
        let ns = &mut self.ns[i];
        let off = lba << shift;
        let r = if write {
            let fua = sqe.cdw12 & (1 << 30) != 0;
            ns.store.write(off, mem, &self.segs, fua)
        } else {
            ns.store.read(off, mem, &self.segs)
        };
        r.map_err(|e| store_error(e, write, lba, st))
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

    /// Write Zeroes: zeroes data and metadata (DEAC: deallocates them); on a protected
    /// namespace with PRACT the controller then generates the blocks' PI. A write for the
    /// zone rules.
    fn write_zeroes(&mut self, sqe: &Sqe) -> Result<IoDone, IoDone> {
        let (i, slba, nlb) = self.range(sqe)?;
        let zw = match &self.ns[i].zones {
            Some(z) => Some(
                z.check_write(slba, nlb, false)
                    .map_err(|s| IoDone::err(s, slba))?,
            ),
            None => None,
        };
        let pi = self.pi_command(i, sqe, slba)?;
        // No data comes from the host, so there is nothing to check: a Write Zeroes asking
        // for checks (PRCHK) is refused, as QEMU's controller refuses it.
        if pi.is_some_and(|c| c.prinfo.0 & 0x7 != 0) {
            return Err(IoDone::err(
                Status::INVALID_PROTECTION_INFORMATION.with_dnr(true),
                slba,
            ));
        }
        let deac = sqe.cdw12 & (1 << 25) != 0;
        let fault = |_| IoDone::err(Status::WRITE_FAULT, slba);
        self.ns[i].zero_blocks(slba, nlb, deac).map_err(fault)?;
        if let Some(c) = pi.filter(|c| c.prinfo.pract()) {
            self.generate_zero_pi(i, slba, nlb, &c).map_err(fault)?;
        }
        if let (Some(w), Some(z)) = (zw, self.ns[i].zones.as_mut()) {
            z.commit_write(w, nlb);
        }
        Ok(IoDone::ok())
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
                if ns.zero_blocks(r.slba, r.nlb, true).is_err() {
                    return IoDone::err(Status::WRITE_FAULT, r.slba);
                }
            }
        }
        IoDone::ok()
    }
}

/// The status of a store failure: Data Transfer Error for a segment that did not
/// translate, else a media error (Write Fault or Unrecovered Read Error), counted.
pub(super) fn store_error(e: StoreError, write: bool, lba: u64, st: &mut EmuStats) -> IoDone {
    match e {
        StoreError::Dma => IoDone::err(Status::DATA_TRANSFER_ERROR.with_dnr(true), lba),
        StoreError::Io(_) => {
            st.media_errors += 1;
            let s = if write {
                Status::WRITE_FAULT
            } else {
                Status::UNRECOVERED_READ_ERROR
            };
            IoDone::err(s, lba)
        }
    }
}
