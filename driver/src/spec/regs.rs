//! Controller registers (NVMe Base Specification 2.0, section 3.1.3; 1.4, section 3.1).
//!
//! Each register is a newtype over its raw value with accessors named after the
//! spec's field mnemonics. The newtypes are plain values: reading and writing the
//! device goes through [`crate::hw::mmio::Bar`], never through a reference into BAR
//! memory (`Bar` reads and writes a register with `hw::barrier::read_once`/`write_once`
//! on a raw pointer, one 32-bit access each, ordered against DMA memory as Linux's
//! `readl`/`writel`).

/// Byte offsets of the controller registers in BAR0.
pub mod offset {
    /// Controller Capabilities (64 bit).
    pub const CAP: usize = 0x00;
    /// Version.
    pub const VS: usize = 0x08;
    /// Interrupt Mask Set.
    pub const INTMS: usize = 0x0C;
    /// Interrupt Mask Clear.
    pub const INTMC: usize = 0x10;
    /// Controller Configuration.
    pub const CC: usize = 0x14;
    /// Controller Status.
    pub const CSTS: usize = 0x1C;
    /// NVM Subsystem Reset.
    pub const NSSR: usize = 0x20;
    /// Admin Queue Attributes.
    pub const AQA: usize = 0x24;
    /// Admin Submission Queue Base Address (64 bit).
    pub const ASQ: usize = 0x28;
    /// Admin Completion Queue Base Address (64 bit).
    pub const ACQ: usize = 0x30;
    /// Controller Memory Buffer Location.
    pub const CMBLOC: usize = 0x38;
    /// Controller Memory Buffer Size.
    pub const CMBSZ: usize = 0x3C;
    /// First doorbell register (SQ0TDBL).
    pub const DOORBELLS: usize = 0x1000;
}

/// The value written to NSSR to request an NVM Subsystem Reset ("NVMe" in ASCII).
pub const NSSR_RESET_VALUE: u32 = 0x4E56_4D65;

/// The memory page size the driver programs in CC.MPS (2 ^ (12 + MPS)); Kestrel uses 4 KiB.
pub const PAGE_SIZE: usize = 4096;

const fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

const fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

const fn set32(v: u32, lo: u32, width: u32, field: u32) -> u32 {
    let mask = ((1u32 << width) - 1) << lo;
    (v & !mask) | ((field << lo) & mask)
}

const fn set64(v: u64, lo: u32, width: u32, field: u64) -> u64 {
    let mask = ((1u64 << width) - 1) << lo;
    (v & !mask) | ((field << lo) & mask)
}

/// CAP: Controller Capabilities.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Cap(pub u64);

impl Cap {
    /// MQES: Maximum Queue Entries Supported, zero-based (a value of 1 means two entries).
    pub const fn mqes(self) -> u16 {
        bits64(self.0, 0, 16) as u16
    }
    /// The largest queue size in entries (MQES + 1).
    pub const fn max_queue_entries(self) -> u32 {
        self.mqes() as u32 + 1
    }
    /// CQR: Contiguous Queues Required.
    pub const fn cqr(self) -> bool {
        bits64(self.0, 16, 1) != 0
    }
    /// AMS: Arbitration Mechanism Supported.
    pub const fn ams(self) -> u8 {
        bits64(self.0, 17, 2) as u8
    }
    /// TO: worst-case time to wait for CSTS.RDY to change, in 500 ms units.
    pub const fn to(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }
    /// CAP.TO in milliseconds.
    pub const fn timeout_ms(self) -> u64 {
        self.to() as u64 * 500
    }
    /// DSTRD: Doorbell Stride; doorbells are `4 << DSTRD` bytes apart.
    pub const fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }
    /// NSSRS: NVM Subsystem Reset Supported.
    pub const fn nssrs(self) -> bool {
        bits64(self.0, 36, 1) != 0
    }
    /// CSS: Command Sets Supported (bit 0: NVM command set).
    pub const fn css(self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }
    /// BPS: Boot Partition Support.
    pub const fn bps(self) -> bool {
        bits64(self.0, 45, 1) != 0
    }
    /// MPSMIN: minimum memory page size, 2 ^ (12 + MPSMIN).
    pub const fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }
    /// MPSMAX: maximum memory page size, 2 ^ (12 + MPSMAX).
    pub const fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }
    /// PMRS: Persistent Memory Region Supported.
    pub const fn pmrs(self) -> bool {
        bits64(self.0, 56, 1) != 0
    }
    /// CMBS: Controller Memory Buffer Supported.
    pub const fn cmbs(self) -> bool {
        bits64(self.0, 57, 1) != 0
    }

    /// Returns CAP with MQES set (zero-based).
    pub const fn with_mqes(self, v: u16) -> Self {
        Self(set64(self.0, 0, 16, v as u64))
    }
    /// Returns CAP with CQR set.
    pub const fn with_cqr(self, v: bool) -> Self {
        Self(set64(self.0, 16, 1, v as u64))
    }
    /// Returns CAP with TO set (500 ms units).
    pub const fn with_to(self, v: u8) -> Self {
        Self(set64(self.0, 24, 8, v as u64))
    }
    /// Returns CAP with DSTRD set.
    pub const fn with_dstrd(self, v: u8) -> Self {
        Self(set64(self.0, 32, 4, v as u64))
    }
    /// Returns CAP with CSS set.
    pub const fn with_css(self, v: u8) -> Self {
        Self(set64(self.0, 37, 8, v as u64))
    }
    /// Returns CAP with MPSMIN set.
    pub const fn with_mpsmin(self, v: u8) -> Self {
        Self(set64(self.0, 48, 4, v as u64))
    }
    /// Returns CAP with MPSMAX set.
    pub const fn with_mpsmax(self, v: u8) -> Self {
        Self(set64(self.0, 52, 4, v as u64))
    }
}

