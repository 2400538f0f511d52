//! The part of a context common to both modes: request slots, validation of iocbs,
//! bounce buffers, and turning completions into events exactly once.

use std::sync::Arc;

use crate::hw::dma::{DmaBuf, DmaPool, DmaSlice, Leases};
use crate::io::{Completion, IoError, IoRequest, Segments};
use crate::spec::Status;
use crate::target::{Target, TargetInfo};

use super::error::{AioError, IocbError};
use super::types::*;
use super::wire;

/// A slot with no bounce buffer.
const NO_BOUNCE: u32 = u32::MAX;

/// One request of a context, from submit until its event is returned.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    user_data: u64,
    len: u64,
    user_addr: usize,
    bounce: u32,
    gen: u32,
    /// Cross-thread: the ring (poller) it went to.
    pub(super) chan: u16,
    /// Target index.
    pub(super) target: u16,
    opcode: Opcode,
    active: bool,
    /// A cancel was asked for.
    pub(super) cancel: bool,
}

/// What a context knows of one target.
pub(super) struct TargetView {
    /// The target's description.
    pub(super) info: TargetInfo,
    pool: DmaPool,
    /// The pool's regions as last seen (they only grow).
    regions: Vec<(usize, usize)>,
}

impl TargetView {
    fn contains(&mut self, addr: usize, len: usize) -> bool {
        let inside = |r: &[(usize, usize)]| {
            r.iter()
                .any(|&(b, l)| addr >= b && addr.checked_add(len).is_some_and(|e| e <= b + l))
        };
        if inside(&self.regions) {
            return true;
        }
        // A region added since we looked (setup-time allocation, not per I/O).
        self.regions = self.pool.regions();
        inside(&self.regions)
    }
}

/// One target's bounce buffers: `free` indexes chunks of `mem`.
pub(super) struct Bounce {
    /// The chunks, in one DMA buffer.
    pub(super) mem: DmaBuf,
    chunk: usize,
    buf_size: usize,
    free: Vec<u32>,
}

/// Why an iocb was not prepared.
pub(super) enum Prep {
    /// No room (in what).
    Busy(&'static str),
    /// It is invalid.
    Invalid(IocbError),
}

/// The part of a context common to both modes: request slots, validation, bounce
/// buffers, events.
pub(super) struct Core {
    pub(super) slots: Box<[Slot]>,
    pub(super) free: Vec<u32>,
    pub(super) nr_events: u32,
    pub(super) targets: Vec<TargetView>,
    pub(super) bounce: Vec<Bounce>,
    /// The buffers lent to the context ([`super::IoContext::lend`]): every DMA segment
    /// of an iocb is a slice of one of them, and they stay the context's while any
    /// request is outstanding.
    pub(super) leases: Leases,
    pub(super) stats: AioStats,
}

impl Core {
    pub(super) fn new(
        targets: &[Arc<dyn Target>],
        opts: &ContextOptions,
    ) -> Result<Core, AioError> {
        if opts.nr_events == 0 || opts.nr_events > MAX_EVENTS {
            return Err(AioError::BadNrEvents {
                nr_events: opts.nr_events,
                max: MAX_EVENTS,
            });
        }
        let n = opts.nr_events as usize;
        let slots = vec![
            Slot {
                user_data: 0,
                len: 0,
                user_addr: 0,
                bounce: NO_BOUNCE,
                gen: 0,
                chan: 0,
                target: 0,
                opcode: Opcode::Flush,
                active: false,
                cancel: false,
            };
            n
        ]
        .into_boxed_slice();
        let free: Vec<u32> = (0..n as u32).rev().collect();
        let views: Vec<TargetView> = targets
            .iter()
            .map(|t| TargetView {
                info: t.info().clone(),
                pool: t.dma_pool().clone(),
                regions: t.dma_pool().regions(),
            })
            .collect();
        let bounce = match &opts.bounce {
            Some(b) => bounce_buffers(targets, b)?,
            None => Vec::new(),
        };
        let pools: Vec<DmaPool> = targets.iter().map(|t| t.dma_pool().clone()).collect();
        Ok(Core {
            slots,
            free,
            nr_events: opts.nr_events,
            targets: views,
            bounce,
            leases: Leases::for_pools(&pools),
            stats: AioStats::default(),
        })
    }

