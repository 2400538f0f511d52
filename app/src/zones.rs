//! Zone capacities read from the device. ZCAP, the writable part of a zone, may be less
//! than the zone size and may differ from zone to zone; it is only in the zone
//! descriptors, so it is read with Report Zones through a queue of the target, one
//! command at a time (`kestrel perf` before its zoned workloads, `kestrel identify`).

use std::time::Duration;

use kestrel::io::IoRequest;
use kestrel::spec::zns::{parse_report, ZoneState, ZONE_DESCRIPTOR_SIZE};
use kestrel::target::TargetInfo;
use kestrel::{DmaSlice, Target, TargetQueue};

use crate::read::run_one;

/// The largest Report Zones asked for (1,023 descriptors), less where the target's
/// largest transfer is smaller.
const REPORT_BYTES: usize = 64 * 1024;
/// How long one Report Zones may take (the queue's I/O timeout, 30 s unless set,
/// normally ends a stuck command first).
const REPORT_WAIT: Duration = Duration::from_secs(120);

/// One zone as Report Zones describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneCap {
    /// ZCAP: its writable blocks, from its start.
    pub zcap: u64,
    /// Neither Read Only nor Offline.
    pub writable: bool,
}

/// The capacities of zones `first .. first + count` of zoned target `t` (zone size
/// `zone_blocks`), read through `q`, which must have nothing else in flight.
pub fn capacities(
    t: &dyn Target,
    q: &mut dyn TargetQueue,
    zone_blocks: u64,
    first: u64,
    count: u64,
) -> Result<Vec<ZoneCap>, String> {
    let info = t.info();
    let name = &info.name;
    let len = (info.max_transfer_bytes as usize).clamp(2 * ZONE_DESCRIPTOR_SIZE, REPORT_BYTES)
        / ZONE_DESCRIPTOR_SIZE
        * ZONE_DESCRIPTOR_SIZE;
    let buf = t
        .dma_pool()
        .alloc(len)
        .map_err(|e| format!("a report zones buffer for {name}: {e}"))?;
    let buf = q
        .lend(buf)
        .map_err(|e| format!("a report zones buffer for {name}: {e}"))?;
    let caps = report(q, &buf, info, zone_blocks, first, count);
    // Given back whatever happened: freed now, or once the queue has nothing outstanding
    // (a report that did not complete).
    let released = q.release(&buf);
    let caps = caps?;
    released.map_err(|e| format!("giving back the report zones buffer of {name}: {e}"))?;
    Ok(caps)
}

/// The reports of [`capacities`], one buffer (`buf`, lent to `q`) at a time.
fn report(
    q: &mut dyn TargetQueue,
    buf: &DmaSlice,
    info: &TargetInfo,
    zone_blocks: u64,
    first: u64,
    count: u64,
) -> Result<Vec<ZoneCap>, String> {
    let name = &info.name;
    let mut bytes = vec![0u8; buf.len()];
    let mut caps = Vec::with_capacity(count as usize);
    let end = first + count;
    let mut next = first;
    while next < end {
        let slba = next * zone_blocks;
        let req = IoRequest::report_zones(info.nsid, slba, *buf, 0);
        let what = format!("report zones from lba {slba} on {name}");
        run_one(q, req, &what, REPORT_WAIT).map_err(|e| e.to_string())?;
        q.read_lent(buf, 0, &mut bytes)
            .map_err(|e| format!("reading the zone report of {name}: {e}"))?;
        let from = next;
        for d in parse_report(&bytes) {
            // Descriptors in order, one per zone from the one asked: anything else ends
            // this report (the next starts after the last zone taken).
            if d.zslba != next * zone_blocks || next >= end {
                break;
            }
            let writable = !matches!(d.state(), Some(ZoneState::ReadOnly | ZoneState::Offline));
            caps.push(ZoneCap {
                zcap: d.zcap,
                writable,
            });
            next += 1;
        }
        if next == from {
            return Err(format!(
                "report zones from lba {slba} on {name} described no zone from that lba on"
            ));
        }
    }
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use kestrel::{target_spec, QueueOptions};

    use super::*;

    /// Report Zones' buffer is lent to the queue only while the reports are read: the
    /// queue (perf's first, which then runs the workload) holds nothing of it afterwards.
    #[test]
    fn capacities_give_their_buffer_back() {
        // 64 zones of 64 blocks.
        let spec = "emu:store=memory,ns=16M+4096+zoned+zone256K+open8+active8";
        let t = target_spec::open_spec(&target_spec::parse(spec).unwrap()).unwrap();
        let mut q = t.create_queue(&QueueOptions::default()).unwrap();
        let caps = capacities(t.as_ref(), q.as_mut(), 64, 0, 64).unwrap();
        assert_eq!(caps.len(), 64);
        assert!(caps.iter().all(|c| c.zcap == 64 && c.writable), "{caps:?}");
        assert_eq!(q.leases().lent(), 0);
        assert_eq!(q.outstanding(), 0);
    }
}
