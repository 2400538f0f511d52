//! fio's zone operations (`zonemode=zbd`) on a zoned namespace: Report Zones, and Zone
//! Management Send's Reset and Finish, through the library's zoned API.
//!
//! fio calls them when it sets a job up (on its main thread, before the job's queue pair
//! exists) and from the job's thread while I/O is in flight (a zone is reset once fio has
//! no I/O in it), and waits for each: so they go through a small queue pair of their own,
//! made at the first zone operation, submitted and polled to completion. Its report
//! buffer comes from the target's DMA pool and is lent to that queue pair.

use std::time::Instant;

use kestrel::io::{IoRequest, ZoneAction, ZoneGeometry};
use kestrel::spec::zns::{parse_report, zone_type, ZoneState, ZONE_DESCRIPTOR_SIZE};
use kestrel::{DmaSlice, QueueOptions, TargetQueue};

use super::Job;
use crate::DRAIN_TIMEOUT;

/// The largest report one Report Zones command fills (a header and 1023 descriptors),
/// less when the target's transfers are smaller.
const REPORT_BYTES: usize = 64 << 10;

/// One zone as fio's `struct zbd_zone` has it, in bytes (`struct kfio_zone` of kfio.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KfioZone {
    /// First byte.
    pub start: u64,
    /// Write pointer (byte).
    pub wp: u64,
    /// Zone size in bytes.
    pub len: u64,
    /// Writable bytes from the start (zone capacity).
    pub capacity: u64,
    /// fio's `enum zbd_zone_cond`: the NVMe zone state code (the same values).
    pub cond: u32,
    /// fio's `enum zbd_zone_type`: 2, sequential write required.
    pub kind: u32,
}

const _: () = assert!(std::mem::size_of::<KfioZone>() == 40);

/// The zone queue pair and its report buffer.
pub(crate) struct ZoneQueue {
    queue: Box<dyn TargetQueue>,
    report: DmaSlice,
}

/// A failure: a positive errno and a message.
type ZoneFailure = (i32, String);

impl Job {
    /// The zone geometry, or ENOTSUP for a namespace that is not zoned.
    fn geometry(&self) -> Result<ZoneGeometry, ZoneFailure> {
        self.target.info().zones.ok_or_else(|| {
            (
                libc::EOPNOTSUPP,
                format!("{} is not a zoned namespace", self.name.to_string_lossy()),
            )
        })
    }

    /// The zone queue pair, made at the first use.
    fn zone_queue(&mut self) -> Result<&mut ZoneQueue, ZoneFailure> {
        if self.zones.is_none() {
            let name = self.name.to_string_lossy().into_owned();
            let fail = |what: &str, e: String| (libc::EIO, format!("{name}: {what}: {e}"));
            let opts = QueueOptions {
                depth: 4,
                ..QueueOptions::default()
            };
            let mut queue = self
                .target
                .create_queue(&opts)
                .map_err(|e| fail("creating the zone management queue pair", e.to_string()))?;
            let max = self.target.info().max_transfer_bytes as usize;
            let len = REPORT_BYTES.min(max) / ZONE_DESCRIPTOR_SIZE * ZONE_DESCRIPTOR_SIZE;
            let buf = self
                .target
                .dma_pool()
                .alloc(len.max(2 * ZONE_DESCRIPTOR_SIZE))
                .map_err(|e| fail("allocating the zone report buffer", e.to_string()))?;
            let report = queue
                .lend(buf)
                .map_err(|e| fail("lending the zone report buffer", e.to_string()))?;
            self.zones = Some(ZoneQueue { queue, report });
        }
        Ok(self.zones.as_mut().expect("made just above"))
    }

    /// Submits `req` on the zone queue pair and waits (bounded) for its completion.
    fn zone_command(&mut self, req: IoRequest, what: &str) -> Result<(), ZoneFailure> {
        let name = self.name.to_string_lossy().into_owned();
        let z = self.zone_queue()?;
        z.queue
            .submit(req)
            .map_err(|e| (libc::EIO, format!("{name}: {what}: {e}")))?;
        z.queue.flush();
        let end = Instant::now() + DRAIN_TIMEOUT;
        let mut result = None;
        while result.is_none() {
            z.queue.poll(1, &mut |c| result = Some(c.result));
            if result.is_none() && Instant::now() >= end {
                return Err((libc::ETIMEDOUT, format!("{name}: {what}: no completion")));
            }
        }
        match result.expect("loop ends with a result") {
            Ok(()) => Ok(()),
            Err(e) => Err((e.errno(), format!("{name}: {what}: {e}"))),
        }
    }

