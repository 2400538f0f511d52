# shellcheck shell=bash
# The VM_* variables set here are read by the scripts that source this file.
# shellcheck disable=SC2034
# Host side of the VM runners (scripts/vm-test.sh, scripts/vm-nvmf-test.sh,
# scripts/vm-bench.sh, scripts/vm-compare.sh): packages, the Debian guest
# kernel, the noiommu vfio.ko, the initramfs, the QEMU command line, and the
# steps the runners share (--help, --mode, the run directory, the summary
# line). Sourced, not run. The guest side has its own: scripts/vm/guest-lib.sh.
# Facts behind the choices made here: docs/vm-testing.md.
#
# Everything fetched or built lives under $VM_CACHE (default
# $REPO/.vm-cache, overridable with KESTREL_VM_CACHE), keyed by what it was
# made from, so a second run rebuilds nothing.

VM_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VM_CACHE=${KESTREL_VM_CACHE:-$VM_REPO/.vm-cache}
# Guest RAM besides the hugepages, and the hugepage pool (MiB).
VM_MEM_MB=${KESTREL_VM_MEM_MB:-512}
VM_HUGEMEM_MB=${KESTREL_VM_HUGEMEM:-128}
VM_SMP=${KESTREL_VM_SMP:-2}
# Cached initramfs segments loaded after the base (vm_initramfs_segment),
# and options for the guest's nvme module.
VM_INITRD_EXTRA=()
VM_NVME_PARAMS=
# Further static executables for the guest, at /kestrel/bin/<name>.
VM_PAYLOAD_EXTRA=()
# The emulated controller's namespaces, one "SIZE_MIB:NVME_NS_PROPERTIES" each (nsid 1,
# 2, ... in order; e.g. "64:logical_block_size=4096,ms=8,pi=1"), each backed by its own
# image BACKEND.nsN. Empty: one namespace on BACKEND itself. VM_NVME_PROPS: further
# properties of that controller's nvme device (e.g. "mdts=3").
VM_NVME_NAMESPACES=()
VM_NVME_PROPS=
# Further emulated controllers, beside the one above, one "PROPERTIES|NS|NS..." each: the
# nvme device's own properties (e.g. "mdts=1" or "max_ioqpairs=1"; may be empty) and its
# namespaces as in VM_NVME_NAMESPACES, each on an image BACKEND.cK.nsN. Controller K
# (1, 2, ...) sits at PCI address 00:1K.0 (0x10 + K - 1), after the first controller, so
# the guest lists the first one first.
VM_NVME_CONTROLLERS=()
# Bump when the layout of what is cached changes.
VM_CACHE_FORMAT=1

VM_PROG=$(basename "$0" .sh)
# depmod, modinfo and friends live in sbin, which a non-login PATH may lack.
PATH=$PATH:/usr/sbin:/sbin
vm_log() { printf '%s: %s\n' "$VM_PROG" "$*" >&2; }
vm_is_elf() { [[ $(head -c 4 "$1" | od -An -tx1 | tr -d ' \n') == 7f454c46 ]]; }
vm_die() {
    vm_log "error: $*"
    exit 1
}

# ------------------------------------------------------ the runners' steps

# Prints the running script's help (its leading comment, from the second line
# to `set -euo`) and exits with $1 (default 0).
vm_usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[-1]}" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

# Takes an option every runner has off the front of "$@": --mode M (M as
# VM_MODE_NEEDS says), --binary PATH, --keep, --shell, or -h/--help (prints
# the help, exits 0). Sets the runner's mode, binary, keep or shell, and
# VM_SHIFT to the number of words taken. Anything else is a usage error:
# says so, prints the help, exits 2.
VM_MODE_NEEDS="iommu, noiommu or both"
vm_runner_opt() {
    VM_SHIFT=1
    case $1 in
    --mode)
        mode=${2:?--mode needs $VM_MODE_NEEDS}
        VM_SHIFT=2
        ;;
    --binary)
        binary=${2:?--binary needs a path}
        VM_SHIFT=2
        ;;
    --keep) keep=1 ;;
    --shell) shell=1 ;;
    -h | --help) vm_usage 0 ;;
    *)
        vm_log "unknown argument: $1"
        vm_usage 2
        ;;
    esac
}

# Sets VM_MODES from a --mode value: iommu, noiommu, or both (iommu, then
# noiommu). Returns 1 for anything else.
vm_modes_of() {
    case $1 in
    iommu | noiommu) VM_MODES=("$1") ;;
    both) VM_MODES=(iommu noiommu) ;;
    *) return 1 ;;
    esac
}

# Logs a step, with the seconds since the run started.
VM_T_START=$SECONDS
vm_step() { vm_log "[$((SECONDS - VM_T_START))s] $*"; }

