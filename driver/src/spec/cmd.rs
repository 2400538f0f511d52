//! Submission and completion queue entries (spec 4.2 and 4.6), opcodes, and command builders.

use super::status::Status;

/// Admin command opcodes (spec figure "Opcodes for Admin Commands").
pub mod admin_opc {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Doorbell Buffer Config.
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7C;
    /// Format NVM.
    pub const FORMAT_NVM: u8 = 0x80;
}

/// NVM command set opcodes (NVM Command Set Specification, "Opcodes for NVM Commands").
pub mod nvm_opc {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Identify CNS values.
pub mod cns {
    /// Identify Namespace data structure for the NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list (NVMe 1.3): EUI64, NGUID, UUID and, since
    /// 2.0, the namespace's Command Set Identifier.
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
    /// I/O Command Set specific Identify Namespace data structure (CSI in CDW11).
    pub const NAMESPACE_CSI: u8 = 0x05;
    /// I/O Command Set specific Identify Controller data structure (CSI in CDW11).
    pub const CONTROLLER_CSI: u8 = 0x06;
    /// Identify I/O Command Set data structure: the I/O Command Set combinations the
    /// controller supports.
    pub const IO_COMMAND_SETS: u8 = 0x1C;
}

/// Command Set Identifiers (CSI), as in the Namespace Identification Descriptor of type
/// 04h and CDW11 of Identify.
pub mod csi {
    /// NVM Command Set.
    pub const NVM: u8 = 0x00;
    /// Key Value Command Set.
    pub const KEY_VALUE: u8 = 0x01;
    /// Zoned Namespace Command Set.
    pub const ZONED: u8 = 0x02;

    /// The command set's name as the specifications write it.
    pub fn name(csi: u8) -> &'static str {
        match csi {
            NVM => "NVM Command Set",
            KEY_VALUE => "Key Value Command Set",
            ZONED => "Zoned Namespace Command Set",
            _ => "unknown command set",
        }
    }
}

/// Feature identifiers.
pub mod fid {
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration: which events the controller reports.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    /// I/O Command Set Profile (the index of the I/O Command Set combination in use).
    pub const IO_COMMAND_SET_PROFILE: u8 = 0x19;
}

/// Log page identifiers.
pub mod lid {
    /// Error Information.
    pub const ERROR_INFORMATION: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART_HEALTH: u8 = 0x02;
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    /// Discovery (NVMe over Fabrics).
    pub const DISCOVERY: u8 = 0x70;
}

/// An Asynchronous Event Request's completion: dword 0 names the event and the log page
/// that clears it (NVMe Base, "Asynchronous Event Request command", completion queue
/// entry dword 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Asynchronous Event Type (bits 2:0): 0 Error status, 1 SMART / Health status,
    /// 2 Notice, 6 I/O Command specific status, 7 Vendor specific.
    pub kind: u8,
    /// Asynchronous Event Information (bits 15:8): which event of its type.
    pub info: u8,
    /// Log Page Identifier (bits 23:16): reading it (Retain Asynchronous Event cleared)
    /// lets the controller report events of this type again.
    pub log_page: u8,
}

impl AsyncEvent {
    /// The event in completion dword 0 `dw0`.
    pub fn from_dw0(dw0: u32) -> Self {
        AsyncEvent {
            kind: (dw0 & 0x7) as u8,
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }

    /// Completion dword 0 that reports this event.
    pub fn to_dw0(self) -> u32 {
        u32::from(self.kind & 0x7) | u32::from(self.info) << 8 | u32::from(self.log_page) << 16
    }

    /// The event's name as the specification writes it (type, and for a Notice its
    /// information).
    pub fn name(&self) -> &'static str {
        match (self.kind, self.info) {
            (0, _) => "error status",
            (1, _) => "smart / health status",
            (2, 0x00) => "notice: namespace attribute changed",
            (2, 0x01) => "notice: firmware activation starting",
            (2, 0x02) => "notice: telemetry log changed",
            (2, 0x03) => "notice: asymmetric namespace access change",
            (2, 0xF0) => "notice: discovery log page change",
            (2, _) => "notice",
            (6, _) => "i/o command specific status",
            (7, _) => "vendor specific",
            _ => "reserved event type",
        }
    }

    /// How many bytes of its log page to read to clear it: enough for the log's header or
    /// its entries, bounded.
    pub fn clear_len(&self) -> usize {
        match self.log_page {
            lid::ERROR_INFORMATION => 64,
            lid::CHANGED_NAMESPACES => 4096,
            lid::DISCOVERY => 1024,
            _ => 512,
        }
    }
}

