//! Interrupts: which vectors have entries posted since their last message, aggregation
//! (one message per vector per pass) and Interrupt Coalescing (Set Features 08h). See
//! "Interrupts" in the module doc of [`crate::emu`].

use std::time::{Duration, Instant};

use super::admin::fid_plain;
use super::Ctrl;

/// A vector's entries posted and not yet signalled.
#[derive(Clone, Copy, Default)]
pub(super) struct Pending {
    entries: u32,
    /// When the first of them was posted (for the coalescing time).
    since: Option<Instant>,
    /// The admin CQ posted to it (coalescing never applies to the admin CQ).
    admin: bool,
}

impl Ctrl {
    /// Called by `post` for a CQ with interrupts enabled.
    #[inline]
    pub(super) fn irq_posted(&mut self, vector: u16, admin: bool) {
        let Some(p) = self.irq_pending.get_mut(vector as usize) else {
            return;
        };
        if p.entries == 0 {
            p.since = Some(Instant::now());
            self.irq_vectors.push(vector);
        }
        p.entries += 1;
        p.admin |= admin;
    }

    /// The aggregation threshold (entries) and time of Interrupt Coalescing.
    fn coalescing(&self) -> (u32, Duration) {
        let v = self
            .plain_features
            .iter()
            .find(|(f, _)| *f == fid_plain::INTERRUPT_COALESCING)
            .map_or(0, |&(_, v)| v);
        let thr = (v & 0xFF) + 1;
        let time = Duration::from_micros(((v >> 8) & 0xFF) as u64 * 100);
        (thr, time)
    }

    /// End of a pass: signals each pending vector whose coalescing allows it. Returns the
    /// instant the next held-back vector is due, if any.
    pub(super) fn raise_interrupts(&mut self) -> Option<Instant> {
        if self.irq_vectors.is_empty() {
            return None;
        }
        let (thr, time) = self.coalescing();
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut i = 0;
        while i < self.irq_vectors.len() {
            let v = self.irq_vectors[i];
            let p = self.irq_pending[v as usize];
            let due = p.since.map_or(now, |s| s + time);
            if p.admin || p.entries >= thr || due <= now {
                self.irq_pending[v as usize] = Pending::default();
                self.irq_vectors.swap_remove(i);
                if self.shared.irqs.signal(v) {
                    self.st.interrupts += 1;
                }
            } else {
                next = Some(next.map_or(due, |n: Instant| n.min(due)));
                i += 1;
            }
        }
        next
    }

    /// Forgets pending interrupts (controller reset).
    pub(super) fn clear_interrupts(&mut self) {
        for &v in &self.irq_vectors {
            self.irq_pending[v as usize] = Pending::default();
        }
        self.irq_vectors.clear();
    }
}
