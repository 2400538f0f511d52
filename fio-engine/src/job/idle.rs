//! What a job does while fio waits for completions and none has come (`kestrel_idle=`):
//! `busy` polls its queue pair without pause (the lowest latency; a core at 100 %),
//! `interrupt` sleeps on the queue's completion interrupt as soon as a poll finds
//! nothing, `hybrid` (the default) keeps polling for a short spin after the last
//! completion and then sleeps as `interrupt` does. Sleeping needs a queue made with
//! interrupts (an MSI-X vector's eventfd through VFIO, the emulator's interrupt eventfd);
//! a file target's queue sleeps in `io_uring_enter` instead (its ring defers completion
//! work to the thread that enters it, so an eventfd would not be signalled meanwhile). A
//! queue that can do neither is polled.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use kestrel::file::FileQueue;
use kestrel::TargetQueue;

use crate::{IDLE_BUSY, IDLE_HYBRID, IDLE_INTERRUPT};

/// The longest single sleep: the job looks at its queue again after it, so that no
/// completion can be missed for long whatever happens to an interrupt.
const MAX_SLEEP: Duration = Duration::from_millis(10);

/// The idle policy of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idle {
    Busy,
    Hybrid(Duration),
    Interrupt,
}

impl Idle {
    /// From `kfio_job_start`'s arguments.
    pub(crate) fn from_c(idle: i32, spin_ns: u64) -> Result<Idle, String> {
        match idle {
            IDLE_BUSY => Ok(Idle::Busy),
            IDLE_HYBRID => Ok(Idle::Hybrid(Duration::from_nanos(spin_ns))),
            IDLE_INTERRUPT => Ok(Idle::Interrupt),
            n => Err(format!("kestrel_idle: unknown policy {n}")),
        }
    }

    /// Whether the queue pair needs interrupts.
    pub(crate) fn sleeps(self) -> bool {
        self != Idle::Busy
    }
}

/// A job's queue pair: a file target's, which can sleep in the kernel until a
/// completion, or any other (through its interrupt eventfd, if it has one).
pub(crate) enum Queue {
    Any(Box<dyn TargetQueue>),
    File(Box<FileQueue>),
}

impl Deref for Queue {
    type Target = dyn TargetQueue;
    #[inline]
    fn deref(&self) -> &(dyn TargetQueue + 'static) {
        match self {
            Queue::Any(q) => &**q,
            Queue::File(q) => &**q,
        }
    }
}

impl DerefMut for Queue {
    #[inline]
    fn deref_mut(&mut self) -> &mut (dyn TargetQueue + 'static) {
        match self {
            Queue::Any(q) => &mut **q,
            Queue::File(q) => &mut **q,
        }
    }
}

/// A getevents call's idle state: when its polls last found something.
pub(crate) struct Waiting {
    idle: Idle,
    since: Option<Instant>,
}

impl Waiting {
    pub(crate) fn new(idle: Idle) -> Self {
        Waiting { idle, since: None }
    }

    /// After a poll that reaped `got` completions without satisfying fio: spins, or
    /// sleeps on the queue's interrupt (until `deadline` at the latest). Returns whether
    /// it slept.
    #[inline]
    pub(crate) fn idle(&mut self, got: u32, q: &mut Queue, deadline: Option<Instant>) -> bool {
        let spin = match self.idle {
            Idle::Busy => {
                std::hint::spin_loop();
                return false;
            }
            Idle::Interrupt => Duration::ZERO,
            Idle::Hybrid(spin) => spin,
        };
        if got > 0 {
            self.since = None;
        }
        if !spin.is_zero() {
            let now = Instant::now();
            let since = *self.since.get_or_insert(now);
            if now.duration_since(since) < spin {
                std::hint::spin_loop();
                return false;
            }
        }
        self.since = None;
        sleep(q, deadline)
    }
}

/// Sleeps until a completion: a file queue in `io_uring_enter` (when fio set no deadline:
/// that wait has no time limit), any other on its completion interrupt, which it arms
/// first (looking at the queue once more), bounded by `deadline` and [`MAX_SLEEP`].
#[cold]
fn sleep(q: &mut Queue, deadline: Option<Instant>) -> bool {
    let q = match q {
        Queue::File(f) if deadline.is_none() => {
            f.wait(1);
            return true;
        }
        Queue::File(_) => {
            std::hint::spin_loop();
            return false;
        }
        Queue::Any(q) => q,
    };
    if q.arm_interrupt() {
        // Something to reap already (or the queue has no interrupt to sleep on).
        return false;
    }
    let Some(fd) = q.interrupt_fd() else {
        return false;
    };
    let t = deadline.map_or(MAX_SLEEP, |d| {
        d.saturating_duration_since(Instant::now()).min(MAX_SLEEP)
    });
    let ts = Timespec {
        tv_sec: t.as_secs() as _,
        tv_nsec: t.subsec_nanos() as _,
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    // An error (EINTR) only ends the sleep early: the caller polls the queue again.
    let _ = poll(&mut fds, Some(&ts));
    true
}
