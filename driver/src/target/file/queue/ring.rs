//! The ring: building it (setup flags the kernel takes, the registered file and
//! buffers), the pool regions a segment must lie in, pushing SQEs and entering the kernel.

use super::*;

/// Makes a ring of `sq_entries` for `shared`'s file at setup level `max_level` or the best
/// below it the kernel takes, and registers the file (`Fixed(0)`). Levels, falling back
/// where the kernel says EINVAL:
/// 2: COOP_TASKRUN + TASKRUN_FLAG + SINGLE_ISSUER + DEFER_TASKRUN (Linux 6.1),
/// 1: COOP_TASKRUN + TASKRUN_FLAG (5.19), 0: plain.
pub(super) fn build_ring(
    shared: &Shared,
    sq_entries: u32,
    max_level: u8,
) -> Result<(IoUring, u8), FileError> {
    let ring_err = |what, source| FileError::Ring {
        path: shared.path.clone(),
        what,
        source,
    };
    let build = |level: u8| {
        let mut b = IoUring::builder();
        // Completions can never outnumber slots (one operation per slot at a time), so a
        // CQ of twice the SQ never overflows.
        b.setup_cqsize(sq_entries * 2).setup_submit_all();
        if level >= 1 {
            // No inter-processor interrupt to run completion work while we spin: the kernel
            // raises IORING_SQ_TASKRUN instead and poll enters to run it. Cheaper, above
            // all in a VM where an IPI is a VM exit.
            b.setup_coop_taskrun().setup_taskrun_flag();
        }
        if level >= 2 {
            // Completion work runs only when the owning thread enters the ring, in one
            // batch. The owner is the first thread to enter it (the ring starts disabled
            // and is enabled then); see `FileQueue::check_thread` for other threads.
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_r_disabled();
        }
        if shared.sqpoll {
            b.setup_sqpoll(SQPOLL_IDLE_MS);
        }
        if shared.iopoll {
            b.setup_iopoll();
        }
        b.build(sq_entries)
    };
    let mut level = max_level;
    let ring = loop {
        match build(level) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && level > 0 => level -= 1,
            r => break r,
        }
    }
    .map_err(|e| ring_err("setup", e))?;
    ring.submitter()
        .register_files(&[shared.io.as_raw_fd()])
        .map_err(|e| ring_err("file registration", e))?;
    Ok((ring, level))
}

/// Registers a sparse fixed-buffer table sized for the pool (`max_bytes / region_len`, at
/// most [`MAX_FIXED_BUFFERS`]); returns its entries, 0 when it could not be registered.
pub(super) fn register_table(ring: &IoUring, shared: &Shared, pool: &DmaPool) -> usize {
    let po = pool.options();
    let region_unit = po.region_len.next_multiple_of(po.page_kind.size()).max(1);
    let fixed_slots = po
        .max_bytes
        .div_ceil(region_unit)
        .clamp(1, MAX_FIXED_BUFFERS);
    match ring.submitter().register_buffers_sparse(fixed_slots as u32) {
        Ok(()) => fixed_slots,
        Err(e) => {
            tracing::warn!(
                path = %shared.path.display(),
                "cannot register a fixed-buffer table ({e}{}); using unregistered buffers",
                memlock_hint(&e)
            );
            0
        }
    }
}

/// For a registration that failed with ENOMEM: registered buffers are charged to
/// RLIMIT_MEMLOCK (without CAP_IPC_LOCK).
fn memlock_hint(e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOMEM) {
        format!(
            "; registered buffers count against the memlock limit (RLIMIT_MEMLOCK, `ulimit -l`), now {}: {}",
            Limit::Memlock.text(),
            Limit::Memlock.how_to_raise()
        )
    } else {
        String::new()
    }
}

