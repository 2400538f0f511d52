//! Interrupts and the pollers that sleep on them, against the emulated controller: a CQ
//! created with IEN = 1 signals its vector's eventfd and one without does not; the
//! arm-then-check protocol; Interrupt Coalescing; a reactor in interrupt and hybrid mode
//! moves verified data, sleeps with I/O in flight and is woken by the completion
//! interrupt; and an idle reactor in those modes uses under 2% of a core.
//!
//! # The idle measurement and its tolerance
//! The poller thread's CPU time (`/proc/self/task/TID/schedstat`, nanoseconds on the CPU;
//! `stat`'s utime + stime in clock ticks where schedstat is missing) over about 1.5 s of
//! idleness, divided by the wall time that passed, must stay under 2%. What it measures
//! is CPU time used, not progress made: a loaded machine can only stretch the wall time
//! (making the ratio smaller), never add CPU time to a thread asleep in `epoll_wait`. An
//! idle poller wakes at most every 100 ms (its sleep limit), a few microseconds each, so
//! the expected figure is ~0.01%, two orders of magnitude below the bound. (A busy-polling
//! reactor measured the same way shows tens of percent, whatever share of the core a
//! loaded machine leaves it; it is not run here, to keep a spinning thread off CI's cores.)

mod common;

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use kestrel::aio::{Event, Iocb};
use kestrel::emu::{EmuConfig, EmuController};
use kestrel::io::IoRequest;
use kestrel::reactor::{IdlePolicy, Reactor};
use kestrel::target::{QueueOptions, Target};
use kestrel::{NvmeNamespace, QpairOptions};

/// Waits until `fd` is readable, at most `limit`; true if it became readable.
fn readable(fd: BorrowedFd<'_>, limit: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut p = [PollFd::new(&fd, PollFlags::IN)];
    let ts = Timespec {
        tv_sec: limit.as_secs() as _,
        tv_nsec: limit.subsec_nanos() as _,
    };
    matches!(poll(&mut p, Some(&ts)), Ok(n) if n > 0)
}

#[test]
fn a_cq_with_interrupts_signals_its_vector_and_one_without_does_not() {
    let (emu, c) = emu();
    let bs = 4096;

    // Without interrupts: no eventfd, nothing signalled.
    let mut plain = c.create_io_qpair(&QpairOptions::default()).unwrap();
    assert!(plain.interrupt_fd().is_none());
    let buf = lend(&mut plain, c.dma_pool(), bs);
    plain.submit(IoRequest::read(1, 0, 1, buf, 1)).unwrap();
    plain.flush();
    reap(&mut plain, 1);
    assert_eq!(
        emu.stats().interrupts,
        0,
        "an IEN = 0 queue raised an interrupt"
    );

    let mut q = c
        .create_io_qpair(&QpairOptions {
            interrupts: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(q.interrupt_vector(), Some(q.qid()), "one vector per queue");
    let buf = lend(&mut q, c.dma_pool(), bs);
    // Armed with nothing outstanding: nothing to reap, sleep allowed.
    assert!(!q.arm_interrupt());
    let fd = q.interrupt_fd().unwrap().try_clone_to_owned().unwrap();
    assert!(
        !readable(fd.as_fd(), Duration::ZERO),
        "signalled before any I/O"
    );
    for round in 0..20u64 {
        q.submit(IoRequest::read(1, round, 1, buf, round)).unwrap();
        q.flush();
        // Arm, check, sleep: the completion wakes us (bounded by WAIT, never hit).
        if !q.arm_interrupt() {
            assert!(readable(fd.as_fd(), WAIT), "round {round}: no interrupt");
        }
        let got = reap(&mut q, 1);
        assert_eq!(got[0].token, round);
        assert!(got[0].result.is_ok());
        // Consumed: the next arm finds nothing and clears the signal.
        assert!(!q.arm_interrupt());
        assert!(
            !readable(fd.as_fd(), Duration::ZERO),
            "round {round}: stale signal"
        );
    }
    let s = emu.stats();
    assert!(
        (1..=20).contains(&s.interrupts),
        "20 completions, {} interrupts",
        s.interrupts
    );
}

#[test]
fn coalescing_holds_the_interrupt_until_the_threshold() {
    let (emu, c) = emu();
    // Interrupt Coalescing: THR = 3 (four entries), TIME = 255 x 100 us (25.5 ms).
    // SAFETY: Set Features Interrupt Coalescing names no memory.
    unsafe { c.admin_command(kestrel::spec::Sqe::set_features(0x08, (255 << 8) | 3), None) }
        .unwrap();
    let mut q = c
        .create_io_qpair(&QpairOptions {
            interrupts: true,
            ..Default::default()
        })
        .unwrap();
    let buf = lend(&mut q, c.dma_pool(), 4096);
    let fd = q.interrupt_fd().unwrap().try_clone_to_owned().unwrap();
    // Three completions, one at a time: below the threshold, held back until TIME.
    for i in 0..3u64 {
        q.submit(IoRequest::read(1, i, 1, buf, i)).unwrap();
        q.flush();
        reap(&mut q, 1);
    }
    // The fourth reaches the threshold: one message for the four.
    q.submit(IoRequest::read(1, 3, 1, buf, 3)).unwrap();
    q.flush();
    reap(&mut q, 1);
    assert!(readable(fd.as_fd(), WAIT));
    let n = emu.stats().interrupts;
    // Without coalescing each of the four completions, posted in a pass of its own, is a
    // message. With it, one message (or, if this thread was stalled past the 25.5 ms
    // limit between completions, a message per stalled group): never four.
    assert!((1..=3).contains(&n), "{n} interrupts for 4 completions");
}

/// The CPU time of thread `tid` of this process, in nanoseconds.
fn thread_cpu_ns(tid: &str) -> u64 {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return ns;
        }
    }
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at state (field 3);
    // utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks * 10_000_000 // USER_HZ = 100
}

