//! NVMe definitions: controller registers, queue entries, opcodes, status codes, Identify
//! data structures, log pages and end-to-end protection information (NVMe Base
//! Specification 2.0; 1.4 where they agree), and the NVMe over Fabrics commands and NVMe/TCP
//! PDUs (NVMe over Fabrics 1.1, NVMe/TCP Transport 1.0) that both ends of a TCP connection use.
//!
//! Pure data: no `unsafe`, no I/O. Every `#[repr(C)]` layout has compile-time size and
//! offset assertions beside it.

pub mod cmd;
pub mod fabrics;
pub mod identify;
pub mod pi;
pub mod regs;
pub mod status;
pub mod tcp;
pub mod zns;

pub use cmd::{admin_opc, cns, csi, fid, lid, nvm_opc, AsyncEvent, Cqe, DsmRange, Sqe, NSID_ALL};
pub use identify::{
    ErrorLogEntry, IdentifyController, IdentifyNamespace, LbaFormat, NsFormat, NsIdDescriptors,
    SmartLog, IDENTIFY_SIZE,
};
pub use regs::{doorbell_offset, Aqa, Cap, Cc, Csts, DoorbellKind, Vs, PAGE_SIZE};
pub use status::{Sct, Status};
