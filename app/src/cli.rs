//! The command line (clap derive).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::parse::{self, TargetSpec};

const MAIN_AFTER_HELP: &str = "\
With no --target, every subcommand runs on the built-in emulated NVMe controller (one 1 GiB
namespace of 4 KiB blocks), so it works on a machine without NVMe hardware.

Examples:
  kestrel identify --json
  kestrel perf -t 5
  kestrel perf -q 128 -o 4k -w randread --json
  kestrel identify --target pci:0000:01:00.0
  kestrel smart --target 0000:01:00.0
  kestrel list
  kestrel doctor
  kestrel serve --target emu --allow-any-host   (NVMe/TCP on 127.0.0.1:4420)

Logging: -v (info), -vv (debug), -vvv (trace), or RUST_LOG (e.g. RUST_LOG=kestrel=debug).
Exit status: 0 success; 1 setup failure (the target could not be opened or the run could
not start); 2 usage error; 3 perf ran but I/O failed (errors, timeouts, lost I/O, controller
resets, or no I/O succeeded); 4 perf --verify found data that does not match; 130 Ctrl-C.";

const TARGET_HELP_LONG: &str = "\
Target to use; repeat for several. Forms:
  pci:0000:01:00.0 (or a bare BDF): an NVMe controller bound to vfio-pci
  file:PATH[,size=SIZE][,direct=on|off]: a file or block device through io_uring
      (direct: on = O_DIRECT or fail, off = page cache, unset = O_DIRECT where possible)
  tcp:HOST:PORT/NQN[,OPTS]: a subsystem over NVMe/TCP (docs/nvme-tcp-host.md); OPTS:
      hostnqn=NQN, hostid=UUID (default /etc/nvme/hostnqn, hostid, else from
      /etc/machine-id), digest=none|hdr|data|both, queues=N, queue_size=N,
      kato=DURATION (5s), ctrl_loss_tmo=DURATION (30s), connect_timeout=DURATION (3s),
      sqflow=on|off (default on; off: I/O queues ask the controller to disable SQ flow control)
  emu[:OPTS]: the emulated controller; OPTS are comma-separated key=value:
      size=SIZE (1G), lba=512|4096 (4096), namespaces=N (1), latency=DURATION (0),
      store=memory|null|PATH, mdts=N (5: 128 KiB), queues=N, core=N|none,
      faults=SPEC (fault injection, items joined by +, e.g. status/read/read-error/dnr/1%
      or delay/write/2ms/10%+seed/7; grammar in the emulator's documentation),
      ns=SIZE[+ATTR...] (repeat: one per namespace, nsid 1, 2, ...; instead of
      namespaces= and size=). ATTR: 512|4096 (block size; default lba=), mdN (N bytes of
      metadata per block, separate buffer), ext (metadata inline: extended LBA),
      pi1|pi2|pi3 (protection type; needs md8 or more), pifirst (PI in the first
      metadata bytes), zeropi (never-written blocks read with all-zero PI, as on QEMU),
      guard32|guard64 (report that guard size: refused), zoned, zoneSIZE
      (zone size, 1M), zcapSIZE (zone capacity, the writable part; default the zone size),
      openN, activeN (zone limits), csiN (report command set N).
      E.g. emu:ns=256M+4096+md8+pi1,ns=1G+4096+zoned+zone64M+zcap48M
  A pci or emu target may end in /ns=N: that namespace only (default: every namespace
  kestrel supports; the others are skipped with the reason, see docs/formats.md).
Sizes: 512, 4k, 4K, 128KiB, 1M, 1G, 1GiB (binary units). Durations: 10us, 1ms, 1.5ms, 2s.
Default: emu.";

/// kestrel: a polled-mode userspace NVMe driver's tool: benchmark, identify, inspect.
#[derive(Parser, Debug)]
#[command(name = "kestrel", version, about, after_help = MAIN_AFTER_HELP)]
pub struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Identify controllers and namespaces (or a file target's geometry).
    #[command(after_help = IDENTIFY_AFTER_HELP)]
    Identify(IdentifyArgs),
    /// The SMART / Health log and the error log of NVMe controllers.
    #[command(after_help = SMART_AFTER_HELP)]
    Smart(SmartArgs),
    /// NVMe controllers on the PCI bus, their drivers, IOMMU groups, and hugepages.
    #[command(after_help = LIST_AFTER_HELP)]
    List(ListArgs),
    /// Measure IOPS, bandwidth and latency with pinned per-core pollers.
    #[command(after_help = PERF_AFTER_HELP)]
    Perf(Box<PerfArgs>),
    /// Copy a byte range of a target to a file or stdout.
    #[command(after_help = READ_AFTER_HELP)]
    Read(ReadArgs),
    /// Copy a file onto a byte range of a target.
    #[command(after_help = WRITE_AFTER_HELP)]
    Write(WriteArgs),
    /// Export targets over NVMe/TCP to stock initiators (Linux nvme-tcp).
    #[command(after_help = kestrel_nvmf::cli::SERVE_AFTER_HELP)]
    Serve(Box<kestrel_nvmf::cli::ServeArgs>),
    /// Check this machine for running on an NVMe device, with the fix for each problem.
    #[command(after_help = DOCTOR_AFTER_HELP)]
    Doctor(DoctorArgs),
}

const DOCTOR_AFTER_HELP: &str = "\
Reads sysfs, procfs and /dev (changes nothing, needs no root) and prints one line per check,
marked ✓ (fine), ✗ (missing: a fix line follows), ⚠ (works, worth knowing) or · (a fact):
the IOMMU and the kernel command line, the vfio, vfio-pci and vfio_iommu_type1 modules,
noiommu mode, /dev/vfio/vfio, each NVMe controller (driver, IOMMU group and the other devices
in it, mounted filesystems or swap, its /dev/vfio node), hugepages per size and NUMA node,
RLIMIT_MEMLOCK, the user and its capabilities, CPUs and their isolation, TSC invariance,
and what kestrel perf on a device still needs.

Exit status: 0 ready (a controller kestrel perf --target pci:BDF can open now; with
--target, that one), 1 something is missing, 2 usage error.

Examples:
  kestrel doctor
  kestrel doctor --target 0000:01:00.0
  kestrel doctor --json";

/// `kestrel doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Judge readiness for this controller only (a BDF, pci: prefix allowed).
    #[arg(long, value_name = "BDF")]
    pub target: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Read sys/, proc/, dev/ and etc/passwd below DIR instead of / (for tests; also
    /// KESTREL_SYSROOT).
    #[arg(long, value_name = "DIR", hide = true)]
    pub root: Option<PathBuf>,
}

const READ_AFTER_HELP: &str = "\
Reads the namespace /ns=N names (else the first one kestrel supports), or the file, through a queue of the library, one 128 KiB command at a
time, and writes the bytes out: a way to check what another path (a kernel, a host over
NVMe/TCP) wrote. Offset and length are multiples of the block size.

Examples:
  kestrel read --target pci:0000:01:00.0 --offset 0 --length 1M --output /tmp/head.bin
  kestrel read --target file:/tmp/disk.img --length 4k | od -A d -t x1 | head";

/// `kestrel read`.
#[derive(Args, Debug)]
pub struct ReadArgs {
    /// Target (one).
    #[command(flatten)]
    pub targets: TargetArgs,
    /// First byte.
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = offset_parser)]
    pub offset: u64,
    /// Bytes to read.
    #[arg(long, value_name = "SIZE", value_parser = size_parser)]
    pub length: u64,
    /// Write here instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