# What every guest needs (QEMU, busybox, bash, kmod, cpio, xz); a runner
# adds its own before vm_install_packages.
VM_PACKAGES=(qemu-system-x86 busybox-static bash-static kmod cpio xz-utils)
# Installs VM_PACKAGES; dies when that fails.
vm_install_packages() {
    vm_step "packages"
    vm_apt_install "${VM_PACKAGES[@]}" || vm_die "cannot install the packages the VM needs"
}

# Picks and fetches the guest kernel (VM_KVER, VM_KPKGVER, VM_KDIR).
vm_guest_kernel() {
    vm_step "guest kernel"
    vm_kernel_pick
    vm_kernel_fetch
}

# When noiommu is among the modes given, builds the noiommu vfio.ko. Sets
# VM_NOIOMMU_OK to 1 when it is there; when it cannot be built, says that
# the mode will be skipped and why (VM_NOIOMMU_WHY).
vm_noiommu_prepare() {
    VM_NOIOMMU_OK=0 VM_NOIOMMU_WHY=
    [[ " $* " == *" noiommu "* ]] || return 0
    vm_step "noiommu vfio.ko"
    if vm_noiommu_build; then
        VM_NOIOMMU_OK=1
    else
        vm_log "noiommu mode will be SKIPPED: $VM_NOIOMMU_WHY"
    fi
}

# The guest's payload: $1 when given, else binary $3 of package $2, built
# here as a static executable. Checked, and set in VM_PAYLOAD as an absolute
# path.
vm_payload() {
    local binary=$1
    if [[ -z $binary ]]; then
        vm_step "building $3 (static)"
        vm_build_static "$2" "$3"
        binary=$VM_BUILT
    fi
    vm_check_payload "$binary"
    VM_PAYLOAD=$(realpath "$binary")
}

# Makes the run directory VM_RUN_DIR (disk images, initramfs, the 9p
# shares), removed when the script exits unless $1 is 1 (--keep).
vm_make_run_dir() {
    VM_KEEP=$1
    VM_RUN_DIR=$(mktemp -d "$VM_CACHE/run.XXXXXX")
    trap vm_remove_run_dir EXIT
}
# shellcheck disable=SC2317 # run by the EXIT trap
vm_remove_run_dir() {
    if ((VM_KEEP)); then
        vm_log "kept $VM_RUN_DIR"
    else
        rm -rf "$VM_RUN_DIR"
    fi
}

# Prints a mode's summary line: "$1: mode=$2 result=$3 ($4) $5", the
# parenthesis left out when $4 is empty.
vm_mode_line() {
    local line="$1: mode=$2 result=$3"
    [[ -n $4 ]] && line+=" ($4)"
    echo "$line $5"
}

# ---------------------------------------------------------------- packages

VM_APT_UPDATED=0
vm_apt_update_once() {
    ((VM_APT_UPDATED)) && return 0
    vm_log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 update >"$VM_CACHE/apt-update.log" 2>&1 ||
        vm_log "warning: apt-get update failed (see $VM_CACHE/apt-update.log)"
    VM_APT_UPDATED=1
}

