//! The I/O queues' socket calls on the caller's data buffers, and the NVMe/TCP host's only
//! `unsafe`: `recv` straight into a request's data memory (C2HData; with what follows the
//! data into the queue's receive stage, in the same call), copies from the stage into that
//! memory (data that came in one `recv` with its header), one gathered `sendmsg`
//! of PDU headers and a request's data memory (in-capsule data, H2CData), and CRC32C over
//! that memory for data digests. The memory is named by address, never by a Rust
//! reference (it is lent DMA memory, see `hw::dma`): the kernel copies between the socket
//! and it, which is the one copy each direction makes.
//!
//! Where the addresses come from: every data segment of a request a queue accepts is a
//! [`DmaSlice`](crate::hw::dma::DmaSlice) that is either a slice of a buffer lent to the
//! queue (checked at submit) or memory the caller of `TargetQueue::submit_unchecked`
//! keeps allocated and untouched until the completion. Either way it stays valid, and
//! nothing but the queue uses it, from submit until the request's completion is
//! delivered; the queue reaches it only in that window (`queue/mod.rs`, "Memory").

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The most pieces one [`send_gather`] sends.
pub const MAX_IOV: usize = 64;

/// One piece of a gathered send: an address and a length.
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    /// First byte.
    pub addr: usize,
    /// Length.
    pub len: usize,
}

fn cvt(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Receives at most `len + spill.len()` bytes with one `recvmsg`: first into the memory
/// at `addr` (up to `len`), then what follows into `spill`; never blocks. Returns the bytes
/// received in all: `Ok(0)` is end of stream, `WouldBlock` nothing there yet.
///
/// # Safety
/// `addr..addr + len` lies inside one live allocation that stays allocated for the call,
/// and nothing else reads or writes those bytes during it (no reference to them exists).
pub unsafe fn recv_split(
    fd: BorrowedFd<'_>,
    addr: usize,
    len: usize,
    spill: &mut [u8],
) -> io::Result<usize> {
    let mut v = [
        libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        },
        libc::iovec {
            iov_base: spill.as_mut_ptr().cast(),
            iov_len: spill.len(),
        },
    ];
    // SAFETY: msghdr is integers and raw pointers, for which all-zero bytes are a valid
    // value (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = v.as_mut_ptr();
    msg.msg_iovlen = 2;
    // SAFETY: the first iovec is writable and used by nothing else for the call (this
    // function's contract); the second is `spill`, exclusively borrowed for the call;
    // `msg` and `v` are locals that outlive it; recvmsg keeps no pointer afterwards.
    cvt(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) })
}

/// Copies `src` to the memory at `addr`.
///
/// # Safety
/// `addr..addr + src.len()` lies inside one live allocation that stays allocated for the
/// call, and nothing else reads or writes those bytes during it (no reference to them
/// exists, so it cannot overlap `src`).
pub unsafe fn copy_to(addr: usize, src: &[u8]) {
    // SAFETY: the destination is writable and unaliased by this function's contract, so
    // it does not overlap `src`, a live shared slice.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) }
}

/// Sends the pieces, in order, with one `sendmsg` (at most the first [`MAX_IOV`]); returns
/// the bytes sent. Never blocks and never raises `SIGPIPE`.
///
/// # Safety
/// Every piece lies inside one live allocation that stays allocated for the call, and
/// nothing writes those bytes during it.
pub unsafe fn send_gather(fd: BorrowedFd<'_>, pieces: &[Piece]) -> io::Result<usize> {
    let mut v = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_IOV];
    let n = pieces.len().min(MAX_IOV);
    for (d, p) in v.iter_mut().zip(&pieces[..n]) {
        d.iov_base = p.addr as *mut libc::c_void;
        d.iov_len = p.len;
    }
    // SAFETY: msghdr is integers and raw pointers, for which all-zero bytes are a valid
    // value (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = v.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: `msg` and the iovecs are locals that outlive the call and the kernel only
    // reads them; each piece is readable and unchanged during the call by this function's
    // contract; sendmsg keeps no pointer afterwards.
    cvt(unsafe {
        libc::sendmsg(
            fd.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    })
}

/// CRC32C of `len` bytes at `addr`, continuing `crc`, read through a stack buffer.
///
/// # Safety
/// `addr..addr + len` lies inside one live allocation that stays allocated for the call,
/// and nothing writes those bytes during it.
pub unsafe fn crc32c_at(crc: u32, addr: usize, len: usize) -> u32 {
    let mut tmp = [0u8; 4096];
    let mut crc = crc;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(tmp.len());
        // SAFETY: `addr + done .. + n` is inside the range this function's contract makes
        // readable; `tmp` is a local of at least `n` bytes; the two do not overlap (one is
        // on this stack frame, the other in the caller's allocation).
        unsafe {
            std::ptr::copy_nonoverlapping((addr + done) as *const u8, tmp.as_mut_ptr(), n);
        }
        crc = crc32c::crc32c_append(crc, &tmp[..n]);
        done += n;
    }
    crc
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn recv_and_send_touch_only_their_ranges() {
        let mut buf = vec![0xeeu8; 64];
        let (mut tx, rx) = UnixStream::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        let base = buf.as_mut_ptr() as usize;
        // SAFETY: 10..18 of `buf`, alive for the call, no reference in use meanwhile.
        let e = unsafe { recv_split(rx.as_fd(), base + 10, 8, &mut []) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        tx.write_all(b"0123456789").unwrap();
        // SAFETY: 10..18 of `buf` again, alive for the call, no reference in use meanwhile.
        let n = unsafe { recv_split(rx.as_fd(), base + 10, 8, &mut []) }.unwrap();
        assert_eq!(n, 8);
        assert_eq!(&buf[8..20], b"\xee\xee01234567\xee\xee");
        let pieces = [
            Piece {
                addr: base + 10,
                len: 2,
            },
            Piece {
                addr: base + 16,
                len: 2,
            },
        ];
        // SAFETY: both pieces are inside `buf`, which nothing writes during the call.
        let n = unsafe { send_gather(tx.as_fd(), &pieces) }.unwrap();
        assert_eq!(n, 4);
        let mut got = [0u8; 6];
        let mut rx = rx;
        std::thread::sleep(std::time::Duration::from_millis(10));
        let k = std::io::Read::read(&mut rx, &mut got).unwrap();
        // The two bytes left of the first send, then the two pieces.
        assert_eq!(&got[..k], b"890167");
        // SAFETY: `buf` is alive and not written during the call.
        let c = unsafe { crc32c_at(0, base + 10, 8) };
        assert_eq!(c, crc32c::crc32c(b"01234567"));
        tx.write_all(b"abcdefghij").unwrap();
        let mut spill = [0u8; 16];
        std::thread::sleep(std::time::Duration::from_millis(10));
        // SAFETY: 40..44 of `buf`, alive for the call, no reference in use meanwhile.
        let n = unsafe { recv_split(rx.as_fd(), base + 40, 4, &mut spill) }.unwrap();
        assert_eq!(n, 10, "one call takes both parts");
        assert_eq!(&buf[38..46], b"\xee\xeeabcd\xee\xee");
        assert_eq!(&spill[..6], b"efghij");
        // SAFETY: 50..53 of `buf`, alive for the call, no reference in use meanwhile.
        unsafe { copy_to(base + 50, b"xyz") };
        assert_eq!(&buf[49..54], b"\xeexyz\xee");
    }
}
