//! Random-read benchmark of the file target: one queue on one thread, the queue depth kept
//! full, random block-aligned offsets from an xorshift generator. Reports IOPS and the CPU
//! time per I/O (user + system, from getrusage, all threads of the process).
//!
//! ```text
//! cargo run --release -p kestrel --example file_bench -- PATH [--qd 32] [--bs 4096]
//!     [--secs 20] [--idle spin|wait] [--batch N] [--sqpoll] [--buffered] [--cpu N]
//! ```
//! `--batch N` makes one `io_uring_enter` per N resubmissions instead of one per reaped
//! batch (fewer requests per enter: more syscalls, the device sees requests sooner).
//! `--idle spin` polls the completion ring without sleeping (the polled-mode default);
//! `--idle wait` sleeps in `io_uring_enter` when a poll finds nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::target::file::{Direct, FileOptions, FileQueue, FileTarget};
use kestrel::{DmaSlice, IoRequest, QueueOptions, QueueStats, Target, TargetQueue};

struct Args {
    path: String,
    qd: u32,
    bs: usize,
    secs: u64,
    wait: bool,
    sqpoll: bool,
    buffered: bool,
    cpu: Option<usize>,
    batch: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: file_bench PATH [--qd N] [--bs BYTES] [--secs S] [--idle spin|wait] [--batch N] [--sqpoll] [--buffered] [--cpu N]"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        path: String::new(),
        qd: 32,
        bs: 4096,
        secs: 20,
        wait: false,
        sqpoll: false,
        buffered: false,
        cpu: None,
        batch: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match x.as_str() {
            "--qd" => a.qd = val().parse().unwrap_or_else(|_| usage()),
            "--bs" => a.bs = val().parse().unwrap_or_else(|_| usage()),
            "--secs" => a.secs = val().parse().unwrap_or_else(|_| usage()),
            "--idle" => {
                a.wait = match val().as_str() {
                    "spin" => false,
                    "wait" => true,
                    _ => usage(),
                }
            }
            "--batch" => a.batch = val().parse().unwrap_or_else(|_| usage()),
            "--sqpoll" => a.sqpoll = true,
            "--buffered" => a.buffered = true,
            "--cpu" => a.cpu = Some(val().parse().unwrap_or_else(|_| usage())),
            "-h" | "--help" => usage(),
            p if !p.starts_with('-') && a.path.is_empty() => a.path = p.to_string(),
            _ => usage(),
        }
    }
    if a.path.is_empty() || a.qd == 0 || a.bs == 0 {
        usage()
    }
    a
}

fn cpu_time() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// xorshift64*: fast, good enough for offsets.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Prints the error and exits with status 1.
fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("{e}");
    std::process::exit(1)
}

/// Pins this thread to `--cpu`, when given (a warning if that fails).
fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
            eprintln!("warning: could not pin to cpu {cpu}");
        }
    }
}

/// Opens the file (direct I/O unless `--buffered`) and checks `--bs` against its block
/// size: the target, the blocks per I/O and the number of I/O-sized slots in the file.
fn open(a: &Args) -> (Arc<FileTarget>, u32, u64) {
    let t = FileTarget::open(
        &a.path,
        &FileOptions {
            direct: if a.buffered {
                Direct::Off
            } else {
                Direct::Required
            },
            sqpoll: a.sqpoll,
            ..FileOptions::default()
        },
    )
    .unwrap_or_else(|e| fail(e));
    let info = t.info().clone();
    let bs = info.block_size as usize;
    if a.bs % bs != 0 {
        eprintln!("--bs {} is not a multiple of the block size {bs}", a.bs);
        std::process::exit(1);
    }
    let nlb = (a.bs / bs) as u32;
    let slots = info.num_blocks / u64::from(nlb);
    (t, nlb, slots)
}

/// What the measured loop saw.
struct Measured {
    ios: u64,
    errors: u64,
    wall: Duration,
    cpu: Duration,
    stats: QueueStats,
}

