//! The receive stage: one `recv` takes what the socket has (up to [`RX_STAGE`] bytes), and
//! PDU headers, padding, digests and data that came in the same call are served from it.
//! Without it a 4 KiB read cost three `recv` calls (C2HData's header, its data, the
//! response's header) and a fourth that found the socket empty; with it a burst of PDUs
//! costs one. Data not yet received goes straight into the request's memory, with what
//! follows it into the stage in the same call (`rx.rs`).

use std::io::{self, Read};

/// Bytes the stage holds (allocated once per queue, at connect).
pub(super) const RX_STAGE: usize = 32 << 10;

/// Bytes received and not yet consumed, `buf[head..tail]`.
pub(super) struct Stage {
    buf: Box<[u8]>,
    head: usize,
    tail: usize,
    /// The last receive got less than it had room for: the socket was empty then, and the
    /// receive loop stops there rather than ask again (the next poll does).
    drained: bool,
}

impl Stage {
    pub(super) fn new() -> Stage {
        Stage {
            buf: vec![0; RX_STAGE].into_boxed_slice(),
            head: 0,
            tail: 0,
            drained: false,
        }
    }

    /// Bytes held and not yet consumed.
    pub(super) fn held(&self) -> &[u8] {
        &self.buf[self.head..self.tail]
    }

    /// Consumes `n` of the bytes held.
    pub(super) fn consume(&mut self, n: usize) {
        self.head = (self.head + n).min(self.tail);
    }

    /// Forgets everything held (a connection made again starts a new stream).
    pub(super) fn clear(&mut self) {
        self.head = 0;
        self.tail = 0;
        self.drained = false;
    }

    /// A new receive loop: the socket may have something again.
    pub(super) fn rearm(&mut self) {
        self.drained = false;
    }

    /// Whether the last receive found the socket emptied.
    pub(super) fn drained(&self) -> bool {
        self.drained
    }

    /// One receive from `src` after the bytes held (moved to the front first); `Ok(0)` is
    /// end of stream.
    pub(super) fn fill(&mut self, mut src: impl Read) -> io::Result<usize> {
        if self.head > 0 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        let room = self.buf.len() - self.tail;
        let r = src.read(&mut self.buf[self.tail..]);
        match r {
            Ok(n) => {
                self.tail += n;
                self.drained = n < room;
            }
            Err(ref e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
            Err(_) => {}
        }
        r
    }

    /// The whole (empty) stage for a receive that puts its first bytes elsewhere
    /// ([`sock::recv_split`](super::super::sock::recv_split)); [`Stage::spilled`] then
    /// says how many landed here.
    pub(super) fn spill_area(&mut self) -> &mut [u8] {
        self.head = 0;
        self.tail = 0;
        &mut self.buf
    }

    /// After a receive into `want` bytes elsewhere and then the stage: it got `n` bytes in
    /// all; returns how many went elsewhere.
    pub(super) fn spilled(&mut self, want: usize, n: usize) -> usize {
        self.tail = n.saturating_sub(want);
        self.drained = n < want + self.buf.len();
        n.min(want)
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
    fn one_fill_serves_many_pdus_and_a_short_one_means_drained() {
        let data: Vec<u8> = (0..=255u8).cycle().take(3 * 4120).collect();
        let mut src = Src {
            data: &data,
            chunk: usize::MAX,
            reads: 0,
        };
        let mut st = Stage::new();
        assert_eq!(st.fill(&mut src).unwrap(), data.len());
        assert!(st.drained(), "less than the room: the socket had no more");
        let mut got = Vec::new();
        while !st.held().is_empty() {
            let n = st.held().len().min(24);
            got.extend_from_slice(&st.held()[..n]);
            st.consume(n);
        }
        assert_eq!(got, data);
        assert_eq!(src.reads, 1);
    }

    #[test]
    fn a_partial_header_is_moved_to_the_front_and_completed() {
        let data: Vec<u8> = (0..RX_STAGE + 30).map(|i| i as u8).collect();
        let mut src = Src {
            data: &data,
            chunk: usize::MAX,
            reads: 0,
        };
        let mut st = Stage::new();
        assert_eq!(st.fill(&mut src).unwrap(), RX_STAGE);
        assert!(!st.drained(), "a full stage: the socket may hold more");
        st.consume(RX_STAGE - 10);
        assert_eq!(st.fill(&mut src).unwrap(), 30);
        assert_eq!(st.held(), &data[RX_STAGE - 10..]);
        st.rearm();
        assert!(!st.drained());
        assert_eq!(
            st.fill(&mut src).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert!(st.drained());
    }

    #[test]
    fn spilled_counts_what_landed_in_the_stage() {
        let mut st = Stage::new();
        let _ = st.spill_area();
        assert_eq!(st.spilled(4096, 4096 + 24), 4096);
        assert_eq!(st.held().len(), 24);
        assert!(st.drained());
        let _ = st.spill_area();
        assert_eq!(st.spilled(4096, 100), 100);
        assert!(st.held().is_empty());
        st.clear();
        assert!(!st.drained());
    }
}