    /// Requests accepted whose events have not been returned yet.
    pub(super) fn in_flight(&self) -> u32 {
        self.nr_events - self.free.len() as u32
    }

    /// The token of slot `idx` as it is now.
    pub(super) fn token(&self, idx: u32) -> u64 {
        wire::context_token(idx, self.slots[idx as usize].gen)
    }

    /// Validates an iocb, takes a slot (and a bounce buffer, copying write data in) and
    /// builds its request.
    pub(super) fn prepare(&mut self, iocb: &Iocb) -> Result<(u32, IoRequest), Prep> {
        let ti = iocb.target;
        let count = self.targets.len();
        let view = self
            .targets
            .get_mut(ti as usize)
            .ok_or(Prep::Invalid(IocbError::NoSuchTarget { target: ti, count }))?;
        let nsid = check_target(&view.info, iocb).map_err(Prep::Invalid)?;
        let (lba, nlb) = if iocb.opcode == Opcode::Flush {
            (0, 0)
        } else if matches!(iocb.opcode, Opcode::ZoneSend { .. } | Opcode::ReportZones) {
            (zone_lba(&view.info, iocb).map_err(Prep::Invalid)?, 0)
        } else {
            blocks(&view.info, iocb).map_err(Prep::Invalid)?
        };
        let (iocb, vouched) = &unvouched(iocb);
        let leases = match vouched {
            Some(_) => None,
            None => Some(&self.leases),
        };
        let meta_leases = match vouched {
            Some(true) => None,
            _ => Some(&self.leases),
        };
        check_meta(view, meta_leases, iocb, nlb).map_err(Prep::Invalid)?;
        let (data, bounce, user_addr) = match (iocb.opcode, iocb.buf) {
            (Opcode::Read | Opcode::Write, IoBuf::User(u)) => self.bounce_in(iocb, u)?,
            _ => (
                dma_data(view, leases, iocb, nlb).map_err(Prep::Invalid)?,
                NO_BOUNCE,
                0,
            ),
        };
        let Some(idx) = self.free.pop() else {
            if bounce != NO_BOUNCE {
                self.bounce[ti as usize].free.push(bounce);
                self.stats.bounced -= 1;
            }
            return Err(Prep::Busy("the context's nr_events slots"));
        };
        let s = &mut self.slots[idx as usize];
        s.user_data = iocb.user_data;
        s.len = if iocb.opcode == Opcode::Flush {
            0
        } else {
            iocb.len
        };
        s.user_addr = user_addr;
        s.bounce = bounce;
        s.chan = 0;
        s.target = ti;
        s.opcode = iocb.opcode;
        s.active = true;
        s.cancel = false;
        let req = IoRequest {
            op: iocb.opcode.io_op(),
            nsid,
            lba,
            nlb,
            data,
            token: self.token(idx),
            meta: iocb.meta,
        };
        Ok((idx, req))
    }

