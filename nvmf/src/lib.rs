//! An NVMe over TCP target for Kestrel targets.
//!
//! Stock initiators (the Linux kernel's `nvme-tcp`) connect to it unchanged: it speaks the
//! NVMe/TCP transport (NVM Express TCP Transport Specification 1.0) and the fabrics
//! commands of NVMe over Fabrics, and exports each Kestrel target (an NVMe namespace
//! through VFIO, a file, the emulator) as namespace 1 of its own NVM subsystem.
//!
//! - [`pdu`]: PDU encoding and decoding, header and data digests.
#![deny(missing_docs)]

pub mod pdu;
