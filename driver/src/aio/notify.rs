//! A wake-up for a thread that sleeps when it has nothing to do: an eventfd plus a
//! "sleeping" flag, so that the side with work to hand over makes a syscall only when
//! the other side is (about to be) asleep.
//!
//! # The protocol (no lost wake-ups)
//! Sleeper: [`Notify::prepare`] stores `sleeping = true`, then a `SeqCst` fence; it then
//! looks for work once more (e.g. reloads a ring's tail) and either [`Notify::cancel`]s or
//! [`Notify::sleep`]s. Waker: publishes its work (a release store), then
//! [`Notify::wake_if_sleeping`]: a `SeqCst` fence, then a load of `sleeping`, and a write
//! to the eventfd only if it is set. The two fences order each side's store before its
//! load (a store-load order, which release/acquire alone does not give), so at least one
//! side sees the other's store: either the sleeper sees the work, or the waker sees the
//! flag and writes the eventfd, whose counter then makes the sleeper's `poll` return at
//! once even if the write came before it.

use std::os::fd::OwnedFd;
// `std`'s atomics, or loom's in a `--cfg loom` build (see `super::sync`).
use super::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

/// An eventfd-backed wake-up. See the module documentation.
#[derive(Debug)]
pub struct Notify {
    sleeping: CachePadded<AtomicBool>,
    fd: OwnedFd,
}

impl Notify {
    /// Creates the eventfd (non-blocking, close-on-exec).
    pub fn new() -> std::io::Result<Self> {
        Ok(Notify {
            sleeping: CachePadded::new(AtomicBool::new(false)),
            fd: eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?,
        })
    }

    /// Announces an intent to sleep. Look for work once more after this, then call
    /// [`Notify::sleep`] or [`Notify::cancel`].
    pub fn prepare(&self) {
        // Relaxed store, ordered before the caller's following loads by the fence.
        self.sleeping.store(true, Ordering::Relaxed);
        // SeqCst: our store of `sleeping` is ordered before our next look for work (a
        // store-load order); pairs with the fence in `wake_if_sleeping`.
        fence(Ordering::SeqCst);
    }

    /// Withdraws [`Notify::prepare`]: work was found.
    pub fn cancel(&self) {
        // Relaxed: only a hint to wakers; a stale `true` costs one spurious eventfd write.
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Sleeps until woken or `timeout` passes (`None`: no limit), then clears the flag and
    /// the eventfd counter. Returns true if woken by a signal on the eventfd.
    pub fn sleep(&self, timeout: Option<Duration>) -> bool {
        // Whole milliseconds, at most i32::MAX of them, as poll(2) takes them.
        let ts = timeout.map(|d| {
            let ms = d.as_millis().min(i32::MAX as u128) as i64;
            Timespec {
                tv_sec: ms / 1000,
                tv_nsec: ((ms % 1000) * 1_000_000) as _,
            }
        });
        let mut pfd = [PollFd::new(&self.fd, PollFlags::IN)];
        // An error (EINTR) counts as a time-out: the caller looks for work either way.
        let n = poll(&mut pfd, ts.as_ref()).unwrap_or(0);
        let woken = n > 0 && pfd[0].revents().contains(PollFlags::IN);
        self.sleeping.store(false, Ordering::Relaxed);
        if woken {
            self.drain();
        }
        woken
    }

    /// The eventfd, for a sleeper that waits on it together with other descriptors
    /// (epoll): after [`Notify::prepare`] and a last look for work, it waits, then calls
    /// [`Notify::woke`].
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Ends a sleep made on [`Notify::fd`] by another wait: clears the flag and the
    /// eventfd counter.
    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
        self.drain();
    }

    fn drain(&self) {
        // The fd is non-blocking, so an empty counter is EAGAIN instead of a wait: nothing
        // to clear, and so nothing to handle.
        let _ = rustix::io::read(&self.fd, &mut [0u8; 8]);
    }

    /// Wakes the sleeper unconditionally (shutdown, new attachments).
    pub fn signal(&self) {
        // A full counter (EAGAIN) already means a pending wake-up, so the result needs no
        // handling.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Wakes the sleeper if it is asleep or about to be. Call after publishing work.
    /// Returns true if a signal was sent.
    pub fn wake_if_sleeping(&self) -> bool {
        // SeqCst: our publication of work (the caller's release store) is ordered before
        // the load of `sleeping` below; pairs with the fence in `prepare`.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if self.sleeping.load(Ordering::Relaxed) {
            self.signal();
            true
        } else {
            false
        }
    }
}

/// A set of eventfds to sleep on together (epoll): a poller's [`Notify`] and its queues'
/// interrupt eventfds ([`crate::target::TargetQueue::interrupt_fd`]). Used by the
/// reactor's interrupt and hybrid policies and by `kestrel perf --poll-mode`. The caller
/// follows the protocol of [`crate::target::TargetQueue::arm_interrupt`] (clear, check,
/// then wait) so nothing is missed; `wait` itself allocates nothing.
#[derive(Debug)]
pub struct InterruptWait {
    epoll: OwnedFd,
}

impl InterruptWait {
    /// An empty set.
    pub fn new() -> std::io::Result<Self> {
        use rustix::event::epoll;
        Ok(InterruptWait {
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
        })
    }

    /// Adds an eventfd; it wakes [`InterruptWait::wait`] while readable.
    pub fn watch(&self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
        use rustix::event::epoll;
        epoll::add(
            &self.epoll,
            fd,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )?;
        Ok(())
    }

    /// Sleeps until a watched eventfd is readable or `timeout` passes. Returns true if
    /// an event ended it (an interrupted wait counts as a time-out: the caller looks
    /// again either way).
    pub fn wait(&self, timeout: Duration) -> bool {
        use rustix::event::epoll;
        let ts = Timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let mut events = [epoll::Event {
            flags: epoll::EventFlags::empty(),
            data: epoll::EventData::new_u64(0),
        }; 4];
        matches!(epoll::wait(&self.epoll, &mut events[..], Some(&ts)), Ok(n) if n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn a_signal_before_sleep_is_not_lost() {
        let n = Notify::new().unwrap();
        n.prepare();
        assert!(n.wake_if_sleeping());
        // The counter is set: sleep returns at once.
        assert!(n.sleep(Some(Duration::from_secs(10))));
        n.prepare();
        assert!(!n.sleep(Some(Duration::from_millis(1))), "nothing pending");
        assert!(!n.wake_if_sleeping(), "not sleeping: no syscall");
    }

    #[test]
    fn ping_pong_without_lost_wakeups() {
        let n = Arc::new(Notify::new().unwrap());
        let work = Arc::new(AtomicU64::new(0));
        let (n2, w2) = (Arc::clone(&n), Arc::clone(&work));
        let t = std::thread::spawn(move || {
            let mut seen = 0;
            while seen < 2000 {
                n2.prepare();
                let now = w2.load(Ordering::Acquire);
                if now > seen {
                    n2.cancel();
                    seen = now;
                    continue;
                }
                // A lost wake-up would hang here; the 10 s bound turns it into a failure.
                assert!(n2.sleep(Some(Duration::from_secs(10))), "lost wake-up");
            }
        });
        for i in 1..=2000 {
            work.store(i, Ordering::Release);
            n.wake_if_sleeping();
            if i % 64 == 0 {
                std::thread::yield_now();
            }
        }
        t.join().unwrap();
    }
}
