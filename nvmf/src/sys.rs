//! The system calls of the transport: epoll and eventfd through rustix (safe wrappers), and
//! the crate's only `unsafe` besides its call sites in `conn`: `recv` into DMA memory and a
//! gathered `sendmsg` from headers and DMA memory. DMA memory is reached through raw
//! pointers only, never through a reference (see `kestrel::hw::dma`): the kernel copies
//! between the socket and it. Those two stay on libc because rustix's `recv` and
//! `sendmsg` take Rust slices (`&mut [u8]`, `IoSlice`), which would be references into
//! memory a device also reads and writes.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use kestrel::DmaBuf;
use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Readable (or peer closed).
pub const EV_IN: u32 = epoll::EventFlags::IN.bits();
/// Writable.
pub const EV_OUT: u32 = epoll::EventFlags::OUT.bits();
/// Error or hang-up.
pub const EV_ERR: u32 =
    epoll::EventFlags::ERR.bits() | epoll::EventFlags::HUP.bits() | epoll::EventFlags::RDHUP.bits();
const EV_ET: u32 = epoll::EventFlags::ET.bits();

/// The most events one [`Epoll::wait`] returns.
pub const MAX_EVENTS: usize = 256;

/// An epoll instance, edge triggered for connections.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
    max_events: usize,
}

impl Epoll {
    /// A new epoll instance that returns at most `max_events` (1..=[`MAX_EVENTS`]) per wait.
    pub fn new(max_events: usize) -> io::Result<Self> {
        Ok(Epoll {
            fd: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            max_events: max_events.clamp(1, MAX_EVENTS),
        })
    }

    /// Watches `fd` with `key`: level triggered for `EV_IN` alone (listeners, eventfds),
    /// edge triggered for both directions when `edge` (connections).
    pub fn add(&self, fd: impl AsFd, key: u64, edge: bool) -> io::Result<()> {
        let events = if edge {
            EV_IN | EV_OUT | EV_ERR | EV_ET
        } else {
            EV_IN
        };
        epoll::add(
            &self.fd,
            fd,
            epoll::EventData::new_u64(key),
            epoll::EventFlags::from_bits_retain(events),
        )?;
        Ok(())
    }

    /// Stops watching `fd`; a failure (`fd` not watched) is harmless.
    pub fn del(&self, fd: impl AsFd) {
        let _ = epoll::delete(&self.fd, fd);
    }

    /// Waits up to `timeout_ms` (0: poll; negative: no limit) and calls `f(events, key)`
    /// for each event.
    pub fn wait(&mut self, timeout_ms: i32, mut f: impl FnMut(u32, u64)) -> io::Result<usize> {
        let ts = (timeout_ms >= 0).then(|| Timespec {
            tv_sec: i64::from(timeout_ms / 1000),
            tv_nsec: (i64::from(timeout_ms % 1000) * 1_000_000) as _,
        });
        // On the stack and left uninitialised: the kernel fills the first n entries, which
        // are all that is read (no allocation, no clearing per wait).
        let mut buf = [const { MaybeUninit::<epoll::Event>::uninit() }; MAX_EVENTS];
        let events = match epoll::wait(&self.fd, &mut buf[..self.max_events], ts.as_ref()) {
            Ok((events, _)) => events,
            Err(rustix::io::Errno::INTR) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        for ev in events.iter() {
            // Copied out: the fields of the (packed) epoll_event are read by value.
            let (flags, data) = (ev.flags, ev.data);
            f(flags.bits(), data.u64());
        }
        Ok(events.len())
    }
}

/// An eventfd: wakes a reactor blocked in `epoll_wait`.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        Ok(EventFd {
            fd: eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?,
        })
    }
    /// The descriptor, for epoll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
    /// Wakes the waiter. A full counter (EAGAIN) still leaves the fd readable, which is all
    /// a wake-up needs, so the result needs no handling.
    pub fn signal(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
    /// Clears the pending wake-ups (an empty counter is EAGAIN: nothing to clear).
    pub fn drain(&self) {
        let _ = rustix::io::read(&self.fd, &mut [0u8; 8]);
    }
}

/// Receives up to `len` bytes from the socket `fd` into the memory at `dst`. `Ok(0)` is end
/// of stream; `WouldBlock` means nothing is there yet.
///
/// The memory is named by a raw pointer, not a `&mut [u8]`, because it is DMA memory that
/// the device reads and writes for other commands around it (a connection's data arena is
/// shared by every command in flight on it): the kernel writes into it, no Rust reference
/// to it is made.
///
/// # Safety
/// For the duration of the call:
/// - `dst` is valid for writes of `len` bytes: the whole range lies inside one live
///   allocation (e.g. one `DmaBuf`, which the caller keeps alive across the call);
/// - nothing else reads or writes those `len` bytes: no Rust reference to them exists, no
///   other thread copies into or out of them, and no command at the target (so no device
///   DMA) uses them. Other bytes of the same buffer may be in use meanwhile.
pub unsafe fn recv(fd: BorrowedFd<'_>, dst: *mut u8, len: usize) -> io::Result<usize> {
    // SAFETY: the caller guarantees `dst..dst + len` is writable and used by nothing else
    // for the call (this function's contract); recv(2) writes at most `len` bytes there
    // and keeps no pointer after it returns. MSG_DONTWAIT: it never blocks.
    cvt_size(unsafe { libc::recv(fd.as_raw_fd(), dst.cast(), len, libc::MSG_DONTWAIT) })
}

