//! End-to-end data protection with a 16-bit guard (NVM Command Set Specification,
//! "End-to-end Data Protection"; NVMe 1.4 section 8.3): the 8-byte protection information
//! (PI) tuple, its T10-DIF CRC guard, the PRINFO field of Read and Write, and the
//! reference and application tag rules of protection types 1, 2 and 3.
//!
//! Pure functions over bytes: no I/O, no `unsafe`. The 64-bit guard formats of the NVM
//! Command Set 1.0 (16-byte PI with a storage tag) are not modelled here.
//!
//! # The guard
//! CRC-16/T10-DIF: polynomial 8BB7h, initial value 0, no reflection, no final XOR (the
//! catalogue check value of "123456789" is D0DBh). It covers the logical block's data and,
//! when the PI is the last 8 bytes of a larger metadata area, the metadata bytes before
//! the PI. [`crc16_t10dif`] uses the `crc` crate's 16-lane table (slice-by-16).

use super::status::Status;

/// Bytes of a protection information tuple with a 16-bit guard.
pub const PI_SIZE: usize = 8;

/// Byte offsets inside the tuple (every field big-endian).
pub mod pi_off {
    /// Guard: CRC-16/T10-DIF, big-endian.
    pub const GUARD: usize = 0;
    /// Application Tag, big-endian.
    pub const APP_TAG: usize = 2;
    /// Reference Tag, big-endian.
    pub const REF_TAG: usize = 4;
}

const _: () = {
    assert!(pi_off::GUARD + 2 == pi_off::APP_TAG);
    assert!(pi_off::APP_TAG + 2 == pi_off::REF_TAG);
    assert!(pi_off::REF_TAG + 4 == PI_SIZE);
};

/// The Application Tag value that disables checking of a block (types 1 and 2; with a
/// Reference Tag of [`REF_TAG_ESCAPE`], type 3).
pub const APP_TAG_ESCAPE: u16 = 0xFFFF;
/// The Reference Tag value that, with [`APP_TAG_ESCAPE`], disables checking of a type 3
/// block.
pub const REF_TAG_ESCAPE: u32 = 0xFFFF_FFFF;

static CRC16: crc::Crc<u16, crc::Table<16>> =
    crc::Crc::<u16, crc::Table<16>>::new(&crc::CRC_16_T10_DIF);

/// CRC-16/T10-DIF of `data`: the guard of a block whose PI covers exactly `data`.
pub fn crc16_t10dif(data: &[u8]) -> u16 {
    CRC16.checksum(data)
}

/// A guard computed over several pieces (a block's data, then the metadata bytes before
/// its PI).
pub struct GuardDigest(crc::Digest<'static, u16, crc::Table<16>>);

impl GuardDigest {
    /// An empty computation.
    pub fn new() -> Self {
        GuardDigest(CRC16.digest())
    }
    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    /// The guard.
    pub fn finish(self) -> u16 {
        self.0.finalize()
    }
}

impl Default for GuardDigest {
    fn default() -> Self {
        Self::new()
    }
}

/// A protection information tuple (16-bit guard).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PiTuple {
    /// Guard: the CRC of the block.
    pub guard: u16,
    /// Application Tag.
    pub app_tag: u16,
    /// Reference Tag.
    pub ref_tag: u32,
}

impl PiTuple {
    /// Decodes the 8 bytes of a tuple.
    pub fn from_bytes(b: &[u8; PI_SIZE]) -> Self {
        PiTuple {
            guard: u16::from_be_bytes([b[pi_off::GUARD], b[pi_off::GUARD + 1]]),
            app_tag: u16::from_be_bytes([b[pi_off::APP_TAG], b[pi_off::APP_TAG + 1]]),
            ref_tag: u32::from_be_bytes([
                b[pi_off::REF_TAG],
                b[pi_off::REF_TAG + 1],
                b[pi_off::REF_TAG + 2],
                b[pi_off::REF_TAG + 3],
            ]),
        }
    }
    /// Encodes the tuple.
    pub fn to_bytes(&self) -> [u8; PI_SIZE] {
        let mut b = [0u8; PI_SIZE];
        b[pi_off::GUARD..pi_off::GUARD + 2].copy_from_slice(&self.guard.to_be_bytes());
        b[pi_off::APP_TAG..pi_off::APP_TAG + 2].copy_from_slice(&self.app_tag.to_be_bytes());
        b[pi_off::REF_TAG..pi_off::REF_TAG + 4].copy_from_slice(&self.ref_tag.to_be_bytes());
        b
    }
}