fn this_tid() -> String {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

/// Runs a reactor with `idle` on one core: verified writes and reads (QD 8, then QD 1
/// against 2 ms of device latency, so the poller sleeps with I/O in flight), then ~1.5 s
/// of nothing. Returns (fraction of a core used while idle, the report, interrupts).
fn run(idle: IdlePolicy) -> (f64, kestrel::reactor::ReactorReport, u64) {
    let (emu, c) = emu_with(EmuConfig {
        latency: Duration::from_millis(2),
        ..Default::default()
    });
    let t: Arc<dyn Target> = Arc::new(NvmeNamespace::new(c, 1).unwrap());
    let tid = Arc::new(Mutex::new(String::new()));
    let tid2 = Arc::clone(&tid);
    let core = core_affinity::get_core_ids().unwrap()[0].id;
    let reactor = Reactor::builder()
        .cores([core])
        .target(Arc::clone(&t))
        .idle(idle)
        .on_start(move |_| *tid2.lock().unwrap() = this_tid())
        .start()
        .unwrap();
    let mut ctx = reactor.context(16).unwrap();
    let bs = 4096usize;
    let w = ctx.lend(t.dma_pool().alloc(8 * bs).unwrap()).unwrap();
    let r = ctx.lend(t.dma_pool().alloc(8 * bs).unwrap()).unwrap();
    let data = pattern(8 * bs, 3);
    ctx.write_lent(&w, 0, &data).unwrap();
    let mut evs = vec![Event::default(); 16];
    let mut wait = |ctx: &mut kestrel::aio::IoContext, n: usize| {
        let deadline = Instant::now() + WAIT;
        let mut got = 0;
        while got < n {
            let k = ctx
                .getevents(1, &mut evs[..n - got], Some(Duration::from_millis(200)))
                .unwrap();
            assert!(evs[..k].iter().all(|e| e.res.is_ok()), "{:?}", &evs[..k]);
            got += k;
            assert!(Instant::now() < deadline, "{got} of {n} events");
        }
    };
    let writes: Vec<Iocb> = (0..8)
        .map(|i| Iocb::write((i * bs) as u64, w.slice(i * bs, bs).unwrap(), i as u64))
        .collect();
    assert_eq!(ctx.submit(&writes).unwrap(), 8);
    wait(&mut ctx, 8);
    for i in 0..8 {
        let rd = Iocb::read(
            (i * bs) as u64,
            r.slice(i * bs, bs).unwrap(),
            100 + i as u64,
        );
        assert_eq!(ctx.submit(&[rd]).unwrap(), 1);
        wait(&mut ctx, 1);
    }
    let mut got = vec![0u8; 8 * bs];
    ctx.read_lent(&r, 0, &mut got).unwrap();
    assert!(got == data, "data read back differs");

    // Idle: measure the poller's CPU time over ~1.5 s.
    std::thread::sleep(Duration::from_millis(100));
    let tid = tid.lock().unwrap().clone();
    let (c0, w0) = (thread_cpu_ns(&tid), Instant::now());
    std::thread::sleep(Duration::from_millis(1500));
    let (c1, wall) = (thread_cpu_ns(&tid), w0.elapsed());
    let frac = (c1 - c0) as f64 / wall.as_nanos() as f64;
    drop(ctx);
    let rep = reactor.shutdown().unwrap();
    assert_eq!(rep.outstanding(), 0);
    (frac, rep, emu.stats().interrupts)
}

#[test]
fn an_idle_reactor_sleeps_in_interrupt_and_hybrid_mode() {
    for (name, mode) in [
        ("interrupt", IdlePolicy::Interrupt),
        ("hybrid", IdlePolicy::HYBRID),
    ] {
        let (frac, rep, irqs) = run(mode);
        let p = &rep.pollers[0];
        println!(
            "{name}: idle poller used {:.4} % of a core; {} sleeps, {} woken by an event, {} interrupts",
            frac * 100.0,
            p.sleeps,
            p.irq_wakeups,
            irqs
        );
        assert!(
            frac < 0.02,
            "{name}: idle poller used {:.2} % of a core",
            frac * 100.0
        );
        assert!(p.sleeps > 0, "{name}: the poller never slept");
        assert!(irqs > 0, "{name}: the emulator raised no interrupt");
        assert!(p.irq_wakeups > 0, "{name}: no sleep ended by an event");
    }
}

#[test]
fn queue_options_ask_a_target_for_interrupts() {
    let (_emu, c) = emu();
    let t = NvmeNamespace::new(c, 1).unwrap();
    let q = t
        .create_queue(&QueueOptions {
            interrupts: true,
            ..Default::default()
        })
        .unwrap();
    assert!(q.interrupt_fd().is_some());
    assert!(q.in_use().unwrap().interrupts);
    let q = t.create_queue(&QueueOptions::default()).unwrap();
    assert!(q.interrupt_fd().is_none());
    assert!(!q.in_use().unwrap().interrupts);
}

#[test]
fn a_controller_without_vectors_polls_only() {
    // The emulator has one vector per queue ID: 2 I/O queues -> vectors 0..=2. A queue
    // beyond is created without interrupts (and says so) instead of sharing a vector.
    let emu = EmuController::start(EmuConfig {
        max_io_queues: 2,
        ..Default::default()
    })
    .unwrap();
    let c = kestrel::Controller::new(emu, Default::default()).unwrap();
    let opts = QpairOptions {
        interrupts: true,
        ..Default::default()
    };
    let a = c.create_io_qpair(&opts).unwrap();
    let b = c.create_io_qpair(&opts).unwrap();
    assert!(a.interrupt_fd().is_some() && b.interrupt_fd().is_some());
    assert_ne!(a.interrupt_vector(), b.interrupt_vector());
}

#[test]
fn arming_steers_the_vector_to_the_arming_cpu_once_per_cpu() {
    use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
    // In a thread of its own: it is pinned to CPUs here.
    std::thread::spawn(|| {
        let (emu, c) = emu();
        let allowed = sched_getaffinity(None).unwrap();
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&i| allowed.is_set(i))
            .collect();
        let pin = |cpu: usize| {
            let mut set = CpuSet::new();
            set.set(cpu);
            sched_setaffinity(None, &set).unwrap();
            assert_eq!(sched_getcpu(), cpu, "pinned to cpu {cpu}");
        };
        // A queue without interrupts has nothing to steer.
        let mut plain = c.create_io_qpair(&QpairOptions::default()).unwrap();
        assert!(!plain.arm_interrupt());
        assert!(emu.interrupt_steering().is_empty());

        let mut q = c
            .create_io_qpair(&QpairOptions {
                interrupts: true,
                ..Default::default()
            })
            .unwrap();
        let qid = q.qid();
        pin(cpus[0]);
        assert!(!q.arm_interrupt());
        assert_eq!(emu.interrupt_steering(), [(qid, cpus[0])]);
        // Same CPU: not asked again.
        for _ in 0..5 {
            assert!(!q.arm_interrupt());
        }
        assert_eq!(emu.interrupt_steering(), [(qid, cpus[0])]);
        let Some(&other) = cpus.get(1) else {
            println!(
                "skipping the CPU change: this process may run on cpu {} only",
                cpus[0]
            );
            return;
        };
        // Another CPU: steered there, once.
        pin(other);
        assert!(!q.arm_interrupt());
        assert!(!q.arm_interrupt());
        assert_eq!(emu.interrupt_steering(), [(qid, cpus[0]), (qid, other)]);
    })
    .join()
    .unwrap();
}
