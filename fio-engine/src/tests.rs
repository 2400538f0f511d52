//! Unit tests of the Rust half.
