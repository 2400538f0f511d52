#!/usr/bin/env bash
# Kestrel device setup: bind NVMe controllers to vfio-pci, allocate hugepages, show state.
# Modelled on SPDK's scripts/setup.sh. Reads everything from /sys and /proc, so it also
# runs in a minimal busybox guest (no lspci, lsblk, findmnt or udevadm needed).
#
#   scripts/setup.sh [config|reset|status|help]      (config is the default)
#
# Run `scripts/setup.sh help` for the environment variables.
set -euo pipefail
shopt -s nullglob
export LC_ALL=C

SYSFS_ROOT=${SYSFS_ROOT:-/sys}
PROC_ROOT=${PROC_ROOT:-/proc}
DEV_ROOT=${DEV_ROOT:-/dev}
PCI_ALLOWED=${PCI_ALLOWED:-}
PCI_BLOCKED=${PCI_BLOCKED:-}
HUGEMEM=${HUGEMEM:-2048}
TARGET_USER=${TARGET_USER:-}
NOIOMMU=${NOIOMMU:-0}
BIND_WAIT_S=${BIND_WAIT_S:-5}

NVME_CLASS=$((0x010802))
PROG=setup.sh

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
info() { printf '%s: %s\n' "$PROG" "$*"; }

usage() {
    printf '%s\n' \
        'usage: scripts/setup.sh [config|reset|status|help]' \
        '' \
        '  config  (default) bind NVMe controllers to vfio-pci (through driver_override and' \
        '          drivers_probe), allocate hugepages, mount hugetlbfs, load vfio-pci.' \
        '          Refuses controllers whose namespaces are mounted, used as swap or held by' \
        '          another device (LVM, md); when PCI_ALLOWED is unset such controllers are' \
        '          skipped with a message instead.' \
        "  reset   rebind NVMe controllers on vfio-pci (or no driver) to the kernel's nvme driver." \
        '  status  hugepages per NUMA node (free/total) and a table of NVMe controllers: BDF,' \
        '          vendor:device, NUMA node, IOMMU group, driver, block devices, what uses them.' \
        '  help    this text.' \
        '' \
        'environment:' \
        '  PCI_ALLOWED="BDF ..."  only these controllers (space-separated, 0000:01:00.0 or 01:00.0)' \
        '  PCI_BLOCKED="BDF ..."  never these controllers' \
        '  HUGEMEM=MiB            MiB of 2 MiB hugepages to have in the pool (default 2048)' \
        '  TARGET_USER=user       chown /dev/vfio/<group> to this user so it can run kestrel' \
        '  NOIOMMU=1              enable vfio'"'"'s UNSAFE noiommu mode (no IOMMU: the device can' \
        '                         read and write all memory); only on machines without an IOMMU' \
        '  BIND_WAIT_S=seconds    how long to wait for a driver to bind (default 5)' \
        '  SYSFS_ROOT, PROC_ROOT, DEV_ROOT   roots of /sys, /proc and /dev (for tests)'
}

