//! The namespace table of a queue pair: what checking a request and building its
//! command need of each namespace, copied once from the controller's list.

use crate::nvme::init::NsInfo;

/// What the I/O path needs of one namespace, copied from its [`NsInfo`] when the qpair is
/// made (a controller's namespace list is fixed for its lifetime), so checking a request
/// and building its command read one 32-byte entry, found by NSID with one index
/// (`IoQpair::ns_index`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(super) struct IoNs {
    pub(super) num_blocks: u64,
    pub(super) nsid: u32,
    pub(super) block_size: u32,
    /// Blocks per command: MDTS and the PRP list size in bytes, at most 65536 (the NLB
    /// field is 16 bits, zero-based).
    pub(super) chunk_blocks: u32,
    /// CDW12 bits of every Read and Write (PRACT and the checks; 0 without protection
    /// information).
    pub(super) rw_cdw12: u32,
    /// CDW12 bits of every Write Zeroes (PRACT alone: no data comes from the host to
    /// check).
    pub(super) wz_cdw12: u32,
    /// [`ns_flags`] bits.
    pub(super) flags: u8,
    /// CDW14 of Reads, Writes and Write Zeroes carries the initial reference tag (the
    /// starting LBA's low 32 bits): a byte of its own, read as the tracker's flag as it
    /// is.
    pub(super) reftag: bool,
    /// MS: metadata bytes per block (0: none).
    pub(super) ms: u16,
}

const _: () = assert!(std::mem::size_of::<IoNs>() == 32);

/// [`IoNs::flags`] bits.
pub(super) mod ns_flags {
    /// The driver does I/O to the namespace (it implements its format).
    pub const SERVED: u8 = 1 << 0;
    /// Write Zeroes is supported (ONCS).
    pub const WRITE_ZEROES: u8 = 1 << 1;
    /// Deallocate is supported (ONCS DSM).
    pub const DEALLOCATE: u8 = 1 << 2;
    /// A zoned namespace (its zone geometry is in the controller's `NsInfo`).
    pub const ZONED: u8 = 1 << 3;
    /// Every Read and Write must carry the caller's metadata (`IoRequest::meta`): the
    /// format has metadata the controller cannot insert and strip itself (PRACT).
    pub const NEEDS_META: u8 = 1 << 4;
    /// The metadata is interleaved with the data (an extended LBA).
    pub const EXTENDED: u8 = 1 << 5;
    /// A whole one-segment Read or Write of this namespace may take the submission fast
    /// path (`IoQpair::check_direct`), which then needs only this one bit of the flags:
    /// the namespace is `SERVED` without `NEEDS_META`, its entry is at index `nsid - 1`
    /// of the table (so finding it needs no NSID compare), and it holds at least one
    /// command's blocks (`num_blocks >= chunk_blocks`, so `num_blocks - nlb` cannot wrap
    /// for a request of at most `chunk_blocks`).
    pub const DIRECT: u8 = 1 << 6;
}

impl IoNs {
    /// No namespace (an unused parent slot's).
    pub(super) const NONE: IoNs = IoNs {
        num_blocks: 0,
        nsid: 0,
        block_size: 0,
        chunk_blocks: 1,
        rw_cdw12: 0,
        wz_cdw12: 0,
        flags: 0,
        reftag: false,
        ms: 0,
    };

    /// The entry of namespace `n`, to be put at `index` of the table.
    pub(super) fn of(n: &NsInfo, max_command_bytes: u64, index: usize) -> Self {
        let prot = n.protection;
        let pi = prot.pi_type != 0;
        let (rw_cdw12, wz_cdw12) = if pi {
            (prot.command_dwords(0).0, prot.write_zeroes_dwords(0).0)
        } else {
            (0, 0)
        };
        let bs = n.block_size.max(1);
        let flags = if n.unsupported.is_none() {
            ns_flags::SERVED
        } else {
            0
        } | if n.write_zeroes {
            ns_flags::WRITE_ZEROES
        } else {
            0
        } | if n.deallocate {
            ns_flags::DEALLOCATE
        } else {
            0
        } | if n.zones.is_some() {
            ns_flags::ZONED
        } else {
            0
        } | if prot.required() {
            ns_flags::NEEDS_META
        } else {
            0
        } | if prot.extended { ns_flags::EXTENDED } else { 0 };
        let chunk_blocks = ((max_command_bytes / bs as u64).min(65536) as u32).max(1);
        let direct = flags & (ns_flags::SERVED | ns_flags::NEEDS_META) == ns_flags::SERVED
            && n.nsid as usize == index + 1
            && n.num_blocks >= chunk_blocks as u64;
        IoNs {
            num_blocks: n.num_blocks,
            nsid: n.nsid,
            block_size: n.block_size,
            chunk_blocks,
            rw_cdw12,
            wz_cdw12,
            flags: flags | if direct { ns_flags::DIRECT } else { 0 },
            reftag: pi && prot.ref_tag,
            ms: prot.ms,
        }
    }

    /// The entry as a request carrying the caller's metadata sees it: with extended LBAs
    /// each block in the data buffer is `block_size + ms` bytes, so a command carries
    /// fewer of them (the same bytes at most: the tracker's PRP list still covers it).
    #[cold]
    pub(super) fn with_meta(&self) -> IoNs {
        if !self.has(ns_flags::EXTENDED) {
            return *self;
        }
        let host = self.block_size + u32::from(self.ms);
        let bytes = u64::from(self.chunk_blocks) * u64::from(self.block_size);
        IoNs {
            block_size: host,
            chunk_blocks: ((bytes / u64::from(host)) as u32).max(1),
            ..*self
        }
    }
    #[inline]
    pub(super) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}
