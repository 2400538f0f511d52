//! The wake-up protocol of [`super::notify`] under loom (`--cfg loom`; scripts/test.sh):
//! a [`Notify`] with its real eventfd and [`spsc`] rings, with loom choosing every
//! interleaving of the threads and every value the memory model lets each load of
//! `sleeping` and of a ring's tail read.
//!
//! The sleeper does what a poller's idle sleep and a context's `getevents` do: look at
//! its rings, [`Notify::prepare`], look again ([`spsc::Consumer::len_fresh`]), then
//! cancel or sleep. A producer publishes an item and calls
//! [`Notify::wake_if_sleeping`], as a submitter (for a poller) or a poller (for a
//! context) does. The eventfd is real; only its blocking wait is modelled: the sleeper
//! "sleeps" until the eventfd is readable, and if every producer has finished and it is
//! not, the wake-up was lost and the test fails.

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use loom::thread;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::notify::Notify;
use super::spsc::{self, Consumer};

/// Whether the eventfd has a signal pending (a zero-timeout poll: it does not touch the
/// counter or the flag).
fn signalled(n: &Notify) -> bool {
    let fd = n.fd();
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&zero)).expect("poll of an eventfd") > 0
}

/// The blocking wait of [`Notify::sleep`], modelled: returns once the eventfd is
/// readable (and clears it, as `sleep` does when woken); fails the model if every
/// producer has finished and no signal is pending, since a real sleeper would then
/// sleep with work in its rings until its time-out.
fn sleep_until_signalled(n: &Notify, producers_left: &AtomicUsize) {
    loop {
        if signalled(n) {
            n.woke();
            return;
        }
        // Relaxed: loom runs one thread at a time; this counter is the test's own view
        // of which threads have finished, not part of the protocol.
        if producers_left.load(Ordering::Relaxed) == 0 {
            assert!(signalled(n), "lost wake-up: asleep with work in a ring");
        }
        thread::yield_now();
    }
}

/// `producers` threads each publish `items` items on a ring of their own, calling
/// `wake_if_sleeping` after each; the sleeper takes them all, sleeping whenever it
/// finds its rings empty, with (`recheck`) or without the look after `prepare`.
fn model_wake_ups(producers: usize, items: u64, recheck: bool) {
    crate::aio::sync::model(move || {
        let notify = Arc::new(Notify::new().expect("an eventfd"));
        let left = Arc::new(AtomicUsize::new(producers));
        let mut rings: Vec<Consumer<u64>> = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..producers {
            let (mut p, c) = spsc::channel::<u64>(2);
            rings.push(c);
            let (n, left) = (Arc::clone(&notify), Arc::clone(&left));
            threads.push(thread::spawn(move || {
                for i in 0..items {
                    p.send(i).expect("the ring holds every item");
                    n.wake_if_sleeping();
                }
                left.fetch_sub(1, Ordering::Relaxed);
            }));
        }
        let mut got = 0;
        while got < producers as u64 * items {
            let before = got;
            for c in rings.iter_mut() {
                while c.pop().is_some() {
                    got += 1;
                }
            }
            if got > before {
                continue;
            }
            notify.prepare();
            if recheck && rings.iter_mut().any(|c| c.len_fresh() > 0) {
                notify.cancel();
                continue;
            }
            sleep_until_signalled(&notify, &left);
        }
        for t in threads {
            t.join().unwrap();
        }
    });
}

/// One producer, two items: the sleeper never sleeps through a published item.
#[test]
fn loom_notify_no_lost_wakeup() {
    model_wake_ups(1, 2, true);
}

/// Two producers (a poller's two contexts, or a context's two pollers), one item each.
#[test]
fn loom_notify_no_lost_wakeup_two_producers() {
    model_wake_ups(2, 1, true);
}

/// The model can fail: a sleeper that does not look again after `prepare` loses a
/// wake-up when the item is published between its first look and `prepare` (the
/// producer then sees `sleeping` false and does not signal).
#[test]
#[should_panic(expected = "lost wake-up")]
fn loom_notify_without_the_second_look_loses_a_wakeup() {
    model_wake_ups(1, 1, false);
}
