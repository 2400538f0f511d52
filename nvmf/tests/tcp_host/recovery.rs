//! A target killed mid-write: the host's queue keeps its requests, reconnects (a new
//! controller, then the I/O queue) once the target is back on its port, and sends them
//! again; every write completes only when the restarted target acknowledges it, and all
//! of them read back. Without a restart, the requests fail after ctrl_loss_tmo.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::io::{IoError, IoRequest};
use kestrel::target::{Target, TargetQueue};
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

use crate::common::*;

fn serve(ns: &Arc<dyn Target>, listen: SocketAddr) -> Server {
    Server::start(ServerConfig {
        listen,
        discovery_listen: None,
        reactors: vec![None; 1],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![Arc::clone(ns)],
            allowed_hosts: Vec::new(),
            allow_any_host: true,
        }],
        limits: Limits::default(),
    })
    .expect("server starts")
}

const WRITES: u64 = 3000;
const QD: u64 = 32;

/// Writes block `lba` (0..WRITES) with its own pattern, QD 32, until every one has a
/// completion; `at(acked)` runs between polls (to kill and restart the target). Returns
/// the completions' results by LBA.
fn write_all(
    q: &mut dyn TargetQueue,
    buf: &kestrel::DmaSlice,
    mut at: impl FnMut(u64),
) -> Vec<Result<(), IoError>> {
    let mut res = vec![None; WRITES as usize];
    let mut next = 0u64;
    let mut free: VecDeque<u64> = (0..QD).collect();
    let mut slot_of = vec![0u64; WRITES as usize];
    let mut done = 0u64;
    let end = Instant::now() + Duration::from_secs(60);
    while done < WRITES {
        assert!(
            Instant::now() < end,
            "{done} of {WRITES} writes completed after 60 s"
        );
        while next < WRITES && !free.is_empty() {
            let slot = free.pop_front().unwrap();
            let s = buf.sub(slot as usize * 4096, 4096).unwrap();
            q.write_lent(&s, 0, &pattern(4096, next)).unwrap();
            q.submit(IoRequest::write(1, next, 1, s, next)).unwrap();
            slot_of[next as usize] = slot;
            next += 1;
        }
        q.flush();
        q.poll(0, &mut |c| {
            res[c.token as usize] = Some(c.result);
            free.push_back(slot_of[c.token as usize]);
            done += 1;
        });
        at(done);
    }
    res.into_iter()
        .map(|r| r.expect("every write completed once"))
        .collect()
}

#[test]
fn a_target_killed_mid_write_and_restarted_loses_no_acknowledged_write() {
    let ns = kestrel::target_spec::open("emu:size=64M,core=none").unwrap();
    let mut srv = Some(serve(&ns, "127.0.0.1:0".parse().unwrap()));
    let addr = srv.as_ref().unwrap().local_addr();
    let spec = format!("tcp:{addr}/{NQN},kato=1s,ctrl_loss_tmo=30s");
    let t = kestrel::target_spec::open(&spec).unwrap();
    let (mut q, buf) = queue_with_buffer(&t, 64, (QD as usize) * 4096);
    let mut restart: Option<std::thread::JoinHandle<Server>> = None;
    let res = write_all(q.as_mut(), &buf, |done| {
        if done >= WRITES / 3 && srv.is_some() && restart.is_none() {
            // Kill the target with writes in flight; it comes back on its port in 300 ms.
            drop(srv.take());
            let ns = Arc::clone(&ns);
            restart = Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                serve(&ns, addr)
            }));
        }
    });
    let _back = restart.expect("the target was killed").join().unwrap();
    for (lba, r) in res.iter().enumerate() {
        assert_eq!(*r, Ok(()), "write of lba {lba}");
    }
    let st = q.stats();
    assert!(
        st.resets >= 1 && st.retries >= 1,
        "the queue reconnected and retried: {st:?}"
    );
    // Every acknowledged write is there, read back through a fresh queue.
    drop(q);
    let (mut q, buf) = queue_with_buffer(&t, 16, 256 << 10);
    for start in (0..WRITES).step_by(64) {
        let n = 64.min(WRITES - start) as u32;
        let s = buf.sub(0, n as usize * 4096).unwrap();
        q.submit(IoRequest::read(1, start, n, s, 0)).unwrap();
        q.flush();
        assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
        let mut got = vec![0u8; n as usize * 4096];
        q.read_lent(&s, 0, &mut got).unwrap();
        for k in 0..n as u64 {
            let b = &got[k as usize * 4096..(k as usize + 1) * 4096];
            assert!(
                b == pattern(4096, start + k),
                "lba {} lost its acknowledged write",
                start + k
            );
        }
    }
}

