//! The C ABI from C: the checked-in header is compiled and its sizes, offsets and
//! constants compared with the Rust definitions; the example program in
//! `driver/examples/c/` is built with gcc against the shared and the static library and
//! run against the emulator and a file target; and C programs built with AddressSanitizer
//! keep, and break, the buffer contract of `kestrel.h` (`tests/c/`).

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kestrel::capi::*;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// gcc, or `None` (the test then says why it is skipped).
fn gcc() -> Option<PathBuf> {
    let ok = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(PathBuf::from("gcc"))
    } else {
        eprintln!("SKIPPED: gcc is not installed (scripts/test.sh installs it)");
        None
    }
}

/// The directory holding the libkestrel.so / libkestrel.a cargo built for this test run.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    for d in [deps.clone(), deps.parent().unwrap().to_path_buf()] {
        if d.join("libkestrel.so").exists() && d.join("libkestrel.a").exists() {
            return d;
        }
    }
    panic!(
        "libkestrel.so / libkestrel.a not found next to {}: the library's crate-type must include cdylib and staticlib",
        exe.display()
    );
}

fn run(cmd: &mut Command) -> std::process::Output {
    // The programs find the library through their rpath (this run's build). cargo's
    // LD_LIBRARY_PATH would come first and can name target/release, where an older
    // `cargo build` may have left a libkestrel.so without this build's symbols.
    cmd.env_remove("LD_LIBRARY_PATH");
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed with {}:\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

fn compile(gcc: &Path, src: &Path, out: &Path, link: &[String]) {
    let mut c = Command::new(gcc);
    c.args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(manifest_dir().join("include"))
        .arg("-o")
        .arg(out)
        .arg(src)
        .args(link);
    run(&mut c);
}

fn dynamic_link() -> Vec<String> {
    let d = lib_dir();
    vec![
        format!("-L{}", d.display()),
        "-lkestrel".into(),
        format!("-Wl,-rpath,{}", d.display()),
    ]
}

fn static_link() -> Vec<String> {
    vec![
        lib_dir().join("libkestrel.a").display().to_string(),
        "-lpthread".into(),
        "-ldl".into(),
        "-lm".into(),
        "-lgcc_s".into(),
    ]
}

#[test]
fn header_matches_the_rust_definitions() {
    let Some(gcc) = gcc() else { return };
    let want: Vec<(&str, u64)> = [struct_layouts(), alignments(), header_constants()].concat();
    let got = header_values(&gcc, &want);
    assert_eq!(got.len(), want.len());
    let mismatches: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: header says {:?}, Rust says {v}", got.get(*k)))
        .collect();
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

/// `sizeof` of a C struct and the `offsetof` of each field named, as C expressions with
/// the values of the Rust type.
macro_rules! layout {
    ($rust:ty, $c:literal, [$($field:ident),* $(,)?]) => {
        vec![
            (concat!("sizeof(struct ", $c, ")"), size_of::<$rust>() as u64),
            $((
                concat!("offsetof(struct ", $c, ", ", stringify!($field), ")"),
                offset_of!($rust, $field) as u64,
            ),)*
        ]
    };
}

/// `_Alignof` of a C struct, with the alignment of the Rust type.
macro_rules! align {
    ($rust:ty, $c:literal) => {
        (
            concat!("_Alignof(struct ", $c, ")"),
            std::mem::align_of::<$rust>() as u64,
        )
    };
}

/// Constants of the header, each with the Rust constant of the same name.
macro_rules! constants {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $name as u64)),*]
    };
}

