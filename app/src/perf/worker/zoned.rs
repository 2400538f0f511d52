//! The zoned workloads (`-w zone-write`, `-w zone-append`): each I/O slot of a poller owns
//! zones of its own, so a zone never has more than one write in flight and every write
//! lands at the zone's write pointer whatever order the controller runs a queue's
//! commands in. A slot resets its zone before writing it from its start (the zone may hold
//! an earlier run's data), writes or appends `--io-size` at a time up to the zone's
//! capacity (which may be less than its size: the rest of the zone is never written), then
//! moves to its next zone and resets that. The capacities come from Report Zones when the
//! poller sets up; Read Only and Offline zones are skipped. A Zone Append's completion
//! must name the write pointer the slot expects; anything else ends the run with an error.
//! Resets count among the run's outcomes (submitted, succeeded or failed) but not as I/Os
//! of the figures (IOPS, bandwidth, latency).

use kestrel::io::{Completion, IoRequest, SubmitError, ZoneAction};
use kestrel::target::TargetInfo;
use kestrel::{Target, TargetQueue};

use super::{record_error, Slot, Worker, WorkerConfig, WorkerError, VERIFY_MAX_UNITS};
use crate::cli::ZonedMode;

/// The zones of one slot.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ZoneSlot {
    /// Its first zone (index in the namespace).
    first: u64,
    /// How many zones it owns, from `first` on.
    count: u64,
    /// The zone it writes now (offset from `first`).
    cur: u64,
    /// The next LBA it writes in that zone (the write pointer, as far as it knows).
    wp: u64,
    /// The zone must be reset before it is written (at the start, after a full zone,
    /// after a failed write left the write pointer unknown).
    need_reset: bool,
}

/// A poller's share of a zoned target.
pub(super) struct ZonePlan {
    /// Zone size in blocks.
    pub zone_blocks: u64,
    pub first_zone: u64,
    zones: u64,
    /// Each zone's capacity in blocks, from `first_zone` on (0: not written); filled by
    /// [`ZonePlan::read_capacities`].
    pub caps: Box<[u64]>,
    /// Its I/O units (of `--io-size`): those of its zones.
    pub first_unit: u64,
    pub units: u64,
}

/// This poller's zones of `info`, checked against the run's shape.
pub(super) fn plan(
    cfg: &WorkerConfig,
    info: &TargetInfo,
    io_blocks: u32,
) -> Result<ZonePlan, WorkerError> {
    let Some(z) = info.zones else {
        return Err(format!(
            "{}: not a zoned namespace: -w zone-write and -w zone-append need one",
            info.name
        ));
    };
    let io_blocks = u64::from(io_blocks);
    if z.zone_size % io_blocks != 0 {
        return Err(format!(
            "{}: the zone size ({} blocks) is not a multiple of --io-size ({} blocks)",
            info.name, z.zone_size, io_blocks
        ));
    }
    let slots = u64::from(cfg.qpairs) * u64::from(cfg.queue_depth);
    let all_slots = slots * cfg.pollers as u64;
    for (what, limit) in [("open", z.max_open), ("active", z.max_active)] {
        if let Some(l) = limit {
            if all_slots > u64::from(l) {
                return Err(format!(
                    "{}: a zoned workload keeps one zone open per outstanding i/o: {all_slots} \
                     ({} cores x {} qpairs per core x -q {}), more than the namespace's max \
                     {what} zones ({l}): lower -q, --qpairs-per-core or the cores",
                    info.name, cfg.pollers, cfg.qpairs, cfg.queue_depth
                ));
            }
        }
    }
    let (first_zone, zones) = super::partition(z.zones, cfg.pollers, cfg.index);
    if zones < slots {
        return Err(format!(
            "{}: a zoned workload gives each outstanding i/o zones of its own: core {} has {zones} \
             of the {} zones for {slots} i/os ({} qpairs x -q {}): lower -q, \
             --qpairs-per-core or the cores",
            info.name, cfg.core, z.zones, cfg.qpairs, cfg.queue_depth
        ));
    }
    let zone_units = z.zone_size / io_blocks;
    let units = zones * zone_units;
    if cfg.verify && units > VERIFY_MAX_UNITS {
        return Err(format!(
            "{}: --verify tracks at most {VERIFY_MAX_UNITS} i/o units per core; this core's \
             zones hold {units}: use a larger --io-size or more cores",
            info.name
        ));
    }
    Ok(ZonePlan {
        zone_blocks: z.zone_size,
        first_zone,
        zones,
        caps: Box::default(),
        first_unit: first_zone * zone_units,
        units,
    })
}

impl ZonePlan {
    /// Reads the capacity of each of this poller's zones with Report Zones through `q` (a
    /// new queue, nothing else in flight). A zone is written up to its capacity, so the
    /// capacity must hold whole I/Os; a Read Only or Offline zone is left alone (capacity
    /// 0).
    pub(super) fn read_capacities(
        &mut self,
        cfg: &WorkerConfig,
        t: &dyn Target,
        q: &mut dyn TargetQueue,
        io_blocks: u32,
    ) -> Result<(), WorkerError> {
        let name = &t.info().name;
        let zb = self.zone_blocks;
        let caps: Box<[u64]> = crate::zones::capacities(t, q, zb, self.first_zone, self.zones)
            .map_err(|e| format!("core {}: {e}", cfg.core))?
            .iter()
            .map(|c| if c.writable { c.zcap } else { 0 })
            .collect();
        for (i, &cap) in caps.iter().enumerate() {
            if cap > zb || cap % u64::from(io_blocks) != 0 {
                return Err(format!(
                    "{name}: the zone at lba {} has a capacity of {cap} blocks, not a whole \
                     number of --io-size ({io_blocks} blocks) within its {zb} blocks: a zoned \
                     workload writes whole i/os up to each zone's capacity; use an --io-size \
                     that divides it",
                    (self.first_zone + i as u64) * zb
                ));
            }
        }
        self.caps = caps;
        Ok(())
    }