const WRITE_AFTER_HELP: &str = "\
Writes the bytes of --input to the target from --offset on, through a queue of the library,
one 128 KiB command at a time, then flushes: the counterpart of kestrel read, to hand data
to another path (a kernel driver) to read back. The target is the namespace /ns=N names,
else the first one kestrel serves, or the file; the offset and the input's size are
multiples of the block size. Overwrites what is there.

Examples:
  kestrel write --target pci:0000:01:00.0/ns=2 --offset 1M --input /tmp/pattern.bin
  kestrel write --target file:/tmp/disk.img,size=16M --input /tmp/pattern.bin";

/// `kestrel write`.
#[derive(Args, Debug)]
pub struct WriteArgs {
    /// Target (one).
    #[command(flatten)]
    pub targets: TargetArgs,
    /// First byte written.
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = offset_parser)]
    pub offset: u64,
    /// The data: all of this file.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
}

const IDENTIFY_AFTER_HELP: &str = "\
Prints the controller (model, serial, firmware, NVMe version, MQES, MDTS, I/O queues granted,
shadow doorbells, volatile write cache, optional NVM commands) and each active namespace
(NSID, size, LBA size, what deallocated blocks read as). For a file target: path, block size,
capacity, direct or buffered I/O.

--json prints one object per target (a single object for one target, an array for several)
with at least: vs, model, serial, firmware, mqes, mdts_bytes, io_queues,
namespaces: [{nsid, lba_size, size_lbas, size_bytes}].