impl core::fmt::Debug for Cap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cap")
            .field("raw", &format_args!("{:#018x}", self.0))
            .field("mqes", &self.mqes())
            .field("cqr", &self.cqr())
            .field("to", &self.to())
            .field("dstrd", &self.dstrd())
            .field("css", &self.css())
            .field("mpsmin", &self.mpsmin())
            .field("mpsmax", &self.mpsmax())
            .finish()
    }
}

/// VS: Version.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Vs(pub u32);

impl Vs {
    /// NVMe 1.4.0.
    pub const V1_4_0: Vs = Vs::new(1, 4, 0);
    /// Builds a version value.
    pub const fn new(mjr: u16, mnr: u8, ter: u8) -> Self {
        Self(((mjr as u32) << 16) | ((mnr as u32) << 8) | ter as u32)
    }
    /// MJR: major version.
    pub const fn mjr(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// MNR: minor version.
    pub const fn mnr(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// TER: tertiary version.
    pub const fn ter(self) -> u8 {
        self.0 as u8
    }
}

impl core::fmt::Display for Vs {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{}", self.mjr(), self.mnr(), self.ter())
    }
}

/// CC.SHN / CSTS.SHST values.
pub mod shutdown {
    /// CC.SHN: normal shutdown notification.
    pub const SHN_NORMAL: u8 = 0b01;
    /// CC.SHN: abrupt shutdown notification.
    pub const SHN_ABRUPT: u8 = 0b10;
    /// CSTS.SHST: normal operation, no shutdown requested.
    pub const SHST_NORMAL: u8 = 0b00;
    /// CSTS.SHST: shutdown processing occurring.
    pub const SHST_OCCURRING: u8 = 0b01;
    /// CSTS.SHST: shutdown processing complete.
    pub const SHST_COMPLETE: u8 = 0b10;
}

/// Command set values: CAP.CSS bits and CC.CSS selections.
pub mod css {
    /// CAP.CSS bit 0: NVM Command Set.
    pub const CAP_NVM: u8 = 1 << 0;
    /// CAP.CSS bit 6: one or more I/O Command Sets (CC.CSS = 110b may be selected).
    pub const CAP_IO_COMMAND_SETS: u8 = 1 << 6;
    /// CAP.CSS bit 7: no I/O Command Set (Admin only).
    pub const CAP_NO_IO: u8 = 1 << 7;
    /// CC.CSS 000b: NVM Command Set.
    pub const CC_NVM: u8 = 0b000;
    /// CC.CSS 110b: All Supported I/O Command Sets.
    pub const CC_ALL_IO: u8 = 0b110;
    /// CC.CSS 111b: Admin Command Set only.
    pub const CC_ADMIN_ONLY: u8 = 0b111;
}

/// CC: Controller Configuration.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Cc(pub u32);

impl Cc {
    /// EN: Enable.
    pub const fn en(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }
    /// CSS: I/O Command Set Selected (0: NVM).
    pub const fn css(self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }
    /// MPS: Memory Page Size, 2 ^ (12 + MPS).
    pub const fn mps(self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }
    /// AMS: Arbitration Mechanism Selected.
    pub const fn ams(self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }
    /// SHN: Shutdown Notification.
    pub const fn shn(self) -> u8 {
        bits32(self.0, 14, 2) as u8
    }
    /// IOSQES: I/O Submission Queue Entry Size, 2 ^ n bytes.
    pub const fn iosqes(self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }
    /// IOCQES: I/O Completion Queue Entry Size, 2 ^ n bytes.
    pub const fn iocqes(self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }
    /// Returns CC with EN set.
    pub const fn with_en(self, v: bool) -> Self {
        Self(set32(self.0, 0, 1, v as u32))
    }
    /// Returns CC with CSS set.
    pub const fn with_css(self, v: u8) -> Self {
        Self(set32(self.0, 4, 3, v as u32))
    }
    /// Returns CC with MPS set.
    pub const fn with_mps(self, v: u8) -> Self {
        Self(set32(self.0, 7, 4, v as u32))
    }
    /// Returns CC with AMS set.
    pub const fn with_ams(self, v: u8) -> Self {
        Self(set32(self.0, 11, 3, v as u32))
    }
    /// Returns CC with SHN set.
    pub const fn with_shn(self, v: u8) -> Self {
        Self(set32(self.0, 14, 2, v as u32))
    }
    /// Returns CC with IOSQES set.
    pub const fn with_iosqes(self, v: u8) -> Self {
        Self(set32(self.0, 16, 4, v as u32))
    }
    /// Returns CC with IOCQES set.
    pub const fn with_iocqes(self, v: u8) -> Self {
        Self(set32(self.0, 20, 4, v as u32))
    }
}

/// CSTS: Controller Status.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Csts(pub u32);

impl Csts {
    /// RDY: Ready.
    pub const fn rdy(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }
    /// CFS: Controller Fatal Status.
    pub const fn cfs(self) -> bool {
        bits32(self.0, 1, 1) != 0
    }
    /// SHST: Shutdown Status.
    pub const fn shst(self) -> u8 {
        bits32(self.0, 2, 2) as u8
    }
    /// NSSRO: NVM Subsystem Reset Occurred.
    pub const fn nssro(self) -> bool {
        bits32(self.0, 4, 1) != 0
    }
    /// PP: Processing Paused.
    pub const fn pp(self) -> bool {
        bits32(self.0, 5, 1) != 0
    }
    /// All ones: what a read of a removed PCIe device returns.
    pub const fn is_all_ones(self) -> bool {
        self.0 == u32::MAX
    }
    /// Returns CSTS with RDY set.
    pub const fn with_rdy(self, v: bool) -> Self {
        Self(set32(self.0, 0, 1, v as u32))
    }
    /// Returns CSTS with CFS set.
    pub const fn with_cfs(self, v: bool) -> Self {
        Self(set32(self.0, 1, 1, v as u32))
    }
    /// Returns CSTS with SHST set.
    pub const fn with_shst(self, v: u8) -> Self {
        Self(set32(self.0, 2, 2, v as u32))
    }
}

/// AQA: Admin Queue Attributes (both sizes zero-based).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Aqa(pub u32);

impl Aqa {
    /// Builds AQA from queue sizes in entries (not zero-based).
    pub const fn new(sq_entries: u16, cq_entries: u16) -> Self {
        Self((((cq_entries as u32 - 1) & 0xFFF) << 16) | ((sq_entries as u32 - 1) & 0xFFF))
    }
    /// ASQS: Admin Submission Queue Size, zero-based.
    pub const fn asqs(self) -> u16 {
        bits32(self.0, 0, 12) as u16
    }
    /// ACQS: Admin Completion Queue Size, zero-based.
    pub const fn acqs(self) -> u16 {
        bits32(self.0, 16, 12) as u16
    }
}

/// CMBLOC: Controller Memory Buffer Location (kept raw; Kestrel does not use the CMB).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Cmbloc(pub u32);

/// CMBSZ: Controller Memory Buffer Size (kept raw; Kestrel does not use the CMB).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Cmbsz(pub u32);

/// Which doorbell of a queue pair.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DoorbellKind {
    /// SQyTDBL: Submission Queue y Tail Doorbell.
    SqTail,
    /// CQyHDBL: Completion Queue y Head Doorbell.
    CqHead,
}