/// The protection information type of a namespace (DPS bits 2:0).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PiType {
    /// Type 1: the Reference Tag is the low 32 bits of the block's LBA.
    Type1,
    /// Type 2: the Reference Tag starts at the command's initial reference tag and
    /// increments per block.
    Type2,
    /// Type 3: the Reference Tag is not checked (an opaque value).
    Type3,
}

impl PiType {
    /// The type of DPS bits 2:0, or `None` for "not protected" (0) and reserved values.
    pub const fn from_dps(dps: u8) -> Option<Self> {
        match dps & 0x7 {
            1 => Some(PiType::Type1),
            2 => Some(PiType::Type2),
            3 => Some(PiType::Type3),
            _ => None,
        }
    }
    /// DPS bits 2:0.
    pub const fn code(self) -> u8 {
        match self {
            PiType::Type1 => 1,
            PiType::Type2 => 2,
            PiType::Type3 => 3,
        }
    }
}

/// Byte offset of the PI inside a block's `ms`-byte metadata: the first bytes when DPS
/// bit 3 is set, else the last (`ms` ≥ [`PI_SIZE`]).
pub const fn pi_offset(ms: usize, pi_first: bool) -> usize {
    if pi_first {
        0
    } else {
        ms - PI_SIZE
    }
}

/// PRINFO: Protection Information Field of Read, Write, Compare, Write Zeroes (CDW12 bits
/// 29:26).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Prinfo(pub u8);

impl Prinfo {
    /// PRACT: Protection Information Action (the controller inserts or strips PI).
    pub const PRACT: u8 = 1 << 3;
    /// PRCHK bit 2: check the Guard field.
    pub const PRCHK_GUARD: u8 = 1 << 2;
    /// PRCHK bit 1: check the Application Tag field.
    pub const PRCHK_APP: u8 = 1 << 1;
    /// PRCHK bit 0: check the Reference Tag field.
    pub const PRCHK_REF: u8 = 1 << 0;
    /// Bit position of PRINFO in CDW12.
    pub const CDW12_SHIFT: u32 = 26;

    /// PRINFO of a command's CDW12.
    pub const fn from_cdw12(cdw12: u32) -> Self {
        Prinfo(((cdw12 >> Self::CDW12_SHIFT) & 0xF) as u8)
    }
    /// The CDW12 bits of this PRINFO.
    pub const fn to_cdw12(self) -> u32 {
        ((self.0 & 0xF) as u32) << Self::CDW12_SHIFT
    }
    /// PRACT.
    pub const fn pract(self) -> bool {
        self.0 & Self::PRACT != 0
    }
    /// PRCHK guard.
    pub const fn check_guard(self) -> bool {
        self.0 & Self::PRCHK_GUARD != 0
    }
    /// PRCHK application tag.
    pub const fn check_app(self) -> bool {
        self.0 & Self::PRCHK_APP != 0
    }
    /// PRCHK reference tag.
    pub const fn check_ref(self) -> bool {
        self.0 & Self::PRCHK_REF != 0
    }
}

/// A protection information check that failed, with the values involved.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PiError {
    /// The guard does not match the CRC of the block.
    #[error("end-to-end guard check error: guard {found:#06x}, crc of the block {computed:#06x}")]
    Guard {
        /// The guard in the PI.
        found: u16,
        /// The CRC computed over the block.
        computed: u16,
    },
    /// The application tag does not match under the mask.
    #[error("end-to-end application tag check error: tag {found:#06x}, expected {expected:#06x} under mask {mask:#06x}")]
    AppTag {
        /// The tag in the PI.
        found: u16,
        /// The expected tag (ELBAT / LBAT).
        expected: u16,
        /// The mask (ELBATM / LBATM).
        mask: u16,
    },
    /// The reference tag does not match.
    #[error("end-to-end reference tag check error: tag {found:#010x}, expected {expected:#010x}")]
    RefTag {
        /// The tag in the PI.
        found: u32,
        /// The expected tag.
        expected: u32,
    },
}

