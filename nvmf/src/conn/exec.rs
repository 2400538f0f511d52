//! Executing commands on an admin queue or before Connect: Fabrics commands (Connect,
//! Property Get/Set), admin commands, held Asynchronous Event Requests.

use super::*;
use crate::config::Limits;

impl Conn {
    /// Runs a command whose data (if host to controller) is all here.
    pub(super) fn execute(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let sqe = self.slots[s as usize].sqe;
        // Traffic for the keep-alive timer (`check_controller`); a Connect's queue has no
        // controller yet, so there it counts for nothing.
        self.traffic = true;
        if sqe[0] == FABRICS_OPC {
            self.fabrics(s, ctx);
            return;
        }
        match &self.role {
            Role::Unbound => self.finish(s, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true), ctx),
            Role::Admin(c) => {
                let c = Arc::clone(c);
                if sqe[0] == kestrel::spec::admin_opc::ABORT {
                    // Only a held Asynchronous Event Request can be aborted here (every
                    // other command completes without waiting on the host).
                    let cdw10 = u32::from_le_bytes([sqe[40], sqe[41], sqe[42], sqe[43]]);
                    let (sqid, cid) = (cdw10 as u16, (cdw10 >> 16) as u16);
                    let held = self
                        .slots
                        .iter()
                        .position(|x| x.st == St::Held && x.cid == cid)
                        .filter(|_| sqid == 0);
                    if let Some(h) = held {
                        self.complete_held(h as u16, Status::ABORT_REQUESTED, ctx);
                    }
                    // Dword 0 bit 0: 0 when the command was aborted.
                    self.slots[s as usize].dw0 = held.is_none() as u32;
                    self.finish(s, Status::SUCCESS, ctx);
                    return;
                }
                let input = self.take_local_vec(s);
                let mut out = Vec::new();
                let r = c.admin(&sqe, &input, &mut out, ctx.shared, self.local);
                drop(input);
                match r {
                    AdminOutcome::Hold => {
                        if self.held_aers >= ctrl::MAX_AERS {
                            self.finish(s, Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED, ctx);
                        } else {
                            self.held_aers += 1;
                            self.slots[s as usize].st = St::Held;
                        }
                    }
                    AdminOutcome::Done { status, dw0, dw1 } => {
                        let slot = &mut self.slots[s as usize];
                        slot.dw0 = dw0;
                        slot.dw1 = dw1;
                        let dir = sqe[0] & 3;
                        if status.is_success() && dir == 2 && slot.len > 0 {
                            // The data itself only (at most `max_admin_data`, within the
                            // budget); the rest of the transfer goes out as zeroes.
                            out.truncate(slot.len as usize);
                            self.set_local(s, out);
                            self.slots[s as usize].buf = BufLoc::Local;
                            self.send_data_and_resp(s, Status::SUCCESS, ctx.queues);
                        } else {
                            self.finish(s, status, ctx);
                        }
                    }
                }
            }
            // A queue its host deleted with Disconnect takes no more commands.
            Role::Io { .. } if self.disconnected => {
                self.finish(s, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true), ctx)
            }
            Role::Io { .. } => self.io_command(s, ctx),
        }
    }

    pub(super) fn fabrics(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let sqe = self.slots[s as usize].sqe;
        match (fabrics::fctype_of(&sqe), &self.role) {
            (fctype::CONNECT, Role::Unbound) => self.connect(s, ctx),
            (fctype::CONNECT, _) => {
                self.finish(s, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true), ctx)
            }
            (fctype::PROPERTY_GET, Role::Admin(c)) => {
                let r = match PropertyCmd::parse(&sqe) {
                    Ok(p) => c.property_get(&p, &ctx.shared.limits),
                    Err(_) => AdminOutcome::Done {
                        status: Status::INVALID_FIELD.with_dnr(true),
                        dw0: 0,
                        dw1: 0,
                    },
                };
                self.admin_done(s, r, ctx);
            }
            (fctype::PROPERTY_SET, Role::Admin(c)) => {
                let r = match PropertyCmd::parse(&sqe) {
                    Ok(p) => c.property_set(&p),
                    Err(_) => AdminOutcome::Done {
                        status: Status::INVALID_FIELD.with_dnr(true),
                        dw0: 0,
                        dw1: 0,
                    },
                };
                // A controller reset (CC.EN cleared) stops the processing of the commands
                // outstanding (NVMe Base, Controller Level Reset): held Asynchronous
                // Event Requests end with no completion, and the host, which completes
                // them itself (SPDK's initiator as aborted, before it writes CC), sends
                // new ones once the controller is ready again. A shutdown (CC.SHN) leaves
                // them held: they are answered only by an Abort, ended by a reset or go
                // with the connection. Answering them here would complete, for SPDK's
                // initiator, commands it has already freed (a response for a CID it has
                // nothing outstanding for, which fails its admin queue and so the
                // shutdown itself). Every answer carries its own command's CID.
                if c.cc() & 1 == 0 {
                    self.drop_held();
                }
                self.admin_done(s, r, ctx);
            }
            (fctype::DISCONNECT, Role::Io { ctrl, qid, .. }) => {
                // Disconnect deletes the I/O queue (NVMe over Fabrics, Disconnect command):
                // its QID is free for a new Connect now, not when the host gets round to
                // closing this connection, and commands still here finish as usual.
                if !self.disconnected {
                    self.disconnected = true;
                    ctrl.release_qid(*qid);
                    tracing::debug!(peer = %self.peer, cntlid = ctrl.cntlid, qid, "i/o queue disconnected");
                }
                self.finish(s, Status::SUCCESS, ctx)
            }
            (_, Role::Unbound) => {
                self.finish(s, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true), ctx)
            }
            _ => self.finish(s, Status::INVALID_OPCODE.with_dnr(true), ctx),
        }
    }

    /// Completes held Asynchronous Event Request `s` with `status`.
    pub(super) fn complete_held(&mut self, s: u16, status: Status, ctx: &mut Ctx<'_>) {
        if self.slots[s as usize].st == St::Held {
            self.held_aers = self.held_aers.saturating_sub(1);
            self.finish(s, status, ctx);
        }
    }

    /// Ends every held Asynchronous Event Request without a completion (a controller
    /// reset): their slots are free again.
    pub(super) fn drop_held(&mut self) {
        for s in 0..self.slots.len() {
            if self.slots[s].st == St::Held {
                self.release(s as u16);
            }
        }
    }

    pub(super) fn admin_done(&mut self, s: u16, r: AdminOutcome, ctx: &mut Ctx<'_>) {
        if let AdminOutcome::Done { status, dw0, dw1 } = r {
            let slot = &mut self.slots[s as usize];
            slot.dw0 = dw0;
            slot.dw1 = dw1;
            self.finish(s, status, ctx);
        }
    }

    pub(super) fn connect(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let sqe = self.slots[s as usize].sqe;
        let cmd = ConnectCmd::parse(&sqe);
        let data = std::mem::take(&mut self.slots[s as usize].local);
        let r = ctrl::connect(ctx.shared, &cmd, &data);
        self.slots[s as usize].local = data;
        let (conn, d) = match r {
            Ok(x) => x,
            Err(refusal) => {
                tracing::warn!(peer = %self.peer, qid = cmd.qid, "connect refused: {}", refusal.why);
                self.slots[s as usize].dw0 = refusal.dw0;
                self.finish(s, refusal.status, ctx);
                return;
            }
        };
        self.sqflow_disabled = cmd.cattr & fabrics::CATTR_DISABLE_SQFLOW != 0;
        let entries = cmd.sqsize as usize + 1;
        match conn {
            Connected::Admin(c) => {
                tracing::info!(peer = %self.peer, host = %d.hostnqn, nqn = %c.subsys.nqn, cntlid = c.cntlid, kato_ms = cmd.kato_ms, "controller created");
                self.slots[s as usize].dw0 = c.cntlid as u32;
                self.role = Role::Admin(c);
                self.grow_slots(entries + ctrl::MAX_AERS);
            }
            Connected::Io(c, qid) => {
                if !self.connect_io(s, c, qid, entries, ctx) {
                    return;
                }
            }
        }
        self.bind_budget(ctx.shared);
        self.sqsize = cmd.sqsize;
        self.sqhd = 1 % (cmd.sqsize + 1);
        self.finish(s, Status::SUCCESS, ctx);
    }

    /// Binds this connection to I/O queue `qid` of controller `c`: this reactor's queues
    /// on the namespaces' targets, the queue's DMA buffers. False when it failed (the
    /// Connect is answered).
    fn connect_io(
        &mut self,
        s: u16,
        c: Arc<Controller>,
        qid: u16,
        entries: usize,
        ctx: &mut Ctx<'_>,
    ) -> bool {
        let sub = c.subsys.index;
        let bufs = match open_target_queues(&c, ctx) {
            Ok(()) => lend_io_bufs(&c, qid, &ctx.shared.limits, entries, ctx.queues),
            Err(()) => None,
        };
        let Some(bufs) = bufs else {
            c.release_qid(qid);
            self.finish(s, Status::INTERNAL_ERROR, ctx);
            return false;
        };
        self.bufs = bufs;
        tracing::debug!(peer = %self.peer, cntlid = c.cntlid, qid, entries, "i/o queue connected");
        let epoch = c.epoch.load(Ordering::Acquire);
        self.sub = sub;
        self.role = Role::Io {
            ctrl: c,
            qid,
            epoch,
        };
        self.grow_slots(entries);
        self.stage.grow(stage::RX_STAGE_IO);
        true
    }

    pub(super) fn grow_slots(&mut self, n: usize) {
        let old = self.slots.len();
        if n > old {
            self.slots.resize_with(n, Slot::new);
            self.free.extend((old..n).map(|i| i as u16));
        }
        self.wait_buf.reserve(n);
        self.tx.reserve(3 * n + 4);
    }
}