/// Byte offset in BAR0 of a queue's doorbell, from CAP.DSTRD (spec 3.1.3.24/25):
/// SQyTDBL at `1000h + (2y) * (4 << DSTRD)`, CQyHDBL at `1000h + (2y + 1) * (4 << DSTRD)`.
pub const fn doorbell_offset(dstrd: u8, qid: u16, kind: DoorbellKind) -> usize {
    let stride = 4usize << dstrd;
    let index = 2 * qid as usize
        + match kind {
            DoorbellKind::SqTail => 0,
            DoorbellKind::CqHead => 1,
        };
    offset::DOORBELLS + index * stride
}

/// Index of a queue's doorbell in a shadow doorbell / EventIdx buffer (Doorbell Buffer
/// Config, spec 5.8): the same layout as the registers, in units of `4 << DSTRD` bytes.
pub const fn shadow_doorbell_index(dstrd: u8, qid: u16, kind: DoorbellKind) -> usize {
    (doorbell_offset(dstrd, qid, kind) - offset::DOORBELLS) / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_cap_decodes() {
        // CAP as QEMU 7.2's NVMe model reports it.
        let cap = Cap(0x0040_1820_0f01_07ff);
        assert_eq!(cap.mqes(), 2047);
        assert!(cap.cqr());
        assert_eq!(cap.dstrd(), 0);
        assert_eq!(cap.to(), 15);
        assert_eq!(cap.timeout_ms(), 7500);
        assert_eq!(cap.css(), 0xc1);
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
    }

    #[test]
    fn cap_builders_round_trip() {
        let cap = Cap::default()
            .with_mqes(1023)
            .with_cqr(true)
            .with_to(4)
            .with_dstrd(2)
            .with_css(1)
            .with_mpsmin(0)
            .with_mpsmax(4);
        assert_eq!(cap.mqes(), 1023);
        assert!(cap.cqr());
        assert_eq!(cap.to(), 4);
        assert_eq!(cap.dstrd(), 2);
        assert_eq!(cap.css(), 1);
        assert_eq!(cap.mpsmax(), 4);
    }

    #[test]
    fn cc_fields() {
        let cc = Cc::default()
            .with_iosqes(6)
            .with_iocqes(4)
            .with_mps(0)
            .with_css(0)
            .with_en(true);
        assert_eq!(cc.0, 0x0046_0001);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        let cc = cc.with_shn(shutdown::SHN_NORMAL);
        assert_eq!(cc.shn(), 1);
        assert!(!cc.with_en(false).en());
    }

    #[test]
    fn csts_and_vs() {
        let csts = Csts(0).with_rdy(true).with_shst(shutdown::SHST_COMPLETE);
        assert!(csts.rdy());
        assert!(!csts.cfs());
        assert_eq!(csts.shst(), 2);
        assert!(Csts(u32::MAX).is_all_ones());
        assert_eq!(Vs(0x0001_0400).to_string(), "1.4.0");
        assert_eq!(Vs::V1_4_0.0, 0x0001_0400);
    }

    #[test]
    fn aqa_is_zero_based() {
        let aqa = Aqa::new(32, 64);
        assert_eq!(aqa.asqs(), 31);
        assert_eq!(aqa.acqs(), 63);
    }

    #[test]
    fn doorbell_offsets_follow_dstrd() {
        assert_eq!(doorbell_offset(0, 0, DoorbellKind::SqTail), 0x1000);
        assert_eq!(doorbell_offset(0, 0, DoorbellKind::CqHead), 0x1004);
        assert_eq!(doorbell_offset(0, 3, DoorbellKind::SqTail), 0x1018);
        assert_eq!(doorbell_offset(2, 1, DoorbellKind::CqHead), 0x1000 + 3 * 16);
        assert_eq!(shadow_doorbell_index(0, 1, DoorbellKind::CqHead), 3);
    }
}