/// The most pieces one [`writev`] sends: 85 read responses of three pieces (C2HData
/// header, data, response capsule), so one call per connection per reactor pass carries
/// every response of a queue of 64 (`IOV_MAX` is 1024).
pub const MAX_IOVS: usize = 256;

/// One piece of a gathered write: a header in ordinary memory or data in a DMA buffer.
/// Laid out as the kernel's `struct iovec` (asserted below), so a slice of them is the
/// `msg_iov` array [`writev`] hands to `sendmsg` as it is.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct RawIov {
    /// First byte.
    pub base: *const u8,
    /// Length.
    pub len: usize,
}

const _: () = {
    assert!(std::mem::size_of::<RawIov>() == std::mem::size_of::<libc::iovec>());
    assert!(std::mem::align_of::<RawIov>() == std::mem::align_of::<libc::iovec>());
    assert!(std::mem::offset_of!(RawIov, base) == std::mem::offset_of!(libc::iovec, iov_base));
    assert!(std::mem::offset_of!(RawIov, len) == std::mem::offset_of!(libc::iovec, iov_len));
};

// SAFETY: a RawIov is an address and a length. Rust code never reads or writes through
// `base`; only the kernel does, inside `writev`, whose contract makes the memory valid for
// that call whatever thread makes it. Moving the numbers between threads (a connection's
// reusable piece array goes where the connection goes) dereferences nothing.
unsafe impl Send for RawIov {}

impl RawIov {
    /// A slice of ordinary memory.
    pub fn of(s: &[u8]) -> Self {
        RawIov {
            base: s.as_ptr(),
            len: s.len(),
        }
    }
    /// `len` bytes of a DMA buffer at `off` (`None` when out of bounds).
    pub fn of_dma(buf: &DmaBuf, off: usize, len: usize) -> Option<Self> {
        let end = off.checked_add(len)?;
        (end <= buf.len()).then(|| RawIov {
            // The pointer is formed with wrapping arithmetic; it is only dereferenced by
            // the kernel, inside the bounds checked here.
            base: buf.as_ptr().wrapping_add(off),
            len,
        })
    }
}

/// Writes the pieces in order with one `sendmsg` (a `writev` with `MSG_NOSIGNAL`); returns
/// the bytes written. At most the first [`MAX_IOVS`] pieces are sent.
///
/// # Safety
/// For the duration of the call, every piece's `base` is valid for reads of its `len`
/// bytes (inside one live allocation the caller keeps alive across the call), and nothing
/// writes those bytes meanwhile: no Rust code, no other thread, no command at the target
/// (so no device DMA). `fd` is an open descriptor of a socket this caller owns.
pub unsafe fn writev(fd: RawFd, iovs: &[RawIov]) -> io::Result<usize> {
    let n = iovs.len().min(MAX_IOVS);
    let mut msg: libc::msghdr = {
        // SAFETY: msghdr is integers and raw pointers (plus private padding on some
        // targets), for all of which all-zero bytes are a valid value: an empty message
        // with no name and no control data.
        unsafe { std::mem::zeroed() }
    };
    // `RawIov` has `iovec`'s layout (asserted above); the kernel only reads the array, so
    // the `*mut` msghdr asks for is never written through.
    msg.msg_iov = iovs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = n as _;
    // SAFETY: `msg` is a local and `iovs` a borrow, both alive across the call, and the
    // kernel only reads them; each piece's memory is readable and not written during the
    // call by this function's contract. sendmsg keeps no pointer after it returns.
    // MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE; MSG_DONTWAIT: it
    // never blocks.
    cvt_size(unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
}

/// CRC32C over `len` bytes of a DMA buffer at `off`, continuing `crc`, reading through a
/// small stack buffer (no reference to DMA memory is made).
pub fn crc32c_dma(crc: u32, buf: &DmaBuf, off: usize, len: usize) -> u32 {
    let mut tmp = [0u8; 4096];
    let mut crc = crc;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(tmp.len());
        if buf.read_at(off + done, &mut tmp[..n]).is_err() {
            break;
        }
        crc = crate::pdu::crc32c_append(crc, &tmp[..n]);
        done += n;
    }
    crc
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use kestrel::dma::{DmaPool, DmaPoolOptions, IdentityMapper};

    use super::*;

    #[test]
    fn recv_writes_only_the_range_it_is_given() {
        let pool = DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default());
        let mut buf = pool.alloc(4096).unwrap();
        buf.fill(0xee);
        let (mut tx, rx) = UnixStream::pair().unwrap();
        // Nothing sent yet: WouldBlock, not a wait.
        let dst = buf.as_mut_ptr().wrapping_add(100);
        // SAFETY: 100..108 of `buf`, alive for the call; nothing else uses the buffer.
        let e = unsafe { recv(rx.as_fd(), dst, 8) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        tx.write_all(b"0123456789").unwrap();
        // SAFETY: 100..108 of `buf` again, which is alive and used by nothing else.
        let n = unsafe { recv(rx.as_fd(), dst, 8) }.unwrap();
        assert_eq!(n, 8, "at most the length given");
        let mut got = [0u8; 12];
        buf.read_at(98, &mut got).unwrap();
        assert_eq!(&got, b"\xee\xee01234567\xee\xee");
    }
}
