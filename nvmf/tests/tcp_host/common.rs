//! Servers on loopback for the host's tests, and the I/O helpers they share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::io::{Completion, IoRequest};
use kestrel::target::{QueueOptions, Target, TargetQueue};
use kestrel::DmaSlice;
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

pub const NQN: &str = "nqn.2026-12.io.kestrel:host-test";

/// A server on an ephemeral loopback port exporting one subsystem, `NQN`, with `ns`
/// emulated namespaces of `size` each (MDTS `max_io` bytes), and a discovery listener.
pub fn server(ns: usize, size: &str, max_io: u32) -> Server {
    let namespaces: Vec<Arc<dyn Target>> = (0..ns)
        .map(|_| {
            kestrel::target_spec::open(&format!("emu:size={size},core=none")).expect("emulator")
        })
        .collect();
    let limits = Limits {
        max_io_size: max_io,
        queue_buffer: (4 * max_io).max(2 << 20),
        ..Limits::default()
    };
    Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: Some("127.0.0.1:0".parse().unwrap()),
        reactors: vec![None; 2],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces,
            allowed_hosts: Vec::new(),
            allow_any_host: true,
        }],
        limits,
    })
    .expect("server starts")
}

/// The target string of the server's subsystem, with `opts` appended.
pub fn spec(s: &Server, opts: &str) -> String {
    let sep = if opts.is_empty() { "" } else { "," };
    format!("tcp:{}/{NQN}{sep}{opts}", s.local_addr())
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(0x9e37_79b9) ^ seed ^ (i as u64 >> 12)) as u8)
        .collect()
}

/// Polls until `n` completions arrived (10 s at most) and returns them.
pub fn reap(q: &mut dyn TargetQueue, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while got.len() < n {
        assert!(
            Instant::now() < end,
            "{} of {n} completions after 10 s",
            got.len()
        );
        q.poll(0, &mut |c| got.push(c));
    }
    got
}

/// A queue on `t` with a lent buffer of `len` bytes.
pub fn queue_with_buffer(
    t: &Arc<dyn Target>,
    depth: u32,
    len: usize,
) -> (Box<dyn TargetQueue>, DmaSlice) {
    let mut q = t
        .create_queue(&QueueOptions {
            depth,
            ..QueueOptions::default()
        })
        .expect("queue connects");
    let buf = t.dma_pool().alloc(len).unwrap();
    let s = q.lend(buf).unwrap();
    (q, s)
}

/// Writes `data` at `lba` and reads it back through `q` (buffer `s`, at least twice
/// `data.len()`), asserting both succeed and the bytes match.
pub fn write_read(
    q: &mut dyn TargetQueue,
    s: &DmaSlice,
    nsid: u32,
    bs: u32,
    lba: u64,
    data: &[u8],
) {
    let len = data.len();
    let nlb = (len / bs as usize) as u32;
    let (w, r) = (s.sub(0, len).unwrap(), s.sub(len, len).unwrap());
    q.write_lent(&w, 0, data).unwrap();
    q.submit(IoRequest::write(nsid, lba, nlb, w, 1)).unwrap();
    q.flush();
    let c = reap(q, 1);
    assert_eq!(c[0].result, Ok(()), "write of {len} bytes at lba {lba}");
    q.submit(IoRequest::read(nsid, lba, nlb, r, 2)).unwrap();
    q.flush();
    let c = reap(q, 1);
    assert_eq!(c[0].result, Ok(()), "read of {len} bytes at lba {lba}");
    let mut back = vec![0u8; len];
    q.read_lent(&r, 0, &mut back).unwrap();
    assert!(back == data, "{len} bytes at lba {lba} read back differ");
}

/// A relay on an ephemeral loopback port in front of `target`: for each connection the
/// host makes (`k` counts them from 0: the admin queue first), it connects to `target`
/// and hands both streams, host first, to `on_conn`, which moves the bytes.
pub fn relay(
    target: std::net::SocketAddr,
    mut on_conn: impl FnMut(usize, std::net::TcpStream, std::net::TcpStream) + Send + 'static,
) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for (k, host) in l.incoming().enumerate() {
            let (Ok(host), Ok(t)) = (host, std::net::TcpStream::connect(target)) else {
                return;
            };
            on_conn(k, host, t);
        }
    });
    at
}

/// Copies what the host sends to the target unchanged, on a thread of its own, until
/// either side closes.
pub fn pass_upstream(host: &std::net::TcpStream, target: &std::net::TcpStream) {
    let (mut h, mut t) = (host.try_clone().unwrap(), target.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut h, &mut t);
        let _ = t.shutdown(std::net::Shutdown::Both);
    });
}

/// Writes 4 KiB .. 128 KiB (in-capsule and R2T) at LBAs 64 apart through `q` (buffer
/// `buf`, at least 2 MiB), then reads them all back at once and compares; no connection
/// may have been reset on the way.
pub fn write_then_read_back_sizes(q: &mut dyn TargetQueue, buf: &DmaSlice) {
    let sizes: Vec<usize> = (0..8).map(|k| (4 << 10) << (k % 6)).collect();
    for (k, &len) in sizes.iter().enumerate() {
        let w = buf.sub(k * (128 << 10), len).unwrap();
        q.write_lent(&w, 0, &pattern(len, k as u64)).unwrap();
        let nlb = (len / 4096) as u32;
        q.submit(IoRequest::write(1, 64 * k as u64, nlb, w, k as u64))
            .unwrap();
    }
    q.flush();
    assert!(reap(q, sizes.len()).iter().all(|c| c.result.is_ok()));
    for (k, &len) in sizes.iter().enumerate() {
        let r = buf.sub((1 << 20) + k * (128 << 10), len).unwrap();
        let nlb = (len / 4096) as u32;
        q.submit(IoRequest::read(1, 64 * k as u64, nlb, r, k as u64))
            .unwrap();
    }
    q.flush();
    let done = reap(q, sizes.len());
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    for (k, &len) in sizes.iter().enumerate() {
        let mut back = vec![0u8; len];
        let r = buf.sub((1 << 20) + k * (128 << 10), len).unwrap();
        q.read_lent(&r, 0, &mut back).unwrap();
        assert!(
            back == pattern(len, k as u64),
            "read {k} of {len} bytes differs"
        );
    }
    assert_eq!(q.stats().resets, 0, "{:?}", q.stats());
}
