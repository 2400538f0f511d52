//! Reads and writes through `tcp:` targets.

use kestrel::io::{IoError, IoRequest};
use kestrel::target::QueueOptions;

use crate::common::*;

fn sizes_round_trip(opts: &str) {
    let s = server(1, "64M", 128 << 10);
    let t = kestrel::target_spec::open(&spec(&s, opts)).expect("tcp target opens");
    let info = t.info().clone();
    assert_eq!((info.nsid, info.block_size), (1, 4096));
    assert_eq!(info.num_blocks, (64 << 20) / 4096);
    assert_eq!(info.max_transfer_bytes, 128 << 10);
    let (mut q, buf) = queue_with_buffer(&t, 32, 2 << 20);
    // In-capsule (4 KiB, 8 KiB), R2T (12 KiB .. 128 KiB), split at MDTS (above).
    for (k, kib) in [4usize, 8, 12, 64, 128, 132, 512, 1024]
        .into_iter()
        .enumerate()
    {
        let data = pattern(kib << 10, k as u64 + 7);
        write_read(q.as_mut(), &buf, 1, 4096, 100 * k as u64, &data);
    }
    let st = q.stats();
    assert!(
        st.split >= 3,
        "1 MiB and 512 KiB and 132 KiB are split at MDTS: {st:?}"
    );
}

#[test]
fn reads_and_writes_from_4k_to_1m() {
    sizes_round_trip("");
}

#[test]
fn reads_and_writes_with_digests() {
    sizes_round_trip("digest=both");
    sizes_round_trip("digest=hdr");
    sizes_round_trip("digest=data");
}

#[test]
fn out_of_range_and_nvme_errors() {
    let s = server(1, "16M", 128 << 10);
    let t = kestrel::target_spec::open(&spec(&s, "")).unwrap();
    let (mut q, buf) = queue_with_buffer(&t, 8, 1 << 20);
    let n = t.info().num_blocks;
    let e = q.submit(IoRequest::read(1, n, 1, buf.sub(0, 4096).unwrap(), 9));
    assert!(e.is_err(), "past the end is refused before it is sent");
    // Flush, write zeroes, deallocate: the namespace's support as the target says.
    q.submit(IoRequest::flush(1, 3)).unwrap();
    q.flush();
    assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
    if t.info().write_zeroes {
        q.submit(IoRequest::write_zeroes(1, 0, 70_000.min(n as u32), 4))
            .unwrap();
        q.flush();
        assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
    }
    let _ = IoError::Timeout;
}

#[test]
fn a_tcp_target_served_again() {
    // Server A exports an emulated namespace; server B exports A's namespace through the
    // tcp: target kind; the host reaches it through B, and sees what it wrote through A.
    let a = server(1, "32M", 128 << 10);
    let through_a = kestrel::target_spec::open(&spec(&a, "digest=both")).unwrap();
    let b = kestrel_nvmf::Server::start(kestrel_nvmf::ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
        reactors: vec![None; 1],
        subsystems: vec![kestrel_nvmf::SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![through_a],
            allowed_hosts: Vec::new(),
            allow_any_host: true,
        }],
        limits: kestrel_nvmf::Limits::default(),
    })
    .expect("a tcp: target is exportable");
    let t = kestrel::target_spec::open(&spec(&b, "")).unwrap();
    let (mut q, buf) = queue_with_buffer(&t, 16, 1 << 20);
    for (k, kib) in [4usize, 64, 256].into_iter().enumerate() {
        write_read(
            q.as_mut(),
            &buf,
            1,
            4096,
            64 * k as u64,
            &pattern(kib << 10, k as u64),
        );
    }
    drop(q);
    let direct = kestrel::target_spec::open(&spec(&a, "")).unwrap();
    let (mut q, buf) = queue_with_buffer(&direct, 4, 8192);
    let r = buf.sub(0, 4096).unwrap();
    q.submit(IoRequest::read(1, 0, 1, r, 1)).unwrap();
    q.flush();
    assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
    let mut got = vec![0u8; 4096];
    q.read_lent(&r, 0, &mut got).unwrap();
    assert_eq!(got, pattern(4096, 0), "written through B, read through A");
}

#[test]
fn keep_alive_holds_an_idle_controller_and_drop_shuts_it_down() {
    let s = server(1, "16M", 128 << 10);
    let t = kestrel::target_spec::open(&spec(&s, "kato=2s")).unwrap();
    let (mut q, buf) = queue_with_buffer(&t, 8, 64 << 10);
    assert_eq!(s.controllers(NQN), 1);
    // Idle for more than twice KATO: only Keep Alive keeps the controller.
    std::thread::sleep(std::time::Duration::from_millis(5000));
    assert_eq!(s.controllers(NQN), 1, "the controller expired while idle");
    write_read(q.as_mut(), &buf, 1, 4096, 0, &pattern(8192, 1));
    assert_eq!(
        q.stats().resets,
        0,
        "the queue had to reconnect: {:?}",
        q.stats()
    );
    // The last handle gone: shutdown, then the connections close.
    drop(q);
    drop(t);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while s.controllers(NQN) != 0 || s.connections() != 0 {
        assert!(
            std::time::Instant::now() < end,
            "{} controllers, {} connections left",
            s.controllers(NQN),
            s.connections()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A queue dropped and another made at once, 200 times: the new queue takes the queue ID
/// the old one gave back. The closing queue waits for its Disconnect's answer, and the
/// server deletes the queue on Disconnect, so the ID is free before the new Connect is
/// sent: no Connect is refused for a busy queue ID (the refusal the host would retry, seen
/// once in CI when the C example set a context up twice).
#[test]
fn a_queue_id_given_back_is_taken_again_at_once() {
    let s = server(1, "16M", 128 << 10);
    let spec = kestrel::target_spec::parse(&spec(&s, "queues=1")).unwrap();
    let opened = kestrel::target_spec::open_with(&spec, &Default::default()).unwrap();
    let kestrel::target_spec::Opened::Tcp { ctrlr, .. } = &opened else {
        panic!("a tcp target opens as one");
    };
    let t = opened.first_target().unwrap();
    for i in 0..200 {
        let q = t.create_queue(&QueueOptions {
            depth: 8,
            ..QueueOptions::default()
        });
        assert!(q.is_ok(), "queue {i}: {:?}", q.err().map(|e| e.to_string()));
    }
    assert_eq!(
        ctrlr.qid_refusals(),
        0,
        "connects refused for a busy queue id"
    );
}
