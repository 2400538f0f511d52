//! Builds the C half of the engine (`src/shim.c`) against the source of the fio that will
//! load it.
//!
//! fio's ioengine ABI is its own headers: `struct ioengine_ops` (checked against
//! `FIO_IOOPS_VERSION` at load), and `struct thread_data`, `struct io_u`, `struct
//! fio_file`, whose layouts change between releases and depend on the configured source
//! (`config-host.h`). So the shim is compiled with the headers of exactly the fio that is
//! installed:
//!
//! 1. The fio binary: `$FIO`, else `fio` on `PATH`; its version from `fio --version`.
//! 2. Its source: `$FIO_SRC` (any fio source tree; configured here if it is not yet), else
//!    a cache (`$KESTREL_FIO_CACHE`, default `~/.cache/kestrel-fio/<version>`) filled once
//!    with `apt-get source fio=<the installed package's version>` and `./configure`.
//! 3. The source's version (`FIO-VERSION-GEN`, what fio's own build uses) must equal the
//!    binary's, or the build fails naming both.
//!
//! Without any fio (no binary, no `$FIO_SRC`), or when fio is merely found on `PATH` but its
//! source cannot be had, the crate builds without the shim, so the workspace builds on
//! any machine; the library then has no `get_ioengine` (fio cannot load it) and a warning
//! says why. When the build is asked for explicitly (`$FIO`, `$FIO_SRC` or
//! `KESTREL_FIO_REQUIRE=1`, which `scripts/fio-test.sh` sets) every problem is an error.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The C half: compiled against the fio source's headers.
const SHIM_SOURCES: &[&str] = &["src/shim.c", "src/checks.c", "src/zbd.c"];