impl PiError {
    /// The completion status a controller reports for this error.
    pub const fn status(self) -> Status {
        match self {
            PiError::Guard { .. } => Status::E2E_GUARD_CHECK_ERROR,
            PiError::AppTag { .. } => Status::E2E_APPLICATION_TAG_CHECK_ERROR,
            PiError::RefTag { .. } => Status::E2E_REFERENCE_TAG_CHECK_ERROR,
        }
    }
}

/// What a command asks about the PI of its blocks: the namespace's type, PRINFO, and the
/// command's initial reference tag and application tag/mask.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PiCommand {
    /// The namespace's protection type.
    pub pi_type: PiType,
    /// PRINFO of the command.
    pub prinfo: Prinfo,
    /// EILBRT / ILBRT (CDW14): the expected reference tag of the first block.
    pub ilbrt: u32,
    /// ELBAT / LBAT (CDW15 bits 15:0): the expected application tag.
    pub app_tag: u16,
    /// ELBATM / LBATM (CDW15 bits 31:16): which application tag bits are checked.
    pub app_mask: u16,
}

impl PiCommand {
    /// The PI fields of a Read or Write command (CDW12 PRINFO, CDW14, CDW15).
    pub const fn from_cdws(pi_type: PiType, cdw12: u32, cdw14: u32, cdw15: u32) -> Self {
        PiCommand {
            pi_type,
            prinfo: Prinfo::from_cdw12(cdw12),
            ilbrt: cdw14,
            app_tag: cdw15 as u16,
            app_mask: (cdw15 >> 16) as u16,
        }
    }

    /// The command's own consistency, checked before any block: for type 1 with the
    /// reference tag checked, the initial reference tag must be the low 32 bits of the
    /// starting LBA (else Invalid Protection Information).
    pub fn validate(&self, slba: u64) -> Result<(), Status> {
        if self.pi_type == PiType::Type1 && self.prinfo.check_ref() && self.ilbrt != slba as u32 {
            return Err(Status::INVALID_PROTECTION_INFORMATION.with_dnr(true));
        }
        Ok(())
    }

    /// The reference tag of block `i` of the command (0-based): types 1 and 2 increment
    /// from the initial reference tag; type 3 keeps it.
    pub const fn ref_tag(&self, i: u32) -> u32 {
        match self.pi_type {
            PiType::Type1 | PiType::Type2 => self.ilbrt.wrapping_add(i),
            PiType::Type3 => self.ilbrt,
        }
    }

    /// The PI a controller generates for block `i` with guard `guard` (PRACT = 1).
    pub const fn generate(&self, guard: u16, i: u32) -> PiTuple {
        PiTuple {
            guard,
            app_tag: self.app_tag,
            ref_tag: self.ref_tag(i),
        }
    }

    /// Whether `pi` disables checking of its block: application tag FFFFh (types 1 and
    /// 2), or application tag FFFFh and reference tag FFFFFFFFh (type 3).
    pub const fn escaped(&self, pi: &PiTuple) -> bool {
        match self.pi_type {
            PiType::Type1 | PiType::Type2 => pi.app_tag == APP_TAG_ESCAPE,
            PiType::Type3 => pi.app_tag == APP_TAG_ESCAPE && pi.ref_tag == REF_TAG_ESCAPE,
        }
    }

    /// Checks block `i`'s PI as PRCHK asks, in the order guard, application tag,
    /// reference tag (never for type 3), given the CRC computed over the block.
    pub fn check(&self, pi: &PiTuple, computed_guard: u16, i: u32) -> Result<(), PiError> {
        if self.escaped(pi) {
            return Ok(());
        }
        let p = self.prinfo;
        if p.check_guard() && pi.guard != computed_guard {
            return Err(PiError::Guard {
                found: pi.guard,
                computed: computed_guard,
            });
        }
        if p.check_app() && (pi.app_tag ^ self.app_tag) & self.app_mask != 0 {
            return Err(PiError::AppTag {
                found: pi.app_tag,
                expected: self.app_tag,
                mask: self.app_mask,
            });
        }
        if p.check_ref() && self.pi_type != PiType::Type3 && pi.ref_tag != self.ref_tag(i) {
            return Err(PiError::RefTag {
                found: pi.ref_tag,
                expected: self.ref_tag(i),
            });
        }
        Ok(())
    }
}