/// The structs of `kestrel.h`: sizes and field offsets.
fn struct_layouts() -> Vec<(&'static str, u64)> {
    [
        layout!(
            KestrelInfo,
            "kestrel_info",
            [
                num_blocks,
                capacity_bytes,
                max_transfer_bytes,
                block_size,
                nsid,
                flags,
                md_size,
                pi_type,
                md_flags,
                name,
            ]
        ),
        layout!(KestrelIovec, "kestrel_iovec", [base, len]),
        layout!(
            KestrelIocb,
            "kestrel_iocb",
            [
                user_data, offset, len, buf, iov, iovcnt, nsid, opcode, flags, reserved, md_buf,
                md_len, ref_tag, app_tag, app_mask,
            ]
        ),
        layout!(
            KestrelEvent,
            "kestrel_event",
            [user_data, res, has_status, sct, sc, dnr, more, cancel, reserved, value]
        ),
        layout!(
            KestrelOpenParams,
            "kestrel_open_params",
            [io_timeout_ns, admin_timeout_ns, flags, reserved]
        ),
        layout!(
            KestrelIoParams,
            "kestrel_io_params",
            [nr_events, flags, bounce_buffers, bounce_buf_size]
        ),
        layout!(KestrelZoneInfo, "kestrel_zone_info", [max_active]),
    ]
    .concat()
}

/// Alignments too: a C compiler may pad where Rust does not.
fn alignments() -> Vec<(&'static str, u64)> {
    vec![
        align!(KestrelInfo, "kestrel_info"),
        align!(KestrelIocb, "kestrel_iocb"),
        align!(KestrelEvent, "kestrel_event"),
        align!(KestrelIovec, "kestrel_iovec"),
        align!(KestrelIoParams, "kestrel_io_params"),
        align!(KestrelOpenParams, "kestrel_open_params"),
    ]
}

/// The constants of `kestrel.h`, by theme.
fn header_constants() -> Vec<(&'static str, u64)> {
    [
        // Version and limits.
        constants![
            KESTREL_ABI_VERSION,
            KESTREL_MAX_IOV,
            KESTREL_NAME_LEN,
            KESTREL_DEFAULT_BOUNCE_BUFFERS,
            KESTREL_DEFAULT_BOUNCE_BUF_SIZE,
        ],
        // Opcodes.
        constants![
            KESTREL_OP_READ,
            KESTREL_OP_WRITE,
            KESTREL_OP_FLUSH,
            KESTREL_OP_WRITE_ZEROES,
            KESTREL_OP_DISCARD,
            KESTREL_OP_READV,
            KESTREL_OP_WRITEV,
            KESTREL_OP_ZONE_APPEND,
            KESTREL_OP_ZONE_OPEN,
            KESTREL_OP_ZONE_CLOSE,
            KESTREL_OP_ZONE_FINISH,
            KESTREL_OP_ZONE_RESET,
            KESTREL_OP_REPORT_ZONES,
        ],
        // Flags of iocbs, metadata, targets, contexts and reactors.
        constants![
            KESTREL_IOCB_MD,
            KESTREL_IOCB_ZONE_ALL,
            KESTREL_MD_EXTENDED,
            KESTREL_MD_PI_FIRST,
            KESTREL_MD_REQUIRED,
            KESTREL_INFO_ZONED,
            KESTREL_INFO_WRITE_ZEROES,
            KESTREL_INFO_DISCARD,
            KESTREL_INFO_DISCARD_ZEROES,
            KESTREL_INFO_FLUSH,
            KESTREL_INFO_READ_ONLY,
            KESTREL_IO_BOUNCE,
            KESTREL_REACTOR_BACKOFF,
            KESTREL_REACTOR_INTERRUPT,
            KESTREL_REACTOR_HYBRID,
        ],
        // Cancel outcomes and the statuses an event reports.
        constants![
            KESTREL_CANCEL_NONE,
            KESTREL_CANCEL_CANCELLED,
            KESTREL_CANCEL_ABORTED,
            KESTREL_CANCEL_TOO_LATE,
            KESTREL_CANCEL_STATUS_CANCELLED,
            KESTREL_CANCEL_STATUS_ABORTED,
            KESTREL_CANCEL_STATUS_NOT_ABORTED,
            KESTREL_CANCEL_STATUS_TOO_LATE,
            KESTREL_CANCEL_STATUS_REQUESTED,
        ],
    ]
    .concat()
}

