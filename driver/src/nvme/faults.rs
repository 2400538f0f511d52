//! Deliberate driver faults, for proving that a test suite finds real faults: the
//! conformance suite's own tests (`hw-tests/tests/faults.rs`) turn each on and check that
//! the suite fails where the fault matters. Hidden from the documentation and off by
//! default ([`ControllerOptions::faults`](crate::nvme::ctrlr::ControllerOptions)). Each is
//! read only on a cold path — a request carrying the caller's metadata
//! (`IoQpair::issue_meta`) or the pieces of a split request (`IoQpair::continue_split`) —
//! never on the fast path of a plain read or write.

/// Which deliberate faults a controller's queue pairs make (all off: a correct driver).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverFaults {
    /// A Read or Write carrying the caller's protection information (types 1 and 2) names
    /// an initial reference tag (CDW14) one more than its first block's.
    pub ref_tag_off_by_one: bool,
    /// Every piece of a split request with separate metadata points its metadata pointer
    /// (MPTR) at the start of the request's metadata buffer instead of at its own blocks'.
    pub mptr_not_advanced: bool,
    /// The second piece of a split request is issued with the command identifier of the
    /// first while that one is still outstanding (when a tracker is free, so the SQ has
    /// room for it).
    pub cid_reused_early: bool,
}

impl DriverFaults {
    /// No fault at all.
    pub const NONE: DriverFaults = DriverFaults {
        ref_tag_off_by_one: false,
        mptr_not_advanced: false,
        cid_reused_early: false,
    };
}
