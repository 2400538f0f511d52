//! The check of a request at submit: what the namespace supports, its range and lengths,
//! and (for `submit`) that its buffers are lent to the queue.

use crate::io::{InvalidRequest, IoOp, IoRequest};

use super::TcpQueue;

impl TcpQueue {
    /// The checks of a request (what the namespace supports, range, lengths, buffers lent
    /// when `leased`).
    pub(super) fn validate(&self, req: &IoRequest, leased: bool) -> Result<(), InvalidRequest> {
        self.check_kind(req)?;
        let op = req.op;
        if !op.has_range() {
            return Ok(());
        }
        InvalidRequest::check_range(op, self.nsid, req.lba, req.nlb, self.num_blocks)?;
        if !op.has_data() {
            return Ok(());
        }
        let need = u64::from(req.nlb) * u64::from(self.block_size);
        let have = req.data.total_len() as u64;
        if have < need || need > u64::from(u32::MAX) {
            return Err(InvalidRequest::LengthMismatch {
                op: op.name(),
                nlb: req.nlb,
                block_size: self.block_size,
                need,
                have,
            });
        }
        if leased {
            for (index, s) in req.data.as_slice().iter().enumerate() {
                if !self.leases.holds(s) {
                    return Err(InvalidRequest::NotLent {
                        index,
                        iova: s.iova(),
                        len: s.len(),
                    });
                }
            }
        }
        Ok(())
    }

    /// What the operation needs of the namespace: its NSID, no metadata, data segments
    /// only where it moves data, and support for it.
    fn check_kind(&self, req: &IoRequest) -> Result<(), InvalidRequest> {
        let op = req.op;
        if op.is_zoned() {
            return Err(InvalidRequest::NotZoned {
                op: op.name(),
                nsid: self.nsid,
            });
        }
        if req.nsid != self.nsid {
            return Err(InvalidRequest::InactiveNamespace { nsid: req.nsid });
        }
        if req.meta.with {
            return Err(InvalidRequest::Metadata {
                op: op.name(),
                nsid: self.nsid,
                nlb: req.nlb,
                ms: 0,
                extended: false,
                why: "the namespace is used without metadata over nvme/tcp",
            });
        }
        InvalidRequest::check_segment_count(op, req.data.len())?;
        let unsupported = match op {
            IoOp::WriteZeroes => !self.info.write_zeroes,
            IoOp::Deallocate => !self.info.deallocate || self.in_capsule < 16,
            _ => false,
        };
        if unsupported {
            return Err(InvalidRequest::Unsupported { op: op.name() });
        }
        Ok(())
    }
}