/// The NSID that addresses all namespaces.
pub const NSID_ALL: u32 = 0xFFFF_FFFF;

/// A Submission Queue Entry: 64 bytes (spec figure "Common Command Format").
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Sqe {
    /// CDW0: OPC (7:0), FUSE (9:8), PSDT (15:14), CID (31:16).
    pub cdw0: u32,
    /// NSID: Namespace Identifier.
    pub nsid: u32,
    /// CDW2 (command specific).
    pub cdw2: u32,
    /// CDW3 (command specific).
    pub cdw3: u32,
    /// MPTR: Metadata Pointer.
    pub mptr: u64,
    /// DPTR PRP Entry 1.
    pub prp1: u64,
    /// DPTR PRP Entry 2 (a second page or a PRP list pointer).
    pub prp2: u64,
    /// CDW10.
    pub cdw10: u32,
    /// CDW11.
    pub cdw11: u32,
    /// CDW12.
    pub cdw12: u32,
    /// CDW13.
    pub cdw13: u32,
    /// CDW14.
    pub cdw14: u32,
    /// CDW15.
    pub cdw15: u32,
}

const _: () = {
    assert!(core::mem::size_of::<Sqe>() == 64);
    assert!(core::mem::offset_of!(Sqe, nsid) == 4);
    assert!(core::mem::offset_of!(Sqe, mptr) == 16);
    assert!(core::mem::offset_of!(Sqe, prp1) == 24);
    assert!(core::mem::offset_of!(Sqe, prp2) == 32);
    assert!(core::mem::offset_of!(Sqe, cdw10) == 40);
    assert!(core::mem::offset_of!(Sqe, cdw15) == 60);
};

