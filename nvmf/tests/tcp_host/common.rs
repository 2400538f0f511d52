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