/// The value of each C expression of `want`, from a program compiled against the
/// checked-in header and run.
fn header_values(gcc: &Path, want: &[(&str, u64)]) -> HashMap<String, u64> {
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"kestrel.h\"\nint main(void) {\n",
    );
    for (expr, _) in want {
        src.push_str(&format!(
            "    printf(\"%s=%llu\\n\", \"{expr}\", (unsigned long long)({expr}));\n"
        ));
    }
    src.push_str("    return 0;\n}\n");
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("layout.c");
    std::fs::write(&c, src).unwrap();
    let exe = dir.path().join("layout");
    compile(gcc, &c, &exe, &[]);
    let out = run(&mut Command::new(&exe));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.rsplit_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// `examples/c/kestrel_example.c` built as `name` in a new temporary directory.
fn example(gcc: &Path, link: &[String], name: &str) -> (tempfile::TempDir, PathBuf) {
    example_from(gcc, link, "kestrel_example.c", name)
}

/// The example program `examples/c/<src>` built as `name` in a new temporary directory.
fn example_from(
    gcc: &Path,
    link: &[String],
    src: &str,
    name: &str,
) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join(name);
    compile(
        gcc,
        &manifest_dir().join("examples/c").join(src),
        &exe,
        link,
    );
    (dir, exe)
}

fn run_example(exe: &Path, target: &str) {
    run_example_on(exe, target, "0");
}

fn run_example_on(exe: &Path, target: &str, cores: &str) {
    let mut cmd = Command::new(exe);
    cmd.arg(target);
    if !cores.is_empty() {
        cmd.arg(cores);
    }
    assert_all_checks_passed(&run(&mut cmd));
}

/// The program said it passed all its checks (the C programs' last line).
fn assert_all_checks_passed(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("all checks passed"),
        "unexpected output: {stdout}"
    );
}

#[test]
fn c_example_against_the_emulator() {
    let Some(gcc) = gcc() else { return };
    let (_d, exe) = example(&gcc, &dynamic_link(), "kestrel_example");
    run_example(&exe, "emu:size=64M");
    // Cross-thread part on two pinned pollers where there are two cores.
    let ids: Vec<String> = core_affinity::get_core_ids()
        .unwrap()
        .iter()
        .take(2)
        .map(|c| c.id.to_string())
        .collect();
    run_example_on(&exe, "emu:size=16M,lba=512", &ids.join(","));
}

/// The zoned example: zone info, reset, appends returning distinct LBAs, Zone Invalid
/// Write, report zones, Zone Is Full, reset; and on a namespace that is not zoned,
/// `kestrel_get_zone_info` is -ENOTSUP.
#[test]
fn c_zoned_example_against_the_emulator() {
    let Some(gcc) = gcc() else { return };
    let (_d, exe) = example_from(&gcc, &dynamic_link(), "kestrel_zoned.c", "kestrel_zoned");
    run_example_on(&exe, "emu:ns=16M+4096+zoned+zone1M", "");
    // Without cargo's LD_LIBRARY_PATH, as in `run` (which fails on the exit code wanted here).
    let out = Command::new(&exe)
        .arg("emu:size=16M")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("kestrel_get_zone_info"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_example_against_a_file_target() {
    let Some(gcc) = gcc() else { return };
    let (d, exe) = example(&gcc, &dynamic_link(), "kestrel_example");
    let img = d.path().join("disk.img");
    run_example(&exe, &format!("file:{},size=16M", img.display()));
    // The data is in the file: blocks 0.. hold the example's pattern (not all zeroes).
    let data = std::fs::read(&img).unwrap();
    assert_eq!(data.len(), 16 << 20);
    assert!(data[4096..8192].iter().any(|&b| b != 0));
}

#[test]
fn c_example_linked_statically() {
    let Some(gcc) = gcc() else { return };
    let (_d, exe) = example(&gcc, &static_link(), "kestrel_example_static");
    run_example(&exe, "emu:size=64M");
}

#[test]
fn c_example_reports_a_bad_target() {
    let Some(gcc) = gcc() else { return };
    let (_d, exe) = example(&gcc, &dynamic_link(), "kestrel_example");
    let out = Command::new(&exe).arg("bogus:thing").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid target"), "{err}");
}

/// What the C programs below start with: the headers they use, and CHECK, which ends the
/// program (exit 1) with the line, the condition and the library's last error.
const C_PRELUDE: &str = r#"
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "kestrel.h"

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "line %d: %s (last error: %s)\n", __LINE__, #c,       \
                    kestrel_last_error());                                        \
            return 1;                                                             \
        }                                                                         \
    } while (0)