/// Fills the queue with random reads, one per buffer, then keeps it full for `--secs`:
/// each completion is replaced by a read of a new random slot into the same buffer.
fn measure(a: &Args, q: &mut FileQueue, bufs: &[DmaSlice], nlb: u32, slots: u64) -> Measured {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let next_req = |i: usize, rng: &mut Rng| {
        let lba = (rng.next() % slots) * u64::from(nlb);
        IoRequest::read(1, lba, nlb, bufs[i], i as u64)
    };
    for i in 0..a.qd as usize {
        q.submit(next_req(i, &mut rng)).unwrap();
    }
    q.flush();
    let mut done_tokens = Vec::with_capacity(a.qd as usize);
    let mut ios: u64 = 0;
    let mut errors: u64 = 0;
    let start = Instant::now();
    let cpu0 = cpu_time();
    let end = start + Duration::from_secs(a.secs);
    let mut iter: u32 = 0;
    loop {
        let n = q.poll(a.qd, &mut |c| {
            if c.result.is_err() {
                errors += 1;
            }
            done_tokens.push(c.token as usize);
        });
        ios += u64::from(n);
        for (k, &i) in done_tokens.iter().enumerate() {
            q.submit(next_req(i, &mut rng)).unwrap();
            if a.batch > 0 && (k + 1) % a.batch == 0 && k + 1 < done_tokens.len() {
                q.flush();
            }
        }
        done_tokens.clear();
        if a.wait {
            // Submit and sleep for a completion in one io_uring_enter.
            q.wait(1);
        } else {
            q.flush();
        }
        iter = iter.wrapping_add(1);
        if iter % 256 == 0 && Instant::now() >= end {
            break;
        }
    }
    let wall = start.elapsed();
    let cpu = cpu_time() - cpu0;
    Measured {
        ios,
        errors,
        wall,
        cpu,
        stats: q.stats(),
    }
}

/// Prints the run's settings and figures.
fn report(a: &Args, t: &FileTarget, q: &FileQueue, m: &Measured) {
    let Measured {
        ios,
        errors,
        wall,
        cpu,
        stats: st,
    } = m;
    let iops = *ios as f64 / wall.as_secs_f64();
    println!(
        "file_bench: {} qd={} bs={} direct={} idle={} batch={} sqpoll={}",
        a.path,
        a.qd,
        a.bs,
        t.is_direct(),
        if a.wait { "wait" } else { "spin" },
        a.batch,
        a.sqpoll
    );
    println!(
        "  {ios} i/os in {:.2} s: {:.0} IOPS, {:.1} MiB/s, errors {errors}",
        wall.as_secs_f64(),
        iops,
        iops * a.bs as f64 / (1 << 20) as f64
    );
    println!(
        "  cpu {:.2} s ({:.0}% of one core), {:.2} us cpu per i/o; {} io_uring_enter ({:.2} per i/o), {} idle polls of {}",
        cpu.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / *ios as f64,
        st.sq_doorbell_writes,
        st.sq_doorbell_writes as f64 / *ios as f64,
        st.idle_polls,
        st.polls
    );
    let c = q.counters();
    println!(
        "  fixed-buffer ops {}, plain {}, vectored {}",
        c.fixed_rw, c.plain_rw, c.vectored_rw
    );
}

fn main() {
    let a = parse();
    pin(a.cpu);
    let (t, nlb, slots) = open(&a);
    let mut q = t
        .create_file_queue(&QueueOptions {
            depth: a.qd,
            sw_queue_depth: 0,
            ..QueueOptions::default()
        })
        .unwrap_or_else(|e| fail(e));
    let pool = t.dma_pool().clone();
    let bufs: Vec<_> = (0..a.qd)
        .map(|_| q.lend(pool.alloc(a.bs).unwrap()).unwrap())
        .collect();
    let m = measure(&a, &mut q, &bufs, nlb, slots);
    // Drain.
    while q.outstanding() > 0 {
        q.poll(a.qd, &mut |_| {});
    }
    report(&a, &t, &q, &m);
}
