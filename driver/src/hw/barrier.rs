//! Ordering between the CPU and a device: the barriers, named as Linux names them, and the
//! single-copy 32-bit accesses they order. Every access the driver makes to a register, a
//! doorbell, or a word of DMA memory that the device writes while the driver reads it (a
//! completion's dword 3, a shadow doorbell, an EventIdx) goes through [`read_once`] (or
//! [`read_once_at`]) or [`write_once`]; every order between such accesses and the rest of DMA memory is one of
//! [`dma_wmb`], [`dma_rmb`] or [`dma_mb`], with a comment at the call saying which
//! accesses it orders and why.
//!
//! # The primitives
//!
//! | here | orders | x86-64 | aarch64 (Linux) |
//! |---|---|---|---|
//! | [`dma_wmb`] | earlier loads and stores before later stores (to memory or a register) | no instruction | `dmb oshst` orders stores only; with the loads, `dmb osh` |
//! | [`dma_rmb`] | earlier loads (of memory or a register) before later loads and stores | no instruction | `dmb oshld` |
//! | [`dma_mb`] | earlier stores before later loads (and everything else) | `lock or [rsp-n], 0` | `dmb osh` |
//! | [`read_once`], [`read_once_at`] | one 32-bit load, never elided, split or merged | `mov r32, [m]` | `ldr w, [x]` |
//! | [`write_once`] | one 32-bit store, never elided, split or merged | `mov [m], r32` | `str w, [x]` |
//!
//! A register access is ordered against DMA memory as Linux's `writel`/`readl` order it:
//! [`crate::hw::mmio::Bar`] puts [`dma_wmb`] before every register or doorbell write and
//! [`dma_rmb`] after every register read (Linux's `__io_bw()`/`__io_ar()`, which are
//! `dma_wmb()`/`dma_rmb()` on arm64 and compiler barriers on x86-64). Register accesses
//! among themselves stay in program order without a barrier: the compiler does not reorder
//! two [`read_once`]/[`write_once`] (each is an `asm!` block with side effects), and the
//! memory type of a BAR mapping (uncached on x86-64, Device-nGnRE on aarch64) keeps the
//! CPU's accesses to one device in order. Linux's mandatory barriers (`wmb()` = `sfence` /
//! `dsb st`, `rmb()` = `lfence` / `dsb ld`, `mb()` = `mfence` / `dsb sy`) are not here:
//! on x86-64 they order write-combining mappings and non-temporal stores, and on aarch64
//! `dsb` also waits for accesses to complete before non-memory effects; the driver needs
//! neither.
//!
//! # Why x86-64 needs no instruction but a store-load fence
//! x86-64 is TSO: the CPU makes its stores visible in program order, never before an
//! earlier load, and never satisfies a load before an earlier load; a DMA write to
//! write-back memory is snooped like another CPU's store, and an uncached MMIO store is not
//! passed by later stores nor passes earlier ones. The one reordering the CPU does is a load
//! completing before an earlier store is visible (the store buffer), which only a
//! `lock`-prefixed instruction or `mfence` prevents: [`dma_mb`] is the first (a locked `or`
//! of 0 to the stack; Linux's `smp_mb()` is a locked `add` the same way; `mfence` would
//! also order non-temporal stores, which the driver does not make). So [`dma_wmb`] and
//! [`dma_rmb`] only keep the compiler from moving accesses across them.
//!
//! # The memory model, and the emulator
//! With the emulated controller the "device" is another thread of this process, and the
//! BAR and every ring are ordinary memory both threads use, so each access must be sound in
//! Rust's memory model as well as right on the bus:
//! - The barriers are `std::sync::atomic::fence`s: [`dma_wmb`] is `fence(Release)`,
//!   [`dma_rmb`] `fence(Acquire)`, [`dma_mb`] `fence(SeqCst)`. On x86-64 the first two
//!   compile to no instruction and the third to a locked `or` (the table above), and
//!   in the model they make the driver's writes of an SQE happen before the emulator's
//!   reads of it once the emulator has seen the doorbell, and the emulator's writes of a
//!   completion happen before the driver's reads once the driver has seen its phase tag.
//!   That is also why [`dma_wmb`] orders earlier loads: a release fence does, and the
//!   driver relies on it for the CQ head doorbell (its reads of the entries come before the
//!   controller may overwrite them); on aarch64 that needs `dmb osh` rather than Linux's
//!   `dmb oshst`.
//! - A fence synchronizes only through atomic accesses, and `ptr::read_volatile`/
//!   `write_volatile` are not atomic: a volatile doorbell store racing the emulator's load
//!   of it is a data race, undefined behaviour, and carries no ordering. `AtomicU32` would be
//!   sound but is reached through a reference (`AtomicU32::from_ptr` returns
//!   `&AtomicU32`), and a reference into a BAR lets the compiler read it when the program
//!   does not (a reference is dereferenceable), which on a register with read side effects
//!   is a wrong access on the bus. So [`read_once`] and [`write_once`] are one `mov` in an
//!   `asm!` block on a raw pointer: no reference is made, the compiler neither invents,
//!   elides, merges nor splits it (an `asm!` block without `pure` runs exactly as often as
//!   the program says), and, because an `asm!` block may do only what Rust code could do to
//!   the same memory (the reference's rule: what an FFI call may do), the `mov` is what
//!   Rust's relaxed atomic load or store of a `u32` compiles to on x86-64, and that is what
//!   it is in the model. The emulator's side of the same words uses `AtomicU32` (on its
//!   own register page through these same functions, on host memory through
//!   `emu::mem::GuestSlice`), so both sides are atomic and no access races.
//!
//! The other accesses to DMA memory need no atomicity: an SQE is written (volatile, in
//! `nvme::ring`) while the controller is not reading its slot and published by
//! [`dma_wmb`] and the tail doorbell; a CQE's dwords 0-2 are read after its dword 3 said it
//! is new and [`dma_rmb`], and the controller does not rewrite the slot before the head
//! doorbell moves past it. PRP lists and data buffers follow the same two orders.
//!
//! # Other architectures
//! Everything here is written for x86-64 only. On any other `target_arch`, `lib.rs` stops
//! the build with a `compile_error!` naming these primitives, rather than building a
//! driver that assumes x86's ordering. A port writes each for the new architecture (the
//! table gives aarch64's instructions: Linux's `arch/arm64/include/asm/barrier.h` and
//! `io.h`) and lifts the `compile_error!` for it.
//!
//! # `unsafe`
//! The accessors' `asm!` blocks: the caller vouches for the memory (their `# Safety`).

