//! Zone Management Send and Receive of the Zoned Namespace Command Set, over the zone
//! state of [`crate::emu::zns`].

use super::{IoDone, Nvm};
use crate::emu::mem::Mem;
use crate::emu::prp::to_host;
use crate::spec::zns::{zra, zsa};
use crate::spec::{Sqe, Status};

impl Nvm {
    /// Zone Management Send: the action on one zone, or on all (Select All); a reset
    /// deallocates the zones' blocks and metadata.
    pub(super) fn zone_send(&mut self, sqe: &Sqe) -> Result<IoDone, IoDone> {
        let i = self.ns_index(sqe.nsid).ok_or(IoDone::err(
            Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true),
            0,
        ))?;
        let zslba = sqe.slba();
        let all = sqe.cdw13 & zsa::SELECT_ALL != 0;
        let ns = &mut self.ns[i];
        if !all && zslba >= ns.nsze {
            return Err(IoDone::err(Status::LBA_OUT_OF_RANGE.with_dnr(true), zslba));
        }
        let zones = ns
            .zones
            .as_mut()
            .expect("dispatched for zoned namespaces only");
        let resets = zones
            .send(zslba, sqe.cdw13 as u8, all)
            .map_err(|s| IoDone::err(s, zslba))?;
        for (slba, n) in resets {
            ns.zero_blocks(slba, n as u32, true)
                .map_err(|_| IoDone::err(Status::WRITE_FAULT, slba))?;
        }
        Ok(IoDone::ok())
    }

    /// Zone Management Receive: Report Zones (the extended report needs descriptor
    /// extensions, which these zones do not have: Invalid Field).
    pub(super) fn zone_receive(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Result<IoDone, IoDone> {
        let i = self.ns_index(sqe.nsid).ok_or(IoDone::err(
            Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true),
            0,
        ))?;
        let slba = sqe.slba();
        let invalid = IoDone::err(Status::INVALID_FIELD.with_dnr(true), slba);
        if sqe.psdt() != 0 || sqe.cdw13 as u8 != zra::REPORT_ZONES {
            return Err(invalid);
        }
        let len = (sqe.cdw12 as u64 + 1) * 4;
        if self.mdts_bytes.is_some_and(|m| len > m) || len > 1 << 24 {
            return Err(invalid);
        }
        let ns = &self.ns[i];
        if slba >= ns.nsze {
            return Err(IoDone::err(Status::LBA_OUT_OF_RANGE.with_dnr(true), slba));
        }
        let zones = ns
            .zones
            .as_ref()
            .expect("dispatched for zoned namespaces only");
        let zras = (sqe.cdw13 >> 8) as u8;
        let partial = sqe.cdw13 & zra::PARTIAL != 0;
        let report = zones
            .report(slba, zras, partial, len as usize)
            .map_err(|s| IoDone::err(s, slba))?;
        to_host(mem, sqe, &report, len as usize, self.page, &mut self.segs)
            .map_err(|s| IoDone::err(s, slba))?;
        Ok(IoDone::ok())
    }
}
