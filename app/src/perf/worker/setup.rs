//! A poller's set-up before the run: its queues on every target, one DMA buffer slice per
//! I/O slot, the completion lists and (with `--verify`) the generation table.

use kestrel::io::{IoMeta, IoRequest, QueueStats};
use kestrel::spec::pi::{PiFormat, PiType};
use kestrel::target::TargetInfo;
use kestrel::{Target, TargetQueue};

use super::bufs::SlotBufs;

use super::{
    partition, zoned, QueueState, Slot, TargetResult, TargetState, Worker, WorkerConfig,
    WorkerError, MISMATCHES_KEPT, VERIFY_MAX_UNITS,
};
use crate::perf::latency::LatStats;
use crate::perf::outcome::Outcomes;

impl Worker<'_> {
    pub(super) fn setup(
        cfg: &WorkerConfig,
    ) -> Result<(Vec<TargetState>, Vec<QueueState>), WorkerError> {
        let mut targets = Vec::new();
        let mut queues = Vec::new();
        for (ti, t) in cfg.targets.iter().enumerate() {
            let info = t.info();
            let io_blocks = (cfg.io_size / info.block_size as u64) as u32;
            let mut zone = match cfg.zoned {
                Some(_) => Some(zoned::plan(cfg, info, io_blocks)?),
                None => None,
            };
            for qn in 0..cfg.qpairs {
                let mut q = t.create_queue(&cfg.queue).map_err(|e| {
                    format!("core {}: creating a queue on {}: {e}", cfg.core, info.name)
                })?;
                if qn == 0 {
                    // The zones' capacities come from the device (Report Zones, through
                    // the first queue) before any slot picks a zone.
                    if let Some(z) = zone.as_mut() {
                        z.read_capacities(cfg, t.as_ref(), q.as_mut(), io_blocks)?;
                    }
                    targets.push(target_state(cfg, info, zone.as_ref()));
                }
                let res = &mut targets[ti].res;
                if res.in_use.is_none() {
                    res.in_use = q.in_use();
                }
                let zslots = match &zone {
                    Some(z) => z.slots(cfg, qn as usize)?,
                    None => Default::default(),
                };
                queues.push(queue_state(cfg, t.as_ref(), &targets[ti], ti, q, zslots)?);
            }
        }
        Ok((targets, queues))
    }
}

/// This poller's share of a target: its I/O units, the `--verify` generations, the
/// results (preallocated).
fn target_state(
    cfg: &WorkerConfig,
    info: &TargetInfo,
    zone: Option<&zoned::ZonePlan>,
) -> TargetState {
    let io_blocks = (cfg.io_size / info.block_size as u64) as u32;
    let total_units = info.num_blocks / io_blocks as u64;
    let (first_unit, mut units) = zone.map_or_else(
        || partition(total_units, cfg.pollers, cfg.index),
        |z| (z.first_unit, z.units),
    );
    if cfg.verify {
        units = units.min(VERIFY_MAX_UNITS);
    }
    // The namespace's metadata goes with every I/O under --verify (it is checked), and
    // whenever the format needs it.
    let md = info.metadata.filter(|m| cfg.verify || m.required());
    let pi = md.and_then(|m| {
        PiType::from_dps(m.pi_type).map(|t| PiFormat {
            data_size: info.block_size as usize,
            ms: m.ms as usize,
            extended: m.extended,
            pi_first: m.pi_first,
            pi_type: t,
        })
    });
    let host_bs = md.map_or(info.block_size, |m| {
        m.host_block_size(info.block_size, true)
    }) as usize;
    let md_bytes = md
        .filter(|m| !m.extended)
        .map_or(0, |m| io_blocks as usize * m.ms as usize);
    TargetState {
        nsid: info.nsid,
        io_blocks,
        block_size: info.block_size as usize,
        md,
        pi,
        host_bs,
        io_bytes: io_blocks as usize * host_bs,
        md_bytes,
        first_unit,
        units,
        seq_next: 0,
        gens: if cfg.verify {
            vec![0; units as usize]
        } else {
            Vec::new()
        },
        res: TargetResult {
            ios: 0,
            reads: 0,
            writes: 0,
            bytes: 0,
            lat: [LatStats::default(), LatStats::default()],
            stats: QueueStats::default(),
            run_stats: QueueStats::default(),
            outcomes: Outcomes::default(),
            first_error: None,
            in_use: None,
            removed: false,
            lost: 0,
            blocks_verified: 0,
            mismatches: 0,
            mismatch_list: Vec::with_capacity(MISMATCHES_KEPT),
            readback_ios: 0,
            lba_range: (first_unit * io_blocks as u64, units * io_blocks as u64),
        },
        zone_blocks: zone.map_or(0, |z| z.zone_blocks),
        zone_first: zone.map_or(0, |z| z.first_zone),
        zone_caps: zone.map_or_else(Default::default, |z| z.caps.clone()),
    }
}

/// A queue of target `ti` (`ts`): its DMA buffers (one data slice, and one separate
/// metadata slice when the run carries it, per I/O slot), requests, slots and completion
/// list.
fn queue_state(
    cfg: &WorkerConfig,
    t: &dyn Target,
    ts: &TargetState,
    ti: usize,
    mut q: Box<dyn TargetQueue>,
    zslots: Box<[zoned::ZoneSlot]>,
) -> Result<QueueState, WorkerError> {
    let stride = ts.io_bytes.next_multiple_of(4096);
    let md_stride = ts.md_bytes.next_multiple_of(64);
    let qd = cfg.queue_depth as usize;
    let name = &t.info().name;
    // Lent to the queue for the whole run: the requests below carry slices of them, and
    // the queue's lease check is the only per-I/O cost of that.
    let buf = SlotBufs::lend(t.dma_pool(), q.as_mut(), qd, stride)
        .map_err(|e| format!("core {}: i/o buffers for {name}: {e}", cfg.core))?;
    let md_buf = if ts.md_bytes > 0 {
        Some(
            SlotBufs::lend(t.dma_pool(), q.as_mut(), qd, md_stride)
                .map_err(|e| format!("core {}: metadata buffers for {name}: {e}", cfg.core))?,
        )
    } else {
        None
    };
    let slice = |b: &SlotBufs, i: usize, len: usize| {
        b.slice(i, len).ok_or_else(|| {
            format!(
                "core {}: i/o buffer slices: {len} bytes past slot {i}'s region",
                cfg.core
            )
        })
    };
    let reqs = (0..qd)
        .map(|i| {
            let req = IoRequest::read(0, 0, 0, slice(&buf, i, ts.io_bytes)?, i as u64);
            Ok(match (&ts.md, &md_buf) {
                (Some(m), Some(b)) => {
                    req.with_meta(IoMeta::for_layout(m, slice(b, i, ts.md_bytes)?))
                }
                (Some(m), None) => req.with_meta(IoMeta::for_layout(m, IoMeta::NONE.buf)),
                _ => req,
            })
        })
        .collect::<Result<Box<[_]>, WorkerError>>()?;
    Ok(QueueState {
        q,
        target: ti,
        dead: false,
        reqs,
        md_buf,
        buf,
        slots: vec![
            Slot {
                submit_raw: 0,
                unit: 0,
                gen: 0,
                write: false,
                reset: false,
            };
            qd
        ]
        .into_boxed_slice(),
        zslots,
        done: Vec::with_capacity(
            qd.max(kestrel::nvme::qpair::MAX_COMPLETIONS_PER_POLL as usize) + 1,
        ),
        base: QueueStats::default(),
    })
}
