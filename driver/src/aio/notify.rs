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

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
// `std`'s atomics, or loom's in a `--cfg loom` build (see `super::sync`).
use super::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;

/// An eventfd-backed wake-up. See the module documentation.
#[derive(Debug)]
pub struct Notify {
    sleeping: CachePadded<AtomicBool>,
    fd: OwnedFd,
}

impl Notify {
    /// Creates the eventfd (non-blocking, close-on-exec).
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Notify {
            sleeping: CachePadded::new(AtomicBool::new(false)),
            // SAFETY: fd is a new descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
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
        let ms: libc::c_int = match timeout {
            None => -1,
            Some(d) => d.as_millis().clamp(0, i32::MAX as u128) as libc::c_int,
        };
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        let woken = rc > 0 && pfd.revents & libc::POLLIN != 0;
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
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v`; the fd is non-blocking, so an empty counter
        // returns EAGAIN instead of blocking.
        unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut v as *mut u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// Wakes the sleeper unconditionally (shutdown, new attachments).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from `one`. A full counter (EAGAIN) already means a
        // pending wake-up, so the result needs no handling.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
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
        use rustix::event::{epoll, Timespec};
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