"#;

/// Builds the C program `body` (after [`C_PRELUDE`]) against the shared library, runs it
/// and asserts it passed all its checks.
fn run_c_program(gcc: &Path, name: &str, body: &str) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(format!("{name}.c"));
    std::fs::write(&src, format!("{C_PRELUDE}{body}")).unwrap();
    let exe = dir.path().join(name);
    compile(gcc, &src, &exe, &dynamic_link());
    assert_all_checks_passed(&run(&mut Command::new(&exe)));
}

/// `kestrel_open_params` from C: its checks, and both timeouts honoured.
const OPEN_PARAMS_C: &str = r#"
int main(void)
{
    kestrel_t *k = NULL;
    struct kestrel_open_params p;
    memset(&p, 0, sizeof p);

    /* Refused: a timeout below 1 ms or above a day, flags set, NULL params. */
    p.io_timeout_ns = 999999;
    CHECK(kestrel_open_params("emu:size=1M", &p, &k) == -EINVAL && k == NULL);
    CHECK(strstr(kestrel_last_error(), "io_timeout_ns") != NULL);
    p.io_timeout_ns = 0;
    p.admin_timeout_ns = 86401ull * 1000000000ull;
    CHECK(kestrel_open_params("emu:size=1M", &p, &k) == -EINVAL && k == NULL);
    p.admin_timeout_ns = 0;
    p.flags = 1;
    CHECK(kestrel_open_params("emu:size=1M", &p, &k) == -EINVAL && k == NULL);
    p.flags = 0;
    CHECK(kestrel_open_params("emu:size=1M", NULL, &k) == -EINVAL && k == NULL);
    /* Zeroes: what kestrel_open does. */
    CHECK(kestrel_open_params("emu:size=1M", &p, &k) == 0 && k != NULL);
    CHECK(kestrel_close(k) == 0);

    /* The I/O timeout: the emulator holds a read's completion back for 5 s; with a
     * 200 ms timeout the read is aborted and its event is -ETIMEDOUT (with the default
     * 30 s it would complete, successfully, after 5 s). */
    p.io_timeout_ns = 200000000ull;
    CHECK(kestrel_open_params("emu:size=1M,faults=delay/read/5s/100%/max1", &p, &k) == 0);
    void *buf = NULL;
    CHECK(kestrel_dma_alloc(k, 4096, &buf) == 0);
    kestrel_ctx_t *ctx = NULL;
    CHECK(kestrel_io_setup(k, 4, &ctx) == 0);
    struct kestrel_iocb io;
    memset(&io, 0, sizeof io);
    io.opcode = KESTREL_OP_READ;
    io.len = 4096;
    io.buf = buf;
    io.user_data = 7;
    CHECK(kestrel_io_submit(ctx, 1, &io) == 1);
    struct kestrel_event ev;
    struct timespec limit = {20, 0}; /* a bound against hanging, far above the timeout */
    CHECK(kestrel_io_getevents(ctx, 1, 1, &ev, &limit) == 1);
    printf("read: res %lld\n", (long long)ev.res);
    CHECK(ev.user_data == 7 && ev.res == -ETIMEDOUT);
    CHECK(kestrel_io_destroy(ctx) == 0);
    CHECK(kestrel_dma_free(k, buf) == 0);
    CHECK(kestrel_close(k) == 0);

    /* The admin timeout: every admin command held back for 5 s; bring-up's first one
     * times out at 200 ms and the open fails (with the default 60 s it would succeed). */
    memset(&p, 0, sizeof p);
    p.admin_timeout_ns = 200000000ull;
    int rc = kestrel_open_params("emu:size=1M,faults=delay/admin/5s/100%", &p, &k);
    printf("admin: %d %s\n", rc, kestrel_last_error());
    CHECK(rc < 0 && rc != -EINVAL && k == NULL);
    puts("all checks passed");
    return 0;
}
"#;

