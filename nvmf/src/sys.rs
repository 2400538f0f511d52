//! The system calls of the transport, and the crate's only `unsafe` besides one call site
//! in `conn`: epoll, eventfd, `recv` into DMA memory and `writev` from headers and DMA
//! memory. DMA memory is reached through raw pointers only, never through a reference
//! (see `kestrel::hw::dma`): the kernel copies between the socket and it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use kestrel::DmaBuf;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Readable (or peer closed).
pub const EV_IN: u32 = libc::EPOLLIN as u32;
/// Writable.
pub const EV_OUT: u32 = libc::EPOLLOUT as u32;
/// Error or hang-up.
pub const EV_ERR: u32 = (libc::EPOLLERR | libc::EPOLLHUP | libc::EPOLLRDHUP) as u32;
const EV_ET: u32 = libc::EPOLLET as u32;

/// An epoll instance, edge triggered for connections.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    /// A new epoll instance that returns at most `max_events` per wait.
    pub fn new(max_events: usize) -> io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new fd we own.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll {
            // SAFETY: fd was just returned by epoll_create1 and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; max_events.max(1)],
        })
    }

    /// Watches `fd` with `key`: level triggered for `EV_IN` alone (listeners, eventfds),
    /// edge triggered for both directions when `edge` (connections).
    pub fn add(&self, fd: RawFd, key: u64, edge: bool) -> io::Result<()> {
        let events = if edge {
            EV_IN | EV_OUT | EV_ERR | EV_ET
        } else {
            EV_IN
        };
        let mut ev = libc::epoll_event { events, u64: key };
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        Ok(())
    }

    /// Stops watching `fd`.
    pub fn del(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: ev is valid for the call; a failure (fd not watched) is harmless.
        unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Waits up to `timeout_ms` (0: poll) and calls `f(events, key)` for each event.
    pub fn wait(&mut self, timeout_ms: i32, mut f: impl FnMut(u32, u64)) -> io::Result<usize> {
        // SAFETY: the buffer holds self.events.len() entries, which is what we pass.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                timeout_ms,
            )
        };
        let n = match cvt(n) {
            Ok(n) => n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        for ev in &self.events[..n] {
            let (events, key) = (ev.events, ev.u64);
            f(events, key);
        }
        Ok(n)
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
        // SAFETY: no pointers; a non-negative result is a new fd we own.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        Ok(EventFd {
            // SAFETY: fd was just returned by eventfd and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }
    /// The descriptor, for epoll.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// Wakes the waiter.
    pub fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local array; a full counter (EAGAIN) still
        // leaves the fd readable, which is all a wake-up needs.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
    /// Clears the pending wake-ups.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local array.
        unsafe { libc::read(self.fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
    }
}

/// Receives up to `len` bytes from the socket into the memory at `dst`. `Ok(0)` is end of
/// stream; `WouldBlock` means nothing is there yet.
///
/// # Safety
/// For the duration of the call `dst` is valid for writes of `len` bytes (inside one live
/// allocation, e.g. a lent DMA buffer), and nothing else reads or writes those bytes (no
/// Rust reference to them, no other thread, no command at the target).
pub unsafe fn recv_into_dma(fd: RawFd, dst: *mut u8, len: usize) -> io::Result<usize> {
    // SAFETY: this function's contract: `dst..dst + len` is writable and used by nothing
    // else for the call; recv(2) writes at most `len` bytes there and keeps no pointer.
    cvt_size(unsafe { libc::recv(fd, dst.cast(), len, libc::MSG_DONTWAIT) })
}

/// One piece of a gathered write: a header in ordinary memory or data in a DMA buffer.
#[derive(Clone, Copy, Debug)]
pub struct RawIov {
    /// First byte.
    pub base: *const u8,
    /// Length.
    pub len: usize,
}

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

/// Writes the pieces in order with one `writev`; returns the bytes written.
///
/// # Safety
/// Every piece must point at `len` readable bytes that stay alive and unchanged for the
/// duration of the call.
pub unsafe fn writev(fd: RawFd, iovs: &[RawIov]) -> io::Result<usize> {
    let mut v: [libc::iovec; 64] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 64];
    let n = iovs.len().min(64);
    for (d, s) in v.iter_mut().zip(&iovs[..n]) {
        d.iov_base = s.base as *mut libc::c_void;
        d.iov_len = s.len;
    }
    let mut msg: libc::msghdr = {
        // SAFETY: msghdr is plain data; all-zero is a valid empty message.
        unsafe { std::mem::zeroed() }
    };
    msg.msg_iov = v.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: the iovecs describe memory the caller guarantees readable for the call;
    // MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
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
