//! The `kestrel` command.
fn main() {
    println!("kestrel {}", env!("CARGO_PKG_VERSION"));
}