    /// A bounced read or write of ordinary memory: takes a bounce buffer of the iocb's
    /// target (copying write data in); returns its segment, index and the user address.
    fn bounce_in(&mut self, iocb: &Iocb, u: UserBuf) -> Result<(Segments, u32, usize), Prep> {
        let op = iocb.opcode.name();
        if (u.len as u64) < iocb.len {
            return Err(Prep::Invalid(IocbError::BufferTooShort {
                op,
                len: iocb.len,
                buf_len: u.len as u64,
            }));
        }
        let Some(b) = self.bounce.get_mut(iocb.target as usize) else {
            return Err(Prep::Invalid(IocbError::NoBounce {
                addr: u.addr,
                len: u.len,
            }));
        };
        if iocb.len > b.buf_size as u64 {
            return Err(Prep::Invalid(IocbError::BounceTooLarge {
                op,
                len: iocb.len,
                max: b.buf_size,
            }));
        }
        if self.free.is_empty() {
            return Err(Prep::Busy("the context's nr_events slots"));
        }
        let Some(bi) = b.free.pop() else {
            return Err(Prep::Busy("the bounce buffers"));
        };
        let off = bi as usize * b.chunk;
        let len = iocb.len as usize;
        if iocb.opcode == Opcode::Write {
            // SAFETY: the caller of `IoBuf::user` promised `addr..addr + u.len`
            // readable and untouched until the event; len <= u.len.
            let src = unsafe { std::slice::from_raw_parts(u.addr as *const u8, len) };
            b.mem
                .write_at(off, src)
                .expect("a bounce chunk holds buf_size bytes");
        }
        self.stats.bounced += 1;
        let seg = Segments::one(b.mem.slice(off, len).expect("inside the bounce buffer"));
        Ok((seg, bi, u.addr))
    }

    /// Gives back a slot whose request was not accepted after all.
    pub(super) fn unprepare(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        if s.bounce != NO_BOUNCE {
            self.bounce[s.target as usize].free.push(s.bounce);
            s.bounce = NO_BOUNCE;
            self.stats.bounced -= 1;
        }
        s.active = false;
        self.free.push(idx);
    }

    /// Turns a completion into its event (once: the slot is freed and its generation
    /// moves on, so a repeat is counted as bogus and dropped).
    pub(super) fn complete(&mut self, c: Completion) -> Option<Event> {
        let idx = wire::slot_of(c.token);
        let gen = wire::gen_of(c.token);
        let Some(s) = self.slots.get_mut(idx).filter(|s| s.active && s.gen == gen) else {
            self.stats.bogus += 1;
            return None;
        };
        let mut res = c.result.map(|()| s.len);
        let cancel = if s.cancel {
            match c.result {
                Err(IoError::Cancelled) => CancelOutcome::Cancelled,
                Err(IoError::Nvme(st)) if st.same_code(Status::ABORT_REQUESTED) => {
                    res = Err(IoError::Aborted);
                    CancelOutcome::Aborted
                }
                Err(IoError::Aborted) => CancelOutcome::Aborted,
                _ => CancelOutcome::TooLate,
            }
        } else if c.result == Err(IoError::Cancelled) {
            CancelOutcome::Cancelled
        } else {
            CancelOutcome::NotRequested
        };
        if s.bounce != NO_BOUNCE {
            let b = &mut self.bounce[s.target as usize];
            if s.opcode == Opcode::Read && res.is_ok() {
                let off = s.bounce as usize * b.chunk;
                // SAFETY: the caller of `IoBuf::user` promised `user_addr..+len` writable
                // and untouched by anything else until this event is returned.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(s.user_addr as *mut u8, s.len as usize)
                };
                b.mem
                    .read_at(off, dst)
                    .expect("a bounce chunk holds buf_size bytes");
            }
            b.free.push(s.bounce);
            s.bounce = NO_BOUNCE;
        }
        s.active = false;
        s.gen = wire::next_gen(s.gen);
        let ev = Event {
            user_data: s.user_data,
            value: if res.is_ok() { c.value } else { 0 },
            res,
            cancel,
        };
        self.free.push(idx as u32);
        self.stats.completed += 1;
        if self.leases.has_released() && self.in_flight() == 0 {
            // No request outstanding: nothing the device holds names a released buffer.
            self.leases.collect();
        }
        match cancel {
            CancelOutcome::Cancelled => self.stats.cancelled += 1,
            CancelOutcome::Aborted => self.stats.aborted += 1,
            CancelOutcome::TooLate => self.stats.too_late += 1,
            CancelOutcome::NotRequested => {}
        }
        Some(ev)
    }

    /// The slot of the first outstanding request with `user_data`.
    pub(super) fn find(&self, user_data: u64) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.active && s.user_data == user_data)
            .map(|i| i as u32)
    }
}

