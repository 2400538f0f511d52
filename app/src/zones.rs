//! Zone capacities read from the device. ZCAP, the writable part of a zone, may be less
//! than the zone size and may differ from zone to zone; it is only in the zone
//! descriptors, so it is read with Report Zones through a queue of the target, one
//! command at a time (`kestrel perf` before its zoned workloads, `kestrel identify`).

use std::time::Duration;

use kestrel::io::IoRequest;
use kestrel::spec::zns::{parse_report, ZoneState, ZONE_DESCRIPTOR_SIZE};
use kestrel::{Target, TargetQueue};

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
    let mut bytes = vec![0u8; len];
    let mut caps = Vec::with_capacity(count as usize);
    let end = first + count;
    let mut next = first;
    while next < end {
        let slba = next * zone_blocks;
        let req = IoRequest::report_zones(info.nsid, slba, buf.slice_all(), 0);
        let what = format!("report zones from lba {slba} on {name}");
        run_one(q, req, &what, REPORT_WAIT).map_err(|e| e.to_string())?;
        buf.read_at(0, &mut bytes)
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
