//! A poller's set-up before the run: its queues on every target, one DMA buffer slice per
//! I/O slot, the completion lists and (with `--verify`) the generation table.

use kestrel::io::QueueStats;
use kestrel::spec::pi::{PiFormat, PiType};

use super::{
    partition, QueueState, Slot, TargetResult, TargetState, Worker, WorkerConfig, WorkerError,
    MISMATCHES_KEPT, VERIFY_MAX_UNITS,
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
            let io_bytes = io_blocks as usize * host_bs;
            let md_bytes = md
                .filter(|m| !m.extended)
                .map_or(0, |m| io_blocks as usize * m.ms as usize);
            let stride = io_bytes.next_multiple_of(4096);
            let md_stride = md_bytes.next_multiple_of(64);
            let total_units = info.num_blocks / io_blocks as u64;
            let (first_unit, mut units) = partition(total_units, cfg.pollers, cfg.index);
            if cfg.verify {
                units = units.min(VERIFY_MAX_UNITS);
            }
            targets.push(TargetState {
                nsid: info.nsid,
                io_blocks,
                block_size: info.block_size as usize,
                md,
                pi,
                host_bs,
                io_bytes,
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
            });
            for _ in 0..cfg.qpairs {
                let q = t.create_queue(&cfg.queue).map_err(|e| {
                    format!("core {}: creating a queue on {}: {e}", cfg.core, info.name)
                })?;
                let res = &mut targets[ti].res;
                if res.in_use.is_none() {
                    res.in_use = q.in_use();
                }
                let qd = cfg.queue_depth as usize;
                let buf = t.dma_pool().alloc(qd * stride).map_err(|e| {
                    format!("core {}: i/o buffers for {}: {e}", cfg.core, info.name)
                })?;
                let slices = (0..qd)
                    .map(|i| buf.slice(i * stride, io_bytes))
                    .collect::<Result<Box<[_]>, _>>()
                    .map_err(|e| format!("core {}: i/o buffer slices: {e}", cfg.core))?;
                let md_buf = if md_bytes > 0 {
                    Some(t.dma_pool().alloc(qd * md_stride).map_err(|e| {
                        format!("core {}: metadata buffers for {}: {e}", cfg.core, info.name)
                    })?)
                } else {
                    None
                };
                let md_slices = match &md_buf {
                    Some(b) => (0..qd)
                        .map(|i| b.slice(i * md_stride, md_bytes))
                        .collect::<Result<Box<[_]>, _>>()
                        .map_err(|e| format!("core {}: metadata slices: {e}", cfg.core))?,
                    None => Box::default(),
                };
                queues.push(QueueState {
                    q,
                    target: ti,
                    dead: false,
                    slices,
                    stride,
                    md_slices,
                    md_stride,
                    md_buf,
                    buf,
                    slots: vec![
                        Slot {
                            submit_raw: 0,
                            unit: 0,
                            gen: 0,
                            write: false
                        };
                        qd
                    ]
                    .into_boxed_slice(),
                    done: Vec::with_capacity(
                        qd.max(kestrel::nvme::qpair::MAX_COMPLETIONS_PER_POLL as usize) + 1,
                    ),
                    base: QueueStats::default(),
                });
            }
        }
        Ok((targets, queues))
    }
}
