//! The aio API over a `tcp:` target.