use std::sync::atomic::{fence, Ordering};

/// Orders this thread's earlier loads and stores before its later stores, as the device
/// (or the emulator thread) observes them: the barrier before a store that publishes
/// memory to the device.
///
/// Used before every doorbell write (SQEs, PRP lists and data written before the SQ tail;
/// CQEs read before the CQ head), before a shadow doorbell store, before every register
/// write (the admin queues set up before CC.EN) and, on the emulator's side, before the
/// store of a completion's dword 3.
///
/// x86-64: no instruction, a compiler barrier (TSO makes stores visible in order and never
/// before an earlier load). aarch64: `dmb oshst` (Linux's `dma_wmb()`, and the barrier in
/// its `writel()`) for stores; `dmb osh` where earlier loads must be ordered too (module
/// doc). In Rust's model: `fence(Release)`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn dma_wmb() {
    fence(Ordering::Release);
}

/// Orders this thread's earlier loads (of DMA memory or a register) before its later loads
/// and stores: the barrier after a load that says other memory is ready to read.
///
/// Used after a completion's phase tag says the entry is new and before its other dwords
/// (and the data the command moved) are read, after every register read (as Linux's
/// `readl()`), and, on the emulator's side, after reading a doorbell and before reading the
/// entries it covers.
///
/// x86-64: no instruction, a compiler barrier (TSO does not satisfy a load before an
/// earlier load). aarch64: `dmb oshld` (Linux's `dma_rmb()`). In Rust's model:
/// `fence(Acquire)`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn dma_rmb() {
    fence(Ordering::Acquire);
}

