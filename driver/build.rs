//! No build step: the script exists so that the build-dependency in Cargo.toml takes
//! part in feature unification (see the comment there).

fn main() {}