impl Sqe {
    /// A command with the opcode set and everything else zero.
    pub const fn new(opc: u8) -> Self {
        Sqe {
            cdw0: opc as u32,
            nsid: 0,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            prp1: 0,
            prp2: 0,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }
    /// OPC: opcode.
    pub const fn opc(&self) -> u8 {
        self.cdw0 as u8
    }
    /// FUSE: fused operation.
    pub const fn fuse(&self) -> u8 {
        ((self.cdw0 >> 8) & 0x3) as u8
    }
    /// PSDT: PRP or SGL for Data Transfer (0: PRPs).
    pub const fn psdt(&self) -> u8 {
        ((self.cdw0 >> 14) & 0x3) as u8
    }
    /// CID: Command Identifier.
    pub const fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }
    /// Sets CID.
    pub fn set_cid(&mut self, cid: u16) {
        self.cdw0 = (self.cdw0 & 0xFFFF) | ((cid as u32) << 16);
    }
    /// Starting LBA of an NVM I/O command (CDW10/11).
    pub const fn slba(&self) -> u64 {
        (self.cdw10 as u64) | ((self.cdw11 as u64) << 32)
    }
    /// Number of logical blocks of an NVM I/O command (CDW12 NLB, zero-based in the
    /// command; this returns the real count).
    pub const fn nlb(&self) -> u32 {
        (self.cdw12 & 0xFFFF) + 1
    }
    /// The entry as its eight quadwords in order (bytes 0..8, 8..16, ...), each the
    /// little-endian value of those bytes: CDW0 and NSID, CDW2 and CDW3, MPTR, PRP1, PRP2,
    /// CDW10 and CDW11, CDW12 and CDW13, CDW14 and CDW15. How the rings write an entry.
    #[inline]
    pub fn to_qwords(&self) -> [u64; 8] {
        let pair = |lo: u32, hi: u32| (lo as u64) | ((hi as u64) << 32);
        [
            pair(self.cdw0, self.nsid),
            pair(self.cdw2, self.cdw3),
            self.mptr,
            self.prp1,
            self.prp2,
            pair(self.cdw10, self.cdw11),
            pair(self.cdw12, self.cdw13),
            pair(self.cdw14, self.cdw15),
        ]
    }
    /// The entry as little-endian bytes, as it sits in the submission queue.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&self.cdw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        b[8..12].copy_from_slice(&self.cdw2.to_le_bytes());
        b[12..16].copy_from_slice(&self.cdw3.to_le_bytes());
        b[16..24].copy_from_slice(&self.mptr.to_le_bytes());
        b[24..32].copy_from_slice(&self.prp1.to_le_bytes());
        b[32..40].copy_from_slice(&self.prp2.to_le_bytes());
        for (i, dw) in [
            self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
        ]
        .iter()
        .enumerate()
        {
            b[40 + 4 * i..44 + 4 * i].copy_from_slice(&dw.to_le_bytes());
        }
        b
    }
    /// Parses an entry from its little-endian bytes.
    pub fn from_bytes(b: &[u8; 64]) -> Self {
        let d = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let q = |o: usize| (d(o) as u64) | ((d(o + 4) as u64) << 32);
        Sqe {
            cdw0: d(0),
            nsid: d(4),
            cdw2: d(8),
            cdw3: d(12),
            mptr: q(16),
            prp1: q(24),
            prp2: q(32),
            cdw10: d(40),
            cdw11: d(44),
            cdw12: d(48),
            cdw13: d(52),
            cdw14: d(56),
            cdw15: d(60),
        }
    }

    // ---- Admin command builders ----

    /// Identify (CNS, NSID) into a 4 KiB buffer at `prp1`.
    pub fn identify(cns: u8, nsid: u32, prp1: u64) -> Self {
        let mut c = Sqe::new(admin_opc::IDENTIFY);
        c.nsid = nsid;
        c.prp1 = prp1;
        c.cdw10 = cns as u32;
        c
    }
    /// Identify with a Command Set Identifier (CDW11 bits 31:24), for CNS 05h, 06h.
    pub fn identify_csi(cns: u8, nsid: u32, csi: u8, prp1: u64) -> Self {
        let mut c = Sqe::identify(cns, nsid, prp1);
        c.cdw11 = (csi as u32) << 24;
        c
    }
    /// Get Log Page: `numd` dwords (not zero-based) of log `lid` at byte `offset`.
    pub fn get_log_page(lid: u8, nsid: u32, numd: u32, offset: u64, prp1: u64, prp2: u64) -> Self {
        let mut c = Sqe::new(admin_opc::GET_LOG_PAGE);
        let numd0 = numd.saturating_sub(1);
        c.nsid = nsid;
        c.prp1 = prp1;
        c.prp2 = prp2;
        c.cdw10 = ((numd0 & 0xFFFF) << 16) | lid as u32;
        c.cdw11 = numd0 >> 16;
        c.cdw12 = offset as u32;
        c.cdw13 = (offset >> 32) as u32;
        c
    }
    /// Set Features (FID, value in CDW11).
    pub fn set_features(fid: u8, cdw11: u32) -> Self {
        let mut c = Sqe::new(admin_opc::SET_FEATURES);
        c.cdw10 = fid as u32;
        c.cdw11 = cdw11;
        c
    }
    /// Get Features (FID, current value).
    pub fn get_features(fid: u8) -> Self {
        let mut c = Sqe::new(admin_opc::GET_FEATURES);
        c.cdw10 = fid as u32;
        c
    }
    /// Set Features / Number of Queues: request `nsq` submission and `ncq` completion
    /// queues (not zero-based).
    pub fn set_number_of_queues(nsq: u16, ncq: u16) -> Self {
        Self::set_features(
            fid::NUMBER_OF_QUEUES,
            ((ncq.saturating_sub(1) as u32) << 16) | nsq.saturating_sub(1) as u32,
        )
    }
    /// Create I/O Completion Queue (physically contiguous, interrupts disabled).
    pub fn create_io_cq(qid: u16, entries: u16, prp1: u64) -> Self {
        let mut c = Sqe::new(admin_opc::CREATE_IO_CQ);
        c.prp1 = prp1;
        c.cdw10 = ((entries.wrapping_sub(1) as u32) << 16) | qid as u32;
        c.cdw11 = 1; // PC = 1, IEN = 0, IV = 0
        c
    }
    /// Create I/O Completion Queue (physically contiguous) with interrupts enabled on
    /// vector `iv` (IEN = 1).
    pub fn create_io_cq_interrupts(qid: u16, entries: u16, prp1: u64, iv: u16) -> Self {
        let mut c = Self::create_io_cq(qid, entries, prp1);
        c.cdw11 = ((iv as u32) << 16) | 2 | 1; // IV, IEN = 1, PC = 1
        c
    }
    /// Create I/O Submission Queue bound to completion queue `cqid` (contiguous, urgent-free
    /// medium priority is irrelevant under round robin).
    pub fn create_io_sq(qid: u16, entries: u16, cqid: u16, prp1: u64) -> Self {
        let mut c = Sqe::new(admin_opc::CREATE_IO_SQ);
        c.prp1 = prp1;
        c.cdw10 = ((entries.wrapping_sub(1) as u32) << 16) | qid as u32;
        c.cdw11 = ((cqid as u32) << 16) | 1; // PC = 1
        c
    }
    /// Delete I/O Submission Queue.
    pub fn delete_io_sq(qid: u16) -> Self {
        let mut c = Sqe::new(admin_opc::DELETE_IO_SQ);
        c.cdw10 = qid as u32;
        c
    }
    /// Delete I/O Completion Queue.
    pub fn delete_io_cq(qid: u16) -> Self {
        let mut c = Sqe::new(admin_opc::DELETE_IO_CQ);
        c.cdw10 = qid as u32;
        c
    }
    /// Abort the command `cid` on submission queue `sqid`.
    pub fn abort(sqid: u16, cid: u16) -> Self {
        let mut c = Sqe::new(admin_opc::ABORT);
        c.cdw10 = ((cid as u32) << 16) | sqid as u32;
        c
    }
    /// Doorbell Buffer Config: shadow doorbells at `shadow_iova`, EventIdx at `eventidx_iova`.
    pub fn doorbell_buffer_config(shadow_iova: u64, eventidx_iova: u64) -> Self {
        let mut c = Sqe::new(admin_opc::DOORBELL_BUFFER_CONFIG);
        c.prp1 = shadow_iova;
        c.prp2 = eventidx_iova;
        c
    }

    // ---- NVM command builders ----

    fn rw(opc: u8, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Self {
        debug_assert!((1..=65536).contains(&nlb));
        let mut c = Sqe::new(opc);
        c.nsid = nsid;
        c.prp1 = prp1;
        c.prp2 = prp2;
        c.cdw10 = slba as u32;
        c.cdw11 = (slba >> 32) as u32;
        c.cdw12 = nlb.wrapping_sub(1) & 0xFFFF;
        c
    }
    /// Read `nlb` blocks (1..=65536) from `slba`.
    pub fn read(nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Self {
        Self::rw(nvm_opc::READ, nsid, slba, nlb, prp1, prp2)
    }
    /// Write `nlb` blocks (1..=65536) at `slba`.
    pub fn write(nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Self {
        Self::rw(nvm_opc::WRITE, nsid, slba, nlb, prp1, prp2)
    }
    /// Write Zeroes of `nlb` blocks at `slba`; `deallocate` sets DEAC.
    pub fn write_zeroes(nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Self {
        let mut c = Self::rw(nvm_opc::WRITE_ZEROES, nsid, slba, nlb, 0, 0);
        if deallocate {
            c.cdw12 |= 1 << 25;
        }
        c
    }
    /// Flush.
    pub fn flush(nsid: u32) -> Self {
        let mut c = Sqe::new(nvm_opc::FLUSH);
        c.nsid = nsid;
        c
    }
    /// Dataset Management with the Deallocate attribute over `nr` ranges (1..=256) described
    /// by [`DsmRange`] entries at `prp1`.
    pub fn deallocate(nsid: u32, nr: u32, prp1: u64) -> Self {
        let mut c = Sqe::new(nvm_opc::DATASET_MANAGEMENT);
        c.nsid = nsid;
        c.prp1 = prp1;
        c.cdw10 = nr.saturating_sub(1) & 0xFF;
        c.cdw11 = 1 << 2; // AD: attribute deallocate
        c
    }
}

/// A Dataset Management range (16 bytes, spec "Dataset Management – Range Definition").
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct DsmRange {
    /// Context Attributes.
    pub cattr: u32,
    /// Length in logical blocks.
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}

const _: () = assert!(core::mem::size_of::<DsmRange>() == 16);

impl DsmRange {
    /// The range as little-endian bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.cattr.to_le_bytes());
        b[4..8].copy_from_slice(&self.nlb.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }
    /// Parses a range from its little-endian bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        DsmRange {
            cattr: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            nlb: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            slba: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }
}

/// A Completion Queue Entry: 16 bytes (spec figure "Common Completion Queue Entry Layout").
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Cqe {
    /// DW0: command specific result.
    pub dw0: u32,
    /// DW1: command specific.
    pub dw1: u32,
    /// SQHD: SQ Head Pointer.
    pub sqhd: u16,
    /// SQID: SQ Identifier.
    pub sqid: u16,
    /// CID: Command Identifier.
    pub cid: u16,
    /// Phase Tag (bit 0) and Status Field (bits 15:1).
    pub status: u16,
}

const _: () = {
    assert!(core::mem::size_of::<Cqe>() == 16);
    assert!(core::mem::offset_of!(Cqe, sqhd) == 8);
    assert!(core::mem::offset_of!(Cqe, sqid) == 10);
    assert!(core::mem::offset_of!(Cqe, cid) == 12);
    assert!(core::mem::offset_of!(Cqe, status) == 14);
};

impl Cqe {
    /// P: Phase Tag.
    pub const fn phase(&self) -> bool {
        self.status & 1 != 0
    }
    /// The decoded Status Field.
    pub const fn status(&self) -> Status {
        Status::from_cqe_status(self.status)
    }
    /// Packs CID and the status/phase halfword into DW3, as the controller writes it.
    pub const fn dw3(&self) -> u32 {
        (self.cid as u32) | ((self.status as u32) << 16)
    }
    /// Packs SQHD and SQID into DW2.
    pub const fn dw2(&self) -> u32 {
        (self.sqhd as u32) | ((self.sqid as u32) << 16)
    }
    /// Rebuilds an entry from its four dwords.
    pub const fn from_dwords(dw0: u32, dw1: u32, dw2: u32, dw3: u32) -> Self {
        Cqe {
            dw0,
            dw1,
            sqhd: dw2 as u16,
            sqid: (dw2 >> 16) as u16,
            cid: dw3 as u16,
            status: (dw3 >> 16) as u16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_event_dword_0() {
        // Notice (2), namespace attribute changed (00h), Changed Namespace List (04h).
        let e = AsyncEvent::from_dw0(0x0004_0002);
        assert_eq!(
            e,
            AsyncEvent {
                kind: 2,
                info: 0,
                log_page: lid::CHANGED_NAMESPACES
            }
        );
        assert_eq!(e.name(), "notice: namespace attribute changed");
        assert_eq!(e.to_dw0(), 0x0004_0002);
        assert_eq!(e.clear_len(), 4096);
        // SMART / Health (1), temperature threshold (01h), SMART log (02h).
        let s = AsyncEvent::from_dw0(0x0002_0101);
        assert_eq!((s.kind, s.info, s.log_page), (1, 1, lid::SMART_HEALTH));
        assert_eq!(s.name(), "smart / health status");
    }

    #[test]
    fn sqe_bytes_round_trip() {
        let mut c = Sqe::read(1, 0x1_2345_6789, 8, 0x1000, 0x2000);
        c.set_cid(0xBEEF);
        let b = c.to_bytes();
        assert_eq!(b[0], nvm_opc::READ);
        assert_eq!(u16::from_le_bytes([b[2], b[3]]), 0xBEEF);
        assert_eq!(Sqe::from_bytes(&b), c);
        let q = c.to_qwords();
        for (i, v) in q.iter().enumerate() {
            assert_eq!(&b[8 * i..8 * i + 8], &v.to_le_bytes(), "quadword {i}");
        }
        assert_eq!(c.slba(), 0x1_2345_6789);
        assert_eq!(c.nlb(), 8);
        assert_eq!(c.cid(), 0xBEEF);
        assert_eq!(c.opc(), nvm_opc::READ);
    }

    #[test]
    fn queue_builders_are_zero_based() {
        let c = Sqe::create_io_sq(3, 256, 3, 0x4000);
        assert_eq!(c.cdw10, (255 << 16) | 3);
        assert_eq!(c.cdw11, (3 << 16) | 1);
        let q = Sqe::set_number_of_queues(4, 4);
        assert_eq!(q.cdw11, (3 << 16) | 3);
        let l = Sqe::get_log_page(lid::SMART_HEALTH, NSID_ALL, 128, 0, 0x1000, 0);
        assert_eq!(l.cdw10, (127 << 16) | 2);
        let wz = Sqe::write_zeroes(1, 10, 1, true);
        assert_eq!(wz.cdw12, 1 << 25);
    }

    #[test]
    fn cqe_dwords_round_trip() {
        let e = Cqe {
            dw0: 7,
            dw1: 0,
            sqhd: 12,
            sqid: 1,
            cid: 99,
            status: (0x02 << 1) | 1,
        };
        assert_eq!(Cqe::from_dwords(e.dw0, e.dw1, e.dw2(), e.dw3()), e);
        assert!(e.phase());
        assert_eq!(e.status().sc, 0x02);
    }
}