/// Orders this thread's earlier stores before its later loads (and every other pair): the
/// barrier between publishing a value and reading the other side's answer, where each side
/// must see the other's store or have its own seen (a store-load order, which
/// [`dma_wmb`] and [`dma_rmb`] do not give).
///
/// Used between a shadow doorbell store and the load of EventIdx (Linux's `mb()` in
/// `nvme_dbbuf_update_and_check_event`), and on the emulator's side between arming
/// EventIdx and its next look at the shadow doorbells.
///
/// x86-64: `lock or dword ptr [rsp-n], 0`, what LLVM makes of `fence(SeqCst)` for the
/// default x86-64 CPU (tuned for some CPUs it is `mfence`; either drains the store buffer
/// before later loads, which is the order wanted on write-back memory such as the shadow
/// pages, snooped by the device's DMA). aarch64: `dmb osh` (Linux's `dma_mb()`; its NVMe
/// driver uses the stronger `mb()`, `dsb sy`). In Rust's model: `fence(SeqCst)`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn dma_mb() {
    fence(Ordering::SeqCst);
}

/// Loads the `u32` at `p` with one 32-bit load: a register, a doorbell, or a word of DMA
/// memory the device writes while the driver reads it. Never elided, merged with another
/// load or split; orders nothing by itself (put [`dma_rmb`] after it for that). The value
/// is as the memory holds it (NVMe is little-endian, as x86-64 is).
///
/// x86-64: `mov r32, dword ptr [p]`. aarch64: `ldr w, [x]` (Linux's `__raw_readl`, an
/// `asm` block there too). In Rust's model: a relaxed atomic load.
///
/// # Safety
/// `p` is 4-byte aligned and points to 4 bytes that stay mapped and readable for the call:
/// device memory (a BAR) outside every Rust allocation, or memory that no thread accesses
/// non-atomically at the same time (it may be written concurrently by a device, by
/// [`write_once`] or by an atomic store).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn read_once(p: *const u32) -> u32 {
    // SAFETY: `p` is as `read_once_at` requires of `base + 0` (the caller's contract is
    // the same).
    unsafe { read_once_at::<0>(p.cast()) }
}

/// [`read_once`] of the `u32` `OFF` bytes past `base`, the offset in the instruction
/// (`mov r32, dword ptr [base + OFF]`): a field of an entry read without computing its
/// address first, so the hot path's read of a completion's dword 3 costs what a plain
/// load with a displacement did (`nvme::ring`).
///
/// # Safety
/// `base + OFF` is what [`read_once`] requires of its `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn read_once_at<const OFF: usize>(base: *const u8) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees `base + OFF` is aligned and mapped for 4 bytes and not
    // accessed non-atomically meanwhile; the block reads those 4 bytes and nothing else
    // (readonly), uses no stack and leaves the flags alone.
    unsafe {
        std::arch::asm!(
            "mov {v:e}, dword ptr [{b} + {off}]",
            b = in(reg) base,
            off = const OFF,
            v = lateout(reg) v,
            options(nostack, preserves_flags, readonly),
        );
    }
    v
}

