//! The receive stage: one `read` of the socket takes up to [`RX_STAGE`] bytes, and PDU
//! headers, padding, digests and small data are served from it. Without it a 4 KiB read
//! command cost two reads (the 8-byte common header, then the rest of the header) and a
//! write three; with it a burst of commands costs one read, as SPDK's target reads
//! through its receive pipe. Data is still read straight into its destination when the
//! stage is empty and the data at least as long as the stage.

use std::io::{self, Read};

/// Bytes the stage holds (part of each connection's fixed size in the budget).
pub const RX_STAGE: usize = 16 << 10;

/// Bytes read from the socket and not yet consumed.
pub(super) struct Stage {
    buf: Box<[u8]>,
    head: usize,
    tail: usize,
}

impl Stage {
    pub(super) fn new() -> Self {
        Stage {
            buf: vec![0; RX_STAGE].into_boxed_slice(),
            head: 0,
            tail: 0,
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

    /// Reads into `dst`: from the bytes held, else one read of `src` (into the stage, or
    /// into `dst` itself when it is at least as long as the stage). `Ok(0)`: end of stream.
    pub(super) fn read(&mut self, mut src: impl Read, dst: &mut [u8]) -> io::Result<usize> {
        if self.head == self.tail {
            if dst.len() >= self.buf.len() {
                return src.read(dst);
            }
            let n = src.read(&mut self.buf)?;
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
        assert_eq!(
            e.kind(),
            io::ErrorKind::WouldBlock,
            "drained: the socket's own answer"
        );
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
        let mut big = vec![0u8; RX_STAGE];
        assert_eq!(
            st.read(&mut src, &mut big).unwrap(),
            10,
            "straight into dst"
        );
        assert_eq!(&big[..10], &data[10..20]);
        assert!(st.held().is_empty());
    }
}
