//! The receive stage: one `read` of the socket takes up to [`RX_STAGE`] bytes, and PDU
//! headers, padding, digests and small data are served from it. Without it a 4 KiB read
//! command cost two reads (the 8-byte common header, then the rest of the header) and a
//! write three; with it a burst of commands costs one read, as SPDK's target reads
//! through its receive pipe. Data is still read straight into its destination when the
//! stage is empty and the data at least as long as the stage.
//!
//! A socket read that returns less than it asked for has emptied the socket (a stream
//! socket hands over all it holds): the stage then answers the next read it cannot serve
//! from what it holds with `WouldBlock` itself, sparing the `recv` that would only say
//! so, until the connection's next readable event ([`Stage::rearm`]). Edge-triggered
//! epoll reports every arrival after that read, so nothing that comes later is missed. A
//! peer's FIN or an error seen in an event turns the shortcut off: its last data may come
//! in a short read, and only reading on finds the end.

use std::io::{self, Read};

/// Bytes the stage holds on a connection that is not an I/O queue (part of each
/// connection's fixed size in the budget), and the length from which data is read straight
/// into its destination instead of through the stage.
pub const RX_STAGE: usize = 16 << 10;
/// Bytes the stage holds once the connection is an I/O queue ([`Stage::grow`]): one read
/// then takes about fifteen 4 KiB writes with their capsules where 16 KiB took three
/// (SPDK's target reads through a pipe of about 64 KiB too).
pub const RX_STAGE_IO: usize = 64 << 10;

/// Bytes read from the socket and not yet consumed.
pub(super) struct Stage {
    buf: Box<[u8]>,
    head: usize,
    tail: usize,
    /// The last socket read returned less than it asked for: the socket was empty then.
    drained: bool,
    /// The peer's FIN or an error was reported: read until the socket says so itself.
    hup: bool,
}

impl Stage {
    pub(super) fn new() -> Self {
        Stage {
            buf: vec![0; RX_STAGE].into_boxed_slice(),
            head: 0,
            tail: 0,
            drained: false,
            hup: false,
        }
    }

    /// Bytes the stage can hold.
    pub(super) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Lets the stage hold `len` bytes (no change when it holds that many already); the
    /// bytes held stay, in order.
    pub(super) fn grow(&mut self, len: usize) {
        if len <= self.buf.len() {
            return;
        }
        let mut buf = vec![0; len].into_boxed_slice();
        let held = self.tail - self.head;
        buf[..held].copy_from_slice(&self.buf[self.head..self.tail]);
        self.buf = buf;
        self.head = 0;
        self.tail = held;
    }

    /// A readable event came (`hup`: with the peer's FIN, a hang-up or an error): the
    /// socket may hold data again.
    pub(super) fn rearm(&mut self, hup: bool) {
        self.drained = false;
        self.hup |= hup;
    }

    /// Whether the socket is known to be empty (the last read was short, and no event
    /// since): a read the stage cannot serve from what it holds would find nothing.
    pub(super) fn socket_empty(&self) -> bool {
        self.drained && !self.hup
    }

    /// A socket read asked for `asked` bytes and got `got`.
    pub(super) fn note_read(&mut self, asked: usize, got: usize) {
        self.drained = got < asked;
    }

    /// Bytes held and not yet consumed.
    pub(super) fn held(&self) -> &[u8] {
        &self.buf[self.head..self.tail]
    }

    /// Consumes `n` of the bytes held.
    pub(super) fn consume(&mut self, n: usize) {
        self.head = (self.head + n).min(self.tail);
    }

    /// When nothing is held, one read of `src` into the stage (for data shorter than the
    /// stage, which is then copied out of it: one read serves it and the PDUs after it).
    /// `Ok(0)`: end of stream; `WouldBlock` when the socket is known to be empty.
    pub(super) fn fill(&mut self, mut src: impl Read) -> io::Result<usize> {
        if self.head != self.tail {
            return Ok(self.tail - self.head);
        }
        if self.socket_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = src.read(&mut self.buf)?;
        self.note_read(self.buf.len(), n);
        self.head = 0;
        self.tail = n;
        Ok(n)
    }

    /// Reads into `dst`: from the bytes held, else one read of `src` (into the stage, or
    /// into `dst` itself when it is at least [`RX_STAGE`] long). `Ok(0)`: end of stream.
    pub(super) fn read(&mut self, mut src: impl Read, dst: &mut [u8]) -> io::Result<usize> {
        if self.head == self.tail {
            if self.socket_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if dst.len() >= RX_STAGE.min(self.buf.len()) {
                let n = src.read(dst)?;
                self.note_read(dst.len(), n);
                return Ok(n);
            }
            let n = src.read(&mut self.buf)?;
            self.note_read(self.buf.len(), n);
            self.head = 0;
            self.tail = n;
        }
        let n = dst.len().min(self.tail - self.head);
        dst[..n].copy_from_slice(&self.buf[self.head..self.head + n]);
        self.head += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that counts its reads and hands out its bytes in reads of at most `chunk`.
    struct Src<'a> {
        data: &'a [u8],
        chunk: usize,
        reads: usize,
    }

