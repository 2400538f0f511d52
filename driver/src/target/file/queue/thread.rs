//! The owning thread: a single-issuer ring is entered only by the thread that enabled
//! it; a queue moved to another thread with nothing in flight rebuilds its ring there.

use super::*;

/// A number for the calling thread, unique in the process and never reused (unlike OS
/// thread ids): the owner of a single-issuer ring is compared against it.
pub(super) fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static TOKEN: Cell<u64> = const { Cell::new(0) });
    TOKEN.with(|t| match t.get() {
        0 => {
            let v = NEXT.fetch_add(1, Ordering::Relaxed);
            t.set(v);
            v
        }
        v => v,
    })
}

impl FileQueue {
    /// Whether the calling thread may use the ring: always for a ring that is not
    /// single-issuer or not entered yet, and for its owner. On another thread, a queue
    /// with nothing in the kernel moves here (see [`Self::move_here`]); one with
    /// operations in the kernel cannot (only the owner's entering completes them):
    /// `Err(operations in the kernel)`.
    #[inline]
    pub(super) fn check_thread(&mut self) -> Result<(), u32> {
        if !self.single_issuer || self.owner == 0 || self.owner == thread_token() {
            return Ok(());
        }
        self.move_here()
    }

    /// Moves the queue to the calling thread: the ring is rebuilt here without
    /// `SINGLE_ISSUER`/`DEFER_TASKRUN`, so that from then on any thread may use it without
    /// moving again, and its file and buffers are registered again.
    /// Operations pushed but never submitted are pushed again into the new ring. Refused
    /// (`Err` with their count) while operations are in the kernel.
    #[cold]
    pub(super) fn move_here(&mut self) -> Result<(), u32> {
        let in_kernel = self.in_ring - self.unsubmitted.min(self.in_ring);
        if in_kernel > 0 {
            return Err(in_kernel);
        }
        // Level 1 at most: no single issuer.
        let (ring, _) = match build_ring(&self.shared, self.sq_entries, 1) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(
                    path = %self.shared.path.display(),
                    "cannot move the file queue to this thread: {e}"
                );
                return Err(0);
            }
        };
        // Nothing of the old ring is in the kernel: closing it cannot free memory in use.
        self.ring = ring;
        self.single_issuer = false;
        self.owner = 0;
        self.fixed_slots = register_table(&self.ring, &self.shared, &self.pool);
        self.regions.clear();
        self.refresh_regions();
        // Push again what the old ring held unsubmitted, without counting it twice.
        let (stats, counters) = (self.stats, self.counters);
        self.unsubmitted = 0;
        for idx in 0..self.slots.len() {
            if self.slots[idx].state == State::Ring {
                self.issue(idx);
            }
        }
        self.stats = stats;
        self.counters = counters;
        self.counters.thread_moves += 1;
        tracing::debug!(
            path = %self.shared.path.display(),
            "file queue moved to another thread; its ring is now usable from any thread"
        );
        Ok(())
    }

    /// Logs, once per queue, that the queue is being used from a thread that cannot
    /// complete its operations.
    #[cold]
    pub(super) fn warn_wrong_thread(&mut self, what: &str, in_kernel: u32) {
        if !self.warned_wrong_thread {
            self.warned_wrong_thread = true;
            tracing::error!(
                path = %self.shared.path.display(),
                in_kernel,
                "file queue {what} from a thread other than the one that owns its ring, with {in_kernel} operations in flight that only that thread can complete; use the queue on that thread until they have completed"
            );
        }
    }
}