    /// The zones of the slots of queue `qn` (of `cfg.qpairs`) of this poller, each at its
    /// first writable zone.
    pub(super) fn slots(
        &self,
        cfg: &WorkerConfig,
        qn: usize,
    ) -> Result<Box<[ZoneSlot]>, WorkerError> {
        let qd = cfg.queue_depth as usize;
        let all = cfg.qpairs as usize * qd;
        (0..qd)
            .map(|s| {
                let (f, count) = super::partition(self.zones, all, qn * qd + s);
                let first = self.first_zone + f;
                let cur = (0..count)
                    .find(|&c| self.caps[(f + c) as usize] > 0)
                    .ok_or_else(|| {
                        format!(
                            "core {}: every zone of i/o slot {s} (zones {first} to {}) is read \
                             only or offline: lower -q, --qpairs-per-core or the cores",
                            cfg.core,
                            first + count - 1
                        )
                    })?;
                Ok(ZoneSlot {
                    first,
                    count,
                    cur,
                    wp: (first + cur) * self.zone_blocks,
                    need_reset: true,
                })
            })
            .collect()
    }
}

impl Worker<'_> {
    /// The next I/O of a zoned slot: a reset of its zone, or a write (append) at its
    /// write pointer.
    pub(super) fn submit_zoned(
        &mut self,
        qi: usize,
        slot: usize,
        now: u64,
    ) -> Result<(), WorkerError> {
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let z = q.zslots[slot];
        let zslba = (z.first + z.cur) * ts.zone_blocks;
        if !z.need_reset {
            let unit = z.wp / u64::from(ts.io_blocks) - ts.first_unit;
            return self.issue(qi, slot, unit, true, now);
        }
        q.slots[slot] = Slot {
            submit_raw: now,
            unit: zslba / u64::from(ts.io_blocks) - ts.first_unit,
            gen: 0,
            write: false,
            reset: true,
        };
        let req = IoRequest::zone_send(ts.nsid, zslba, ZoneAction::Reset, slot as u64);
        match q.q.submit(req) {
            Ok(()) => {
                ts.res.outcomes.submitted += 1;
                Ok(())
            }
            Err(SubmitError::DeviceRemoved) => {
                self.dead += usize::from(!q.dead);
                q.dead = true;
                ts.res.removed = true;
                Ok(())
            }
            Err(e) => Err(format!(
                "core {}: submitting a reset of the zone at lba {zslba}: {e}",
                self.cfg.core
            )),
        }
    }

    /// A zone reset completed: the slot writes the zone from its start (its blocks now
    /// read as never written), or tries the reset again after a failure.
    pub(super) fn reset_done(
        &mut self,
        qi: usize,
        slot_i: usize,
        c: Completion,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let z = &mut q.zslots[slot_i];
        let zslba = (z.first + z.cur) * ts.zone_blocks;
        ts.res.outcomes.record(c.result);
        if let Err(e) = c.result {
            self.prog_err += 1;
            record_error(&mut ts.res, cfg.core, true, zslba, e);
            return Ok(());
        }
        z.need_reset = false;
        z.wp = zslba;
        if cfg.verify {
            let first = (zslba / u64::from(ts.io_blocks) - ts.first_unit) as usize;
            let n = (ts.zone_blocks / u64::from(ts.io_blocks)) as usize;
            ts.gens[first..first + n].fill(0);
        }
        Ok(())
    }

    /// A write or append of a zoned slot completed: checks an append's LBA and moves the
    /// write pointer (to the next zone when this one is full); after a failure the zone
    /// is reset.
    pub(super) fn zone_written(
        &mut self,
        qi: usize,
        slot_i: usize,
        lba0: u64,
        c: &Completion,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &self.targets[q.target];
        let z = &mut q.zslots[slot_i];
        let zslba = (z.first + z.cur) * ts.zone_blocks;
        if c.result.is_err() {
            z.need_reset = true;
            z.wp = zslba;
            return Ok(());
        }
        if cfg.zoned == Some(ZonedMode::Append) && c.value != lba0 {
            return Err(format!(
                "core {}: a zone append to the zone at lba {zslba} completed at lba {}, not at \
                 the write pointer {lba0} (the only append in flight to that zone)",
                cfg.core, c.value
            ));
        }
        z.wp = lba0 + u64::from(ts.io_blocks);
        let cap = |c: u64| ts.zone_caps[(z.first + c - ts.zone_first) as usize];
        if z.wp >= zslba + cap(z.cur) {
            // The next writable zone of the slot (it has one: the one just written).
            for _ in 0..z.count {
                z.cur = (z.cur + 1) % z.count;
                if cap(z.cur) > 0 {
                    break;
                }
            }
            z.wp = (z.first + z.cur) * ts.zone_blocks;
            z.need_reset = true;
        }
        Ok(())
    }
}
