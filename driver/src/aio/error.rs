//! Errors of the aio layer: why an iocb was refused, and why a call failed.

use crate::hw::dma::DmaError;
use crate::io::InvalidRequest;

/// Why an iocb was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum IocbError {
    /// Offset or length not a multiple of the block size.
    #[error("{op} {what} {value} is not a multiple of the {block_size}-byte block size")]
    Misaligned {
        /// Operation.
        op: &'static str,
        /// "offset" or "length".
        what: &'static str,
        /// The value.
        value: u64,
        /// The target's block size.
        block_size: u32,
    },
    /// A zero-length transfer.
    #[error("{op} of zero bytes at offset {offset}")]
    ZeroLength {
        /// Operation.
        op: &'static str,
        /// Offset.
        offset: u64,
    },
    /// More blocks than one request can carry.
    #[error("{op} of {len} bytes is more than one request carries ({max} bytes); split it")]
    TooLong {
        /// Operation.
        op: &'static str,
        /// Length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Past the end of the target.
    #[error(
        "{op} of {len} bytes at offset {offset} runs past the end of the target ({capacity} bytes)"
    )]
    OutOfRange {
        /// Operation.
        op: &'static str,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Target capacity in bytes.
        capacity: u64,
    },
    /// The buffer is shorter than the length.
    #[error("{op} of {len} bytes with a buffer of {buf_len} bytes")]
    BufferTooShort {
        /// Operation.
        op: &'static str,
        /// Length.
        len: u64,
        /// Buffer bytes.
        buf_len: u64,
    },
    /// The wrong kind of buffer for the opcode.
    #[error("{op}: {why}")]
    WrongBuffer {
        /// Operation.
        op: &'static str,
        /// The rule.
        why: &'static str,
    },
    /// A DMA buffer that is not from the target's pool.
    #[error("buffer at {addr:#x} ({len} bytes) is not dma memory of this target's pool; allocate it from Target::dma_pool() (kestrel_dma_alloc in C) or enable the bounce path")]
    ForeignBuffer {
        /// Address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// A DMA slice that is not a slice of a buffer lent to this context.
    #[error("{op}: the dma slice at {addr:#x} ({len} bytes) is not lent to this context: lend the buffer with IoContext::lend first (kestrel_dma_alloc does it in C), and submit its slices only until it is reclaimed or released")]
    NotLent {
        /// Operation.
        op: &'static str,
        /// Address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// Ordinary memory without the bounce path.
    #[error("ordinary memory at {addr:#x} ({len} bytes) needs the bounce path, and this context was set up without it (ContextOptions::bounce, KESTREL_IO_BOUNCE in C)")]
    NoBounce {
        /// Address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// A bounced request longer than a bounce buffer.
    #[error("bounced {op} of {len} bytes is longer than a bounce buffer ({max} bytes); raise BounceOptions::buf_size or use dma memory")]
    BounceTooLarge {
        /// Operation.
        op: &'static str,
        /// Length.
        len: u64,
        /// Bounce buffer size.
        max: usize,
    },
    /// The target does not do this.
    #[error("{op} is not supported by target {target}")]
    Unsupported {
        /// Operation.
        op: &'static str,
        /// Target index.
        target: u16,
    },
    /// A write to a read-only target.
    #[error("{op} to read-only target {target}")]
    ReadOnly {
        /// Operation.
        op: &'static str,
        /// Target index.
        target: u16,
    },
    /// No such target.
    #[error("target {target} does not exist (the context has {count})")]
    NoSuchTarget {
        /// Index given.
        target: u16,
        /// Targets there are.
        count: usize,
    },
    /// A namespace other than the target's.
    #[error("nsid {nsid} is not target {target}'s namespace ({target_nsid}); use 0 or open that namespace as its own target")]
    WrongNamespace {
        /// Given.
        nsid: u32,
        /// Target index.
        target: u16,
        /// The target's namespace.
        target_nsid: u32,
    },
}

/// Errors of the aio layer.
#[derive(Debug, thiserror::Error)]
pub enum AioError {
    /// Nothing could be accepted.
    #[error("no room for a request: {what} full ({in_flight} of {nr_events} events outstanding); reap events with getevents and retry")]
    Busy {
        /// What is full.
        what: &'static str,
        /// Requests outstanding.
        in_flight: u32,
        /// The context's bound.
        nr_events: u32,
    },
    /// The first iocb of a batch is invalid.
    #[error("iocb {index} (user_data {user_data:#x}): {reason}")]
    Invalid {
        /// Its index in the batch.
        index: usize,
        /// Its user data.
        user_data: u64,
        /// What is wrong.
        reason: IocbError,
    },
    /// The queue refused the first iocb of a batch.
    #[error("iocb {index} (user_data {user_data:#x}) refused by the target: {reason}")]
    Rejected {
        /// Its index in the batch.
        index: usize,
        /// Its user data.
        user_data: u64,
        /// The queue's reason.
        reason: InvalidRequest,
    },
    /// The device is gone.
    #[error("device removed; close the context and the target")]
    DeviceRemoved,
    /// The reactor is shutting down or gone.
    #[error("the reactor is shut down and accepts no more requests; collect outstanding events with getevents")]
    Stopped,
    /// A bad `nr_events`.
    #[error("nr_events {nr_events} must be from 1 to {max}")]
    BadNrEvents {
        /// Given.
        nr_events: u32,
        /// The bound.
        max: u32,
    },
    /// A bad option.
    #[error("invalid context option {option} = {value}: {why}")]
    BadOption {
        /// The option.
        option: &'static str,
        /// Its value.
        value: u64,
        /// The rule.
        why: &'static str,
    },
    /// Bounce buffers smaller than one block of a target: every bounced I/O to it would be
    /// refused.
    #[error(
        "invalid context option bounce.buf_size = {buf_size}: smaller than one block of \
         {target} ({block_size} bytes), so every bounced i/o to it would be refused; give at \
         least {block_size} (kestrel_io_params.bounce_buf_size in C)"
    )]
    BounceBufTooSmall {
        /// Given.
        buf_size: usize,
        /// The target's block size: the smallest valid size.
        block_size: u32,
        /// The target.
        target: String,
    },
    /// `min_nr` larger than the event buffer.
    #[error("min_nr {min_nr} is more than the {nr} events the buffer holds")]
    MinNrTooLarge {
        /// Asked.
        min_nr: usize,
        /// Buffer length.
        nr: usize,
    },
    /// `getevents` on a thread that cannot complete what is in flight.
    #[error("{in_flight} requests in flight can only be completed on the thread that submitted them (a file target's io_uring belongs to that thread): call getevents there, or let them complete before moving the context")]
    WrongThread {
        /// Requests only the submitting thread can complete.
        in_flight: u32,
    },
    /// `getevents` with no timeout and too little outstanding to ever satisfy `min_nr`.
    #[error("getevents with no timeout would wait forever: min_nr {min_nr} but only {outstanding} requests are outstanding")]
    WouldWaitForever {
        /// Asked.
        min_nr: usize,
        /// Outstanding.
        outstanding: u32,
    },
    /// Cancel of an unknown `user_data`.
    #[error("no outstanding request has user_data {user_data:#x} (it completed, or was never submitted)")]
    NotFound {
        /// Asked.
        user_data: u64,
    },
    /// A poller index that does not exist.
    #[error("poller {index} does not exist (the reactor has {pollers})")]
    NoSuchPoller {
        /// Asked.
        index: usize,
        /// Pollers there are.
        pollers: usize,
    },
    /// Creating the context's queue failed.
    #[error("creating the context's queue on {target}: {source}")]
    Queue {
        /// Target name.
        target: String,
        /// Why.
        source: Box<crate::target::TargetError>,
    },
    /// Allocating bounce buffers failed.
    #[error("allocating {bytes} bytes of bounce buffers: {source}")]
    Bounce {
        /// Bytes.
        bytes: usize,
        /// Why.
        source: DmaError,
    },
    /// An eventfd could not be made.
    #[error("could not create the context's eventfd: {0}")]
    EventFd(std::io::Error),
}

impl AioError {
    /// The errno a C caller sees for this error (positive).
    pub fn errno(&self) -> i32 {
        match self {
            AioError::Busy { .. } => libc::EAGAIN,
            // A file queue whose ring belongs to a thread with requests in flight.
            AioError::Rejected {
                reason: InvalidRequest::WrongThread { .. },
                ..
            } => libc::EBUSY,
            AioError::WrongThread { .. } => libc::EBUSY,
            AioError::Invalid { .. } | AioError::Rejected { .. } => libc::EINVAL,
            AioError::DeviceRemoved => libc::ENODEV,
            AioError::Stopped => libc::ESHUTDOWN,
            AioError::BadNrEvents { .. }
            | AioError::BadOption { .. }
            | AioError::BounceBufTooSmall { .. }
            | AioError::MinNrTooLarge { .. }
            | AioError::NoSuchPoller { .. } => libc::EINVAL,
            AioError::WouldWaitForever { .. } => libc::EDEADLK,
            AioError::NotFound { .. } => libc::ENOENT,
            AioError::Queue { .. } => libc::EIO,
            AioError::Bounce { .. } => libc::ENOMEM,
            AioError::EventFd(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}