/// Memory the caller vouches for (`IoBuf::vouched`, the C ABI) is checked like lent memory
/// but for the lease: the iocb with its data as `Dma` or `Vectored`, and whether its
/// metadata buffer is vouched for too (`None`: nothing is vouched for).
fn unvouched(iocb: &Iocb) -> (Iocb, Option<bool>) {
    match iocb.buf {
        IoBuf::Vouched(v) => (
            Iocb {
                buf: match v.segs.single() {
                    Some(s) if !matches!(iocb.opcode, Opcode::Readv | Opcode::Writev) => {
                        IoBuf::Dma(*s)
                    }
                    _ => IoBuf::Vectored(v.segs),
                },
                ..*iocb
            },
            Some(v.meta),
        ),
        _ => (*iocb, None),
    }
}

/// Checks what an iocb asks of its target (namespace, writability, support); returns the
/// namespace to use.
fn check_target(info: &TargetInfo, iocb: &Iocb) -> Result<u32, IocbError> {
    let (op, target) = (iocb.opcode.name(), iocb.target);
    if iocb.nsid != 0 && iocb.nsid != info.nsid {
        return Err(IocbError::WrongNamespace {
            nsid: iocb.nsid,
            target,
            target_nsid: info.nsid,
        });
    }
    if iocb.opcode.writes() && info.read_only {
        return Err(IocbError::ReadOnly { op, target });
    }
    let unsupported = match iocb.opcode {
        Opcode::WriteZeroes => !info.write_zeroes,
        Opcode::Discard => !info.deallocate,
        op if op.is_zoned() => info.zones.is_none(),
        _ => false,
    };
    if unsupported {
        return Err(IocbError::Unsupported { op, target });
    }
    Ok(info.nsid)
}

/// The LBA of a zone management or report iocb: its offset, a whole block inside the
/// target (the length is that of the buffer, or 0).
fn zone_lba(info: &TargetInfo, iocb: &Iocb) -> Result<u64, IocbError> {
    let op = iocb.opcode.name();
    let bs = info.block_size as u64;
    if iocb.offset % bs != 0 {
        return Err(IocbError::Misaligned {
            op,
            what: "offset",
            value: iocb.offset,
            block_size: info.block_size,
        });
    }
    let capacity = info.num_blocks.saturating_mul(bs);
    let all = matches!(iocb.opcode, Opcode::ZoneSend { all: true, .. });
    if !all && iocb.offset >= capacity {
        return Err(IocbError::OutOfRange {
            op,
            offset: iocb.offset,
            len: iocb.len,
            capacity,
        });
    }
    Ok(iocb.offset / bs)
}

/// The blocks a (non-flush) iocb covers: offset and length whole blocks, not zero, not
/// more than one request carries, inside the target.
fn blocks(info: &TargetInfo, iocb: &Iocb) -> Result<(u64, u32), IocbError> {
    let op = iocb.opcode.name();
    let bs = info.block_size as u64;
    for (what, value) in [("offset", iocb.offset), ("length", iocb.len)] {
        if value % bs != 0 {
            return Err(IocbError::Misaligned {
                op,
                what,
                value,
                block_size: info.block_size,
            });
        }
    }
    if iocb.len == 0 {
        return Err(IocbError::ZeroLength {
            op,
            offset: iocb.offset,
        });
    }
    let max = u32::MAX as u64 * bs;
    if iocb.len > max {
        return Err(IocbError::TooLong {
            op,
            len: iocb.len,
            max,
        });
    }
    let capacity = info.num_blocks.saturating_mul(bs);
    let past_end = match iocb.offset.checked_add(iocb.len) {
        Some(e) => e > capacity,
        None => true,
    };
    if past_end {
        return Err(IocbError::OutOfRange {
            op,
            offset: iocb.offset,
            len: iocb.len,
            capacity,
        });
    }
    Ok((iocb.offset / bs, (iocb.len / bs) as u32))
}