fn main() {
    for f in SHIM_SOURCES
        .iter()
        .chain(&["build.rs", "src/shim.h", "src/kfio.h"])
    {
        println!("cargo:rerun-if-changed={f}");
    }
    for v in [
        "FIO",
        "FIO_SRC",
        "KESTREL_FIO_CACHE",
        "KESTREL_FIO_REQUIRE",
        "PATH",
        "HOME",
        "XDG_CACHE_HOME",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo::rustc-check-cfg=cfg(kestrel_fio_shim)");
    if let Err(e) = run() {
        eprintln!("\nkestrel-fio: {e}\n");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let require = env::var("KESTREL_FIO_REQUIRE").is_ok_and(|v| !v.is_empty() && v != "0");
    let installed = match find_fio()? {
        Some(bin) => {
            println!("cargo:rerun-if-changed={}", bin.display());
            let ver = fio_version(&bin)?;
            Some((bin, ver))
        }
        None => None,
    };
    let Some(src) = source_tree(&installed, require)? else {
        return Ok(());
    };
    let src_ver = check_source(&src, &installed)?;
    if !src.join("config-host.h").is_file() {
        println!(
            "cargo:warning=configuring the fio source at {} (./configure --disable-native)",
            src.display()
        );
        configure(&src)?;
    }
    let ioops = ioops_version(&src)?;
    for f in ["config-host.h", "ioengines.h", "fio.h"] {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    compile_shim(&src, &src_ver)?;
    println!("cargo:rustc-cfg=kestrel_fio_shim");
    println!("cargo:rustc-env=KFIO_FIO_VERSION={src_ver}");
    println!("cargo:rustc-env=KFIO_IOOPS_VERSION={ioops}");
    // fio dlclose()s the engine when the last job using it ends, while a shared emulator
    // or controller may still have threads running in this library: never unload it.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    Ok(())
}

/// The fio source tree to build against (canonical): `$FIO_SRC`, else the cached source
/// of the installed fio. `None` (after a warning) when the build goes on without the
/// shim: no fio at all, or its source cannot be had and the build was not asked for.
fn source_tree(
    installed: &Option<(PathBuf, String)>,
    require: bool,
) -> Result<Option<PathBuf>, String> {
    let src_env = env::var_os("FIO_SRC").map(PathBuf::from);
    let explicit =
        require || env::var_os("FIO").is_some_and(|v| !v.is_empty()) || src_env.is_some();
    let src = match (installed, src_env) {
        (_, Some(s)) => s,
        (Some((bin, ver)), None) => match cached_source(bin, ver) {
            Ok(s) => s,
            Err(e) if !explicit => {
                println!(
                    "cargo:warning=libkestrel_fio.so is built without its fio glue (fio cannot \
                     load it): {}; rebuild with KESTREL_FIO_REQUIRE=1 to retry",
                    e.replace('\n', " ")
                );
                return Ok(None);
            }
            Err(e) => return Err(e),
        },
        (None, None) => return no_fio(require).map(|()| None),
    };
    src.canonicalize()
        .map(Some)
        .map_err(|e| format!("fio source tree {}: {e}", src.display()))
}

/// No fio binary and no `$FIO_SRC`: a warning, or an error if the build was required.
fn no_fio(require: bool) -> Result<(), String> {
    // Install fio and this reruns (a directory in PATH changes).
    for dir in env::split_paths(&env::var_os("PATH").unwrap_or_default()) {
        if dir.is_dir() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
    }
    let msg = "no fio found (not on PATH, FIO and FIO_SRC unset): libkestrel_fio.so \
               is built without its fio glue and cannot be loaded by fio; install fio \
               (apt-get install fio) or set FIO_SRC, and rebuild";
    if require {
        return Err(format!("{msg} (KESTREL_FIO_REQUIRE is set)"));
    }
    println!("cargo:warning={msg}");
    Ok(())
}

/// Checks that `src` is a fio source tree of the installed fio's version; its version.
fn check_source(src: &Path, installed: &Option<(PathBuf, String)>) -> Result<String, String> {
    if !src.join("ioengines.h").is_file() || !src.join("fio.h").is_file() {
        return Err(format!(
            "{} is not a fio source tree (no fio.h / ioengines.h); FIO_SRC must name the top \
             directory of fio's source",
            src.display()
        ));
    }
    let src_ver = source_version(src)?;
    match installed {
        Some((bin, ver)) if *ver != src_ver => {
            return Err(format!(
                "fio version mismatch: the fio that will load the engine is {ver} ({}), but the \
                 fio source tree {} is {src_ver}. An external ioengine must be compiled against \
                 the headers of the fio that loads it (struct thread_data and io_u change \
                 between releases). Fix: set FIO_SRC to a {ver} source tree, unset FIO_SRC to \
                 fetch it with apt-get source, or set FIO to a {src_ver} binary.",
                bin.display(),
                src.display()
            ));
        }
        Some(_) => {}
        None => println!(
            "cargo:warning=no fio binary found; building for {src_ver} from FIO_SRC={} \
             (the engine checks fio's version when it is loaded)",
            src.display()
        ),
    }
    Ok(src_ver)
}

/// Compiles `src/shim.c` with the headers and configuration of the fio tree `src`.
fn compile_shim(src: &Path, src_ver: &str) -> Result<(), String> {
    let mut b = cc::Build::new();
    // Zone operations that newer fio headers add to struct ioengine_ops.
    let ops = fs::read_to_string(src.join("ioengines.h")).unwrap_or_default();
    for (member, define) in [
        ("(*finish_zone)", "KFIO_HAVE_FINISH_ZONE"),
        ("(*get_max_active_zones)", "KFIO_HAVE_MAX_ACTIVE_ZONES"),
    ] {
        if ops.contains(member) {
            b.define(define, None);
        }
    }
    b.files(SHIM_SOURCES)
        .include("src")
        .include(src)
        .flag("-std=gnu99")
        .flag("-include")
        .flag(
            src.join("config-host.h")
                .to_str()
                .ok_or("non-UTF-8 source path")?,
        )
        .define("_GNU_SOURCE", None)
        .define("_LARGEFILE_SOURCE", None)
        .define("_FILE_OFFSET_BITS", "64")
        .define("FIO_INTERNAL", None)
        .define("KFIO_BUILT_FOR", format!("\"{src_ver}\"").as_str())
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-sign-compare")
        .flag_if_supported("-Wno-missing-field-initializers");
    b.try_compile("kfio_shim").map_err(|e| {
        format!(
            "compiling {} against the fio source at {}: {e}",
            SHIM_SOURCES.join(", "),
            src.display()
        )
    })
}

/// `$FIO` or `fio` on `PATH`.
fn find_fio() -> Result<Option<PathBuf>, String> {
    if let Some(p) = env::var_os("FIO").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(Some(p))
        } else {
            Err(format!("FIO={} is not a file", p.display()))
        };
    }
    Ok(env::split_paths(&env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("fio"))
        .find(|p| p.is_file()))
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let what = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {what}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect();
        return Err(format!(
            "{what} failed ({}):\n  {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n  ")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `fio --version`: `fio-3.33`.
fn fio_version(bin: &Path) -> Result<String, String> {
    let v = output(Command::new(bin).arg("--version"))?;
    let v = v.lines().next().unwrap_or("").trim().to_string();
    if !v.starts_with("fio-") {
        return Err(format!(
            "{} --version printed {v:?}, not a version like fio-3.33",
            bin.display()
        ));
    }
    Ok(v)
}

/// The version a fio tree builds, as its own build computes it (`FIO-VERSION-GEN`).
fn source_version(src: &Path) -> Result<String, String> {
    let gen = src.join("FIO-VERSION-GEN");
    if gen.is_file() {
        output(Command::new("sh").arg("FIO-VERSION-GEN").current_dir(src))?;
    }
    let file = src.join("FIO-VERSION-FILE");
    let text = fs::read_to_string(&file)
        .map_err(|e| format!("reading {} (fio's version): {e}", file.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("FIO_VERSION = "))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| format!("{} has no FIO_VERSION line", file.display()))
}

fn ioops_version(src: &Path) -> Result<u32, String> {
    let h = src.join("ioengines.h");
    let text = fs::read_to_string(&h).map_err(|e| format!("reading {}: {e}", h.display()))?;
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some("FIO_IOOPS_VERSION"))
                .then(|| w.next()?.parse().ok())
                .flatten()
        })
        .ok_or_else(|| format!("{} defines no FIO_IOOPS_VERSION", h.display()))
}