    /// Reports the zones from the one holding byte `offset` into `out`: how many.
    pub(crate) fn report_zones(
        &mut self,
        offset: u64,
        out: &mut [KfioZone],
    ) -> Result<usize, ZoneFailure> {
        let g = self.geometry()?;
        let bs = self.block_size;
        let mut lba = g.zone_start(offset / bs);
        let mut n = 0;
        let mut raw = vec![0u8; 0];
        while n < out.len() && lba < self.num_blocks {
            let report = self.zone_queue()?.report;
            let req = IoRequest::report_zones(self.nsid, lba, report, 0);
            self.zone_command(req, &format!("report zones from lba {lba}"))?;
            raw.resize(report.len(), 0);
            let z = self.zones.as_ref().expect("made by zone_command");
            z.queue
                .read_lent(&report, 0, &mut raw)
                .map_err(|e| (libc::EIO, format!("reading the zone report: {e}")))?;
            let before = n;
            for d in parse_report(&raw) {
                if n == out.len() || d.zslba < lba {
                    break;
                }
                out[n] = self.to_fio(&d, &g);
                lba = d.zslba + g.zone_size;
                n += 1;
            }
            if n == before {
                break;
            }
        }
        Ok(n)
    }

    fn to_fio(&self, d: &kestrel::spec::zns::ZoneDescriptor, g: &ZoneGeometry) -> KfioZone {
        let bs = self.block_size;
        let state = d.state();
        // A full (or read-only, offline) zone's write pointer is not defined: fio takes
        // it as the end of the zone's capacity.
        let wp = match state {
            Some(ZoneState::Full | ZoneState::ReadOnly | ZoneState::Offline) | None => {
                d.zslba + d.zcap
            }
            _ => d.wp,
        };
        KfioZone {
            start: d.zslba * bs,
            wp: wp * bs,
            len: g.zone_size * bs,
            capacity: d.zcap * bs,
            cond: state.map_or(ZoneState::Offline.code(), |s| s.code()) as u32,
            kind: u32::from(if d.zt & 0xf == zone_type::SEQUENTIAL_WRITE_REQUIRED {
                2
            } else {
                d.zt & 0xf
            }),
        }
    }

    /// `action` on every zone in `len` bytes from byte `offset` (both whole zones; a
    /// range that is the whole namespace is one Select All command).
    pub(crate) fn zone_action(
        &mut self,
        action: ZoneAction,
        offset: u64,
        len: u64,
    ) -> Result<(), ZoneFailure> {
        let g = self.geometry()?;
        let bs = self.block_size;
        let zone_bytes = g.zone_size * bs;
        if offset % zone_bytes != 0 || len % zone_bytes != 0 {
            return Err((
                libc::EINVAL,
                format!(
                    "zone {}: {len} bytes at {offset} are not whole zones of {zone_bytes} bytes",
                    action.name()
                ),
            ));
        }
        let (first, count) = (offset / bs, len / bs / g.zone_size);
        if first == 0 && count >= g.zones {
            let req = IoRequest::zone_send_all(self.nsid, action, 0);
            return self.zone_command(req, &format!("zone {} (all zones)", action.name()));
        }
        for z in 0..count {
            let zslba = first + z * g.zone_size;
            let req = IoRequest::zone_send(self.nsid, zslba, action, 0);
            self.zone_command(req, &format!("zone {} at lba {zslba}", action.name()))?;
        }
        Ok(())
    }

    /// The open (`active` false) or active zone limit; 0: none.
    pub(crate) fn zone_limit(&self, active: bool) -> u32 {
        let g = self.target.info().zones;
        let limit = g.and_then(|g| if active { g.max_active } else { g.max_open });
        limit.unwrap_or(0)
    }
}