Examples:
  kestrel identify
  kestrel identify --json
  kestrel identify --target emu:namespaces=2,lba=512,size=64M
  kestrel identify --target emu:ns=64M+512,ns=64M+4096+md8+pi1,ns=64M+zoned+zone4M
  kestrel identify --target pci:0000:01:00.0
  kestrel identify --target file:/tmp/disk.img,size=1G";

const SMART_AFTER_HELP: &str = "\
Decodes the SMART / Health Information log (critical warnings by name, temperature, spare,
wear, data units and commands, busy time, power cycles and hours, unsafe shutdowns, media
errors) and lists the valid entries of the Error Information log. NVMe targets only.

Examples:
  kestrel smart
  kestrel smart --json --target 0000:01:00.0";

const LIST_AFTER_HELP: &str = "\
Reads sysfs (no device is opened): each NVMe controller (PCI class 0x010802) with its
vendor:device, NUMA node, IOMMU group, bound driver and block devices (and whether they are
mounted or otherwise in use), and the hugepage pools per NUMA node. To hand a controller to
kestrel: PCI_ALLOWED=<BDF> scripts/setup.sh config.

Examples:
  kestrel list";

const PERF_AFTER_HELP: &str = "\
Each core in --cores runs one pinned poller thread with its own queue pairs on every target
(--qpairs-per-core of them), keeping --queue-depth I/Os outstanding on each. A controller
target is every active namespace kestrel supports (or the one /ns=N names); a namespace of
a format kestrel refuses is skipped with a note giving its format (skipped_namespaces in
JSON), and the controller is asked for queues for every namespace of the run. The report
has one row per core per target and a Total row (IOPS, MiB/s, latency), latency
percentiles from an HDR histogram, transport counters (doorbell writes per I/O) and the
pollers' CPU busy time; --json prints all of it (schema in docs/perf.md).

Note: -q is --queue-depth, as in spdk_nvme_perf; --quiet has no short form.

Only successful I/Os count in IOPS, MiB/s and latency. Every I/O of the run ends in exactly
one outcome (succeeded, error with its NVMe status or errno, timed out, cancelled, or lost),
reported per target and in total, with the timeouts, Aborts and controller resets the driver
went through. Exit status: 0 when every I/O succeeded (and, with --verify, every block
matched); 3 when I/O failed, timed out, was lost, the controller had to be reset, or no I/O
succeeded; 4 when --verify found wrong data; 2 for a usage error; 1 when the run could not
be set up. What the run used where it differs from what was asked (a ring clamped to the
controller's queue size, shadow doorbells not offered, the emulator sharing the pollers'
cores) is printed as a warning on stderr and listed in the report (warnings in JSON).

