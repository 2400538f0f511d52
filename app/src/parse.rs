//! The values `kestrel` takes on its command line — sizes, durations, core lists, switches,
//! PCI addresses, target strings — parsed by the driver's one grammar
//! ([`kestrel::parse`]), the same that `kestrel_open` and the reactor use.

pub use kestrel::parse::*;
