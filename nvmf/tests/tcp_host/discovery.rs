//! Discovery through the `tcp:` target kind, and what a discovery string opens to.

use kestrel::target_spec::{discover, parse, OpenOptions, TargetSpec};

use crate::common::*;

#[test]
fn the_discovery_log_lists_the_subsystem() {
    let s = server(2, "16M", 128 << 10);
    let d = s.discovery_addr().unwrap();
    let TargetSpec::Tcp(t) = parse(&format!("tcp:{d}")).unwrap() else {
        panic!("a tcp spec")
    };
    assert!(t.is_discovery());
    let log = discover(&t, &OpenOptions::default()).unwrap();
    let nvm: Vec<_> = log.entries.iter().filter(|e| e.subnqn == NQN).collect();
    assert_eq!(nvm.len(), 1, "{log:?}");
    assert_eq!(nvm[0].trsvcid, s.local_addr().port().to_string());
    // Opening it as a block target says what it is and what to do instead.
    let e = kestrel::target_spec::open(&format!("tcp:{d}"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("discovery controller"), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
}

#[test]
fn several_queues_and_namespaces_at_once() {
    let s = server(3, "16M", 128 << 10);
    let spec = spec(&s, "queues=8,queue_size=16");
    let opened =
        kestrel::target_spec::open_with(&parse(&spec).unwrap(), &OpenOptions::default()).unwrap();
    let ts = opened.block_targets().unwrap();
    assert_eq!(
        ts.iter().map(|t| t.info().nsid).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    // Two queues per namespace, each its own connection, used from their own threads.
    std::thread::scope(|sc| {
        for (i, t) in ts.iter().enumerate() {
            for k in 0..2u64 {
                sc.spawn(move || {
                    let (mut q, buf) = queue_with_buffer(t, 16, 256 << 10);
                    assert_eq!(q.in_use().unwrap().depth, 16);
                    let data = pattern(64 << 10, (i as u64) << 8 | k);
                    write_read(q.as_mut(), &buf, t.info().nsid, 4096, k * 64, &data);
                });
            }
        }
    });
    // Queues beyond what the controller granted are refused with the reason.
    let t = &ts[0];
    let qs: Vec<_> = (0..8)
        .map(|_| t.create_queue(&Default::default()).unwrap())
        .collect();
    let e = t.create_queue(&Default::default()).err().unwrap();
    assert!(e.to_string().contains("all 8 i/o queues"), "{e}");
    drop(qs);
    assert!(
        t.create_queue(&Default::default()).is_ok(),
        "queue ids come back"
    );
}
