//! Dropping a queue: the operations the kernel holds are waited for (bounded by the
//! drain timeout) before their buffers go; past that, the memory is leaked, never
//! unmapped under the kernel.

use super::*;

impl Drop for FileQueue {
    fn drop(&mut self) {
        // Wait for every operation the ring holds: their buffers and iovecs must outlive
        // them. Each wait submits SQEs not yet submitted too, so each slot in the ring
        // yields exactly one more CQE. Completions are dropped, not delivered. The wait is
        // bounded by the target's drain timeout.
        if self.in_ring == 0 {
            return;
        }
        if let Err(n) = self.check_thread() {
            tracing::error!(
                path = %self.shared.path.display(),
                in_flight = n,
                "file queue dropped on a thread other than the one that owns its ring, with operations in flight only that thread can complete; leaking its buffers"
            );
            self.leak();
            return;
        }
        self.enable();
        let timeout = self.shared.drain_timeout;
        let deadline = Instant::now() + timeout;
        let ext_arg = self.ring.params().is_feature_ext_arg();
        let mut failures = 0;
        while self.in_ring > 0 {
            let now = Instant::now();
            if now >= deadline {
                tracing::error!(
                    path = %self.shared.path.display(),
                    in_flight = self.in_ring,
                    "file queue dropped with operations still in flight after the drain timeout ({timeout:?}); leaking its buffers"
                );
                self.leak();
                return;
            }
            let slice = (deadline - now).min(Duration::from_millis(100));
            let r = self.wait_once(slice, ext_arg);
            match r {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME)
                            | Some(libc::EINTR)
                            | Some(libc::EAGAIN)
                            | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    failures += 1;
                    if failures > 100 {
                        tracing::error!(
                            path = %self.shared.path.display(),
                            in_flight = self.in_ring,
                            "cannot wait for in-flight i/o ({e}); leaking its buffers"
                        );
                        self.leak();
                        return;
                    }
                }
            }
            self.reap_dropped();
        }
    }
}

impl FileQueue {
    /// Enters the ring once to wait up to `slice` for completions (`ext_arg`: a timed
    /// wait; else a submit and a short sleep).
    fn wait_once(&mut self, slice: Duration, ext_arg: bool) -> std::io::Result<usize> {
        if ext_arg {
            let ts = types::Timespec::from(slice);
            self.ring
                .submitter()
                .submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
        } else {
            // No timed wait before Linux 5.11 (nor DEFER_TASKRUN): entering runs our
            // completion work; sleep a little between looks.
            let r = self.ring.submitter().submit();
            if self.ring.completion().is_empty() {
                std::thread::sleep(slice.min(Duration::from_millis(1)));
            }
            r
        }
    }

    /// Frees the slots of the CQEs in the ring; their completions are dropped.
    fn reap_dropped(&mut self) {
        let cq = self.ring.completion();
        for c in cq {
            let idx = c.user_data() as usize;
            if idx < self.slots.len() && self.slots[idx].state == State::Ring {
                self.slots[idx].state = State::Free;
                self.in_ring -= 1;
            }
        }
    }

    /// The kernel may still write our memory: never unmap it.
    fn leak(&mut self) {
        // The kernel may still write the lent buffers: they are never freed, and the pool
        // (so every region) stays mapped.
        self.leases.leak_all();
        std::mem::forget(self.pool.clone());
        std::mem::forget(std::mem::take(&mut self.iovecs));
    }
}