/// Stores `v` to the `u32` at `p` with one 32-bit store: a register, a doorbell, or a word
/// of DMA memory the device reads while the driver writes it. Never elided, merged with
/// another store or split; orders nothing by itself (put [`dma_wmb`] before it for that).
///
/// x86-64: `mov dword ptr [p], r32`. aarch64: `str w, [x]` (Linux's `__raw_writel`). In
/// Rust's model: a relaxed atomic store.
///
/// # Safety
/// `p` is 4-byte aligned and points to 4 bytes that stay mapped and writable for the call:
/// device memory (a BAR) outside every Rust allocation, or memory that no thread accesses
/// non-atomically at the same time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn write_once(p: *mut u32, v: u32) {
    // SAFETY: the caller guarantees `p` is aligned and mapped for 4 bytes and not accessed
    // non-atomically meanwhile; the block writes those 4 bytes and nothing else, uses no
    // stack and leaves the flags alone.
    unsafe {
        std::arch::asm!(
            "mov dword ptr [{p}], {v:e}",
            p = in(reg) p,
            v = in(reg) v,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Waits for `f`, spinning a little and then yielding (the machine may have fewer free
    /// cores than threads); gives up when `stop` is set.
    fn spin_until(stop: &AtomicBool, mut f: impl FnMut() -> bool) -> bool {
        let mut spins = 0u32;
        while !f() {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        true
    }

    /// Memory two threads share through raw pointers only (as the driver and a device
    /// share a ring), freed when dropped.
    struct Shared {
        ptr: *mut u64,
        len: usize,
    }
    // SAFETY: the memory is a leaked boxed slice owned by this value; the tests reach it
    // only through `read_once`/`write_once` or accesses ordered by the barriers.
    unsafe impl Send for Shared {}
    // SAFETY: as above.
    unsafe impl Sync for Shared {}
    impl Shared {
        fn new(len: usize) -> Arc<Shared> {
            let b = vec![0u64; len].into_boxed_slice();
            Arc::new(Shared {
                ptr: Box::into_raw(b).cast(),
                len,
            })
        }
        fn word(&self, i: usize) -> *mut u64 {
            assert!(i < self.len);
            // SAFETY: i < len: inside the allocation.
            unsafe { self.ptr.add(i) }
        }
        fn dword(&self, i: usize) -> *mut u32 {
            self.word(i).cast()
        }
    }
    impl Drop for Shared {
        fn drop(&mut self) {
            let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
            // SAFETY: made by Box::into_raw in `new`; both threads have finished.
            drop(unsafe { Box::from_raw(slice) });
        }
    }

    #[test]
    fn accesses_touch_exactly_their_word() {
        let mut w = [0xAAAA_AAAAu32; 3];
        let p = w.as_mut_ptr();
        // SAFETY: p + 1 and p + 2 are aligned u32s of the local array; nothing else
        // accesses it.
        let (back, third) = unsafe {
            write_once(p.add(1), 0x1234_5678);
            (read_once(p.add(1)), read_once_at::<8>(p.cast()))
        };
        assert_eq!((back, third), (0x1234_5678, 0xAAAA_AAAA));
        assert_eq!(w, [0xAAAA_AAAA, 0x1234_5678, 0xAAAA_AAAA]);
    }

    /// The ring protocol with a thread as the device: the host writes a 64-byte entry with
    /// volatile stores, `dma_wmb`, publishes its number (the tail doorbell); the device
    /// reads the number, `dma_rmb`, reads the entry (every word must carry that number),
    /// `dma_wmb`, publishes what it consumed (the head doorbell); the host reads that,
    /// `dma_rmb`, and only then reuses the entry. A torn or stale entry fails the test.
    #[test]
    fn a_published_entry_is_read_whole_and_reused_only_after_release() {
        const ENTRY: usize = 8;
        let mem = Shared::new(ENTRY + 2);
        let (tail, head) = (mem.dword(ENTRY), mem.dword(ENTRY + 1));
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = Instant::now() + Duration::from_secs(2);
        let device = {
            let (mem, stop) = (Arc::clone(&mem), Arc::clone(&stop));
            std::thread::spawn(move || {
                let (tail, head) = (mem.dword(ENTRY), mem.dword(ENTRY + 1));
                let mut seen = 0u32;
                let mut bad = 0u32;
                loop {
                    let mut t = 0;
                    if !spin_until(&stop, || {
                        // SAFETY: an aligned word of `mem`, written by the host with
                        // write_once.
                        t = unsafe { read_once(tail) };
                        t != seen
                    }) {
                        return (seen, bad);
                    }
                    // dma_rmb: the entry is read after the tail that published it.
                    dma_rmb();
                    for i in 0..ENTRY {
                        // SAFETY: inside `mem`; the host wrote it before the tail (dma_wmb)
                        // and does not write it again before our head store below.
                        let v = unsafe { mem.word(i).read_volatile() };
                        bad += u32::from(v != u64::from(t) * 0x1_0000_0001);
                    }
                    seen = t;
                    // dma_wmb: our reads of the entry are done before the host may see
                    // the head and overwrite it.
                    dma_wmb();
                    // SAFETY: an aligned word of `mem`; the host reads it with read_once.
                    unsafe { write_once(head, seen) };
                }
            })
        };
        let mut n = 0u32;
        while Instant::now() < deadline && n < 200_000 {
            n += 1;
            for i in 0..ENTRY {
                // SAFETY: inside `mem`; the device read the previous entry before its head
                // store, which we read (and ordered with dma_rmb) before this write.
                unsafe { mem.word(i).write_volatile(u64::from(n) * 0x1_0000_0001) };
            }
            // dma_wmb: the entry is visible before the tail that publishes it.
            dma_wmb();
            // SAFETY: aligned words of `mem`, the other side's accesses being single ones.
            unsafe { write_once(tail, n) };
            assert!(
                // SAFETY: as above.
                spin_until(&stop, || unsafe { read_once(head) } == n),
                "the device stopped answering"
            );
            // dma_rmb: the next round's writes of the entry come after the head that
            // released it.
            dma_rmb();
        }
        stop.store(true, Ordering::Relaxed);
        let (seen, bad) = device.join().expect("device thread");
        assert_eq!(seen, n);
        assert_eq!(bad, 0, "{bad} torn or stale entries in {n}");
    }

    /// Store buffering: each thread stores its flag, `dma_mb`, loads the other's. x86-64
    /// lets a load complete before an earlier store is visible, so without the barrier
    /// both threads can read 0 (the shadow doorbell and EventIdx would both be missed);
    /// with it at least one sees the other's store, in every round.
    #[test]
    fn dma_mb_orders_a_store_before_a_later_load() {
        const ROUNDS: usize = 50_000;
        let mem = Shared::new(ROUNDS * 2);
        let progress = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = Instant::now() + Duration::from_secs(2);
        let side = |me: usize| {
            let (mem, progress, stop) =
                (Arc::clone(&mem), Arc::clone(&progress), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut saw = Vec::with_capacity(ROUNDS);
                for i in 0..ROUNDS {
                    // Both sides enter round i together, as far as the machine allows.
                    let other = &progress[1 - me];
                    if Instant::now() > deadline
                        || !spin_until(&stop, || other.load(Ordering::Relaxed) >= i)
                    {
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    let (mine, theirs) = (mem.dword(2 * i + me), mem.dword(2 * i + 1 - me));
                    // SAFETY: aligned dwords of `mem`, accessed only with read_once/write_once.
                    let v = unsafe {
                        write_once(mine, 1);
                        // dma_mb: the store is visible before the load (what is tested).
                        dma_mb();
                        read_once(theirs)
                    };
                    saw.push(v);
                    progress[me].store(i + 1, Ordering::Relaxed);
                }
                saw
            })
        };
        let (a, b) = (side(0), side(1));
        let (a, b) = (a.join().expect("side 0"), b.join().expect("side 1"));
        let rounds = a.len().min(b.len());
        let both_missed = (0..rounds).filter(|&i| a[i] == 0 && b[i] == 0).count();
        assert!(rounds > 0);
        assert_eq!(
            both_missed, 0,
            "both stores missed in {both_missed} of {rounds} rounds"
        );
    }

    // The rules of the module doc, checked on the source: what architecture.md says of
    // references, barriers and other architectures stays true of the code.

    /// `driver/src/<rel>` without its `#[cfg(test)] mod` (at the end of a file).
    fn source(rel: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join(rel);
        let s = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        match s.find("\n#[cfg(test)]\nmod ") {
            Some(i) => s[..i].to_string(),
            None => s,
        }
    }

    /// The `.rs` files under `driver/src/<dir>`, relative to `driver/src`, test files and
    /// folders left out.
    fn sources_under(dir: &str) -> Vec<String> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut out = Vec::new();
        let mut todo = vec![root.join(dir)];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).expect("source folder") {
                let p = e.expect("entry").path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if p.is_dir() && name != "tests" {
                    todo.push(p);
                } else if name.ends_with(".rs") && name != "tests.rs" {
                    let rel = p.strip_prefix(&root).expect("under src");
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        out.sort();
        out
    }

    fn is_comment(line: &str) -> bool {
        line.trim_start().starts_with("//")
    }

    #[test]
    fn the_driver_reaches_device_memory_through_no_reference() {
        // Registers and doorbells (mmio), the rings, shadow doorbells and EventIdx (ring),
        // PRP lists (prp): no reference, atomic or not, into memory the device uses.
        let refs = [
            "from_ptr",
            "AtomicU32",
            ".as_ref()",
            ".as_mut()",
            "&*",
            "&mut *",
            "from_raw_parts",
        ];
        let mut found = Vec::new();
        for rel in ["hw/mmio.rs", "nvme/ring.rs", "nvme/prp.rs"] {
            for (n, line) in source(rel).lines().enumerate() {
                if is_comment(line) {
                    continue;
                }
                for r in refs.iter().filter(|r| line.contains(*r)) {
                    found.push(format!(
                        "driver/src/{rel}:{}: `{r}` in `{}`",
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
        assert!(
            found.is_empty(),
            "device memory reached through a reference (use hw::barrier::read_once/write_once \
             or a volatile access on a raw pointer):\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn every_barrier_is_named_and_says_what_it_orders() {
        let names = ["dma_wmb()", "dma_rmb()", "dma_mb()"];
        let mut found = Vec::new();
        let mut calls = 0;
        let files = ["hw", "nvme", "emu"].into_iter().flat_map(sources_under);
        for rel in files.filter(|f| f != "hw/barrier.rs") {
            let src = source(&rel);
            let lines: Vec<&str> = src.lines().collect();
            for (n, line) in lines.iter().enumerate() {
                if is_comment(line) {
                    continue;
                }
                if line.contains("fence(") {
                    found.push(format!(
                        "driver/src/{rel}:{}: a bare fence; use the hw::barrier primitive that \
                         names the order",
                        n + 1
                    ));
                }
                for name in names.iter().filter(|b| line.contains(*b)) {
                    calls += 1;
                    let comment: Vec<&str> = lines[..n]
                        .iter()
                        .rev()
                        .take_while(|l| is_comment(l))
                        .copied()
                        .collect();
                    let bare = name.trim_end_matches("()");
                    if !comment.iter().any(|l| l.contains(bare)) {
                        found.push(format!(
                            "driver/src/{rel}:{}: `{bare}` without a comment above it that \
                             names it and says which accesses it orders and why",
                            n + 1
                        ));
                    }
                }
            }
        }
        assert!(found.is_empty(), "{}", found.join("\n"));
        // The calls this test looks at exist (a renamed primitive would pass vacuously).
        assert!(calls >= 10, "only {calls} barrier calls found");
    }

    #[test]
    fn other_architectures_stop_the_build_naming_every_primitive() {
        let lib = source("lib.rs");
        let at = lib
            .find("#[cfg(not(target_arch = \"x86_64\"))]\ncompile_error!(")
            .expect("lib.rs stops the build off x86-64 with a compile_error!");
        let msg = &lib[at..at + lib[at..].find(");").expect("end of compile_error!")];
        let this = source("hw/barrier.rs");
        let prims: Vec<&str> = this
            .lines()
            .filter_map(|l| {
                l.strip_prefix("pub fn ")
                    .or(l.strip_prefix("pub unsafe fn "))
            })
            .map(|l| &l[..l.find(['(', '<']).expect("a function")])
            .collect();
        assert_eq!(prims.len(), 6, "{prims:?}");
        for p in prims {
            assert!(
                msg.contains(p),
                "the compile_error! does not name `{p}`: {msg}"
            );
        }
    }
}
