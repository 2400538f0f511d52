//! The tables the rules check against. Each is the one place its list is kept; the
//! documents that state the rule point here.

/// Where `unsafe` may appear in library and binary code, as paths from the workspace root:
/// a file, or a folder (ending in `/`) for every file below it, with what the `unsafe` is
/// for. Test code is not counted: `#[cfg(test)]` items, `tests.rs` files and `tests/`
/// folders, benches, examples and build scripts (they call the unsafe APIs to test them).
///
/// The same list is the table "Where `unsafe` lives" in docs/architecture.md, which
/// [`crate::unsafe_lives_only_in_the_named_modules`] checks names every entry. An entry
/// whose files no longer hold any `unsafe` is an error too, so the list says what the tree
/// is: delete it (here and in the document) when its last `unsafe` goes.
pub const UNSAFE_MODULES: &[(&str, &str)] = &[
    (
        "driver/src/hw/barrier.rs",
        "one-instruction loads and stores of device memory, and the DMA barriers",
    ),
    (
        "driver/src/hw/mmio.rs",
        "BAR0 mapping and register/doorbell access",
    ),
    (
        "driver/src/hw/dma/mod.rs",
        "anonymous (huge)page mappings, mlock, buffer copies",
    ),
    (
        "driver/src/hw/vfio/sys.rs",
        "the VFIO ioctls and the BAR0 mmap",
    ),
    (
        "driver/src/hw/vfio/mod.rs",
        "Bar::from_raw over the BAR0 mapping",
    ),
    (
        "driver/src/hw/vfio/mapper.rs",
        "VFIO_IOMMU_MAP_DMA of a pool region",
    ),
    ("driver/src/hw/clock.rs", "rdtsc, clock_gettime"),
    (
        "driver/src/emu/mem.rs",
        "views of the shared register page and of registered memory",
    ),
    (
        "driver/src/nvme/ring.rs",
        "SQ slot stores, CQ entry loads, shadow doorbells",
    ),
    (
        "driver/src/nvme/prp.rs",
        "PRP list entries written into DMA memory",
    ),
    (
        "driver/src/nvme/qpair/split.rs",
        "one DSM range copied into DMA memory; the tracker table",
    ),
    (
        "driver/src/nvme/ctrlr.rs",
        "declares Controller::admin_command (raw admin passthrough, under a contract)",
    ),
    (
        "driver/src/nvme/qpair/submit.rs",
        "declares IoQpair::submit_unchecked and submit_raw (under contracts)",
    ),
    (
        "driver/src/target/mod.rs",
        "declares TargetQueue::submit_unchecked",
    ),
    (
        "driver/src/target/nvme.rs",
        "forwards TargetQueue::submit_unchecked to IoQpair's",
    ),
    (
        "driver/src/target/file/queue/mod.rs",
        "implements TargetQueue::submit_unchecked for a file queue",
    ),
    (
        "driver/src/aio/context.rs",
        "hands a run-to-completion context's requests, whose buffers the context owns, to its queue (submit_unchecked)",
    ),
    (
        "driver/src/aio/reactor/poller.rs",
        "hands a context's requests, whose buffers the context owns, to a poller's queue (submit_unchecked)",
    ),
    (
        "hw-tests/src/support.rs",
        "the conformance suite's raw I/O commands (IoQpair::submit_raw)",
    ),
    (
        "hw-tests/src/errors.rs",
        "the conformance suite's raw admin commands (Controller::admin_command)",
    ),
    (
        "driver/src/target/null.rs",
        "implements `TargetQueue::submit_unchecked` for a null queue; zeroes a read's buffers",
    ),
    (
        "driver/src/target/file/sys.rs",
        "BLKDISCARD, OFD locks, SIGXFSZ",
    ),
    (
        "driver/src/target/file/queue/ring.rs",
        "io_uring buffer registration and pushes",
    ),
    (
        "driver/src/target/file/queue/complete.rs",
        "zeroing the unread tail of a short read",
    ),
    (
        "driver/src/target/tcp/sock.rs",
        "recvmsg into request memory (and the receive stage), copies from the stage into it, gathered sendmsg from it, CRC32C over it",
    ),
    (
        "driver/src/target/tcp/queue/mod.rs",
        "implements TargetQueue::submit_unchecked for an NVMe/TCP queue",
    ),
    (
        "driver/src/target/tcp/queue/issue.rs",
        "the one call of sock::send_gather, data digests of request memory",
    ),
    (
        "driver/src/target/tcp/queue/rx.rs",
        "the calls of sock::recv_split and sock::copy_to, data digests of what it received",
    ),
    ("driver/src/aio/spsc.rs", "the ring slots"),
    (
        "driver/src/aio/types.rs",
        "IoBuf::user and IoBuf::vouched: the contracts of memory a context does not own",
    ),
    (
        "driver/src/aio/core.rs",
        "bounce copies from and to IoBuf::user memory",
    ),
    (
        "driver/src/capi/",
        "the C ABI: the caller's pointers, handles' Box round trips",
    ),
    ("fio-engine/src/ffi.rs", "the fio engine's C entry points"),
    ("nvmf/src/sys.rs", "recv into and sendmsg from DMA memory"),
    ("nvmf/src/conn/recv.rs", "the one call of sys::recv"),
    ("nvmf/src/conn/transmit.rs", "the one call of sys::writev"),
    (
        "app/src/perf/syscalls.rs",
        "the seccomp filter that counts a poller's system calls",
    ),
];