# True when every package ("name" or "name=version") is installed.
vm_pkgs_missing() {
    local spec name want have
    VM_MISSING=()
    for spec in "$@"; do
        name=${spec%%=*}
        want=
        [[ $spec == *=* ]] && want=${spec#*=}
        have=$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null || true)
        if [[ $have != "install ok installed "* ]] || [[ -n $want && ${have##* } != "$want" ]]; then
            VM_MISSING+=("$spec")
        fi
    done
    ((${#VM_MISSING[@]}))
}

# Install the packages that are not installed yet; apt-get update first,
# once, only when something is missing. Returns non-zero (after saying why)
# when apt-get fails, so callers decide whether that is fatal.
vm_apt_install() {
    vm_pkgs_missing "$@" || return 0
    if [[ $(id -u) -ne 0 ]]; then
        vm_log "not root: cannot install ${VM_MISSING[*]}"
        return 1
    fi
    vm_apt_update_once
    vm_log "installing ${VM_MISSING[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600 \
        install --no-install-recommends "${VM_MISSING[@]}" >"$VM_CACHE/apt-install.log" 2>&1; then
        vm_log "apt-get install ${VM_MISSING[*]} failed:"
        tail -n 5 "$VM_CACHE/apt-install.log" >&2
        return 1
    fi
}

# Removes what matches glob $3 (default: everything) in directory $1, but
# $2 and the $4 (default 0) most recently made others: older kernels and
# initramfs images. (Checkouts sharing a cache each keep their initramfs.)
vm_prune() {
    local dir=$1 keep=$2 glob=${3:-*} spare=${4:-0} e
    [[ -d $dir ]] || return 0
    while read -r e; do
        [[ -e $e && $e != "$keep" ]] || continue
        if ((spare > 0)); then
            spare=$((spare - 1))
            continue
        fi
        vm_log "removing the stale $e"
        rm -rf "$e"
    done < <(find "$dir" -mindepth 1 -maxdepth 1 -name "$glob" -printf '%T@ %p\n' | sort -rn | cut -d' ' -f2-)
}

# Takes the cache's lock for the rest of the run (one run at a time per
# cache: it is filled in place, and two TCG guests on two cores would only
# slow each other into their timeouts).
vm_lock_cache() {
    mkdir -p "$VM_CACHE"
    exec 9>"$VM_CACHE/.lock"
    if ! flock -n 9; then
        vm_log "waiting for another run that holds $VM_CACHE/.lock"
        flock -w 1800 9 || vm_die "another run has held $VM_CACHE/.lock for 30 minutes"
    fi
}

# ------------------------------------------------------------ guest kernel

# Sets VM_KVER (e.g. 6.1.0-48-amd64) and VM_KPKGVER (the Debian version of
# linux-image-$VM_KVER). KESTREL_VM_KERNEL=<kver> pins the kernel.
vm_kernel_pick() {
    local dep
    if [[ -n ${KESTREL_VM_KERNEL:-} ]]; then
        VM_KVER=$KESTREL_VM_KERNEL
    else
        dep=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}')
        if [[ -z $dep ]]; then
            vm_apt_update_once
            dep=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}')
        fi
        [[ -n $dep ]] || vm_die "apt-cache knows no linux-image-amd64: cannot pick a guest kernel"
        VM_KVER=${dep#linux-image-}
    fi
    VM_KPKGVER=$(apt-cache show --no-all-versions "linux-image-$VM_KVER" 2>/dev/null | awk '$1 == "Version:" {print $2; exit}')
    [[ -n $VM_KPKGVER ]] || vm_die "apt-cache has no linux-image-$VM_KVER"
    VM_KDIR=$VM_CACHE/kernel/$VM_KVER-$VM_KPKGVER
}

# apt-get download PKG=VER into DIR.
vm_apt_download() {
    local dir=$1 spec=$2
    (cd "$dir" && apt-get -q -o APT::Sandbox::User=root download "$spec") >"$dir/download.log" 2>&1 || {
        tail -n 5 "$dir/download.log" >&2
        return 1
    }
}

# Package lists older than the archive name versions it no longer has: update
# them (once) and pick the kernel again. Returns 1 when they were fresh.
vm_kernel_repick() {
    local was=$VM_KVER=$VM_KPKGVER
    ((VM_APT_UPDATED)) && return 1
    vm_apt_update_once
    vm_kernel_pick
    [[ $VM_KVER=$VM_KPKGVER == "$was" ]] || vm_log "guest kernel now $VM_KVER ($VM_KPKGVER), after apt-get update"
}

# The uncompressed vmlinux out of a Debian vmlinuz: the kernel proper is an
# XZ stream inside it (magic FD 37 7A 58 5A 00); QEMU boots that ELF through
# PVH, faster under TCG than the bzImage's own decompressor.
vm_extract_vmlinux() {
    local vmlinuz=$1 out=$2 off
    while read -r off; do
        # Not a pipe: xz stops at the end of the stream and tail would die
        # of SIGPIPE, which pipefail reports as a failure.
        tail -c +"$((off + 1))" "$vmlinuz" >"$out.xz"
        if xz -dc --single-stream "$out.xz" >"$out.tmp" 2>/dev/null &&
            vm_is_elf "$out.tmp"; then
            mv "$out.tmp" "$out"
            rm -f "$out.xz"
            return 0
        fi
    done < <(LC_ALL=C grep -obUaP '\xFD7zXZ\x00' "$vmlinuz" | cut -d: -f1)
    rm -f "$out.tmp" "$out.xz"
    return 1
}

# Downloads and unpacks linux-image-$VM_KVER into $VM_KDIR/root with
# modules.dep, and $VM_KDIR/vmlinux. Cached.
vm_kernel_fetch() {
    [[ -f $VM_KDIR/done ]] && return 0
    local tmp
    rm -rf "$VM_KDIR"
    mkdir -p "$VM_KDIR"
    tmp=$VM_KDIR/tmp
    mkdir -p "$tmp"
    vm_log "downloading linux-image-$VM_KVER=$VM_KPKGVER"
    if ! vm_apt_download "$tmp" "linux-image-$VM_KVER=$VM_KPKGVER"; then
        rm -rf "$VM_KDIR"
        if vm_kernel_repick; then
            vm_kernel_fetch
            return
        fi
        vm_die "apt-get download linux-image-$VM_KVER=$VM_KPKGVER failed"
    fi
    dpkg-deb -x "$tmp"/linux-image-*.deb "$VM_KDIR/root"
    depmod -b "$VM_KDIR/root" "$VM_KVER" || vm_die "depmod -b $VM_KDIR/root $VM_KVER failed"
    vm_extract_vmlinux "$VM_KDIR/root/boot/vmlinuz-$VM_KVER" "$VM_KDIR/vmlinux" ||
        vm_die "no XZ-compressed ELF kernel found inside $VM_KDIR/root/boot/vmlinuz-$VM_KVER"
    rm -rf "$tmp" "$VM_KDIR/root/usr/share/doc"
    touch "$VM_KDIR/done"
    vm_prune "$VM_CACHE/kernel" "$VM_KDIR"
    vm_prune "$VM_CACHE/vfio-noiommu" "$VM_CACHE/vfio-noiommu/$VM_KVER-$VM_KPKGVER"
}

# ------------------------------------------------------- noiommu vfio.ko

# Debian's kernels are built without CONFIG_VFIO_NOIOMMU. Rebuild vfio.ko
# out of tree from the matching linux-source with the option forced on; its
# exported symbols keep their CRCs, so the stock vfio-pci loads on top.
# On success sets VM_NOIOMMU_KO; on failure sets VM_NOIOMMU_WHY and returns 1.
vm_noiommu_build() {
    local dir=$VM_CACHE/vfio-noiommu/$VM_KVER-$VM_KPKGVER src tmp log
    VM_NOIOMMU_KO=
    VM_NOIOMMU_WHY=
    if [[ -f $dir/vfio.ko ]]; then
        VM_NOIOMMU_KO=$dir/vfio.ko
        return 0
    fi
    # The headers must match the kernel exactly: when they are not installed
    # yet, refresh the lists first, and with them the kernel, so the two
    # come from the same lists.
    if vm_pkgs_missing "linux-headers-$VM_KVER=$VM_KPKGVER" && vm_kernel_repick; then
        vm_kernel_fetch
        dir=$VM_CACHE/vfio-noiommu/$VM_KVER-$VM_KPKGVER
        if [[ -f $dir/vfio.ko ]]; then
            VM_NOIOMMU_KO=$dir/vfio.ko
            return 0
        fi
    fi
    mkdir -p "$dir"
    log=$dir/build.log
    if ! vm_apt_install make gcc "linux-headers-$VM_KVER=$VM_KPKGVER"; then
        VM_NOIOMMU_WHY="cannot install linux-headers-$VM_KVER=$VM_KPKGVER (see $VM_CACHE/apt-install.log)"
        return 1
    fi
    if [[ ! -d /lib/modules/$VM_KVER/build ]]; then
        VM_NOIOMMU_WHY="/lib/modules/$VM_KVER/build is missing after installing linux-headers-$VM_KVER"
        return 1
    fi
    src=$dir/src
    if [[ ! -f $src/vfio_main.c ]]; then
        tmp=$dir/tmp
        rm -rf "$tmp" "$src"
        mkdir -p "$tmp" "$src"
        vm_log "downloading linux-source-6.1=$VM_KPKGVER for drivers/vfio"
        if ! vm_apt_download "$tmp" "linux-source-6.1=$VM_KPKGVER"; then
            VM_NOIOMMU_WHY="apt-get download linux-source-6.1=$VM_KPKGVER failed"
            return 1
        fi
        # The .deb holds usr/src/linux-source-6.1.tar.xz; only drivers/vfio is needed.
        if ! dpkg-deb --fsys-tarfile "$tmp"/linux-source-6.1_*.deb |
            tar -xOf - ./usr/src/linux-source-6.1.tar.xz |
            tar -xJf - -C "$tmp" linux-source-6.1/drivers/vfio; then
            VM_NOIOMMU_WHY="cannot unpack drivers/vfio from linux-source-6.1=$VM_KPKGVER"
            return 1
        fi
        cp -a "$tmp/linux-source-6.1/drivers/vfio/." "$src/"
        rm -rf "$tmp"
    fi
    if [[ ! -f $src/vfio_main.c || ! -f $src/Makefile ]]; then
        VM_NOIOMMU_WHY="linux-source-6.1=$VM_KPKGVER has no drivers/vfio/vfio_main.c or Makefile"
        return 1
    fi
    # vfio.ko is made of what the source's Makefile puts in vfio-y
    # (6.1: vfio_main.o iova_bitmap.o container.o); options that are
    # off in Debian's config (vfio-$(CONFIG_...)) stay out.
    local objs
    objs=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$src/Makefile" |
        awk '$1 ~ /^vfio-y/ { for (i = 2; i <= NF; i++) if ($i ~ /\.o$/) printf "%s ", $i }')
    if [[ -z $objs ]]; then
        VM_NOIOMMU_WHY="found no vfio-y objects in drivers/vfio/Makefile of linux-source-6.1=$VM_KPKGVER"
        return 1
    fi
    local b=$dir/build
    rm -rf "$b"
    mkdir -p "$b"
    cp "$src"/*.[ch] "$b/"
    {
        echo "# vfio.ko with CONFIG_VFIO_NOIOMMU, built by scripts/vm/lib.sh"
        echo "ccflags-y += -DCONFIG_VFIO_NOIOMMU=1"
        echo "obj-m += vfio.o"
        echo "vfio-y += $objs"
    } >"$b/Kbuild"
    vm_log "building vfio.ko with CONFIG_VFIO_NOIOMMU against linux-headers-$VM_KVER"
    if ! make -C "/lib/modules/$VM_KVER/build" M="$b" -j"$(nproc)" modules >"$log" 2>&1; then
        VM_NOIOMMU_WHY="building vfio.ko with CONFIG_VFIO_NOIOMMU failed: $(grep -m1 -E 'error|Error' "$log" || tail -n 1 "$log") (log: $log)"
        return 1
    fi
    if [[ $'\n'$(modinfo -F parm "$b/vfio.ko") != *$'\n'enable_unsafe_noiommu_mode:* ]]; then
        VM_NOIOMMU_WHY="the rebuilt vfio.ko has no enable_unsafe_noiommu_mode parameter"
        return 1
    fi
    if [[ $(modinfo -F vermagic "$b/vfio.ko") != "$VM_KVER "* ]]; then
        VM_NOIOMMU_WHY="the rebuilt vfio.ko has vermagic '$(modinfo -F vermagic "$b/vfio.ko")', not $VM_KVER"
        return 1
    fi
    cp "$b/vfio.ko" "$dir/vfio.ko.tmp"
    mv "$dir/vfio.ko.tmp" "$dir/vfio.ko"
    VM_NOIOMMU_KO=$dir/vfio.ko
}

# ----------------------------------------------------------------- payload

# Builds binary $2 of package $1 as a static executable (the guest has no
# libc) and sets VM_BUILT to its path.
vm_build_static() {
    local pkg=$1 bin=$2 target_dir
    (cd "$VM_REPO" && RUSTFLAGS='-C target-feature=+crt-static' \
        cargo build --release --target x86_64-unknown-linux-gnu -p "$pkg" --bin "$bin") ||
        vm_die "cargo build of $pkg ($bin) failed"
    target_dir=$(cd "$VM_REPO" && cargo metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    VM_BUILT=$target_dir/x86_64-unknown-linux-gnu/release/$bin
}

# Refuses a payload that is missing or needs a dynamic loader.
vm_check_payload() {
    local binary=$1
    [[ -f $binary && -x $binary ]] || vm_die "the payload $binary is not an executable file"
    if vm_is_elf "$binary" && command -v readelf >/dev/null &&
        [[ $(readelf -l "$binary" 2>/dev/null) == *"Requesting program interpreter"* ]]; then
        vm_die "$binary is dynamically linked and the guest has no libc: build it static (-C target-feature=+crt-static)"
    fi
}

# --------------------------------------------------------------- initramfs

# Modules the guest loads (with everything modprobe says they need), plus the
# crypto providers crc-t10dif and crc64-rocksoft ask for at run time.
VM_GUEST_MODULES=(nvme vfio-pci vfio_iommu_type1 crc64_rocksoft_generic crct10dif_generic
    crct10dif-pclmul 9p 9pnet_virtio virtio_pci)

# Copies the closure of VM_GUEST_MODULES (plus extra modules given as
# arguments) from $VM_KDIR/root into $1 (uncompressed) and runs depmod there.
vm_stage_modules() {
    local stage=$1 kroot=$VM_KDIR/root m line path rel
    shift
    mkdir -p "$stage/lib/modules/$VM_KVER"
    for m in "${VM_GUEST_MODULES[@]}" "$@"; do
        if ! line=$(modprobe -d "$kroot" -S "$VM_KVER" --show-depends "$m" 2>&1); then
            vm_log "warning: guest module $m: $line"
            continue
        fi
        while read -r path; do
            rel=${path#"$kroot"/}
            mkdir -p "$stage/$(dirname "$rel")"
            case $path in
            *.ko.xz) xz -dc "$path" >"$stage/${rel%.xz}" ;;
            *.ko.zst) zstd -qdc "$path" >"$stage/${rel%.zst}" ;;
            *) cp "$path" "$stage/$rel" ;;
            esac
        done < <(awk '$1 == "insmod" {print $2}' <<<"$line")
    done
    cp "$kroot/lib/modules/$VM_KVER"/modules.{order,builtin,builtin.modinfo} "$stage/lib/modules/$VM_KVER/" 2>/dev/null || true
    depmod -b "$stage" "$VM_KVER"
}

# Builds (or reuses) the base initramfs, the same for both modes: busybox,
# bash, the modules and /init. Sets VM_INITRD_BASE.
vm_initramfs_base() {
    local busybox=/bin/busybox bash=/bin/bash-static init=$VM_REPO/scripts/vm/guest-init.sh key
    [[ -x $busybox ]] || vm_die "$busybox is missing (package busybox-static)"
    [[ -x $bash ]] || vm_die "$bash is missing (package bash-static)"
    key=$({
        echo "format $VM_CACHE_FORMAT kernel $VM_KVER $VM_KPKGVER modules ${VM_GUEST_MODULES[*]}"
        sha256sum "$busybox" "$bash" "$init" | cut -d' ' -f1
    } | sha256sum | cut -c1-16)
    VM_INITRD_BASE=$VM_CACHE/initramfs/base-$key.cpio.gz
    [[ -f $VM_INITRD_BASE ]] && return 0
    vm_log "building the base initramfs ($key)"
    local stage=$VM_CACHE/initramfs/stage-$key applet
    rm -rf "$stage"
    mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,root,host,kestrel,etc}
    cp "$busybox" "$stage/bin/busybox"
    cp "$bash" "$stage/bin/bash"
    # Every busybox applet as a link, except the shells bash stands for.
    while read -r applet; do
        case $applet in bin/bash | bin/sh | "") continue ;; esac
        [[ -e $stage/$applet ]] || ln -s /bin/busybox "$stage/$applet"
    done < <("$busybox" --list-full)
    ln -sf bash "$stage/bin/sh"
    echo "root:x:0:0:root:/root:/bin/bash" >"$stage/etc/passwd"
    echo "root:x:0:" >"$stage/etc/group"
    install -m 0755 "$init" "$stage/init"
    vm_stage_modules "$stage"
    mkdir -p "$(dirname "$VM_INITRD_BASE")"
    (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort |
        cpio -o -H newc -R 0:0 --reproducible --quiet | gzip -1 -n) >"$VM_INITRD_BASE.tmp"
    mv "$VM_INITRD_BASE.tmp" "$VM_INITRD_BASE"
    rm -rf "$stage"
    vm_prune "$VM_CACHE/initramfs" "$VM_INITRD_BASE" 'base-*' 2
}

# A cached initramfs segment named $1 holding the dynamically linked
# executables $2..., each with the loader and the libraries ldd names for it,
# at the same paths as here.
vm_initramfs_dynamic() {
    local name=$1 files f
    shift
    mapfile -t files < <({
        for f in "$@"; do
            echo "$f"
            ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
        done
    } | sort -u)
    vm_initramfs_segment "$name" "${files[@]}"
}

# A cached initramfs segment named $1 holding host files $2... at the same
# paths (symbolic links followed). Appends it to VM_INITRD_EXTRA.
vm_initramfs_segment() {
    local name=$1 key out stage f
    shift
    key=$({
        echo "format $VM_CACHE_FORMAT"
        printf '%s\n' "$@"
        cat -- "$@" | sha256sum
    } | sha256sum | cut -c1-16)
    out=$VM_CACHE/initramfs/$name-$key.cpio.gz
    if [[ ! -f $out ]]; then
        vm_log "building the initramfs segment $name ($key)"
        stage=$VM_CACHE/initramfs/stage-$name-$key
        rm -rf "$stage"
        for f in "$@"; do
            mkdir -p "$stage$(dirname "$f")"
            cp -L "$f" "$stage$f"
        done
        (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort |
            cpio -o -H newc -R 0:0 --reproducible --quiet | gzip -1 -n) >"$out.tmp"
        mv "$out.tmp" "$out"
        rm -rf "$stage"
        vm_prune "$VM_CACHE/initramfs" "$out" "$name-*" 1
    fi
    VM_INITRD_EXTRA+=("$out")
}

# The per-run part, appended to the base as a second cpio archive (the
# kernel unpacks them in order): the payload binary at /<name> (/kestrel-bin
# for one named kestrel), the repo's
# scripts/ at /kestrel/scripts, /kestrel/env, and in noiommu mode the
# rebuilt vfio.ko at /kestrel/noiommu/vfio.ko. Writes $1.
#   $2 mode, $3 payload binary, $4 guest command, $5 shell (0/1)
vm_initramfs_payload() {
    local out=$1 mode=$2 binary=$3 cmd=$4 shell=$5 stage name
    stage=$out.stage
    rm -rf "$stage"
    mkdir -p "$stage/kestrel"
    name=$(basename "$binary")
    # /kestrel is the directory of the scripts in the guest: a binary named
    # kestrel (the app, as the runners build it) lands at /kestrel-bin.
    [[ $name == kestrel ]] && name=kestrel-bin
    cp "$binary" "$stage/$name"
    # Debug info only costs gzip time and guest memory here.
    if command -v strip >/dev/null && vm_is_elf "$binary"; then
        strip --strip-debug "$stage/$name" 2>/dev/null || cp "$binary" "$stage/$name"
    fi
    chmod 0755 "$stage/$name"
    if [[ $mode == noiommu ]]; then
        mkdir -p "$stage/kestrel/noiommu"
        cp "$VM_NOIOMMU_KO" "$stage/kestrel/noiommu/vfio.ko"
    fi
    if [[ -d $VM_REPO/scripts ]]; then
        cp -a "$VM_REPO/scripts" "$stage/kestrel/scripts"
    fi
    local extra
    for extra in "${VM_PAYLOAD_EXTRA[@]}"; do
        mkdir -p "$stage/kestrel/bin"
        cp "$extra" "$stage/kestrel/bin/"
        if command -v strip >/dev/null && vm_is_elf "$extra"; then
            strip --strip-debug "$stage/kestrel/bin/$(basename "$extra")" 2>/dev/null || true
        fi
    done
    {
        printf 'KESTREL_MODE=%q\n' "$mode"
        printf 'KESTREL_GUEST_CMD=%q\n' "$cmd"
        printf 'KESTREL_HUGEMEM=%q\n' "$VM_HUGEMEM_MB"
        printf 'KESTREL_SHELL=%q\n' "$shell"
        printf 'KESTREL_PAYLOAD=%q\n' "/$name"
        printf 'KESTREL_NVME_PARAMS=%q\n' "${VM_NVME_PARAMS:-}"
        echo "export KESTREL_PAYLOAD"
    } >"$stage/kestrel/env"
    (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort |
        cpio -o -H newc -R 0:0 --reproducible --quiet | gzip -1 -n) >"$out"
    rm -rf "$stage"
}

# ------------------------------------------------------------------- QEMU

# Fills the array VM_QEMU with the command line for mode $1 (iommu |
# noiommu), initrd $2, and NVMe backend $3: a path (raw image) or "null"
# (null-co, reads zeroes and drops writes). $4 is a directory shared with
# the guest over 9p (mount tag "host").
vm_qemu_cmdline() {
    local mode=$1 initrd=$2 backend=$3 share=$4 append machine=q35 drive
    append="console=ttyS0 panic=-1 quiet no_timer_check"
    if [[ $mode == iommu ]]; then
        machine=q35,kernel-irqchip=split
        append+=" intel_iommu=on"
    fi
    if [[ $backend == null ]]; then
        drive="driver=null-co,read-zeroes=on,size=1G,if=none,id=nvm"
    else
        # discard=unmap: QEMU's model reports DLFEAT "deallocated blocks read
        # as zeroes" whatever the backend does, and the default discard=ignore
        # drops Deallocate, leaving the old data; unmap punches holes in the
        # sparse file, so the claim holds.
        drive="file=$backend,format=raw,if=none,id=nvm,cache=writeback,aio=threads,discard=unmap"
    fi
    VM_QEMU=(qemu-system-x86_64 -accel "tcg,thread=multi" -machine "$machine" -smp "$VM_SMP"
        -m "$((VM_MEM_MB + VM_HUGEMEM_MB))M" -nographic -no-reboot -monitor none -nic none)
    [[ $mode == iommu ]] && VM_QEMU+=(-device "intel-iommu,intremap=on")
    VM_QEMU+=(-kernel "$VM_KDIR/vmlinux" -initrd "$initrd" -append "$append")
    if ((${#VM_NVME_NAMESPACES[@]})); then
        vm_qemu_nvme 0 "$VM_NVME_PROPS" "$backend" "${VM_NVME_NAMESPACES[@]}"
        local k=0 c nss
        for c in "${VM_NVME_CONTROLLERS[@]}"; do
            k=$((k + 1))
            IFS='|' read -r -a nss <<<"${c#*|}"
            vm_qemu_nvme "$k" "${c%%|*}" "$backend" "${nss[@]}"
        done
    else
        VM_QEMU+=(-drive "$drive" -device "nvme,serial=kestrel0,drive=nvm")
    fi
    VM_QEMU+=(
        -virtfs "local,path=$share,mount_tag=host,security_model=none,id=host0"
        -device "isa-debug-exit,iobase=0xf4,iosize=0x04")
}

# Appends to VM_QEMU controller $1 (0: the first, at the address QEMU picks; K: at
# 00:(0x10 + K - 1).0) with the nvme properties $2, on NVMe backend $3 (an image path, its
# namespaces on $3.nsN for controller 0 and $3.cK.nsN for K, or "null"), and the
# namespaces "SIZE_MIB:NVME_NS_PROPERTIES" that follow (nsid 1, 2, ...).
vm_qemu_nvme() {
    local k=$1 cprops=$2 backend=$3 i=0 ns size props img id dev drive
    shift 3
    dev="nvme,id=nvme$k,serial=kestrel$k"
    ((k == 0)) || dev+=",addr=$(printf '0x%x' $((0x10 + k - 1)))"
    VM_QEMU+=(-device "$dev${cprops:+,$cprops}")
    for ns in "$@"; do
        i=$((i + 1))
        size=${ns%%:*} props=${ns#*:} id=nvm$k-$i
        if ((k == 0)); then img=$backend.ns$i; else img=$backend.c$k.ns$i; fi
        if [[ $backend == null ]]; then
            drive="driver=null-co,read-zeroes=on,size=${size}M,if=none,id=$id"
        else
            truncate -s "${size}M" "$img"
            drive="file=$img,format=raw,if=none,id=$id,cache=writeback,aio=threads,discard=unmap"
        fi
        VM_QEMU+=(-drive "$drive" -device "nvme-ns,drive=$id,bus=nvme$k,nsid=$i${props:+,$props}")
    done
}

# Boots one guest and waits for it. Arguments: mode (iommu | noiommu),
# payload binary, guest command, interactive shell (0/1), NVMe backend (an
# image path or "null"), run directory, timeout in seconds (0: none).
# The console goes to $VM_CACHE/logs/console-<mode>.log and, prefixed, to
# stdout; what the command printed to $VM_CACHE/logs/output-<mode>.txt.
# Sets VM_RESULT (pass | fail), VM_WHY (why it failed) and VM_RC (the
# payload's exit status, 124 for a timeout, 1 for a guest that died).
vm_run_guest() {
    local m=$1 binary=$2 cmd=$3 shell=$4 backend=$5 run_dir=$6 timeout_s=$7
    local initrd share log qrc rc status logs_dir=$VM_CACHE/logs
    VM_RESULT=fail VM_WHY='' VM_RC=1
    mkdir -p "$logs_dir"
    initrd=$run_dir/initramfs-$m.cpio.gz
    vm_initramfs_payload "$run_dir/payload-$m.cpio.gz" "$m" "$binary" "$cmd" "$shell"
    cat "$VM_INITRD_BASE" "${VM_INITRD_EXTRA[@]}" "$run_dir/payload-$m.cpio.gz" >"$initrd"
    rm -f "$run_dir/payload-$m.cpio.gz"
    share=$run_dir/share-$m
    rm -rf "$share"
    mkdir -p "$share"
    vm_qemu_cmdline "$m" "$initrd" "$backend" "$share"
    log=$logs_dir/console-$m.log
    rm -f "$logs_dir/output-$m.txt"
    printf '%q ' "${VM_QEMU[@]}" >"$run_dir/qemu-$m.cmdline"
    set +e
    if ((shell)); then
        "${VM_QEMU[@]}" 2>&1 | tee "$log"
        qrc=${PIPESTATUS[0]}
    else
        timeout -k 10 "$timeout_s" "${VM_QEMU[@]}" </dev/null 2>&1 |
            tr -d '\r' | tee "$log" |
            sed -u -e $'s/\x1b\\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' -e "s/^/[guest-$m] /"
        qrc=${PIPESTATUS[0]}
    fi
    set -e
    status=
    [[ -f $share/status ]] && status=$(<"$share/status")
    [[ -f $share/output.txt ]] && cp "$share/output.txt" "$logs_dir/output-$m.txt"
    # isa-debug-exit makes QEMU exit with (status << 1) | 1, so a guest's 0
    # and QEMU's own error exit are both 1: the guest's word (the share, or
    # its console line) tells them apart. timeout says
    # 124 (137 after its SIGKILL); a panic or power-off without a status
    # leaves QEMU's own 0.
    if ((qrc == 124 || qrc == 137)); then
        VM_WHY="the guest did not finish within ${timeout_s}s (KESTREL_VM_TIMEOUT)"
        VM_RC=124
    elif ((qrc & 1)); then
        rc=$((qrc >> 1))
        VM_RC=$rc
        if [[ -n $status && $status != "$rc" ]]; then
            vm_log "warning: the exit port says $rc, the share says $status"
        fi
        if ((rc == 0)) && [[ $status != 0 ]] && ! grep -q '^kestrel-init: reporting exit status 0$' "$log"; then
            # QEMU's own failures exit 1 too, which reads as a guest's 0.
            VM_WHY="QEMU exited with status 1 and the guest reported nothing: QEMU failed ($(grep -m1 'qemu-system' "$log" || tail -n 1 "$log"))"
            VM_RC=1
        elif ((rc == 0)); then
            VM_RESULT=pass
        elif ((rc == 125)) && grep -q '^kestrel-init: error:' "$log"; then
            VM_WHY="guest setup failed: $(grep -m1 '^kestrel-init: error:' "$log" | sed 's/^kestrel-init: error: //')"
        else
            VM_WHY="payload exit status $rc"
        fi
    else
        VM_WHY="QEMU exited with status $qrc without a status from the guest (kernel panic or QEMU error; see $log)"
    fi
}