/// This reactor's queue on each namespace's target, made at the first I/O queue of the
/// subsystem.
fn open_target_queues(c: &Controller, ctx: &mut Ctx<'_>) -> Result<(), ()> {
    for ns in &c.subsys.namespaces {
        if ctx.queues[ns.qidx].is_some() {
            continue;
        }
        let opts = kestrel::QueueOptions {
            depth: ctx.queue_depth,
            sw_queue_depth: ctx.queue_depth,
            ..Default::default()
        };
        match ns.target.create_queue(&opts) {
            Ok(q) => ctx.queues[ns.qidx] = Some(q),
            Err(e) => {
                tracing::error!(nqn = %c.subsys.nqn, nsid = ns.nsid, "cannot create a target queue: {e}");
                return Err(());
            }
        }
    }
    Ok(())
}

/// An I/O queue's data buffers, one set per namespace of the subsystem, each allocated
/// from the namespace's target's DMA pool and lent to this reactor's queue on that target
/// (which owns it from then on: requests to the queue carry slices of it). `None` when
/// one could not be had (what was lent is released again).
///
/// One set per namespace rather than one per DMA pool: a lent buffer belongs to exactly one
/// queue, and namespaces of one controller, though they share a pool, each have their own
/// queue. The memory of an I/O queue grows with the namespaces that share a pool.
fn lend_io_bufs(
    c: &Controller,
    qid: u16,
    lim: &Limits,
    entries: usize,
    queues: &mut Queues,
) -> Option<Vec<IoBufs>> {
    let max_io = c.subsys.max_io;
    let max_order = (max_io / 4096).trailing_zeros() as u8;
    let arena_len = (lim.queue_buffer as usize).max(max_io as usize);
    let icd_size = lim.in_capsule_data as usize;
    let icd_n = (lim.in_capsule_buffers as usize).min(entries);
    let mut bufs = Vec::with_capacity(c.subsys.namespaces.len());
    for ns in &c.subsys.namespaces {
        let set = lend_one(ns, arena_len, icd_size * icd_n, queues).map(|(arena, icd)| IoBufs {
            qidx: ns.qidx,
            arena,
            buddy: Buddy::new(arena_len, max_order),
            icd,
            icd_size,
            icd_free: (0..icd_n as u16).rev().collect(),
        });
        match set {
            Ok(set) => bufs.push(set),
            Err(e) => {
                tracing::error!(nqn = %c.subsys.nqn, qid, nsid = ns.nsid, "no dma memory for an i/o queue: {e}");
                release_lent(&mut bufs, queues);
                return None;
            }
        }
    }
    Some(bufs)
}

/// Allocates namespace `ns`'s arena (`arena_len` bytes) and in-capsule buffers
/// (`icd_len` bytes, none if 0) and lends them to its queue.
fn lend_one(
    ns: &crate::ctrl::Namespace,
    arena_len: usize,
    icd_len: usize,
    queues: &mut Queues,
) -> Result<(DmaSlice, Option<DmaSlice>), String> {
    let pool = ns.target.dma_pool();
    let q = queues
        .get_mut(ns.qidx)
        .and_then(|q| q.as_mut())
        .ok_or("no target queue")?;
    let arena = pool.alloc(arena_len).map_err(|e| e.to_string())?;
    let icd = match icd_len {
        0 => None,
        n => Some(pool.alloc(n).map_err(|e| e.to_string())?),
    };
    let arena = q.lend(arena).map_err(|e| e.to_string())?;
    let Some(icd) = icd else {
        return Ok((arena, None));
    };
    match q.lend(icd) {
        Ok(icd) => Ok((arena, Some(icd))),
        Err(e) => {
            let _ = q.release(&arena);
            Err(e.to_string())
        }
    }
}