impl FileQueue {
    /// Picks up regions the pool gained since the last look, registering each as a fixed
    /// buffer where the table has room. Slow path: runs only when a segment names a region
    /// this queue has not seen.
    pub(super) fn refresh_regions(&mut self) {
        let all = self.pool.regions();
        for (i, &(base, len)) in all.iter().enumerate().skip(self.regions.len()) {
            let mut fixed = false;
            if i < self.fixed_slots && len <= MAX_FIXED_BUFFER_BYTES {
                let iov = libc::iovec {
                    iov_base: base as *mut libc::c_void,
                    iov_len: len,
                };
                // SAFETY: `base..base + len` is a region of `self.pool`, mapped until the
                // pool's last clone drops. This queue holds a clone and closes the ring (which
                // unregisters the buffers) before releasing it, so the registered memory is
                // valid for as long as it is registered.
                match unsafe {
                    self.ring
                        .submitter()
                        .register_buffers_update(i as u32, &[iov], None)
                } {
                    Ok(()) => fixed = true,
                    Err(e) => tracing::warn!(
                        path = %self.shared.path.display(),
                        region = i,
                        len,
                        "cannot register dma region as a fixed buffer ({e}{}); using plain reads and writes for it",
                        memlock_hint(&e)
                    ),
                }
            }
            self.regions.push(Region { base, len, fixed });
        }
    }

    /// Whether the slice lies inside a region of this queue's pool.
    pub(super) fn in_pool(&mut self, s: &DmaSlice) -> bool {
        let r = s.region as usize;
        if r >= self.regions.len() {
            self.refresh_regions();
        }
        self.regions
            .get(r)
            .is_some_and(|reg| s.lies_in(reg.base, reg.len))
    }

    /// The fixed-buffer index for a slice already checked with [`Self::in_pool`].
    pub(super) fn fixed_index(&self, s: &DmaSlice) -> Option<u16> {
        let reg = self.regions.get(s.region as usize)?;
        (reg.fixed && reg.base == s.region_vaddr).then_some(s.region as u16)
    }

    pub(super) fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: the entry refers to (a) memory of `self.pool` checked by `in_pool` at
        // submit (or the queue's own zero buffer), mapped for as long as this queue lives;
        // (b) for vectored operations, `self.iovecs[slot]`, a boxed slice never reallocated
        // and not rewritten until the slot's CQE is reaped; (c) the registered file. `Drop`
        // waits for every pushed operation to complete before any of these is released.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        // Each slot has at most one operation in the ring and there are no more slots than
        // SQ entries, so the SQ cannot be full.
        pushed.expect("io_uring submission queue full with fewer operations than entries");
        self.unsubmitted += 1;
        self.stats.commands += 1;
    }

    /// Enables a ring made disabled, making the calling thread its single issuer. Called
    /// before every `io_uring_enter`; a flag test once enabled.
    #[inline]
    pub(super) fn enable(&mut self) {
        if self.single_issuer && self.owner == 0 {
            if let Err(e) = self.ring.submitter().register_enable_rings() {
                tracing::error!(path = %self.shared.path.display(), "cannot enable the io_uring: {e}");
            }
            self.owner = thread_token();
        }
    }

    /// One `io_uring_enter` for every SQE pushed since the last one.
    pub(super) fn enter_submit(&mut self) {
        if let Err(n) = self.check_thread() {
            self.warn_wrong_thread("flushed", n);
            return;
        }
        self.enable();
        if self.shared.sqpoll {
            // The poller thread sees the new tail; a syscall is needed only to wake it.
            if self.ring.submission().need_wakeup() {
                self.stats.sq_doorbell_writes += 1;
            }
            match self.ring.submitter().submit() {
                Ok(_) => self.unsubmitted = 0,
                Err(e) => self.enter_failed(&e),
            }
            return;
        }
        self.stats.sq_doorbell_writes += 1;
        match self.ring.submitter().submit() {
            Ok(k) => self.unsubmitted = self.unsubmitted.saturating_sub(k as u32),
            Err(e) => self.enter_failed(&e),
        }
    }

    pub(super) fn enter_failed(&self, e: &std::io::Error) {
        if e.raw_os_error() == Some(libc::EEXIST) {
            // check_thread should have caught it.
            tracing::error!(
                path = %self.shared.path.display(),
                "io_uring_enter: this thread is not the ring's owner (EEXIST)"
            );
            return;
        }
        // EINTR, EAGAIN and EBUSY leave the SQEs in the ring; the next flush or poll
        // submits them again.
        if !matches!(
            e.raw_os_error(),
            Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
        ) {
            tracing::warn!(path = %self.shared.path.display(), "io_uring_enter failed: {e}");
        }
    }
}