/// The data of an iocb that is not bounced: none, or DMA memory of the target's pool of
/// the kind its opcode takes, long enough.
/// The metadata of an iocb: only on reads and writes of DMA memory (no bounce path), a
/// separate buffer from the target's pool. The queue checks it against the format.
fn check_meta(
    view: &mut TargetView,
    leases: Option<&Leases>,
    iocb: &Iocb,
    nlb: u32,
) -> Result<(), IocbError> {
    let m = &iocb.meta;
    if !m.with {
        return Ok(());
    }
    let op = iocb.opcode.name();
    let wrong = |why| IocbError::WrongBuffer { op, why };
    match (iocb.opcode, iocb.buf) {
        (Opcode::Read | Opcode::Write | Opcode::Readv | Opcode::Writev, IoBuf::User(_)) => {
            return Err(wrong(
                "metadata needs dma buffers: the bounce path does not carry it",
            ))
        }
        (Opcode::Read | Opcode::Write | Opcode::Readv | Opcode::Writev, _) => {}
        _ => return Err(wrong("only reads and writes carry metadata")),
    }
    let Some(layout) = view.info.metadata else {
        return Err(wrong("metadata given for a target without metadata"));
    };
    if !layout.extended && m.buf.len != 0 {
        lent(leases, &m.buf, op)?;
        let need = nlb as usize * layout.ms as usize;
        if !view.contains(m.buf.vaddr, m.buf.len.min(need)) {
            return Err(IocbError::ForeignBuffer {
                addr: m.buf.vaddr,
                len: m.buf.len,
            });
        }
    }
    Ok(())
}

/// Bytes of the data buffer of an iocb of `nlb` blocks: its length, plus the interleaved
/// metadata of an extended LBA format when it carries metadata.
fn data_len(view: &TargetView, iocb: &Iocb, nlb: u32) -> u64 {
    match view.info.metadata {
        Some(l) if l.extended && iocb.meta.with => iocb.len + nlb as u64 * l.ms as u64,
        _ => iocb.len,
    }
}

fn dma_data(
    view: &mut TargetView,
    leases: Option<&Leases>,
    iocb: &Iocb,
    nlb: u32,
) -> Result<Segments, IocbError> {
    let data_len = data_len(view, iocb, nlb);
    let iocb = &Iocb {
        len: data_len,
        ..*iocb
    };
    let op = iocb.opcode.name();
    let too_short = |buf_len: usize| IocbError::BufferTooShort {
        op,
        len: iocb.len,
        buf_len: buf_len as u64,
    };
    let wrong = |why| IocbError::WrongBuffer { op, why };
    match (iocb.opcode, iocb.buf) {
        (
            Opcode::Flush | Opcode::WriteZeroes | Opcode::Discard | Opcode::ZoneSend { .. },
            IoBuf::None,
        ) => Ok(Segments::none()),
        (Opcode::ZoneSend { .. }, _) => Err(wrong("takes no buffer (IoBuf::None)")),
        (Opcode::ZoneAppend | Opcode::ReportZones, IoBuf::Dma(s)) => {
            one_dma(view, leases, s, iocb.len, too_short)
        }
        (Opcode::ZoneAppend | Opcode::ReportZones, _) => {
            Err(wrong("takes one buffer of dma memory (IoBuf::Dma)"))
        }
        (Opcode::Flush, _) => Ok(Segments::none()),
        (Opcode::WriteZeroes | Opcode::Discard, _) => Err(wrong("takes no buffer (IoBuf::None)")),
        (Opcode::Read | Opcode::Write, IoBuf::Dma(s)) => {
            one_dma(view, leases, s, iocb.len, too_short)
        }
        (Opcode::Readv | Opcode::Writev, IoBuf::Vectored(v)) => {
            if (v.total_len() as u64) < iocb.len {
                return Err(too_short(v.total_len()));
            }
            for s in v.as_slice() {
                lent(leases, s, op)?;
                if !view.contains(s.vaddr, s.len) {
                    return Err(IocbError::ForeignBuffer {
                        addr: s.vaddr,
                        len: s.len,
                    });
                }
            }
            Ok(v)
        }
        (Opcode::Read | Opcode::Write, IoBuf::Vectored(_)) => {
            Err(wrong("takes one buffer; use readv/writev for segments"))
        }
        (Opcode::Readv | Opcode::Writev, _) => {
            Err(wrong("takes segments of dma memory (IoBuf::Vectored)"))
        }
        (Opcode::Read | Opcode::Write, IoBuf::None) => Err(wrong("needs a buffer")),
        // Bounced buffers are taken by `Core::bounce_in`.
        (Opcode::Read | Opcode::Write, IoBuf::User(_)) => Err(wrong("is bounced")),
        // Turned into `Dma` or `Vectored` by `Core::prepare`.
        (Opcode::Read | Opcode::Write, IoBuf::Vouched(_)) => Err(wrong("is vouched for")),
    }
}

