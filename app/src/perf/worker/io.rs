//! One I/O of a poller: choosing the next unit (random or sequential, one in flight per
//! unit under `--verify`), submitting it, and accounting for its completion (latency,
//! outcome, data check).

use kestrel::io::{Completion, IoError, IoOp, SubmitError};

use super::metadata::{check_metadata, fill_metadata, pi_mismatch, ref_tag, APP_TAG};
use super::{record_error, Slot, Worker, WorkerError, BUSY, MISMATCHES_KEPT, UNKNOWN};
use crate::perf::verify::{self, Expect, Mismatch};

impl Worker<'_> {
    /// Picks the next I/O's unit and direction and submits it in `slot`.
    #[inline]
    pub(super) fn submit(&mut self, qi: usize, slot: usize, now: u64) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        if cfg.zoned.is_some() {
            return self.submit_zoned(qi, slot, now);
        }
        let ts = &mut self.targets[self.queues[qi].target];
        let write = cfg.read_pct < 100 && (cfg.read_pct == 0 || self.rng.u8(..100) >= cfg.read_pct);
        let mut unit = if cfg.random {
            self.rng.u64(..ts.units)
        } else {
            let u = ts.seq_next;
            ts.seq_next = if u + 1 == ts.units { 0 } else { u + 1 };
            u
        };
        if cfg.verify {
            // One I/O per unit at a time: probe forward to a free one (there are at
            // least twice as many units as I/Os in flight on this poller).
            while ts.gens[unit as usize] & BUSY != 0 {
                unit = if unit + 1 == ts.units { 0 } else { unit + 1 };
            }
        }
        self.issue(qi, slot, unit, write, now)
    }

    /// Submits an I/O of `unit` in `slot` (marking the unit busy and filling the buffer
    /// under `--verify`). Inlined into the poll loop: what only `--verify`, protection
    /// information, zoned workloads or a failure need is out of line.
    #[inline]
    pub(super) fn issue(
        &mut self,
        qi: usize,
        slot: usize,
        unit: u64,
        write: bool,
        now: u64,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let lba = (ts.first_unit + unit) * ts.io_blocks as u64;
        let mut gen = 0;
        if cfg.verify {
            let g = ts.gens[unit as usize];
            debug_assert!(g & BUSY == 0, "unit {unit} already in flight");
            ts.gens[unit as usize] = g | BUSY;
            if write {
                gen = if g == UNKNOWN || g + 1 >= UNKNOWN {
                    1
                } else {
                    g + 1
                };
            }
        }
        if write && (gen != 0 || ts.pi.is_some()) {
            self.fill_write(qi, slot, lba, gen)?;
        }
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let req = &mut q.reqs[slot];
        if write && cfg.zoned == Some(crate::cli::ZonedMode::Append) {
            // One append in flight per zone: it lands at the write pointer, `lba`.
            req.op = IoOp::ZoneAppend;
            req.lba = lba - lba % ts.zone_blocks;
        } else {
            req.op = if write { IoOp::Write } else { IoOp::Read };
            req.lba = lba;
        }
        req.nsid = ts.nsid;
        req.nlb = ts.io_blocks;
        if let Some(f) = &ts.pi {
            // Under --verify the controller checks the application tag too.
            let mask = if cfg.verify { 0xFFFF } else { 0 };
            req.meta = req.meta.with_tags(ref_tag(f, lba), APP_TAG, mask);
        }
        q.slots[slot] = Slot {
            submit_raw: now,
            unit,
            gen,
            write,
            reset: false,
        };
        match q.q.submit_ref(&q.reqs[slot]) {
            Ok(()) => {
                ts.res.outcomes.submitted += 1;
                Ok(())
            }
            Err(e) => self.submit_failed(qi, unit, write, lba, e),
        }
    }

    /// A submission the queue refused: a removed device ends the queue's part of the run,
    /// anything else ends the run with a message.
    #[cold]
    #[inline(never)]
    fn submit_failed(
        &mut self,
        qi: usize,
        unit: u64,
        write: bool,
        lba: u64,
        e: SubmitError,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        match e {
            SubmitError::DeviceRemoved => {
                // Gone before it took the request: nothing was submitted.
                self.dead += usize::from(!q.dead);
                q.dead = true;
                ts.res.removed = true;
                if cfg.verify {
                    ts.gens[unit as usize] &= !BUSY;
                }
                Ok(())
            }
            SubmitError::Busy(b) => Err(format!(
                "core {}: queue refused an i/o with {} in flight and {} queued (queue depth {} is more than the queue holds)",
                cfg.core, b.in_flight, b.queued, cfg.queue_depth
            )),
            e => Err(format!(
                "core {}: submitting {} at lba {lba}: {e}",
                cfg.core,
                if write { "a write" } else { "a read" }
            )),
        }
    }

    /// Accounts for one completion at raw time `now`. Inlined into the poll loop, as
    /// [`Worker::issue`] is; failures and `--verify` are out of line.
    #[inline]
    pub(super) fn complete(
        &mut self,
        qi: usize,
        c: Completion,
        now: u64,
        measuring: bool,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let slot_i = c.token as usize;
        let Some(slot) = q.slots.get(slot_i).copied() else {
            return Err(unknown_token(cfg.core, c.token));
        };
        if slot.reset {
            return self.reset_done(qi, slot_i, c);
        }
        let r = &mut ts.res;
        r.outcomes.record(c.result);
        // Throughput and latency are of successful I/Os only; the warmup's are seen by
        // the progress lines alone.
        let lat = if c.result.is_ok() {
            let lat = now.saturating_sub(slot.submit_raw).max(1);
            self.prog_ok += 1;
            self.prog_lat_ns = self.prog_lat_ns.wrapping_add(lat);
            Some(lat)
        } else {
            self.prog_err += 1;
            None
        };
        if let (true, Some(lat)) = (measuring, lat) {
            r.lat[usize::from(slot.write)].record(lat);
            r.ios += 1;
            r.bytes += cfg.io_size;
            if slot.write {
                r.writes += 1;
            } else {
                r.reads += 1;
            }
        }
        let lba0 = (ts.first_unit + slot.unit) * ts.io_blocks as u64;
        if cfg.zoned.is_some() && slot.write {
            self.zone_written(qi, slot_i, lba0, &c)?;
        }
        if let Err(e) = c.result {
            self.failed(qi, slot, lba0, e);
            return Ok(());
        }
        if !cfg.verify {
            return Ok(());
        }
        let ts = &mut self.targets[self.queues[qi].target];
        if slot.write {
            ts.gens[slot.unit as usize] = slot.gen;
            return Ok(());
        }
        self.check_read(qi, slot_i, slot, lba0)
    }

    /// An I/O of `slot` (its first block `lba0`) completed with error `e`: counted, a
    /// removed device ends the queue's part of the run, and under `--verify` its unit is
    /// free again (after a failed write, with contents unknown).
    #[cold]
    #[inline(never)]
    fn failed(&mut self, qi: usize, slot: Slot, lba0: u64, e: IoError) {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let r = &mut ts.res;
        if e == IoError::DeviceRemoved {
            self.dead += usize::from(!q.dead);
            q.dead = true;
            r.removed = true;
        }
        record_error(r, cfg.core, slot.write, lba0, e);
        if cfg.verify {
            ts.gens[slot.unit as usize] = if slot.write {
                UNKNOWN
            } else {
                ts.gens[slot.unit as usize] & !BUSY
            };
        }
    }

    /// `--verify`: checks the data of a successful read in `slot_i` against the
    /// generation its unit was last written with.
    fn check_read(
        &mut self,
        qi: usize,
        slot_i: usize,
        slot: Slot,
        lba0: u64,
    ) -> Result<(), WorkerError> {
        let core = self.cfg.core;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let r = &mut ts.res;
        let g = ts.gens[slot.unit as usize] & !BUSY;
        ts.gens[slot.unit as usize] = g;
        let expect = match g {
            0 => Expect::Unwritten,
            UNKNOWN => Expect::Unknown,
            g => Expect::Generation(g as u64),
        };
        let data = &mut self.scratch[..ts.io_bytes];
        let md = &mut self.md_scratch[..ts.md_bytes];
        q.buf
            .read_at(&*q.q, slot_i, data)
            .map_err(|e| format!("verify: reading the read buffer: {e}"))?;
        if let Some(b) = &q.md_buf {
            b.read_at(&*q.q, slot_i, md)
                .map_err(|e| format!("verify: reading the metadata buffer: {e}"))?;
        }
        let mut mismatch = |m: Mismatch| {
            r.mismatches += 1;
            if r.mismatch_list.len() < MISMATCHES_KEPT {
                tracing::error!("core {core}: verify: {m}");
                r.mismatch_list.push(m);
            }
        };
        for (i, b) in data.chunks_exact(ts.host_bs).enumerate() {
            r.blocks_verified += 1;
            let lba = lba0 + i as u64;
            if let Err(m) = verify::check_block(&b[..ts.block_size], lba, expect) {
                mismatch(m);
            } else if let (Some(m), Expect::Generation(g)) = (&ts.md, expect) {
                if let Err(m) = check_metadata(m, ts.block_size, data, md, i, lba, g) {
                    mismatch(m);
                }
            }
        }
        if let Some(f) = ts.pi {
            let first = ref_tag(&f, lba0);
            if let Err((b, e)) = f.check(data, md, ts.io_blocks as usize, first, APP_TAG, 0xFFFF) {
                mismatch(pi_mismatch(lba0 + b as u64, e));
            }
        }
        Ok(())
    }

    /// Fills the write buffer of `slot` before its write of `lba`: under `--verify` (`gen`
    /// non-zero) the generation's pattern, its metadata and PI; otherwise, when the format
    /// needs the caller's PI, PI that matches whatever the buffer holds now (a read may
    /// have filled it), so the guards are computed for each write.
    fn fill_write(
        &mut self,
        qi: usize,
        slot: usize,
        lba: u64,
        gen: u32,
    ) -> Result<(), WorkerError> {
        let q = &mut self.queues[qi];
        let ts = &self.targets[q.target];
        if gen == 0 && ts.pi.is_none() {
            return Ok(());
        }
        let data = &mut self.scratch[..ts.io_bytes];
        let md = &mut self.md_scratch[..ts.md_bytes];
        if gen != 0 {
            for (i, b) in data.chunks_exact_mut(ts.host_bs).enumerate() {
                verify::fill_block(&mut b[..ts.block_size], lba + i as u64, gen as u64);
            }
            if let Some(m) = ts.md {
                fill_metadata(&m, ts.block_size, data, md, lba, gen as u64);
            }
        } else {
            q.buf
                .read_at(&*q.q, slot, data)
                .map_err(|e| format!("pi: reading the write buffer: {e}"))?;
        }
        if let Some(f) = ts.pi {
            f.fill(data, md, ts.io_blocks as usize, ref_tag(&f, lba), APP_TAG);
        }
        q.buf
            .write_at(&mut *q.q, slot, data)
            .map_err(|e| format!("filling the write buffer: {e}"))?;
        if let Some(b) = &q.md_buf {
            b.write_at(&mut *q.q, slot, md)
                .map_err(|e| format!("filling the metadata buffer: {e}"))?;
        }
        Ok(())
    }
}

/// The message of a completion whose token names no slot of its queue.
#[cold]
#[inline(never)]
fn unknown_token(core: usize, token: u64) -> WorkerError {
    format!("core {core}: completion with unknown token {token}")
}