#[test]
fn open_params_set_the_timeouts_from_c() {
    let Some(gcc) = gcc() else { return };
    run_c_program(&gcc, "open_params", OPEN_PARAMS_C);
}

/// Metadata from C: `kestrel_get_info` describes the format; a separate-metadata PI type 1
/// namespace is written with PI computed in C (an independent bitwise CRC-16/T10-DIF) and
/// read back with its metadata; a write without its metadata is refused before the device
/// (-EINVAL); a wrong guard comes back as End-to-end Guard Check Error (sct 2, sc 82h);
/// and an extended-LBA namespace carries the metadata inside the data buffer.
const METADATA_C: &str = r#"
static uint16_t crc16(uint16_t crc, const uint8_t *p, size_t n)
{
    while (n--) {
        crc ^= (uint16_t)(*p++) << 8;
        for (int i = 0; i < 8; i++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x8BB7) : (uint16_t)(crc << 1);
    }
    return crc;
}

static int one(kestrel_ctx_t *ctx, struct kestrel_iocb *io, struct kestrel_event *ev)
{
    struct timespec limit = {20, 0};
    if (kestrel_io_submit(ctx, 1, io) != 1)
        return -1;
    return kestrel_io_getevents(ctx, 1, 1, ev, &limit) == 1 ? 0 : -1;
}

