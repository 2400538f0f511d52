//! The `kestrel` command as a library: the binary is a thin `main` over [`main_with_args`],
//! and the value parsers in [`parse`] are reachable by tests and fuzz targets.

pub mod cli;
pub mod doctor;
pub mod error;
pub mod identify;
pub mod list;
pub mod parse;
pub mod perf;
pub mod read;
pub mod remote;
pub mod smart;
pub mod targets;
pub mod units;
pub mod write;
pub mod zones;

use std::process::ExitCode;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command};
use error::{AppError, EXIT_USAGE};

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v).unwrap_or_else(|e| {
            eprintln!("kestrel: warning: ignoring RUST_LOG: {e}");
            EnvFilter::new(default)
        }),
        _ => EnvFilter::new(default),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Runs a parsed command line.
pub fn run(cli: &Cli) -> Result<(), AppError> {
    match &cli.command {
        Command::Identify(a) => identify::run(a),
        Command::Smart(a) => smart::run(a),
        Command::List(a) => list::run(a),
        Command::Perf(a) => perf::run(a),
        Command::Read(a) => read::run(a),
        Command::Write(a) => write::run(a),
        Command::Serve(a) => kestrel_nvmf::cli::run(a).map_err(|e| match e {
            kestrel_nvmf::cli::CliError::Usage(m) => AppError::Usage(m),
            e => AppError::Runtime(e.to_string()),
        }),
        Command::Doctor(a) => doctor::run(a),
    }
}

/// The whole program: parses `args`, runs, and turns every error into a one-line message
/// on stderr and an exit status (see [`error`]: 1 setup, 2 usage, 3 I/O failed, 4 verify
/// mismatch, 130 interrupted).
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(EXIT_USAGE)
                } else {
                    ExitCode::SUCCESS
                };
            }
            // clap's message is "error: ...\n\n  [possible values: ...]\n\nUsage: ...":
            // keep its first line, in our form, with the valid values when clap lists
            // them, and point at --help.
            let text = e.to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid command line");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            let valid = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("[possible values: "))
                .map(|v| v.trim_end_matches(']'))
                .next();
            let first = match valid {
                Some(v) => format!("{first}; valid values: {v}"),
                None => first.to_string(),
            };
            let cmd = match args.iter().skip(1).filter_map(|a| a.to_str()).find(|a| {
                [
                    "identify", "smart", "list", "perf", "read", "serve", "doctor",
                ]
                .contains(a)
            }) {
                Some(sub) => format!("kestrel {sub}"),
                None => "kestrel".to_string(),
            };
            eprintln!("kestrel: error: {first} (see '{cmd} --help')");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    init_logging(cli.verbose);
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = e.to_string();
            let msg = msg.lines().collect::<Vec<_>>().join("; ");
            if matches!(e, AppError::Interrupted(_)) {
                eprintln!("kestrel: {msg}");
            } else {
                eprintln!("kestrel: error: {msg}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}