    impl Read for &mut Src<'_> {
        fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            if self.data.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = dst.len().min(self.data.len()).min(self.chunk);
            dst[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn many_small_reads_cost_one_read_of_the_source() {
        let data: Vec<u8> = (0..=255u8).cycle().take(3 * 72).collect();
        let mut src = Src {
            data: &data,
            chunk: usize::MAX,
            reads: 0,
        };
        let mut st = Stage::new();
        let mut got = Vec::new();
        // Three capsules read as the receive path reads them: 8 bytes, then 64.
        for _ in 0..3 {
            let mut ch = [0u8; 8];
            assert_eq!(st.read(&mut src, &mut ch).unwrap(), 8);
            let mut rest = [0u8; 64];
            assert_eq!(st.read(&mut src, &mut rest).unwrap(), 64);
            got.extend_from_slice(&ch);
            got.extend_from_slice(&rest);
        }
        assert_eq!(got, data, "the bytes in order");
        assert_eq!(src.reads, 1, "six header reads, one read of the socket");
        let e = st.read(&mut src, &mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "drained");
        assert_eq!(
            src.reads, 1,
            "the short read emptied the socket: no read to hear it say so"
        );
        // A readable event: the socket is read again (and says it is empty).
        st.rearm(false);
        let e = st.read(&mut src, &mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(src.reads, 2, "read again after the event");
    }

    #[test]
    fn fill_reads_once_and_serves_data_and_the_pdus_after_it() {
        let data: Vec<u8> = (0..=255u8).cycle().take(3 * (72 + 4096)).collect();
        let mut src = Src {
            data: &data,
            chunk: usize::MAX,
            reads: 0,
        };
        let mut st = Stage::new();
        assert_eq!(st.fill(&mut src).unwrap(), data.len());
        assert_eq!(
            st.fill(&mut src).unwrap(),
            data.len(),
            "held: no second read"
        );
        assert_eq!(st.held(), &data[..]);
        st.consume(data.len());
        let e = st.fill(&mut src).unwrap_err();
        assert_eq!(
            e.kind(),
            io::ErrorKind::WouldBlock,
            "the short read emptied it"
        );
        assert_eq!(src.reads, 1);
    }

    #[test]
    fn after_a_hang_up_the_socket_is_read_until_it_says_it_is_empty() {
        let data = [7u8; 100];
        let mut src = Src {
            data: &data,
            chunk: usize::MAX,
            reads: 0,
        };
        let mut st = Stage::new();
        st.rearm(true);
        let mut b = [0u8; 100];
        assert_eq!(st.read(&mut src, &mut b).unwrap(), 100);
        let e = st.read(&mut src, &mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(
            src.reads, 2,
            "the socket itself was asked (its end may follow)"
        );
    }

    #[test]
    fn a_grown_stage_keeps_what_it_holds_and_takes_more_per_read() {
        let data: Vec<u8> = (0..=255u8).cycle().take(5 * (72 + 4096)).collect();
        let mut src = Src {
            data: &data,
            chunk: usize::MAX,
            reads: 0,
        };
        let mut st = Stage::new();
        assert_eq!(st.capacity(), RX_STAGE);
        assert_eq!(st.fill(&mut src).unwrap(), RX_STAGE);
        st.consume(100);
        st.grow(RX_STAGE_IO);
        assert_eq!(st.capacity(), RX_STAGE_IO);
        assert_eq!(st.held(), &data[100..RX_STAGE], "held bytes kept, in order");
        st.consume(RX_STAGE - 100);
        assert_eq!(st.fill(&mut src).unwrap(), data.len() - RX_STAGE);
        assert_eq!(st.held(), &data[RX_STAGE..]);
        assert_eq!(src.reads, 2, "the rest in one read");
        st.grow(RX_STAGE);
        assert_eq!(st.capacity(), RX_STAGE_IO, "never shrinks");
        // Data of at least RX_STAGE bytes still bypasses the grown stage.
        st.consume(st.held().len());
        let next = vec![9u8; RX_STAGE];
        let mut more = vec![0u8; RX_STAGE];
        let mut src2 = Src {
            data: &next,
            chunk: usize::MAX,
            reads: 0,
        };
        st.rearm(false);
        assert_eq!(st.read(&mut src2, &mut more).unwrap(), RX_STAGE);
        assert!(st.held().is_empty(), "straight into dst");
        assert_eq!(more, next);
    }

    #[test]
    fn held_bytes_are_served_before_the_source_and_large_reads_bypass_the_stage() {
        let data: Vec<u8> = (0..100u8).collect();
        let mut src = Src {
            data: &data,
            chunk: 10,
            reads: 0,
        };
        let mut st = Stage::new();
        let mut a = [0u8; 4];
        assert_eq!(st.read(&mut src, &mut a).unwrap(), 4);
        assert_eq!(
            st.held(),
            &data[4..10],
            "the rest of the first read is held"
        );
        st.consume(2);
        let mut b = [0u8; 8];
        assert_eq!(
            st.read(&mut src, &mut b).unwrap(),
            4,
            "short: only what is held"
        );
        assert_eq!(&b[..4], &data[6..10]);
        // The first read was short (10 of 16 KiB): the socket counts as empty until the
        // next readable event.
        let mut big = vec![0u8; RX_STAGE];
        let e = st.read(&mut src, &mut big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(src.reads, 1);
        st.rearm(false);
        assert_eq!(
            st.read(&mut src, &mut big).unwrap(),
            10,
            "straight into dst"
        );
        assert_eq!(&big[..10], &data[10..20]);
        assert!(st.held().is_empty());
    }
}
