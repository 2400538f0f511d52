//! No allocation per I/O on the host's polling thread: after a warm-up, thousands of
//! reads, in-capsule writes and R2T writes (digests on, some split at MDTS) allocate
//! nothing on the thread that submits and polls.

use kestrel::io::IoRequest;

use crate::common::*;
use crate::counting_alloc::Counter;

fn run(q: &mut dyn kestrel::target::TargetQueue, buf: &kestrel::DmaSlice, rounds: u64) {
    let mut done = 0u64;
    let mut sent = 0u64;
    while done < rounds * 4 {
        while sent < rounds * 4 && q.outstanding() < 16 {
            let k = sent % 4;
            let (len, lba) = [(4096, 0), (4096, 8), (65536, 64), (256 << 10, 256)][k as usize];
            let s = buf.sub(k as usize * (256 << 10), len).unwrap();
            let nlb = (len / 4096) as u32;
            let r = if k == 0 {
                IoRequest::read(1, lba + sent % 8, nlb, s, sent)
            } else {
                IoRequest::write(1, lba, nlb, s, sent)
            };
            q.submit(r).unwrap();
            sent += 1;
        }
        q.flush();
        q.poll(0, &mut |c| {
            assert_eq!(c.result, Ok(()));
            done += 1;
        });
    }
}

#[test]
fn no_allocation_per_io_on_the_polling_thread() {
    let s = server(1, "64M", 128 << 10);
    let t = kestrel::target_spec::open(&spec(&s, "digest=both")).unwrap();
    let (mut q, buf) = queue_with_buffer(&t, 32, 1 << 20);
    run(q.as_mut(), &buf, 200);
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    run(q.as_mut(), &buf, 500);
    let allocs = counter.disarm();
    crate::counting_alloc::unwatch_this_thread();
    assert_eq!(
        allocs, 0,
        "allocations on the polling thread over 2000 I/Os"
    );
}