Zoned namespaces (docs/formats.md) take -w zone-write (sequential writes at each zone's
write pointer) or -w zone-append (Zone Append; each completion's LBA is checked against the
zone's write pointer): each outstanding I/O owns its own zones (so -q x --qpairs-per-core x
cores must not exceed the zones, nor the namespace's max open and active zones), resets a
zone before writing it from its start, and moves to its next zone when one is full. Other
workloads that write are refused on a zoned namespace (and skipped with a note on a
controller that has other namespaces); read workloads run on it as on any namespace.

Ctrl-C ends the run early and still prints the report (exit status 130).

On the default emulator the namespace is backed by the null store (reads return zeroes,
writes are dropped: the figures measure the driver, not memcpy), or by memory with
--verify. The emulator thread is pinned to a core not in --cores when there is one; it needs
a core of its own, so on the emulator use at most one poller fewer than the machine has
cores. Busy pollers on every core are refused (exit 2) unless the emulator's place is given
(emu:core=N|none: it then shares the pollers' cores, and the report says so) or the pollers
sleep when idle (--poll-mode hybrid|interrupt); a one-core machine shares its core.

--poll-mode hybrid|interrupt creates the queues with completion interrupts (MSI-X through
VFIO, or the emulator's) and sleeps on them when idle; the CPU line per core gives the
poller thread's CPU time over the window and its interrupt sleeps.

Examples:
  kestrel perf -t 5
  kestrel perf -q 1 -o 4k -w randread -t 10
  kestrel perf -q 128 -w randrw -M 70 --json
  kestrel perf -w randrw -M 70 -L --transport-stats
  kestrel perf -w randwrite --verify --target emu:store=memory
  kestrel perf -w zone-write --verify --target emu:ns=64M+zoned+zone1M
  kestrel perf -w zone-append -q 4 --target pci:0000:01:00.0/ns=2
  kestrel perf --doorbell immediate --shadow-doorbells off
  kestrel perf -q 1 --poll-mode hybrid
  kestrel perf --latency-plot lat.svg
  kestrel perf -t 1 --io-timeout 200ms --target emu:faults=drop/read/max1
  kestrel perf --target pci:0000:01:00.0 -c 0-1 -q 64";

/// Options every subcommand that opens a device takes.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    #[arg(long = "target", value_name = "SPEC", value_parser = target_parser, long_help = TARGET_HELP_LONG, help = "Target: pci:BDF, file:PATH[,...], tcp:HOST:PORT/NQN[,...] or emu[:...] (repeatable; default emu)")]
    /// Targets (empty: the default emulator).
    pub targets: Vec<TargetSpec>,
    /// Allow VFIO's unsafe noiommu mode for pci targets (DMA is then unconfined).
    #[arg(long)]
    pub noiommu: bool,
}

/// `kestrel identify`.
#[derive(Args, Debug)]
pub struct IdentifyArgs {
    /// Targets.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `kestrel smart`.
#[derive(Args, Debug)]
pub struct SmartArgs {
    /// Targets.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `kestrel list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// A discovery controller to list instead of the local controllers: tcp:HOST[:PORT]
    /// (port 8009 unless given), repeatable; prints what it offers as `nvme discover` does.
    #[arg(long = "target", value_name = "SPEC", value_parser = target_parser)]
    pub targets: Vec<TargetSpec>,
}

/// The I/O pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Sequential mixed reads and writes (--rwmixread).
    Rw,
    /// Random mixed reads and writes (--rwmixread).
    Randrw,
    /// Zoned namespaces: sequential writes at each zone's write pointer (each outstanding
    /// I/O owns its zones; a full zone is reset and written again).
    ZoneWrite,
    /// Zoned namespaces: Zone Append to each zone (each outstanding I/O owns its zones; a
    /// full zone is reset and appended to again).
    ZoneAppend,
}

impl Workload {
    /// Random offsets.
    pub fn random(self) -> bool {
        matches!(
            self,
            Workload::Randread | Workload::Randwrite | Workload::Randrw
        )
    }
    /// Percentage of reads, given the mix for mixed workloads.
    pub fn read_pct(self, mix: u8) -> u8 {
        match self {
            Workload::Read | Workload::Randread => 100,
            Workload::Write | Workload::Randwrite | Workload::ZoneWrite | Workload::ZoneAppend => 0,
            Workload::Rw | Workload::Randrw => mix,
        }
    }
    /// Whether any writes are issued.
    pub fn writes(self, mix: u8) -> bool {
        self.read_pct(mix) < 100
    }
    /// The name as given on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::Randread => "randread",
            Workload::Randwrite => "randwrite",
            Workload::Rw => "rw",
            Workload::Randrw => "randrw",
            Workload::ZoneWrite => "zone-write",
            Workload::ZoneAppend => "zone-append",
        }
    }
    /// The zoned workload, if it is one.
    pub fn zoned(self) -> Option<ZonedMode> {
        match self {
            Workload::ZoneWrite => Some(ZonedMode::Write),
            Workload::ZoneAppend => Some(ZonedMode::Append),
            _ => None,
        }
    }
}