# LINES=(...) from text, one element per line. Used instead of process substitution,
# here-strings and here-documents, which need /dev/fd or a writable /tmp that a minimal
# guest may not have.
LINES=()
split_lines() {
    local rest=$1
    LINES=()
    while [[ -n $rest ]]; do
        LINES+=("${rest%%$'\n'*}")
        if [[ $rest == *$'\n'* ]]; then
            rest=${rest#*$'\n'}
        else
            rest=''
        fi
    done
}

# --- reading sysfs -------------------------------------------------------------------

# read_file PATH: prints the file's content without surrounding whitespace; fails if it
# cannot be read.
read_file() {
    local v
    [[ -r $1 ]] || return 1
    v=$(<"$1") || return 1
    v=${v#"${v%%[![:space:]]*}"}
    v=${v%"${v##*[![:space:]]}"}
    printf '%s' "$v"
}

# link_name PATH: the last component of a symlink's target.
link_name() {
    local t
    t=$(readlink "$1" 2>/dev/null) || return 1
    printf '%s' "${t##*/}"
}

# normalise_bdf ADDR: prints DDDD:BB:DD.F for [DDDD:]BB:DD.F; fails if it does not parse.
normalise_bdf() {
    local b=${1,,} dom bus dev fn
    if [[ $b =~ ^([0-9a-f]{1,8}):([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$ ]]; then
        dom=${BASH_REMATCH[1]} bus=${BASH_REMATCH[2]} dev=${BASH_REMATCH[3]} fn=${BASH_REMATCH[4]}
    elif [[ $b =~ ^([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$ ]]; then
        dom=0 bus=${BASH_REMATCH[1]} dev=${BASH_REMATCH[2]} fn=${BASH_REMATCH[3]}
    else
        return 1
    fi
    if ((16#$dev > 0x1f)); then
        return 1
    fi
    printf '%04x:%02x:%02x.%x' "$((16#$dom))" "$((16#$bus))" "$((16#$dev))" "$fn"
}

pci_dir() { printf '%s/bus/pci/devices/%s' "$SYSFS_ROOT" "$1"; }

# nvme_bdfs: prints the BDF of every NVMe controller, one a line, sorted.
nvme_bdfs() {
    local d name class bdf
    for d in "$SYSFS_ROOT"/bus/pci/devices/*; do
        name=${d##*/}
        bdf=$(normalise_bdf "$name") || continue
        class=$(read_file "$d/class") || continue
        if [[ $class =~ ^0x[0-9a-fA-F]+$ ]] && ((class == NVME_CLASS)); then
            printf '%s\n' "$bdf"
        fi
    done
}

driver_of() { link_name "$(pci_dir "$1")/driver" || true; }
group_of() { link_name "$(pci_dir "$1")/iommu_group" || true; }

# dev_basename SOURCE: the block device a /dev path refers to (symlinks resolved).
dev_basename() {
    local s=$1 r
    [[ $s == /dev/* ]] || return 1
    r=$s
    if [[ -e $s ]]; then
        r=$(readlink -f "$s" 2>/dev/null) || r=$s
    fi
    printf '%s' "${r##*/}"
}

MOUNT_DEVS=()
MOUNT_PTS=()
SWAP_DEVS=()
# collect_usage: reads the mounts and swaps files once.
collect_usage() {
    local src mnt rest n
    MOUNT_DEVS=()
    MOUNT_PTS=()
    SWAP_DEVS=()
    if [[ -r $PROC_ROOT/mounts ]]; then
        while read -r src mnt rest || [[ -n ${src:-} ]]; do
            if [[ -n ${mnt:-} ]] && n=$(dev_basename "$src"); then
                MOUNT_DEVS+=("$n")
                MOUNT_PTS+=("$mnt")
            fi
            src='' mnt=''
        done <"$PROC_ROOT/mounts"
    fi
    if [[ -r $PROC_ROOT/swaps ]]; then
        {
            read -r rest || true
            while read -r src rest || [[ -n ${src:-} ]]; do
                if n=$(dev_basename "$src"); then
                    SWAP_DEVS+=("$n")
                fi
                src=''
            done
        } <"$PROC_ROOT/swaps"
    fi
}

USES=()
# uses_of DEV DIR: appends to USES every mount, swap area and holder of one block
# device or partition whose sysfs directory is DIR.
uses_of() {
    local dev=$1 dir=$2 i s h dm
    for i in "${!MOUNT_DEVS[@]}"; do
        if [[ ${MOUNT_DEVS[i]} == "$dev" ]]; then
            USES+=("$dev mounted on ${MOUNT_PTS[i]}")
        fi
    done
    for s in "${SWAP_DEVS[@]}"; do
        if [[ $s == "$dev" ]]; then
            USES+=("$dev used as swap")
            break
        fi
    done
    for h in "$dir"/holders/*; do
        h=${h##*/}
        if dm=$(read_file "$SYSFS_ROOT/class/block/$h/dm/name"); then
            USES+=("$dev held by $h ($dm)")
        else
            USES+=("$dev held by $h")
        fi
    done
}

BLOCKS=()
# scan_blocks BDF: sets BLOCKS (block devices of its namespaces, sorted) and USES.
scan_blocks() {
    local bdf=$1 ctrl entry name dir sub b names
    BLOCKS=()
    USES=()
    names=()
    for ctrl in "$(pci_dir "$bdf")"/nvme/nvme*; do
        for entry in "$ctrl"/nvme*; do
            entry=${entry##*/}
            # nvme<N>n<M>, or a multipath path device nvme<N>c<C>n<M> of head nvme<N>n<M>.
            if [[ $entry =~ ^nvme([0-9]+)(c[0-9]+)?n([0-9]+)$ ]]; then
                name=nvme${BASH_REMATCH[1]}n${BASH_REMATCH[3]}
                # A space sorts before any digit, so "nvme0n1 ..." comes before "nvme0n10 ...".
                names+=("$name $ctrl/$entry")
            fi
        done
    done
    if ((${#names[@]} == 0)); then
        return 0
    fi
    local seen=" "
    split_lines "$(printf '%s\n' "${names[@]}" | sort)"
    for b in "${LINES[@]}"; do
        name=${b%% *}
        if [[ $seen == *" $name "* ]]; then
            continue
        fi
        seen+="$name "
        dir=$SYSFS_ROOT/class/block/$name
        if [[ ! -e $dir ]]; then
            dir=${b#* }
        fi
        BLOCKS+=("$name")
        uses_of "$name" "$dir"
        for sub in "$dir/$name"*; do
            if [[ -e $sub/partition ]]; then
                uses_of "${sub##*/}" "$sub"
            fi
        done
    done
}

# --- status --------------------------------------------------------------------------

HP_LABEL=()
HP_KIB=()
HP_FREE=()
HP_TOTAL=()
# hugepage_rows DIR LABEL: appends one HP_* row per page size in DIR, by size.
hugepage_rows() {
    local dir=$1 label=$2 kib d k
    local sizes=()
    for d in "$dir"/hugepages-*kB; do
        k=${d##*/hugepages-}
        k=${k%kB}
        if [[ $k =~ ^[0-9]+$ ]]; then
            sizes+=("$k")
        fi
    done
    if ((${#sizes[@]} == 0)); then
        return 0
    fi
    split_lines "$(printf '%s\n' "${sizes[@]}" | sort -n)"
    for kib in "${LINES[@]}"; do
        HP_LABEL+=("$label")
        HP_KIB+=("$kib")
        HP_FREE+=("$(read_file "$dir/hugepages-${kib}kB/free_hugepages" || echo 0)")
        HP_TOTAL+=("$(read_file "$dir/hugepages-${kib}kB/nr_hugepages" || echo 0)")
    done
}

print_hugepages() {
    local nodes=() d n i
    HP_LABEL=() HP_KIB=() HP_FREE=() HP_TOTAL=()
    for d in "$SYSFS_ROOT"/devices/system/node/node*; do
        n=${d##*/node}
        if [[ $n =~ ^[0-9]+$ ]]; then
            nodes+=("$n")
        fi
    done
    if ((${#nodes[@]})); then
        split_lines "$(printf '%s\n' "${nodes[@]}" | sort -n)"
        local sorted=("${LINES[@]}")
        for n in "${sorted[@]}"; do
            hugepage_rows "$SYSFS_ROOT/devices/system/node/node$n/hugepages" "node$n"
        done
    fi
    if ((${#HP_LABEL[@]} == 0)); then
        hugepage_rows "$SYSFS_ROOT/kernel/mm/hugepages" "-"
    fi
    if ((${#HP_LABEL[@]} == 0)); then
        printf 'hugepages: none (kernel without hugetlb support)\n'
        return 0
    fi
    printf '%-6s  %-10s  %6s  %6s\n' NODE HUGEPAGES FREE TOTAL
    for i in "${!HP_LABEL[@]}"; do
        printf '%-6s  %-10s  %6s  %6s\n' "${HP_LABEL[i]}" "${HP_KIB[i]}kB" "${HP_FREE[i]}" "${HP_TOTAL[i]}"
    done
}

# controller_row BDF: prints one line of the controller table.
controller_row() {
    local bdf=$1 d vendor device numa group driver blocks inuse
    d=$(pci_dir "$bdf")
    vendor=$(read_file "$d/vendor") || vendor=0
    device=$(read_file "$d/device") || device=0
    numa=$(read_file "$d/numa_node") || numa=-
    if [[ ! $numa =~ ^[0-9]+$ ]]; then
        numa=-
    fi
    group=$(group_of "$bdf")
    driver=$(driver_of "$bdf")
    scan_blocks "$bdf"
    if ((${#BLOCKS[@]})); then
        blocks=$(IFS=,; printf '%s' "${BLOCKS[*]}")
    else
        blocks=-
    fi
    if ((${#USES[@]})); then
        inuse=$(printf '%s, ' "${USES[@]}")
        inuse=${inuse%, }
    else
        inuse=no
    fi
    printf '%-12s  %-9s  %-4s  %-5s  %-10s  %-16s  %s\n' "$bdf" \
        "$(printf '%04x:%04x' "$((vendor))" "$((device))")" "$numa" "${group:--}" \
        "${driver:--}" "$blocks" "$inuse"
}

cmd_status() {
    local bdfs=() b
    if [[ ! -d $SYSFS_ROOT/bus/pci/devices ]]; then
        die "$SYSFS_ROOT/bus/pci/devices does not exist: is sysfs mounted (mount -t sysfs sysfs /sys)?"
    fi
    collect_usage
    print_hugepages
    printf '\n'
    split_lines "$(nvme_bdfs | sort)"
    bdfs=("${LINES[@]}")
    if ((${#bdfs[@]} == 0)); then
        printf 'no NVMe controllers (PCI class 0x010802) found\n'
        return 0
    fi
    printf '%-12s  %-9s  %-4s  %-5s  %-10s  %-16s  %s\n' BDF VENDOR:ID NUMA GROUP DRIVER \
        'BLOCK DEVICES' 'IN USE'
    for b in "${bdfs[@]}"; do
        controller_row "$b"
    done
}

# --- config and reset ----------------------------------------------------------------

require_root() {
    if [[ $(id -u) != 0 && $SYSFS_ROOT == /sys ]]; then
        die "$1 needs root: run it with sudo"
    fi
}

# sysfs_write VALUE PATH
sysfs_write() {
    if ! printf '%s' "$1" >"$2" 2>/dev/null; then
        die "cannot write '$1' to $2"
    fi
}

PARSED=()
# parse_list NAME VALUE: sets PARSED to the normalised BDFs of a space-separated list.
parse_list() {
    local b n
    PARSED=()
    for b in $2; do
        n=$(normalise_bdf "$b") || die "$1: '$b' is not a PCI address (like 0000:01:00.0 or 01:00.0)"
        PARSED+=("$n")
    done
}

in_list() {
    local x
    for x in "${@:2}"; do
        if [[ $x == "$1" ]]; then
            return 0
        fi
    done
    return 1
}

ALLOWED=()
BLOCKED=()
TARGETS=()
# select_targets: fills TARGETS from the NVMe controllers, PCI_ALLOWED and PCI_BLOCKED.
select_targets() {
    local all=() b
    ALLOWED=()
    BLOCKED=()
    TARGETS=()
    split_lines "$(nvme_bdfs | sort)"
    all=("${LINES[@]}")
    parse_list PCI_ALLOWED "$PCI_ALLOWED"
    ALLOWED=("${PARSED[@]}")
    parse_list PCI_BLOCKED "$PCI_BLOCKED"
    BLOCKED=("${PARSED[@]}")
    for b in "${ALLOWED[@]}"; do
        if [[ ! -e $(pci_dir "$b") ]]; then
            die "PCI_ALLOWED: no PCI device $b (see scripts/setup.sh status)"
        fi
        if ! in_list "$b" "${all[@]}"; then
            die "PCI_ALLOWED: $b is not an NVMe controller (class $(read_file "$(pci_dir "$b")/class" || echo unknown))"
        fi
    done
    for b in "${all[@]}"; do
        if in_list "$b" "${BLOCKED[@]}"; then
            info "$b: skipped (PCI_BLOCKED)"
            continue
        fi
        if ((${#ALLOWED[@]})) && ! in_list "$b" "${ALLOWED[@]}"; then
            continue
        fi
        TARGETS+=("$b")
    done
}

load_module() {
    local mod=$1
    shift
    if ! modprobe "$mod" "$@"; then
        die "modprobe $mod $* failed; is the module built for this kernel ($(uname -r))?"
    fi
}

setup_modules() {
    local param=$SYSFS_ROOT/module/vfio/parameters/enable_unsafe_noiommu_mode
    if [[ $NOIOMMU == 1 ]]; then
        warn "NOIOMMU=1: enabling vfio's UNSAFE noiommu mode. DMA of the devices bound now is"
        warn "NOT confined by an IOMMU: they can read and write ALL memory of this machine."
        warn "Use it only on a machine without an IOMMU, for devices you trust."
        if [[ ! -e $param ]]; then
            if [[ -d $SYSFS_ROOT/module/vfio ]]; then
                die "vfio is loaded without noiommu support ($param missing): the kernel was built without CONFIG_VFIO_NOIOMMU; use a kernel with it"
            fi
            load_module vfio enable_unsafe_noiommu_mode=1
        fi
        if [[ ! -e $param ]]; then
            die "this kernel's vfio has no noiommu support ($param missing): it was built without CONFIG_VFIO_NOIOMMU"
        fi
        if [[ $(read_file "$param") != Y && $(read_file "$param") != 1 ]]; then
            sysfs_write 1 "$param"
        fi
    fi
    if [[ ! -d $SYSFS_ROOT/bus/pci/drivers/vfio-pci ]]; then
        load_module vfio-pci
    fi
    if [[ $NOIOMMU != 1 && ! -d $SYSFS_ROOT/module/vfio_iommu_type1 ]]; then
        load_module vfio_iommu_type1
    fi
}

setup_hugepages() {
    local dir=$SYSFS_ROOT/kernel/mm/hugepages/hugepages-2048kB pages have got
    if [[ ! $HUGEMEM =~ ^[0-9]+$ ]] || ((HUGEMEM == 0)); then
        die "HUGEMEM='$HUGEMEM' is not a positive number of MiB"
    fi
    pages=$(((HUGEMEM + 1) / 2))
    if [[ ! -e $dir/nr_hugepages ]]; then
        die "no 2 MiB hugepage support ($dir missing): the kernel lacks CONFIG_HUGETLBFS"
    fi
    have=$(read_file "$dir/nr_hugepages")
    if ((have < pages)); then
        sysfs_write "$pages" "$dir/nr_hugepages"
        got=$(read_file "$dir/nr_hugepages")
        if ((got < pages)); then
            die "asked for $pages 2 MiB hugepages ($HUGEMEM MiB), the kernel gave $got: memory is short or fragmented; use a smaller HUGEMEM, or try 'echo 1 > /proc/sys/vm/compact_memory' and run again"
        fi
        info "hugepages: $got x 2 MiB ($HUGEMEM MiB)"
    else
        info "hugepages: $have x 2 MiB already (HUGEMEM=$HUGEMEM MiB needs $pages)"
    fi
    local fstype mnt src rest mounted=0
    if [[ -r $PROC_ROOT/mounts ]]; then
        while read -r src mnt fstype rest || [[ -n ${src:-} ]]; do
            if [[ ${fstype:-} == hugetlbfs ]]; then
                mounted=1
            fi
            src=''
        done <"$PROC_ROOT/mounts"
    fi
    if ((mounted == 0)); then
        mkdir -p "$DEV_ROOT/hugepages" || die "cannot create $DEV_ROOT/hugepages"
        mount -t hugetlbfs nodev "$DEV_ROOT/hugepages" || die "cannot mount hugetlbfs at $DEV_ROOT/hugepages"
        info "mounted hugetlbfs at $DEV_ROOT/hugepages"
    fi
}

# wait_driver BDF DRIVER: waits up to BIND_WAIT_S seconds for the device to be bound.
wait_driver() {
    local i=0
    while [[ $(driver_of "$1") != "$2" ]]; do
        if ((i >= BIND_WAIT_S)); then
            return 1
        fi
        sleep 1
        i=$((i + 1))
    done
}

# bind BDF DRIVER: binds through driver_override and drivers_probe.
bind_to() {
    local bdf=$1 drv=$2 d cur
    d=$(pci_dir "$bdf")
    cur=$(driver_of "$bdf")
    sysfs_write "$drv" "$d/driver_override"
    if [[ -n $cur ]]; then
        sysfs_write "$bdf" "$d/driver/unbind"
    fi
    sysfs_write "$bdf" "$SYSFS_ROOT/bus/pci/drivers_probe"
    wait_driver "$bdf" "$drv"
}

# vfio_node GROUP: the group's device node (IOMMU or noiommu).
vfio_node() {
    if [[ -e $DEV_ROOT/vfio/noiommu-$1 ]]; then
        printf '%s' "$DEV_ROOT/vfio/noiommu-$1"
    else
        printf '%s' "$DEV_ROOT/vfio/$1"
    fi
}

# group_users NODE: prints "pid (comm)" of processes that have NODE open.
group_users() {
    local fd t pid comm
    for fd in "$PROC_ROOT"/[0-9]*/fd/*; do
        t=$(readlink "$fd" 2>/dev/null) || continue
        if [[ $t == "$1" || $t == "/dev/vfio/${1##*/}" ]]; then
            pid=${fd#"$PROC_ROOT"/}
            pid=${pid%%/*}
            comm=$(read_file "$PROC_ROOT/$pid/comm") || comm='?'
            printf '%s (%s)\n' "$pid" "$comm"
        fi
    done | sort -u
}

chown_group() {
    local bdf=$1 group node i=0
    group=$(group_of "$bdf")
    if [[ -z $group ]]; then
        warn "$bdf: no IOMMU group after binding; cannot chown its vfio node"
        return 1
    fi
    node=$(vfio_node "$group")
    while [[ ! -e $node ]]; do
        if ((i >= BIND_WAIT_S)); then
            warn "$bdf: $node did not appear; is devtmpfs mounted at $DEV_ROOT?"
            return 1
        fi
        sleep 1
        i=$((i + 1))
        node=$(vfio_node "$group")
    done
    if ! chown "$TARGET_USER" "$node"; then
        warn "$bdf: chown $TARGET_USER $node failed (is '$TARGET_USER' a user here?)"
        return 1
    fi
    info "$bdf: $node now belongs to $TARGET_USER (raise its memlock limit too: ulimit -l, or LimitMEMLOCK=)"
    if [[ $node == */noiommu-* ]]; then
        warn "$bdf: noiommu groups can be opened only with CAP_SYS_RAWIO: $TARGET_USER needs root anyway"
    fi
}

cmd_config() {
    require_root config
    local b drv failed=0 refused u
    if [[ ! -d $SYSFS_ROOT/bus/pci/devices ]]; then
        die "$SYSFS_ROOT/bus/pci/devices does not exist: is sysfs mounted (mount -t sysfs sysfs /sys)?"
    fi
    select_targets
    collect_usage
    setup_modules
    setup_hugepages
    if ((${#TARGETS[@]} == 0)); then
        info "no NVMe controllers to bind"
    fi
    for b in "${TARGETS[@]}"; do
        drv=$(driver_of "$b")
        if [[ $drv == vfio-pci ]]; then
            info "$b: already bound to vfio-pci"
        else
            scan_blocks "$b"
            if ((${#USES[@]})); then
                refused=$(printf '%s, ' "${USES[@]}")
                refused=${refused%, }
                if ((${#ALLOWED[@]})); then
                    printf '%s: error: refusing to unbind %s from %s: %s; unmount / swapoff / remove the holder first\n' \
                        "$PROG" "$b" "${drv:-no driver}" "$refused" >&2
                    failed=1
                else
                    info "$b: skipped, in use: $refused (name it in PCI_ALLOWED after freeing it)"
                fi
                continue
            fi
            if [[ $NOIOMMU != 1 && -z $(group_of "$b") ]]; then
                printf '%s: error: %s has no IOMMU group: the IOMMU is off; boot with intel_iommu=on or amd_iommu=on, or use NOIOMMU=1 knowingly; left on %s\n' \
                    "$PROG" "$b" "${drv:-no driver}" >&2
                failed=1
                continue
            fi
            if ! bind_to "$b" vfio-pci; then
                printf '%s: error: %s did not bind to vfio-pci within %s s (driver now: %s); see dmesg\n' \
                    "$PROG" "$b" "$BIND_WAIT_S" "$(driver_of "$b" || true)" >&2
                failed=1
                continue
            fi
            info "$b: bound to vfio-pci (was ${drv:-no driver})"
        fi
        if [[ -n $TARGET_USER ]]; then
            chown_group "$b" || failed=1
        fi
    done
    if ((failed)); then
        exit 1
    fi
    # A user other than root needs the container node too (normally mode 0666).
    u=$DEV_ROOT/vfio/vfio
    if [[ -n $TARGET_USER && -e $u && ! -w $u ]]; then
        warn "$u is not writable; check its mode (normally 0666)"
    fi
}

cmd_reset() {
    require_root reset
    local b drv failed=0 group node users
    select_targets
    if [[ ! -d $SYSFS_ROOT/bus/pci/drivers/nvme ]]; then
        load_module nvme
    fi
    for b in "${TARGETS[@]}"; do
        drv=$(driver_of "$b")
        if [[ $drv == nvme ]]; then
            info "$b: already bound to nvme"
            continue
        fi
        if [[ -n $drv && $drv != vfio-pci ]]; then
            info "$b: left on $drv (reset only takes controllers from vfio-pci or no driver)"
            continue
        fi
        group=$(group_of "$b")
        if [[ -n $group ]]; then
            node=$(vfio_node "$group")
            users=$(group_users "$node")
            if [[ -n $users ]]; then
                printf '%s: error: %s is in use through %s by pid %s; stop it first\n' \
                    "$PROG" "$b" "$node" "${users//$'\n'/, }" >&2
                failed=1
                continue
            fi
        fi
        # An empty override lets any driver (nvme) claim the device again.
        sysfs_write $'\n' "$(pci_dir "$b")/driver_override"
        if [[ -n $drv ]]; then
            sysfs_write "$b" "$(pci_dir "$b")/driver/unbind"
        fi
        sysfs_write "$b" "$SYSFS_ROOT/bus/pci/drivers_probe"
        if ! wait_driver "$b" nvme; then
            printf '%s: error: %s did not bind to nvme within %s s (driver now: %s); see dmesg\n' \
                "$PROG" "$b" "$BIND_WAIT_S" "$(driver_of "$b" || true)" >&2
            failed=1
            continue
        fi
        info "$b: bound to nvme (was ${drv:-no driver})"
    done
    if ((failed)); then
        exit 1
    fi
}

main() {
    local cmd=${1:-config}
    if (($# > 1)); then
        usage >&2
        die "one subcommand at most, got: $*"
    fi
    case $cmd in
    config) cmd_config ;;
    reset) cmd_reset ;;
    status) cmd_status ;;
    help | -h | --help) usage ;;
    *)
        usage >&2
        die "unknown subcommand '$cmd'"
        ;;
    esac
}

main "$@"
