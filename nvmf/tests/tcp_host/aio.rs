//! The aio API over a `tcp:` target: a run-to-completion context, and a reactor whose
//! pollers sleep on the queues' sockets (interrupt mode) between completions.

use std::sync::Arc;
use std::time::Duration;

use kestrel::aio::{Event, IoContext, Iocb};
use kestrel::reactor::{IdlePolicy, Reactor};

use crate::common::*;

#[test]
fn run_to_completion_context_writes_and_reads_back() {
    let s = server(1, "32M", 128 << 10);
    let t = kestrel::target_spec::open(&spec(&s, "digest=data")).unwrap();
    let bs = t.info().block_size as usize;
    let mut ctx = IoContext::setup(Arc::clone(&t), 64).unwrap();
    let buf = ctx.lend(t.dma_pool().alloc(512 * bs).unwrap()).unwrap();
    let data = pattern(256 * bs, 3);
    ctx.write_lent(&buf, 0, &data).unwrap();
    let w: Vec<Iocb> = (0..4)
        .map(|k| {
            Iocb::write(
                (k * 64 * bs) as u64,
                buf.slice(k * 64 * bs, 64 * bs).unwrap(),
                k as u64,
            )
        })
        .chain([Iocb::flush(9)])
        .collect();
    assert_eq!(ctx.submit(&w).unwrap(), 5);
    let mut ev = [Event::default(); 16];
    let mut got = 0;
    while got < 5 {
        got += ctx
            .getevents(1, &mut ev[got..], Some(Duration::from_secs(5)))
            .unwrap();
    }
    assert!(ev[..5].iter().all(|e| e.res.is_ok()), "{:?}", &ev[..5]);
    let r = buf.slice(256 * bs, 256 * bs).unwrap();
    assert_eq!(ctx.submit(&[Iocb::read(0, r, 20)]).unwrap(), 1);
    let n = ctx
        .getevents(1, &mut ev, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(ev[0].res, Ok(256 * bs as u64));
    let mut back = vec![0u8; 256 * bs];
    ctx.read_lent(&r, 0, &mut back).unwrap();
    assert!(back == data, "read back differs");
}

#[test]
fn reactor_in_interrupt_mode_sleeps_on_the_sockets() {
    let s = server(1, "32M", 128 << 10);
    let t = kestrel::target_spec::open(&spec(&s, "")).unwrap();
    let bs = t.info().block_size as usize;
    let reactor = Reactor::builder()
        .core_list("0")
        .unwrap()
        .target(Arc::clone(&t))
        .idle(IdlePolicy::Interrupt)
        .start()
        .unwrap();
    let mut ctx = reactor.context(64).unwrap();
    let buf = ctx.lend(t.dma_pool().alloc(32 * bs).unwrap()).unwrap();
    ctx.write_lent(&buf, 0, &pattern(16 * bs, 5)).unwrap();
    let mut ev = [Event::default(); 32];
    for round in 0..20u64 {
        let iocbs: Vec<Iocb> = (0..16)
            .map(|k| {
                Iocb::write(
                    (round * 16 + k) * bs as u64,
                    buf.slice(k as usize * bs, bs).unwrap(),
                    k,
                )
            })
            .collect();
        assert_eq!(ctx.submit(&iocbs).unwrap(), 16);
        let mut got = 0;
        while got < 16 {
            got += ctx
                .getevents(1, &mut ev[got..], Some(Duration::from_secs(5)))
                .unwrap();
            assert!(got > 0, "no event within 5 s in round {round}");
        }
        assert!(
            ev[..16].iter().all(|e| e.res == Ok(bs as u64)),
            "{:?}",
            &ev[..16]
        );
        // Idle for a moment: the poller sleeps until the next submission.
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(ctx);
    let report = reactor.shutdown().unwrap();
    assert_eq!(report.outstanding(), 0);
}