/// How a zoned workload writes a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZonedMode {
    /// Write at the write pointer.
    Write,
    /// Zone Append (the controller picks the LBA and returns it).
    Append,
}

/// `--doorbell`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DoorbellArg {
    /// One SQ doorbell write per batch of submissions.
    Batched,
    /// One SQ doorbell write per command.
    Immediate,
}

/// `--poll-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PollModeArg {
    /// Poll without pause (the lowest latency; each poller core is always busy).
    Busy,
    /// Poll while completions come and for 1 ms after the last, then sleep until a
    /// completion interrupt.
    Hybrid,
    /// Sleep until a completion interrupt whenever a poll finds nothing.
    Interrupt,
}

/// `kestrel perf`.
#[derive(Args, Debug)]
pub struct PerfArgs {
    /// Targets.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// I/Os kept outstanding on each queue pair.
    #[arg(short = 'q', long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4095))]
    pub queue_depth: u32,
    /// Bytes per I/O, a multiple of the target's block size (4k, 128KiB, 512, ...).
    #[arg(short = 'o', long, value_name = "SIZE", default_value = "4k", value_parser = size_parser)]
    pub io_size: u64,
    /// I/O pattern.
    #[arg(short = 'w', long, value_enum, default_value_t = Workload::Randread)]
    pub workload: Workload,
    /// Percentage of reads in rw and randrw.
    #[arg(short = 'M', long, value_name = "PCT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: u8,
    /// Length of the measured window, after the warmup: seconds (10) or a duration (500ms,
    /// 1.5s).
    #[arg(short = 't', long = "time", value_name = "DURATION", default_value = "10", value_parser = time_parser)]
    pub time: Duration,
    /// I/O before measuring starts (not counted): seconds or a duration; at most an hour.
    #[arg(long, value_name = "DURATION", default_value = "1", value_parser = warmup_parser)]
    pub warmup: Duration,
    /// End each poller's measured window once this many I/Os completed in it (any outcome),
    /// or at --time if that comes first (fio's number_ios): a run of known size that a busy
    /// machine slows down but cannot empty.
    #[arg(long, value_name = "N", value_parser = number_ios_parser)]
    pub number_ios: Option<u64>,
    /// Count each poller's system calls in the measured window (a seccomp filter on the
    /// poller thread, answered by a supervisor thread; Linux 5.5+). A polled NVMe queue
    /// makes none; a file target makes one io_uring_enter per batch. Slows calls outside
    /// the window.
    #[arg(long)]
    pub count_syscalls: bool,
    /// Per-command I/O timeout: a command not completed within it is aborted, and if the
    /// Abort fails the controller is reset (NVMe targets; at least 1ms).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = timeout_parser)]
    pub io_timeout: Duration,
    /// Timeout of admin commands (bring-up, queue creation, Abort, reset; NVMe targets; at
    /// least 1ms).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = timeout_parser)]
    pub admin_timeout: Duration,
    /// Cores to run pollers on: a list like 0,2-3 or a hex mask like 0x5.
    #[arg(short = 'c', long, value_name = "CORES", default_value = "0", value_parser = cores_parser)]
    pub cores: CoreList,
    /// Ring entries of each queue pair (default: 2 x queue depth + 1, at least 64); at least
    /// queue depth + 1, and clamped to what the controller allows.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=4096))]
    pub io_queue_size: Option<u32>,
    /// Queue pairs per core per target.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub qpairs_per_core: u32,
    /// When the SQ tail doorbell is written.
    #[arg(long, value_enum, default_value_t = DoorbellArg::Batched)]
    pub doorbell: DoorbellArg,
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller offers them.
    #[arg(long, value_name = "on|off", default_value = "off", action = ArgAction::Set, value_parser = switch_parser)]
    pub shadow_doorbells: bool,
    /// How pollers wait: busy polling, or sleeping on completion interrupts (MSI-X through
    /// VFIO, or the emulator's) when idle (hybrid: after polling 1 ms without a completion).
    #[arg(long, value_enum, default_value_t = PollModeArg::Busy)]
    pub poll_mode: PollModeArg,
    /// Completions reaped per poll of a queue pair (0: the queue's own default: an NVMe
    /// queue pair a quarter of its entries, 1 to 128, as SPDK; a file every one ready).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub max_completions: u32,
    /// Write blocks carrying their LBA, a generation and a checksum, and check them on read.
    #[arg(long)]
    pub verify: bool,
    /// Seed of the per-core random generators.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG of the latency distribution (histogram and CDF).
    #[arg(long, value_name = "FILE.svg")]
    pub latency_plot: Option<PathBuf>,
    /// Print the latency histogram (-L: of the total, read and write apart in mixed
    /// workloads; -LL: also per core and target), as spdk_nvme_perf's -L/-LL.
    #[arg(short = 'L', long = "latency-histogram", action = ArgAction::Count)]
    pub latency_histogram: u8,
    /// Print the transport counters (doorbells, shadow doorbell updates, polls that found
    /// nothing) per core and target; JSON always has them.
    #[arg(long)]
    pub transport_stats: bool,
    /// Print a progress line each second on stderr even when it is not a terminal (on a
    /// terminal they are printed unless --quiet).
    #[arg(long)]
    pub progress: bool,
    /// No progress lines and no notes on stderr (no short form: -q is --queue-depth).
    #[arg(long)]
    pub quiet: bool,
}