/// Where the PI of a namespace's blocks lies, for generating and checking it in software
/// ([`PiFormat::fill`], [`PiFormat::check`]): what a caller that supplies its own metadata
/// needs to send PI the controller accepts, and to check what it reads back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PiFormat {
    /// LBA data size in bytes.
    pub data_size: usize,
    /// Metadata bytes per block (at least [`PI_SIZE`]).
    pub ms: usize,
    /// The metadata is interleaved with the data (extended LBAs): `data` of
    /// [`PiFormat::fill`] and [`PiFormat::check`] holds `data_size + ms` bytes per block
    /// and `md` is unused. Else `data` holds the data and `md` the metadata, `ms` per block.
    pub extended: bool,
    /// The PI is the first 8 bytes of the metadata (else the last).
    pub pi_first: bool,
    /// The protection type.
    pub pi_type: PiType,
}

impl PiFormat {
    /// The block `b`'s data and metadata within the buffers.
    fn split<'a>(&self, data: &'a [u8], md: &'a [u8], b: usize) -> (&'a [u8], &'a [u8]) {
        if self.extended {
            let blk = &data[b * (self.data_size + self.ms)..][..self.data_size + self.ms];
            blk.split_at(self.data_size)
        } else {
            (
                &data[b * self.data_size..][..self.data_size],
                &md[b * self.ms..][..self.ms],
            )
        }
    }

    /// The command that checks or generates PI for `nlb` blocks from the first block's
    /// reference tag (type 1: the low 32 bits of its LBA; type 2: any; type 3: any, kept)
    /// and the application tag and mask.
    pub const fn command(&self, first_ref_tag: u32, app_tag: u16, app_mask: u16) -> PiCommand {
        let app = if app_mask != 0 { Prinfo::PRCHK_APP } else { 0 };
        PiCommand {
            pi_type: self.pi_type,
            prinfo: Prinfo(Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF | app),
            ilbrt: first_ref_tag,
            app_tag,
            app_mask,
        }
    }

    /// Generates the PI of `nlb` blocks into their metadata: the guard over each block's
    /// data and the metadata bytes before the PI, the application tag, and the reference
    /// tag counting up from `first_ref_tag` (types 1 and 2; type 3 keeps it). No
    /// allocation. Panics if the buffers are shorter than `nlb` blocks.
    pub fn fill(
        &self,
        data: &mut [u8],
        md: &mut [u8],
        nlb: usize,
        first_ref_tag: u32,
        app_tag: u16,
    ) {
        let c = self.command(first_ref_tag, app_tag, 0);
        let off = pi_offset(self.ms, self.pi_first);
        for b in 0..nlb {
            let (d, m) = self.split(data, md, b);
            let guard = guard_of(d, &m[..off]);
            let pi = c.generate(guard, b as u32).to_bytes();
            let at = if self.extended {
                b * (self.data_size + self.ms) + self.data_size + off
            } else {
                b * self.ms + off
            };
            let dst = if self.extended { &mut *data } else { &mut *md };
            dst[at..at + PI_SIZE].copy_from_slice(&pi);
        }
    }

    /// Checks the PI of `nlb` blocks as a controller does with every PRCHK bit set (the
    /// application tag only under a non-zero `app_mask`; never the reference tag of type 3;
    /// escaped blocks pass). The error names the first failing block (0-based) and what
    /// failed, with the spec's name.
    pub fn check(
        &self,
        data: &[u8],
        md: &[u8],
        nlb: usize,
        first_ref_tag: u32,
        app_tag: u16,
        app_mask: u16,
    ) -> Result<(), (usize, PiError)> {
        let c = self.command(first_ref_tag, app_tag, app_mask);
        let off = pi_offset(self.ms, self.pi_first);
        for b in 0..nlb {
            let (d, m) = self.split(data, md, b);
            let pi = PiTuple::from_bytes(m[off..off + PI_SIZE].try_into().expect("8 bytes"));
            c.check(&pi, guard_of(d, &m[..off]), b as u32)
                .map_err(|e| (b, e))?;
        }
        Ok(())
    }
}

