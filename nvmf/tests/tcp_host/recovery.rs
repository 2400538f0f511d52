//! A target killed mid-write.
