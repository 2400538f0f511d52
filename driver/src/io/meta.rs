//! The metadata of a request: how a namespace's metadata crosses the wire
//! ([`MetaLayout`]) and what one read or write carries ([`IoMeta`]).

use super::EMPTY_SLICE;
use crate::hw::dma::DmaSlice;
use crate::spec::pi::PI_SIZE;

/// How a namespace's metadata crosses the wire, for callers that supply it
/// ([`crate::target::TargetInfo::metadata`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct MetaLayout {
    /// MS: metadata bytes per logical block.
    pub ms: u16,
    /// FLBAS bit 4: the metadata is interleaved with the data (an extended LBA): the data
    /// buffer holds each block's data followed by its metadata. Otherwise it is separate:
    /// one contiguous buffer of `nlb * ms` bytes per request ([`IoMeta::buf`]).
    pub extended: bool,
    /// The protection information type (0: none; 1, 2 or 3: the 8-byte PI with a 16-bit
    /// guard lives in each block's metadata).
    pub pi_type: u8,
    /// DPS bit 3: the PI is the first 8 bytes of the metadata (else the last).
    pub pi_first: bool,
}

impl MetaLayout {
    /// Whether every read and write must carry the metadata: true unless the metadata is
    /// exactly the 8-byte PI, which the controller can insert and strip (PRACT) when the
    /// caller supplies none.
    pub const fn required(&self) -> bool {
        !(self.pi_type != 0 && self.ms as usize == PI_SIZE)
    }
    /// Byte offset of the PI inside a block's metadata (meaningful when `pi_type != 0`).
    pub const fn pi_offset(&self) -> usize {
        crate::spec::pi::pi_offset(self.ms as usize, self.pi_first)
    }
    /// Bytes per block in the data buffer for LBA data size `data_size`: the data, plus
    /// the metadata of an extended LBA when the request carries it.
    pub const fn host_block_size(&self, data_size: u32, with_metadata: bool) -> u32 {
        if self.extended && with_metadata {
            data_size + self.ms as u32
        } else {
            data_size
        }
    }
}

/// The metadata a read or write carries, on a namespace formatted with metadata
/// ([`MetaLayout`]). Plain `Copy` data (64 bytes), [`IoMeta::NONE`] for everything else.
///
/// - Separate metadata: `with` set and `buf` one contiguous DMA region of at least
///   `nlb * ms` bytes (MPTR); a split request's pieces point into it block by block.
/// - Extended LBAs: `with` set and `buf` empty; the data buffer carries `data + ms` bytes
///   per block.
/// - Protection information: with `with` set the caller's PI is sent as it is and the
///   controller checks it (PRCHK: the guard; the reference tag for types 1 and 2, whose
///   expected initial value is the low 32 bits of the LBA for type 1 and `ref_tag` for type 2;
///   the application tag under `app_mask` when the mask is not 0). Without it, on a
///   namespace whose metadata is exactly the PI, the controller inserts and strips the PI
///   (PRACT). [`PiFormat::fill`](crate::spec::pi::PiFormat::fill) and [`PiFormat::check`](crate::spec::pi::PiFormat::check) generate and
///   check PI in software.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IoMeta {
    /// The separate metadata buffer (empty for extended LBAs and for no metadata).
    pub buf: DmaSlice,
    /// Type 2: the expected reference tag of the request's first block (the pieces of a
    /// split request count on from it). Ignored for types 1 and 3.
    pub ref_tag: u32,
    /// The expected application tag (checked when `app_mask` is not 0).
    pub app_tag: u16,
    /// Which application tag bits the controller checks (0: the tag is not checked).
    pub app_mask: u16,
    /// The request carries metadata (in `buf`, or interleaved in the data).
    pub with: bool,
}

impl IoMeta {
    /// No metadata.
    pub const NONE: IoMeta = IoMeta {
        buf: EMPTY_SLICE,
        ref_tag: 0,
        app_tag: 0,
        app_mask: 0,
        with: false,
    };
    /// Metadata in a separate buffer (`nlb * ms` bytes at least).
    pub const fn separate(buf: DmaSlice) -> Self {
        IoMeta {
            buf,
            with: true,
            ..Self::NONE
        }
    }
    /// Metadata interleaved with the data (extended LBAs).
    pub const fn extended() -> Self {
        IoMeta {
            with: true,
            ..Self::NONE
        }
    }
    /// With the type 2 initial reference tag and the application tag and mask.
    pub const fn with_tags(self, ref_tag: u32, app_tag: u16, app_mask: u16) -> Self {
        IoMeta {
            ref_tag,
            app_tag,
            app_mask,
            ..self
        }
    }
    /// For a namespace of layout `layout`: separate (with `buf`) or extended.
    pub const fn for_layout(layout: &MetaLayout, buf: DmaSlice) -> Self {
        if layout.extended {
            Self::extended()
        } else {
            Self::separate(buf)
        }
    }
}

impl Default for IoMeta {
    fn default() -> Self {
        IoMeta::NONE
    }
}

const _: () = assert!(std::mem::size_of::<IoMeta>() == 64);
