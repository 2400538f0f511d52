//! The conformance suite runner.
fn main() {
    println!("kestrel-hw-tests {}", env!("CARGO_PKG_VERSION"));
}