/// A parsed core list (newtype so clap does not treat `Vec` as a repeated argument).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreList(pub Vec<usize>);

fn target_parser(s: &str) -> Result<TargetSpec, parse::ParseError> {
    parse::parse_target(s)
}
fn size_parser(s: &str) -> Result<u64, String> {
    match parse::parse_size(s) {
        Ok(0) => Err("the size must be at least one block".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(e.to_string()),
    }
}
fn offset_parser(s: &str) -> Result<u64, String> {
    parse::parse_size(s).map_err(|e| e.to_string())
}
/// A length of time in the one duration grammar, where a plain number counts seconds
/// (`5`, `1.5`, `5s`, `500ms`).
fn seconds_or_duration(s: &str) -> Result<Duration, String> {
    parse::parse_duration_or(s, parse::TimeUnit::Secs).map_err(|e| e.to_string())
}
fn time_parser(s: &str) -> Result<Duration, String> {
    match seconds_or_duration(s)? {
        d if d < Duration::from_millis(1) => {
            Err(format!("{s:?}: the measured window must be at least 1ms"))
        }
        d => Ok(d),
    }
}
fn number_ios_parser(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("0: at least 1 I/O (leave --number-ios out to run for --time)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?}: a count of I/Os, like 1000")),
    }
}

fn warmup_parser(s: &str) -> Result<Duration, String> {
    match seconds_or_duration(s)? {
        d if d > Duration::from_secs(3600) => Err(format!("{s:?}: the warmup is at most an hour")),
        d => Ok(d),
    }
}
fn timeout_parser(s: &str) -> Result<Duration, String> {
    let d = parse::parse_duration(s).map_err(|e| e.to_string())?;
    if d < kestrel::nvme::qpair::MIN_TIMEOUT {
        return Err(format!(
            "{s:?}: a timeout must be at least {:?}",
            kestrel::nvme::qpair::MIN_TIMEOUT
        ));
    }
    Ok(d)
}
fn cores_parser(s: &str) -> Result<CoreList, parse::ParseError> {
    parse::parse_cores(s).map(CoreList)
}
fn switch_parser(s: &str) -> Result<bool, parse::ParseError> {
    parse::parse_switch(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn perf_defaults() {
        let cli = Cli::try_parse_from(["kestrel", "perf"]).unwrap();
        let Command::Perf(p) = cli.command else {
            panic!("not perf")
        };
        assert_eq!(p.queue_depth, 32);
        assert_eq!(p.io_size, 4096);
        assert_eq!(p.workload, Workload::Randread);
        assert_eq!(p.rwmixread, 50);
        assert_eq!(p.time, Duration::from_secs(10));
        assert_eq!(p.warmup, Duration::from_secs(1));
        assert_eq!(p.io_timeout, Duration::from_secs(30));
        assert_eq!(p.admin_timeout, Duration::from_secs(60));
        assert_eq!(p.cores, CoreList(vec![0]));
        assert_eq!(p.qpairs_per_core, 1);
        assert_eq!(p.doorbell, DoorbellArg::Batched);
        assert!(!p.shadow_doorbells);
        assert!(p.targets.targets.is_empty());
    }

    #[test]
    fn perf_options() {
        let cli = Cli::try_parse_from([
            "kestrel",
            "perf",
            "-q",
            "128",
            "-o",
            "128KiB",
            "-w",
            "randrw",
            "-M",
            "70",
            "-c",
            "0x3",
            "--shadow-doorbells",
            "off",
            "--target",
            "emu:size=64M",
            "--target",
            "file:/tmp/x",
            "--quiet",
        ])
        .unwrap();
        let Command::Perf(p) = cli.command else {
            panic!("not perf")
        };
        assert_eq!(p.queue_depth, 128);
        assert_eq!(p.io_size, 128 << 10);
        assert_eq!(p.cores, CoreList(vec![0, 1]));
        assert!(!p.shadow_doorbells);
        assert_eq!(p.targets.targets.len(), 2);
        assert!(p.quiet);
    }

    #[test]
    fn times_take_seconds_or_durations() {
        let p = |args: &[&str]| {
            let mut v = vec!["kestrel", "perf"];
            v.extend_from_slice(args);
            match Cli::try_parse_from(v).unwrap().command {
                Command::Perf(p) => p,
                _ => panic!("not perf"),
            }
        };
        assert_eq!(p(&["-t", "2"]).time, Duration::from_secs(2));
        assert_eq!(p(&["-t", "2s"]).time, Duration::from_secs(2));
        assert_eq!(p(&["-t", "500ms"]).time, Duration::from_millis(500));
        assert_eq!(p(&["-t", "1.5"]).time, Duration::from_millis(1500));
        for (t, why) in [
            ("2x", "unknown unit"),
            ("90000s", "longer than a day"),
            ("86401", "longer than a day"),
        ] {
            let e = Cli::try_parse_from(["kestrel", "perf", "-t", t]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{t}");
            assert!(e.to_string().contains(why), "{t}: {e}");
        }
        assert_eq!(p(&["--warmup", "0"]).warmup, Duration::ZERO);
        let q = p(&["--io-timeout", "200ms", "--admin-timeout", "1.5s"]);
        assert_eq!(q.io_timeout, Duration::from_millis(200));
        assert_eq!(q.admin_timeout, Duration::from_millis(1500));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["kestrel", "perf", "-o", "4q"][..],
            &["kestrel", "perf", "-o", "0"],
            &["kestrel", "perf", "-c", "3-1"],
            &["kestrel", "perf", "-q", "0"],
            &["kestrel", "perf", "-M", "101"],
            &["kestrel", "perf", "-w", "sideways"],
            &["kestrel", "perf", "-t", "0"],
            &["kestrel", "perf", "-t", "2x"],
            &["kestrel", "perf", "--io-timeout", "0"],
            &["kestrel", "perf", "--io-timeout", "500"],
            &["kestrel", "perf", "--admin-timeout", "10us"],
            &["kestrel", "perf", "--warmup", "2h"],
            &["kestrel", "identify", "--target", "nvme0"],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }
}