/// The guard of a block: the CRC of its data, then of the metadata bytes before its PI.
pub fn guard_of(data: &[u8], md_before_pi: &[u8]) -> u16 {
    if md_before_pi.is_empty() {
        return crc16_t10dif(data);
    }
    let mut g = GuardDigest::new();
    g.update(data);
    g.update(md_before_pi);
    g.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time CRC-16/T10-DIF, straight from the definition: an independent
    /// reference for the table-driven one.
    fn crc_bitwise(data: &[u8]) -> u16 {
        let mut crc: u16 = 0;
        for &b in data {
            crc ^= (b as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x8BB7
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    /// A slice-by-8 CRC-16/T10-DIF (the classic table layout), for the speed comparison
    /// in `bench_guard_crc`.
    struct SliceBy8([[u16; 256]; 8]);

    impl SliceBy8 {
        fn new() -> Self {
            let mut t = [[0u16; 256]; 8];
            for (i, e) in t[0].iter_mut().enumerate() {
                *e = crc_bitwise(&[i as u8]);
            }
            for k in 1..8 {
                for i in 0..256 {
                    let prev = t[k - 1][i];
                    t[k][i] = (prev << 8) ^ t[0][(prev >> 8) as usize];
                }
            }
            SliceBy8(t)
        }
        fn crc(&self, data: &[u8]) -> u16 {
            let t = &self.0;
            let mut crc: u16 = 0;
            let mut chunks = data.chunks_exact(8);
            for c in &mut chunks {
                let hi = (crc >> 8) as u8 ^ c[0];
                let lo = crc as u8 ^ c[1];
                crc = t[7][hi as usize]
                    ^ t[6][lo as usize]
                    ^ t[5][c[2] as usize]
                    ^ t[4][c[3] as usize]
                    ^ t[3][c[4] as usize]
                    ^ t[2][c[5] as usize]
                    ^ t[1][c[6] as usize]
                    ^ t[0][c[7] as usize];
            }
            for &b in chunks.remainder() {
                crc = (crc << 8) ^ t[0][((crc >> 8) as u8 ^ b) as usize];
            }
            crc
        }
    }

    fn pattern(len: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn crc_known_vectors() {
        // The catalogue check value of CRC-16/T10-DIF.
        assert_eq!(crc16_t10dif(b"123456789"), 0xD0DB);
        assert_eq!(crc_bitwise(b"123456789"), 0xD0DB);
        // Zero-filled blocks have a zero guard (initial value 0, no final XOR).
        assert_eq!(crc16_t10dif(&[0u8; 4096]), 0);
        assert_eq!(crc16_t10dif(&[]), 0);
        for len in [1, 7, 8, 9, 512, 520, 4096, 4104] {
            for (i, data) in [vec![0xFF; len], pattern(len, len as u32)]
                .iter()
                .enumerate()
            {
                assert_eq!(
                    crc16_t10dif(data),
                    crc_bitwise(data),
                    "len {len} pattern {i}"
                );
            }
        }
        let ff = crc16_t10dif(&[0xFF; 512]);
        assert_eq!(ff, crc_bitwise(&[0xFF; 512]));
        assert_ne!(ff, 0);
    }

    #[test]
    fn digest_equals_one_shot_and_slice_by_8_agrees() {
        let d = pattern(4096 + 64, 3);
        let mut g = GuardDigest::new();
        g.update(&d[..4096]);
        g.update(&d[4096..]);
        assert_eq!(g.finish(), crc16_t10dif(&d));
        let s8 = SliceBy8::new();
        for len in [0, 1, 8, 13, 512, 4096, 4097] {
            assert_eq!(s8.crc(&d[..len]), crc_bitwise(&d[..len]), "len {len}");
        }
    }

    #[test]
    fn tuple_layout_is_big_endian() {
        let t = PiTuple {
            guard: 0x1234,
            app_tag: 0x5678,
            ref_tag: 0x9ABC_DEF0,
        };
        let b = t.to_bytes();
        assert_eq!(b, [0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE, 0xF0]);
        assert_eq!(PiTuple::from_bytes(&b), t);
        assert_eq!(pi_offset(8, false), 0);
        assert_eq!(pi_offset(16, false), 8);
        assert_eq!(pi_offset(16, true), 0);
    }

    #[test]
    fn prinfo_bits_and_dps() {
        let p = Prinfo(Prinfo::PRACT | Prinfo::PRCHK_GUARD | Prinfo::PRCHK_REF);
        assert_eq!(p.to_cdw12(), 0b1101 << 26);
        assert_eq!(Prinfo::from_cdw12(p.to_cdw12() | 0xFFFF), p);
        assert!(p.pract() && p.check_guard() && !p.check_app() && p.check_ref());
        assert_eq!(PiType::from_dps(0x09), Some(PiType::Type1));
        assert_eq!(PiType::from_dps(0x02), Some(PiType::Type2));
        assert_eq!(PiType::from_dps(0x03).map(PiType::code), Some(3));
        assert_eq!(PiType::from_dps(0), None);
        assert_eq!(PiType::from_dps(4), None);
    }

    fn cmd(t: PiType, chk: u8) -> PiCommand {
        PiCommand {
            pi_type: t,
            prinfo: Prinfo(chk),
            ilbrt: 100,
            app_tag: 0xAB00,
            app_mask: 0xFF00,
        }
    }

    #[test]
    fn checks_follow_type_prchk_and_escapes() {
        let all = Prinfo::PRCHK_GUARD | Prinfo::PRCHK_APP | Prinfo::PRCHK_REF;
        let data = pattern(512, 9);
        let g = crc16_t10dif(&data);
        for t in [PiType::Type1, PiType::Type2, PiType::Type3] {
            let c = cmd(t, all);
            let good = c.generate(g, 5);
            assert_eq!(good.app_tag, 0xAB00);
            let want_ref = if t == PiType::Type3 { 100 } else { 105 };
            assert_eq!(good.ref_tag, want_ref, "{t:?}");
            assert_eq!(c.check(&good, g, 5), Ok(()));
            // Guard.
            let e = c.check(&good, g ^ 1, 5).unwrap_err();
            assert_eq!(e.status(), Status::E2E_GUARD_CHECK_ERROR);
            // Application tag: only the masked bits count.
            let low = PiTuple {
                app_tag: 0xAB7F,
                ..good
            };
            assert_eq!(c.check(&low, g, 5), Ok(()));
            let high = PiTuple {
                app_tag: 0xAC00,
                ..good
            };
            assert_eq!(
                c.check(&high, g, 5).unwrap_err().status(),
                Status::E2E_APPLICATION_TAG_CHECK_ERROR
            );
            // Reference tag: checked for types 1 and 2 only.
            let r = c.check(&good, g, 6);
            if t == PiType::Type3 {
                assert_eq!(r, Ok(()));
            } else {
                assert_eq!(
                    r.unwrap_err().status(),
                    Status::E2E_REFERENCE_TAG_CHECK_ERROR
                );
            }
            // Nothing checked when PRCHK is clear.
            let none = cmd(t, 0);
            assert_eq!(none.check(&PiTuple::default(), g, 5), Ok(()));
        }
        // Escapes: app tag FFFFh for types 1 and 2; type 3 also needs ref tag FFFFFFFFh.
        let esc = PiTuple {
            guard: 0,
            app_tag: APP_TAG_ESCAPE,
            ref_tag: 7,
        };
        assert_eq!(cmd(PiType::Type1, all).check(&esc, g, 0), Ok(()));
        assert_eq!(cmd(PiType::Type2, all).check(&esc, g, 0), Ok(()));
        assert!(cmd(PiType::Type3, all).check(&esc, g, 0).is_err());
        let esc3 = PiTuple {
            ref_tag: REF_TAG_ESCAPE,
            ..esc
        };
        assert_eq!(cmd(PiType::Type3, all).check(&esc3, g, 0), Ok(()));
    }

    #[test]
    fn software_pi_fills_what_it_checks_in_every_layout() {
        for t in [PiType::Type1, PiType::Type2, PiType::Type3] {
            for (extended, pi_first, ms) in [
                (false, false, 8),
                (false, false, 16),
                (false, true, 16),
                (true, false, 16),
                (true, true, 64),
            ] {
                let f = PiFormat {
                    data_size: 512,
                    ms,
                    extended,
                    pi_first,
                    pi_type: t,
                };
                let nlb = 4;
                let dlen = nlb * (512 + if extended { ms } else { 0 });
                let mut data = pattern(dlen, ms as u32);
                let mut md = if extended {
                    Vec::new()
                } else {
                    pattern(nlb * ms, 7)
                };
                f.fill(&mut data, &mut md, nlb, 1000, 0x1234);
                assert_eq!(f.check(&data, &md, nlb, 1000, 0x1234, 0xFFFF), Ok(()));
                // A wrong first reference tag fails types 1 and 2 at block 0.
                let r = f.check(&data, &md, nlb, 1001, 0x1234, 0xFFFF);
                if t == PiType::Type3 {
                    assert_eq!(r, Ok(()));
                } else {
                    assert_eq!(
                        r.unwrap_err().1.status(),
                        Status::E2E_REFERENCE_TAG_CHECK_ERROR
                    );
                }
                // A wrong application tag fails only under the mask.
                assert!(f.check(&data, &md, nlb, 1000, 0x1235, 0xFFFF).is_err());
                assert_eq!(f.check(&data, &md, nlb, 1000, 0x1235, 0), Ok(()));
                // A flipped data byte of block 2 fails its guard.
                let at = 2 * (512 + if extended { ms } else { 0 }) + 3;
                data[at] ^= 1;
                let (b, e) = f.check(&data, &md, nlb, 1000, 0x1234, 0).unwrap_err();
                assert_eq!((b, e.status()), (2, Status::E2E_GUARD_CHECK_ERROR));
            }
        }
    }

    #[test]
    fn type1_initial_reference_tag_must_be_the_lba() {
        let mut c = cmd(PiType::Type1, Prinfo::PRCHK_REF);
        assert_eq!(
            c.validate(101),
            Err(Status::INVALID_PROTECTION_INFORMATION.with_dnr(true))
        );
        assert_eq!(c.validate(100), Ok(()));
        assert_eq!(c.validate((7 << 32) | 100), Ok(()), "low 32 bits");
        c.prinfo = Prinfo(Prinfo::PRCHK_GUARD);
        assert_eq!(c.validate(101), Ok(()), "not checked, not validated");
        assert_eq!(cmd(PiType::Type2, Prinfo::PRCHK_REF).validate(5), Ok(()));
    }

    /// Guard CRC throughput: the `crc` crate (16-lane table, the one used), its 1-lane
    /// table, and a hand-written slice-by-8.
    /// `cargo test -p kestrel --release --lib spec::pi::tests::bench_guard_crc -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bench_guard_crc() {
        let data = pattern(1 << 20, 1);
        let rounds = 256;
        let rate = |name: &str, f: &dyn Fn(&[u8]) -> u16| {
            let mut acc = 0u16;
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                acc = acc.wrapping_add(f(std::hint::black_box(&data)));
            }
            let secs = t.elapsed().as_secs_f64();
            let gbs = (rounds * data.len()) as f64 / secs / 1e9;
            println!("{name:28} {gbs:6.2} GB/s (sum {acc:#06x})");
        };
        let t1 = crc::Crc::<u16, crc::Table<1>>::new(&crc::CRC_16_T10_DIF);
        let s8 = SliceBy8::new();
        rate("crc crate, Table<16> (used)", &crc16_t10dif);
        rate("crc crate, Table<1>", &|d| t1.checksum(d));
        rate("slice-by-8 (hand-written)", &|d| s8.crc(d));
    }
}
