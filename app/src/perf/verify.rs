//! The block format of `kestrel perf --verify`.
//!
//! Every logical block written starts with a 24-byte header, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | the block's LBA |
//! | 8..16 | the generation: how many times this run has written the block's I/O unit |
//! | 16..24 | XXH3-64 of bytes 24.. of the block |
//!
//! and the rest of the block is a pattern derived from LBA and generation (so two versions
//! of a block never look alike). A read checks the LBA, the generation the writer recorded,
//! and the checksum. A block this run never wrote must read as zeroes, or as a complete,
//! self-consistent block for its LBA (left by an earlier run on a persistent store).

use xxhash_rust::xxh3::xxh3_64;

/// Bytes of the header.
pub const HEADER_BYTES: usize = 24;

/// What the reader expects of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// This generation (≥ 1).
    Generation(u64),
    /// Never written by this run: zeroes, or an intact block of an earlier run.
    Unwritten,
    /// A write to it failed: any intact block for this LBA, or zeroes.
    Unknown,
}

/// A block that does not hold what it should.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    /// The LBA read.
    pub lba: u64,
    /// Which check failed: `lba`, `generation` or `checksum`.
    pub field: &'static str,
    /// What it should be.
    pub expected: u64,
    /// What it is.
    pub actual: u64,
    /// What the reader expected of the whole block (`None` for metadata and PI checks).
    pub expect: Option<Expect>,
    /// What the block holds (`None` for metadata and PI checks).
    pub found: Option<Found>,
}

/// What a block that failed its check holds: a wrong block of this format tells a stale
/// or misplaced write from data no `kestrel perf` run wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// All zeroes.
    Zeroes,
    /// A block of this format: generation `generation` of `lba`; `intact` when its
    /// checksum holds (else torn: a header with another block's data).
    Block {
        lba: u64,
        generation: u64,
        intact: bool,
    },
    /// Neither zeroes nor a block of this format (for its LBA or another): data written by
    /// something other than `kestrel perf`, or garbage.
    Foreign,
}

impl Found {
    /// What `block` read from `lba` holds.
    pub fn of(block: &[u8], lba: u64) -> Found {
        if block.iter().all(|&b| b == 0) {
            return Found::Zeroes;
        }
        let (got_lba, generation, sum) = (rd(block, 0), rd(block, 8), rd(block, 16));
        let intact = sum == xxh3_64(&block[HEADER_BYTES..]);
        // A header naming another LBA counts as this format's only with its checksum (a
        // misplaced block); random data has a wrong LBA and a wrong checksum.
        if intact || got_lba == lba {
            Found::Block {
                lba: got_lba,
                generation,
                intact,
            }
        } else {
            Found::Foreign
        }
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Generation(g) => write!(f, "generation {g} (written by this run)"),
            Expect::Unwritten => f.write_str(
                "not written by this run (zeroes, or an intact block of its lba from an earlier run)",
            ),
            Expect::Unknown => f.write_str("any intact block of its lba (a write to it failed)"),
        }
    }
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Found::Zeroes => f.write_str("zeroes"),
            Found::Block {
                lba,
                generation,
                intact,
            } => write!(
                f,
                "generation {generation} of lba {lba}{}",
                if *intact {
                    ""
                } else {
                    ", torn (checksum wrong)"
                }
            ),
            Found::Foreign => f.write_str("data of no kestrel perf block (another writer's)"),
        }
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lba {}: {} mismatch: expected {:#x}, found {:#x}",
            self.lba, self.field, self.expected, self.actual
        )?;
        if let (Some(e), Some(found)) = (self.expect, self.found) {
            write!(f, "; wanted: {e}; holds: {found}")?;
        }
        Ok(())
    }
}

/// How a checked block turned out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// It holds the expected generation.
    Ok,
    /// All zeroes (never written).
    Zero,
    /// An intact block of another generation, accepted (unwritten or unknown).
    Earlier,
}

fn mix(mut z: u64) -> u64 {
    // splitmix64's finaliser.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn rd(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Fills `block` (at least [`HEADER_BYTES`] + 8 bytes, a multiple of 8) as generation `gen`
/// of `lba`.
pub fn fill_block(block: &mut [u8], lba: u64, gen: u64) {
    debug_assert!(block.len() >= HEADER_BYTES + 8 && block.len() % 8 == 0);
    let seed = mix(lba ^ gen.rotate_left(40) ^ 0x6b65_7374_7265_6c00);
    for (i, w) in block[HEADER_BYTES..].chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(
            &seed
                .wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .to_le_bytes(),
        );
    }
    let sum = xxh3_64(&block[HEADER_BYTES..]);
    block[0..8].copy_from_slice(&lba.to_le_bytes());
    block[8..16].copy_from_slice(&gen.to_le_bytes());
    block[16..24].copy_from_slice(&sum.to_le_bytes());
}