#[test]
fn without_a_restart_the_requests_fail_after_ctrl_loss_tmo() {
    let ns = kestrel::target_spec::open("emu:size=64M,core=none").unwrap();
    let mut srv = Some(serve(&ns, "127.0.0.1:0".parse().unwrap()));
    let addr = srv.as_ref().unwrap().local_addr();
    let spec = format!("tcp:{addr}/{NQN},kato=1s,ctrl_loss_tmo=1s");
    let t = kestrel::target_spec::open(&spec).unwrap();
    let (mut q, buf) = queue_with_buffer(&t, 64, (QD as usize) * 4096);
    let mut killed_at = None;
    let res = write_all(q.as_mut(), &buf, |done| {
        if done >= 100 && srv.is_some() {
            drop(srv.take());
            killed_at = Some(Instant::now());
        }
    });
    let waited = killed_at.unwrap().elapsed();
    assert!(waited < Duration::from_secs(10), "failed after {waited:?}");
    let ok = res.iter().filter(|r| r.is_ok()).count();
    assert!(
        (100..WRITES as usize).contains(&ok),
        "{ok} writes acknowledged"
    );
    for r in res.iter().filter(|r| r.is_err()) {
        assert!(matches!(r, Err(IoError::Os(libc::ENOTCONN))), "{r:?}");
    }
    // The queue stays failed: a new request completes with the same error.
    let s = buf.sub(0, 4096).unwrap();
    q.submit(IoRequest::read(1, 0, 1, s, 7)).unwrap();
    assert_eq!(
        reap(q.as_mut(), 1)[0].result,
        Err(IoError::Os(libc::ENOTCONN))
    );
}

/// In interrupt mode a poller watches each queue's interrupt fd from the queue's set-up
/// on (`InterruptWait::watch`, as the aio reactor does). After the target is killed and
/// restarted, the reconnected queue must still wake that same watch when a response
/// comes, not leave its poller to its wait's time-out.
#[test]
fn the_interrupt_fd_watched_at_set_up_still_wakes_after_a_reconnect() {
    let ns = kestrel::target_spec::open("emu:size=64M,core=none").unwrap();
    let srv = serve(&ns, "127.0.0.1:0".parse().unwrap());
    let addr = srv.local_addr();
    let t =
        kestrel::target_spec::open(&format!("tcp:{addr}/{NQN},kato=1s,ctrl_loss_tmo=30s")).unwrap();
    let mut q = t
        .create_queue(&kestrel::target::QueueOptions {
            depth: 8,
            interrupts: true,
            ..Default::default()
        })
        .expect("queue connects");
    let buf = q.lend(t.dma_pool().alloc(8192).unwrap()).unwrap();
    let wait = kestrel::aio::notify::InterruptWait::new().unwrap();
    wait.watch(q.interrupt_fd().expect("an interrupt fd"))
        .unwrap();
    // One write before, to see the watch work at all.
    let (w, r) = (buf.sub(0, 4096).unwrap(), buf.sub(4096, 4096).unwrap());
    q.write_lent(&w, 0, &pattern(4096, 1)).unwrap();
    q.submit(IoRequest::write(1, 5, 1, w, 1)).unwrap();
    q.flush();
    assert!(wait.wait(Duration::from_secs(5)), "woken by the response");
    assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
    // The target goes and comes back; a write through the gap reconnects the queue.
    drop(srv);
    let ns2 = Arc::clone(&ns);
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        serve(&ns2, addr)
    });
    q.write_lent(&w, 0, &pattern(4096, 2)).unwrap();
    q.submit(IoRequest::write(1, 5, 1, w, 2)).unwrap();
    q.flush();
    assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
    let _srv = back.join().unwrap();
    assert!(
        q.stats().resets >= 1,
        "the queue reconnected: {:?}",
        q.stats()
    );
    // Drain what the old connection left readable, then the watch must hear the new one.
    let end = Instant::now() + Duration::from_secs(5);
    while q.arm_interrupt() {
        assert!(
            Instant::now() < end,
            "the queue stays busy with nothing in flight"
        );
        q.poll(0, &mut |_| {});
        std::thread::sleep(Duration::from_millis(1));
    }
    q.submit(IoRequest::read(1, 5, 1, r, 3)).unwrap();
    q.flush();
    assert!(
        wait.wait(Duration::from_secs(5)),
        "the reconnected queue woke the watch made at set-up"
    );
    assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
    let mut got = vec![0u8; 4096];
    q.read_lent(&r, 0, &mut got).unwrap();
    assert!(
        got == pattern(4096, 2),
        "the write made through the gap reads back"
    );
}