fn configure(src: &Path) -> Result<(), String> {
    output(
        Command::new("./configure")
            .arg("--disable-native")
            .current_dir(src),
    )
    .map(|_| ())
}

fn cache_root() -> PathBuf {
    if let Some(d) = env::var_os("KESTREL_FIO_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("kestrel-fio");
    }
    match env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache").join("kestrel-fio"),
        None => env::temp_dir().join("kestrel-fio"),
    }
}

/// The configured source of the installed fio, from the cache or fetched with apt-get.
fn cached_source(bin: &Path, ver: &str) -> Result<PathBuf, String> {
    let root = cache_root();
    let dest = root.join(ver);
    if dest.join("config-host.h").is_file() {
        return Ok(dest);
    }
    let no_src = |why: String| {
        format!(
            "the installed fio is {ver} ({}), and its source is needed to build the engine, but \
             {why}. Set FIO_SRC to a {ver} source tree (configured or not), or install fio from \
             Debian/Ubuntu packages so that `apt-get source` can fetch it.",
            bin.display()
        )
    };
    let real = bin.canonicalize().unwrap_or_else(|_| bin.to_path_buf());
    let owner = output(Command::new("dpkg-query").arg("-S").arg(&real))
        .or_else(|_| output(Command::new("dpkg-query").arg("-S").arg(bin)))
        .map_err(|_| no_src(format!("{} belongs to no Debian package", real.display())))?;
    let pkg = owner.split(':').next().unwrap_or("fio").trim().to_string();
    let pkg_ver = output(
        Command::new("dpkg-query")
            .args(["-W", "-f", "${Version}"])
            .arg(&pkg),
    )
    .map_err(|e| no_src(format!("its package version is unknown ({e})")))?;
    println!(
        "cargo:warning=fetching the source of {ver} (apt-get source {pkg}={pkg_ver}) into {}",
        root.display()
    );
    fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let work = root.join(format!(".fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let fetched = (|| {
        output(
            Command::new("apt-get")
                .args(["source", "-qq"])
                .arg(format!("{pkg}={pkg_ver}"))
                .current_dir(&work),
        )
        .map_err(|e| {
            no_src(format!(
                "`apt-get source {pkg}={pkg_ver}` failed; it needs deb-src entries in the apt \
                 sources (Types: deb deb-src), `apt-get update`, and dpkg-dev for dpkg-source. \
                 {e}"
            ))
        })?;
        let tree = fs::read_dir(&work)
            .map_err(|e| format!("{}: {e}", work.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.join("fio.h").is_file())
            .ok_or_else(|| no_src("apt-get source unpacked no fio tree".into()))?;
        configure(&tree)?;
        Ok::<PathBuf, String>(tree)
    })();
    let result = match fetched {
        Ok(tree) => match fs::rename(&tree, &dest) {
            Ok(()) => Ok(dest.clone()),
            // Another build got there first.
            Err(_) if dest.join("config-host.h").is_file() => Ok(dest.clone()),
            Err(e) => Err(format!(
                "moving {} to {}: {e}",
                tree.display(),
                dest.display()
            )),
        },
        Err(e) => Err(e),
    };
    let _ = fs::remove_dir_all(&work);
    result
}
