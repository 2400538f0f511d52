//! A `null` namespace with `fill=none` (reads leave the buffer as it is, as SPDK's Null
//! bdev): a host never reads another host's data. Each I/O queue has buffers of its own,
//! zero-filled when allocated, so what another connection wrote, in capsule or through R2T,
//! live or after it closed, never reaches this one's reads.

use crate::common::{config, io_queue, pattern, rw};
use crate::host::Host;
use kestrel_nvmf::{Limits, Server};

/// Writes a pattern at LBA 0.. through `io`: 4 KiB blocks in capsule and 128 KiB
/// through R2T, as many as the queue's buffers hold, so every block of its arena has
/// held this host's data.
fn write_everywhere(io: &mut Host, seed: u8) {
    for i in 0..8u64 {
        let (c, _) = io.cmd(rw(0x01, i, 1), &pattern(4096, seed), true, 0);
        assert!(c.status.is_success(), "{:?}", c.status);
    }
    for i in 0..16u64 {
        let (c, _) = io.cmd(
            rw(0x01, 64 + 32 * i, 32),
            &pattern(128 << 10, seed),
            false,
            0,
        );
        assert!(c.status.is_success(), "{:?}", c.status);
    }
}

/// Reads 4 KiB and 128 KiB at the written LBAs through `io`: all zeroes.
fn reads_zeroes(io: &mut Host, who: &str) {
    for (slba, nlb) in [(0u64, 1u32), (7, 1), (64, 32), (64 + 32 * 15, 32)] {
        let (c, d) = io.cmd(rw(0x02, slba, nlb), &[], false, nlb * 4096);
        assert!(c.status.is_success(), "{:?}", c.status);
        assert!(
            d.iter().all(|&b| b == 0),
            "{who}: a read of lba {slba}+{nlb} returned another host's data"
        );
    }
}

#[test]
fn fill_none_never_hands_a_host_another_hosts_data() {
    let target = kestrel::target_spec::open("null:size=16M,fill=none").expect("null target");
    assert!(!target.info().deallocate_reads_zeroes);
    let srv = Server::start(config(vec![target], 1, Vec::new(), true, Limits::default()))
        .expect("server starts");
    // Two hosts at once on the one reactor: A writes everywhere, B reads.
    let (_a_admin, mut a) = io_queue(srv.local_addr());
    let (_b_admin, mut b) = io_queue(srv.local_addr());
    write_everywhere(&mut a, 0xa5);
    // The mode does leave buffers as they are: A's own read gets back what A's last
    // write left in its arena (else B's zeroes below would prove nothing).
    let (st, d) = a.cmd(rw(0x02, 0, 32), &[], false, 128 << 10);
    assert!(st.status.is_success());
    assert!(
        d == pattern(128 << 10, 0xa5),
        "fill=none changed the writer's own buffer"
    );
    reads_zeroes(&mut b, "a second live host");
    // A goes; its buffers go back to the pool, and the next host's come from it.
    drop(a);
    drop(_a_admin);
    let (_c_admin, mut c) = io_queue(srv.local_addr());
    reads_zeroes(&mut c, "a host after the writer closed");
    srv.shutdown();
}