int main(void)
{
    kestrel_t *k = NULL;
    struct kestrel_info info;
    CHECK(kestrel_open("emu:ns=8M+512+md16+pi1", &k) == 0);
    CHECK(kestrel_get_info(k, &info) == 0);
    CHECK(info.block_size == 512 && info.md_size == 16 && info.pi_type == 1);
    CHECK(info.md_flags == KESTREL_MD_REQUIRED);
    uint8_t *data = NULL, *md = NULL, *rd = NULL, *rmd = NULL;
    CHECK(kestrel_dma_alloc(k, 4096, (void **)&data) == 0);
    CHECK(kestrel_dma_alloc(k, 4096, (void **)&md) == 0);
    CHECK(kestrel_dma_alloc(k, 4096, (void **)&rd) == 0);
    CHECK(kestrel_dma_alloc(k, 4096, (void **)&rmd) == 0);
    uint64_t lba = 40;
    for (int i = 0; i < 4096; i++)
        data[i] = (uint8_t)(i * 7 + 3);
    for (int b = 0; b < 8; b++) {
        uint8_t *m = md + 16 * b;
        for (int j = 0; j < 8; j++)
            m[j] = (uint8_t)(b * 16 + j); /* the caller's own metadata before the PI */
        uint16_t g = crc16(crc16(0, data + 512 * b, 512), m, 8);
        uint32_t ref = (uint32_t)(lba + b);
        m[8] = g >> 8; m[9] = g & 0xff; m[10] = 0x12; m[11] = 0x34;
        m[12] = ref >> 24; m[13] = ref >> 16; m[14] = ref >> 8; m[15] = ref;
    }
    kestrel_ctx_t *ctx = NULL;
    CHECK(kestrel_io_setup(k, 4, &ctx) == 0);
    struct kestrel_iocb io;
    struct kestrel_event ev;
    memset(&io, 0, sizeof io);
    io.opcode = KESTREL_OP_WRITE;
    io.offset = lba * 512;
    io.len = 4096;
    io.buf = data;
    /* No metadata on a format that needs it: refused before the device. */
    CHECK(kestrel_io_submit(ctx, 1, &io) == -EINVAL);
    CHECK(strstr(kestrel_last_error(), "needs the metadata") != NULL);
    io.flags = KESTREL_IOCB_MD;
    io.md_buf = md;
    io.md_len = 8 * 16;
    io.app_tag = 0x1234;
    io.app_mask = 0xffff;
    CHECK(one(ctx, &io, &ev) == 0);
    printf("write: res %lld\n", (long long)ev.res);
    CHECK(ev.res == 4096);
    memset(&io, 0, sizeof io);
    io.opcode = KESTREL_OP_READ;
    io.offset = lba * 512;
    io.len = 4096;
    io.buf = rd;
    io.flags = KESTREL_IOCB_MD;
    io.md_buf = rmd;
    io.md_len = 8 * 16;
    io.app_tag = 0x1234;
    io.app_mask = 0xffff;
    CHECK(one(ctx, &io, &ev) == 0 && ev.res == 4096);
    CHECK(memcmp(rd, data, 4096) == 0 && memcmp(rmd, md, 8 * 16) == 0);
    /* A wrong guard: the controller refuses the write by name. */
    md[8] ^= 1;
    memset(&io, 0, sizeof io);
    io.opcode = KESTREL_OP_WRITE;
    io.offset = lba * 512;
    io.len = 512;
    io.buf = data;
    io.flags = KESTREL_IOCB_MD;
    io.md_buf = md;
    io.md_len = 16;
    CHECK(one(ctx, &io, &ev) == 0);
    printf("bad guard: res %lld sct %d sc %#x\n", (long long)ev.res, ev.sct, ev.sc);
    CHECK(ev.res == -EIO && ev.has_status && ev.sct == 2 && ev.sc == 0x82);
    CHECK(kestrel_io_destroy(ctx) == 0);
    CHECK(kestrel_close(k) == 0);

    /* Extended LBAs: 520 bytes per block in buf, len counts the data. */
    CHECK(kestrel_open("emu:ns=8M+512+md8+ext", &k) == 0);
    CHECK(kestrel_get_info(k, &info) == 0);
    CHECK(info.md_size == 8 && info.pi_type == 0);
    CHECK(info.md_flags == (KESTREL_MD_EXTENDED | KESTREL_MD_REQUIRED));
    CHECK(kestrel_dma_alloc(k, 8192, (void **)&data) == 0);
    CHECK(kestrel_dma_alloc(k, 8192, (void **)&rd) == 0);
    for (int i = 0; i < 8 * 520; i++)
        data[i] = (uint8_t)(i * 13 + 1);
    CHECK(kestrel_io_setup(k, 4, &ctx) == 0);
    memset(&io, 0, sizeof io);
    io.opcode = KESTREL_OP_WRITE;
    io.len = 4096;
    io.buf = data;
    io.flags = KESTREL_IOCB_MD;
    CHECK(one(ctx, &io, &ev) == 0 && ev.res == 4096);
    io.opcode = KESTREL_OP_READ;
    io.buf = rd;
    CHECK(one(ctx, &io, &ev) == 0 && ev.res == 4096);
    CHECK(memcmp(rd, data, 8 * 520) == 0);
    CHECK(kestrel_io_destroy(ctx) == 0);
    CHECK(kestrel_close(k) == 0);
    puts("all checks passed");
    return 0;
}
"#;

#[test]
fn metadata_and_protection_information_from_c() {
    let Some(gcc) = gcc() else { return };
    run_c_program(&gcc, "metadata", METADATA_C);
}