/// Files that may call `get_unchecked`/`get_unchecked_mut` (none: an index a device, a
/// file or a peer supplies is checked).
pub const GET_UNCHECKED_ALLOWED: &[&str] = &[];

/// Files that reach BAR0 or memory the device writes, in which no Rust reference to that
/// memory may be made: access is volatile, behind `Bar` and `RingPair`.
pub const DEVICE_MEMORY_FILES: &[&str] = &["driver/src/hw/mmio.rs", "driver/src/nvme/ring.rs"];

/// What makes a reference in those files, with why it is refused.
pub const DEVICE_MEMORY_FORBIDDEN: &[(&str, &str)] = &[
    (
        "::from_ptr(",
        "an atomic made from a pointer (AtomicU32::from_ptr) is a &AtomicU32 into device memory",
    ),
    (
        ".as_ref()",
        "NonNull/pointer as_ref makes a & reference into device memory",
    ),
    (
        ".as_mut()",
        "NonNull/pointer as_mut makes a &mut reference into device memory",
    ),
    (
        "cast::<Atomic",
        "a pointer cast to an atomic type is only ever turned into a reference",
    ),
];

/// Phrases that point at a justification instead of giving one. A `SAFETY:` comment is
/// read with these removed; what is left must name the invariant.
pub const VAGUE: &[&str] = &[
    "the caller's contract",
    "caller's contract",
    "the caller's",
    "the caller promises",
    "the caller passes",
    "by contract",
    "by the contract",
    "the contract",
    "see above",
    "same as above",
    "as above",
    "same contract as ours",
    "the header's contract",
    "trust me",
    "this is safe",
    "it is safe",
    "safe because",
];

/// Phrases by which a `SAFETY:` comment relies on the function's caller. Such a comment
/// must sit in an `unsafe fn` whose doc states that contract under `# Safety`. ("The caller
/// of `IoBuf::user` promised ..." names another function's contract and is not one.)
pub const RELIES_ON_CALLER: &[&str] = &[
    "the caller's contract",
    "caller's contract",
    "the caller guarantees",
    "the caller promises",
    "the caller passes",
    "the caller ensures",
    "by contract",
    "by this function's contract",
    "this function's contract",
];

/// Functions known to rely on their callers without being `unsafe fn` (path, fn name,
/// why it stays for now). An entry that matches nothing any more is an error.
pub const CALLER_CONTRACT_PENDING: &[(&str, &str, &str)] = &[(
    "driver/src/nvme/ring.rs",
    "rewind",
    "RingPair::rewind zeroes the CQ and relies on its callers (bring-up, reset, queue \
     recovery) having the controller not writing it; it is to become an `unsafe fn` with a \
     # Safety section as ring.rs moves to volatile access (branch `barriers`)",
)];

/// The fewest words a `SAFETY:` comment has once the [`VAGUE`] phrases are removed: fewer
/// cannot say what holds and where it is established.
pub const MIN_WORDS: usize = 4;

/// How far above a back-reference ("as above") the `SAFETY:` comment it means may end: the
/// item right before it (an `unsafe impl Sync` after its `unsafe impl Send`), never a
/// comment a reader has to look for.
pub const AS_ABOVE_REACH: usize = 3;
