//! The `kestrel` command.
fn main() -> std::process::ExitCode {
    kestrel_app::main_with_args(std::env::args_os())
}