/// gcc with AddressSanitizer (its runtime, libasan), or `None` (the test then says why it
/// is skipped): a one-line program is built with `-fsanitize=address` and run.
fn gcc_asan() -> Option<PathBuf> {
    let gcc = gcc()?;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("probe.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let exe = dir.path().join("probe");
    let built = Command::new(&gcc)
        .args(ASAN_FLAGS)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    let ran = built.status.success() && Command::new(&exe).status().is_ok_and(|s| s.success());
    if ran {
        Some(gcc)
    } else {
        eprintln!(
            "SKIPPED: gcc cannot build and run a program with -fsanitize=address (is libasan \
             installed? scripts/test.sh installs libasan8): {}",
            String::from_utf8_lossy(&built.stderr)
        );
        None
    }
}

/// How the AddressSanitizer programs are built (added to [`compile`]'s flags).
const ASAN_FLAGS: &[&str] = &["-fsanitize=address", "-fno-omit-frame-pointer"];

/// `ASAN_OPTIONS` of the runs: leaks are reported too (the library frees everything it
/// allocated by the time the program has closed its handle), and a report exits with 23,
/// apart from the programs' own failures (1).
const ASAN_OPTIONS: &str = "detect_leaks=1:exitcode=23";

/// `tests/c/<name>.c` built with AddressSanitizer against the shared library.
fn asan_program(gcc: &Path, name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join(name);
    let mut link: Vec<String> = ASAN_FLAGS.iter().map(|s| s.to_string()).collect();
    link.extend(dynamic_link());
    let src = manifest_dir().join("tests/c").join(format!("{name}.c"));
    compile(gcc, &src, &exe, &link);
    (dir, exe)
}

/// kestrel.h's buffer contract kept by a C program built with AddressSanitizer
/// (`tests/c/asan_contract.c`: batches, vectored and bounced I/O, getevents with min_nr and
/// timeouts, cancel, destroy and reactor stop with I/O in flight, every piece of ordinary
/// memory freed as early as the contract allows), on the emulator and on a file target, in
/// both modes: no report, no leak. The library is not instrumented, but its copies into
/// and out of the program's memory go through the sanitizer's `memcpy`, and its heap
/// through the sanitizer's allocator.
#[test]
fn asan_c_program_following_the_contract() {
    let Some(gcc) = gcc_asan() else { return };
    let (d, exe) = asan_program(&gcc, "asan_contract");
    let cores: Vec<String> = core_affinity::get_core_ids()
        .unwrap()
        .iter()
        .take(2)
        .map(|c| c.id.to_string())
        .collect();
    let img = d.path().join("disk.img");
    for target in [
        "emu:size=64M,latency=200us".to_string(),
        format!("file:{},size=16M", img.display()),
    ] {
        let mut cmd = Command::new(&exe);
        cmd.arg(&target).arg(cores.join(","));
        cmd.env("ASAN_OPTIONS", ASAN_OPTIONS);
        assert_all_checks_passed(&run(&mut cmd));
    }
}

/// The AddressSanitizer build catches a program that breaks the contract
/// (`tests/c/asan_misuse.c`): a bounced read's buffer freed while the read is in flight
/// is written by the library when the event is collected (heap-use-after-free), and a
/// bounced write longer than its buffer is read past the end at submit
/// (heap-buffer-overflow). Each report names the library's frames.
#[test]
fn asan_catches_a_program_breaking_the_contract() {
    let Some(gcc) = gcc_asan() else { return };
    let (_d, exe) = asan_program(&gcc, "asan_misuse");
    for (misuse, report) in [
        ("free-in-flight", "AddressSanitizer: heap-use-after-free"),
        ("past-the-end", "AddressSanitizer: heap-buffer-overflow"),
    ] {
        // Without cargo's LD_LIBRARY_PATH, as in `run` (which fails on the exit code wanted).
        let out = Command::new(&exe)
            .args(["emu:size=16M", misuse])
            .env("ASAN_OPTIONS", ASAN_OPTIONS)
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(23), "{misuse}: not caught:\n{err}");
        assert!(err.contains(report), "{misuse}: want {report:?}:\n{err}");
        assert!(
            err.contains("kestrel"),
            "{misuse}: no library frame:\n{err}"
        );
    }
}