/// The first `len` bytes of `s`, the one DMA buffer of a read, write, zone append or
/// report zones: long enough and inside the target's memory.
#[inline(always)]
fn one_dma(
    view: &mut TargetView,
    leases: Option<&Leases>,
    s: DmaSlice,
    len: u64,
    too_short: impl Fn(usize) -> IocbError,
) -> Result<Segments, IocbError> {
    if (s.len as u64) < len {
        return Err(too_short(s.len));
    }
    lent(leases, &s, "i/o")?;
    if !view.contains(s.vaddr, len as usize) {
        return Err(IocbError::ForeignBuffer {
            addr: s.vaddr,
            len: s.len,
        });
    }
    Ok(Segments::one(
        s.sub(0, len as usize).expect("length checked above"),
    ))
}

/// The ownership rule: `s` is a slice of a buffer lent to the context (`leases`), or the
/// caller vouches for it (`None`: [`IoBuf::vouched`]).
fn lent(leases: Option<&Leases>, s: &DmaSlice, op: &'static str) -> Result<(), IocbError> {
    if leases.is_none_or(|l| l.holds(s)) {
        Ok(())
    } else {
        Err(IocbError::NotLent {
            op,
            addr: s.vaddr,
            len: s.len,
        })
    }
}

/// One target's worth of bounce buffers for each target, after checking the options.
fn bounce_buffers(targets: &[Arc<dyn Target>], b: &BounceOptions) -> Result<Vec<Bounce>, AioError> {
    if b.buffers == 0 || b.buffers > MAX_BOUNCE_BUFFERS {
        return Err(AioError::BadOption {
            option: "bounce.buffers",
            value: b.buffers as u64,
            why: "must be from 1 to 4096",
        });
    }
    if b.buf_size == 0 || b.buf_size > MAX_BOUNCE_BUF_SIZE {
        return Err(AioError::BadOption {
            option: "bounce.buf_size",
            value: b.buf_size as u64,
            why: "must be from 1 byte to 8 MiB",
        });
    }
    // A bounced I/O is whole blocks: a buffer smaller than one block would refuse them all.
    if let Some(t) = targets
        .iter()
        .find(|t| b.buf_size < t.info().block_size as usize)
    {
        let i = t.info();
        return Err(AioError::BounceBufTooSmall {
            buf_size: b.buf_size,
            block_size: i.block_size,
            target: i.name.clone(),
        });
    }
    // Page-aligned chunks: every bounce buffer meets any PRP or O_DIRECT rule.
    let chunk = b.buf_size.next_multiple_of(crate::spec::PAGE_SIZE);
    let mut bounce = Vec::with_capacity(targets.len());
    for t in targets {
        let bytes = chunk * b.buffers as usize;
        let mem = t
            .dma_pool()
            .alloc(bytes)
            .map_err(|source| AioError::Bounce { bytes, source })?;
        bounce.push(Bounce {
            mem,
            chunk,
            buf_size: b.buf_size,
            free: (0..b.buffers).rev().collect(),
        });
    }
    Ok(bounce)
}