/// `Err` naming `field` of the block at `lba` when it holds `actual` instead of `expected`.
fn same(lba: u64, field: &'static str, expected: u64, actual: u64) -> Result<(), Mismatch> {
    if expected == actual {
        Ok(())
    } else {
        Err(Mismatch {
            lba,
            field,
            expected,
            actual,
            expect: None,
            found: None,
        })
    }
}

/// Checks one block read from `lba`; a mismatch says what was expected and what the block
/// holds.
pub fn check_block(block: &[u8], lba: u64, expect: Expect) -> Result<Checked, Mismatch> {
    check_fields(block, lba, expect).map_err(|m| Mismatch {
        expect: Some(expect),
        found: Some(Found::of(block, lba)),
        ..m
    })
}

fn check_fields(block: &[u8], lba: u64, expect: Expect) -> Result<Checked, Mismatch> {
    let (got_lba, got_gen, got_sum) = (rd(block, 0), rd(block, 8), rd(block, 16));
    let intact = |block: &[u8]| xxh3_64(&block[HEADER_BYTES..]);
    match expect {
        Expect::Generation(gen) => {
            same(lba, "lba", lba, got_lba)?;
            same(lba, "generation", gen, got_gen)?;
            same(lba, "checksum", got_sum, intact(block))?;
            Ok(Checked::Ok)
        }
        Expect::Unwritten | Expect::Unknown => {
            if block.iter().all(|&b| b == 0) {
                return Ok(Checked::Zero);
            }
            same(lba, "lba", lba, got_lba)?;
            same(lba, "checksum", got_sum, intact(block))?;
            Ok(Checked::Earlier)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_blocks_check() {
        let mut b = vec![0u8; 4096];
        fill_block(&mut b, 77, 3);
        assert_eq!(check_block(&b, 77, Expect::Generation(3)), Ok(Checked::Ok));
        assert_eq!(check_block(&b, 77, Expect::Unwritten), Ok(Checked::Earlier));
        assert_eq!(
            check_block(&b, 77, Expect::Generation(4)),
            Err(Mismatch {
                lba: 77,
                field: "generation",
                expected: 4,
                actual: 3,
                expect: Some(Expect::Generation(4)),
                found: Some(Found::Block {
                    lba: 77,
                    generation: 3,
                    intact: true
                }),
            })
        );
        assert_eq!(
            check_block(&b, 78, Expect::Generation(3))
                .unwrap_err()
                .field,
            "lba"
        );
        assert_eq!(
            check_block(&b, 78, Expect::Unknown).unwrap_err().field,
            "lba"
        );
    }

    #[test]
    fn zeroes_only_when_unwritten() {
        let b = vec![0u8; 512];
        assert_eq!(check_block(&b, 5, Expect::Unwritten), Ok(Checked::Zero));
        assert_eq!(check_block(&b, 5, Expect::Unknown), Ok(Checked::Zero));
        assert!(check_block(&b, 5, Expect::Generation(1)).is_err());
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let mut b = vec![0u8; 512];
        fill_block(&mut b, 1234, 9);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(
                check_block(&c, 1234, Expect::Generation(9)).is_err(),
                "flip at {i} not caught"
            );
        }
    }

    #[test]
    fn a_mismatch_says_what_the_block_holds() {
        let mut b = vec![0u8; 512];
        fill_block(&mut b, 9, 2);
        // Another LBA's block: misplaced, intact.
        let m = check_block(&b, 10, Expect::Generation(1)).unwrap_err();
        assert_eq!(
            m.found,
            Some(Found::Block {
                lba: 9,
                generation: 2,
                intact: true
            })
        );
        // Its own header over other data: torn.
        b[100] ^= 1;
        let m = check_block(&b, 9, Expect::Generation(2)).unwrap_err();
        assert_eq!(m.field, "checksum");
        assert!(matches!(m.found, Some(Found::Block { intact: false, .. })));
        // Zeroes where a generation was written.
        let z = vec![0u8; 512];
        let m = check_block(&z, 9, Expect::Generation(2)).unwrap_err();
        assert_eq!(m.found, Some(Found::Zeroes));
        // Another writer's data where this run wrote nothing.
        let r: Vec<u8> = (0..512u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let m = check_block(&r, 9, Expect::Unwritten).unwrap_err();
        assert_eq!(m.found, Some(Found::Foreign));
        assert_eq!(m.expect, Some(Expect::Unwritten));
        let text = m.to_string();
        assert!(
            text.contains("wanted: not written by this run") && text.contains("holds: data of no"),
            "{text}"
        );
    }

    #[test]
    fn generations_differ() {
        let mut a = vec![0u8; 512];
        let mut b = vec![0u8; 512];
        fill_block(&mut a, 1, 1);
        fill_block(&mut b, 1, 2);
        assert_ne!(a[HEADER_BYTES..], b[HEADER_BYTES..]);
        fill_block(&mut b, 2, 1);
        assert_ne!(a[HEADER_BYTES..], b[HEADER_BYTES..]);
    }
}
