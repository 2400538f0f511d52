//! Discovery through the `tcp:` target kind.
