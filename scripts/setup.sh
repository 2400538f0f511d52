#!/usr/bin/env bash
# Kestrel device setup: bind NVMe controllers to vfio-pci, allocate hugepages, show state.
# Modelled on SPDK's scripts/setup.sh. Reads everything from /sys and /proc, so it also
# runs in a minimal busybox guest (no lspci, lsblk, findmnt or udevadm needed).
#
#   scripts/setup.sh [config|reset|status|help]      (config is the default)
#
# Every variable and argument is checked, and every controller to bind is checked for
# mounts, swap and holders, before the first module load or sysfs write. Run
# `scripts/setup.sh help` for the variables and exit statuses.
set -euo pipefail
shopt -s nullglob
export LC_ALL=C

PROG=setup.sh
EXIT_FAIL=1
EXIT_USAGE=2

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$EXIT_FAIL"
}
# usage_error MSG: a bad variable or argument; nothing has been done yet.
usage_error() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$EXIT_USAGE"
}
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
info() { printf '%s: %s\n' "$PROG" "$*"; }

usage() {
    printf '%s\n' \
        'usage: scripts/setup.sh [config|reset|status|help]' \
        '' \
        '  config  (default) bind NVMe controllers to vfio-pci (through driver_override and' \
        '          drivers_probe), allocate hugepages, mount hugetlbfs, load vfio-pci, and' \
        '          record what it found in STATE_DIR/setup.state for reset.' \
        '          Refuses controllers whose namespaces are mounted (the root filesystem' \
        '          included), used as swap or held by another device (LVM, md); when' \
        '          PCI_ALLOWED is unset such controllers are skipped with a message instead.' \
        "  reset   undo config: rebind each controller config took to the driver it had" \
        '          (others on vfio-pci or no driver go to nvme); without PCI_ALLOWED and' \
        '          PCI_BLOCKED also put the hugepage pool back, unmount the hugetlbfs it' \
        '          mounted and unload the modules it loaded.' \
        '  status  hugepages per NUMA node (free/total) and a table of NVMe controllers: BDF,' \
        '          vendor:device, NUMA node, IOMMU group, driver, block devices, what uses them.' \
        '  help    this text.' \
        '' \
        'environment (all checked before anything is done):' \
        '  PCI_ALLOWED="BDF ..."  only these controllers, space-separated, as 0000:01:00.0 or' \
        '                         01:00.0; no wildcards' \
        '  PCI_BLOCKED="BDF ..."  never these controllers' \
        '  HUGEMEM=MiB            MiB of hugepages to have in the pool (default 2048), a whole' \
        '                         number without sign or leading zero, at most the memory size' \
        '  HUGEPGSZ=kB            hugepage size in kB: 2048 (default) or 1048576' \
        '  TARGET_USER=user       hand the controllers to this user: chown /dev/vfio/<group>,' \
        '                         hugetlbfs mounted with its group, memlock advice' \
        '  NOIOMMU=0|1            1: enable vfio'"'"'s UNSAFE noiommu mode (no IOMMU: the device can' \
        '                         read and write all memory); only on machines without an IOMMU' \
        '  DRIVER_OVERRIDE=vfio-pci  the only driver Kestrel uses; anything else is refused' \
        '  BIND_WAIT_S=seconds    how long to wait for a driver to bind (0..600, default 5)' \
        '  STATE_DIR=dir          where config records what it changed (default /run/kestrel)' \
        '  SYSFS_ROOT, PROC_ROOT, DEV_ROOT   roots of /sys, /proc and /dev (for tests)' \
        '' \
        'exit status: 0 done; 1 refused or failed (the message says what was and was not' \
        'changed); 2 bad subcommand or variable (nothing was done).'
}

# --- checking the settings (no side effects) ----------------------------------------

# is_abs_path VALUE: an absolute path without newlines.
is_abs_path() { [[ $1 == /* && $1 != *$'\n'* ]]; }

# check_root_var NAME VALUE
check_root_var() {
    is_abs_path "$2" || usage_error "$1='$2' is not an absolute path"
}

# SPDK's names for settings this script has under another name or not at all: set, they
# would be silently ignored.
check_foreign_vars() {
    if [[ -n ${PCI_WHITELIST+x} ]]; then usage_error "PCI_WHITELIST is not read here: use PCI_ALLOWED"; fi
    if [[ -n ${PCI_BLACKLIST+x} ]]; then usage_error "PCI_BLACKLIST is not read here: use PCI_BLOCKED"; fi
    if [[ -n ${NRHUGE+x} ]]; then usage_error "NRHUGE is not read here: give the pool size in MiB with HUGEMEM"; fi
    if [[ -n ${HUGENODE+x} ]]; then usage_error "HUGENODE is not supported: the kernel spreads the pool over the NUMA nodes (see 'status')"; fi
}

# check_decimal NAME VALUE MAX_DIGITS WHAT: a whole decimal number, no sign, no leading
# zero (bash reads 010 as octal), at most MAX_DIGITS digits (no overflow).
check_decimal() {
    local name=$1 v=$2 digits=$3 what=$4
    if [[ -z $v ]]; then
        usage_error "$name is empty: give $what"
    elif [[ $v == -* ]]; then
        usage_error "$name='$v' is negative: give $what"
    elif [[ ! $v =~ ^[0-9]+$ ]]; then
        usage_error "$name='$v' is not a whole decimal number: give $what"
    elif ((${#v} > digits)); then
        usage_error "$name='$v' is absurdly large (more than $digits digits): give $what"
    elif [[ $v =~ ^0[0-9] ]]; then
        usage_error "$name='$v' has a leading zero (some tools read it as octal): write $((10#$v))"
    fi
}

# meminfo_kib KEY: a value of the meminfo file, in kB; fails when absent.
meminfo_kib() {
    local k v rest
    [[ -r $PROC_ROOT/meminfo ]] || return 1
    while read -r k v rest || [[ -n ${k:-} ]]; do
        if [[ $k == "$1:" && $v =~ ^[0-9]+$ ]]; then
            printf '%s' "$v"
            return 0
        fi
        k=''
    done <"$PROC_ROOT/meminfo"
    return 1
}

HUGE_PAGES=0
check_hugemem() {
    check_decimal HUGEMEM "$HUGEMEM" 9 "the hugepage pool size in MiB, like 2048"
    if ((HUGEMEM == 0)); then
        usage_error "HUGEMEM=0: the pool needs at least one page; give its size in MiB, like 2048"
    fi
    check_decimal HUGEPGSZ "$HUGEPGSZ" 8 "the hugepage size in kB: 2048 or 1048576"
    if ((HUGEPGSZ < 4 || (HUGEPGSZ & (HUGEPGSZ - 1)) != 0)); then
        usage_error "HUGEPGSZ=$HUGEPGSZ kB is not a hugepage size: give 2048 (2 MiB) or 1048576 (1 GiB)"
    fi
    # Rounded up to whole pages.
    HUGE_PAGES=$(((HUGEMEM * 1024 + HUGEPGSZ - 1) / HUGEPGSZ))
}

# normalise_bdf ADDR: prints DDDD:BB:DD.F for [DDDD:]BB:DD.F (domain 4 to 8 hex digits,
# bus and device 2, function 1, either case); fails if it does not parse.
normalise_bdf() {
    local b=${1,,} dom=0 bus dev fn
    if [[ $b =~ ^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$ ]]; then
        dom=${BASH_REMATCH[1]} bus=${BASH_REMATCH[2]} dev=${BASH_REMATCH[3]} fn=${BASH_REMATCH[4]}
    elif [[ $b =~ ^([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$ ]]; then
        bus=${BASH_REMATCH[1]} dev=${BASH_REMATCH[2]} fn=${BASH_REMATCH[3]}
    else
        return 1
    fi
    if ((16#$dev > 0x1f)); then
        return 1
    fi
    printf '%04x:%02x:%02x.%x' "$((16#$dom))" "$((16#$bus))" "$((16#$dev))" "$fn"
}

PARSED=()
# parse_list NAME VALUE: sets PARSED to the normalised BDFs of a space-separated list.
# Refuses wildcards and anything that is not an exact address.
parse_list() {
    local name=$1 value=$2 b n words=()
    PARSED=()
    case $value in
    *[*?\[\]]*)
        usage_error "$name='$value': wildcards are refused, name each controller by its address (see 'scripts/setup.sh status')"
        ;;
    esac
    # No glob characters are left; -f anyway, so nothing can expand to file names.
    set -f
    # shellcheck disable=SC2206 # splitting on blanks is the point
    words=($value)
    set +f
    for b in "${words[@]}"; do
        case ${b,,} in
        all | any | none)
            usage_error "$name='$value': '$b' is not an address and wildcards are refused; name each controller (see 'scripts/setup.sh status')"
            ;;
        esac
        n=$(normalise_bdf "$b") ||
            usage_error "$name: '$b' is not a PCI address: give [DDDD:]BB:DD.F in hex, like 0000:01:00.0 or 01:00.0, several separated by spaces"
        if ! in_list "$n" "${PARSED[@]}"; then
            PARSED+=("$n")
        fi
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

TARGET_UID=''
TARGET_GID=''
check_target_user() {
    [[ -n $TARGET_USER ]] || return 0
    if [[ ! $TARGET_USER =~ ^([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})$ ]]; then
        usage_error "TARGET_USER='$TARGET_USER' is not a user name"
    fi
    TARGET_UID=$(id -u "$TARGET_USER" 2>/dev/null) || usage_error "TARGET_USER: no user '$TARGET_USER' on this machine"
    TARGET_GID=$(id -g "$TARGET_USER" 2>/dev/null) || usage_error "TARGET_USER: no group for user '$TARGET_USER'"
    if [[ $NOIOMMU == 1 ]]; then
        usage_error "TARGET_USER with NOIOMMU=1: a noiommu group can be opened only with CAP_SYS_RAWIO, so '$TARGET_USER' could not use it; run kestrel as root, or use the IOMMU"
    fi
}

ALLOWED=()
BLOCKED=()
# check_settings: every variable, before anything is done.
check_settings() {
    local b
    check_foreign_vars
    check_root_var SYSFS_ROOT "$SYSFS_ROOT"
    check_root_var PROC_ROOT "$PROC_ROOT"
    check_root_var DEV_ROOT "$DEV_ROOT"
    check_root_var STATE_DIR "$STATE_DIR"
    case $NOIOMMU in
    0 | 1) ;;
    *) usage_error "NOIOMMU='$NOIOMMU': give 1 (enable the unsafe noiommu mode) or 0" ;;
    esac
    if [[ -n $DRIVER_OVERRIDE && $DRIVER_OVERRIDE != vfio-pci ]]; then
        usage_error "DRIVER_OVERRIDE='$DRIVER_OVERRIDE': Kestrel drives controllers only through vfio-pci (uio drivers give no IOMMU protection and no IOMMU group); unset it"
    fi
    check_decimal BIND_WAIT_S "$BIND_WAIT_S" 3 "seconds to wait for a driver, 0 to 600"
    if ((BIND_WAIT_S > 600)); then
        usage_error "BIND_WAIT_S=$BIND_WAIT_S: at most 600 seconds"
    fi
    check_hugemem
    check_target_user
    parse_list PCI_ALLOWED "$PCI_ALLOWED"
    ALLOWED=("${PARSED[@]}")
    parse_list PCI_BLOCKED "$PCI_BLOCKED"
    BLOCKED=("${PARSED[@]}")
    for b in "${ALLOWED[@]}"; do
        if in_list "$b" "${BLOCKED[@]}"; then
            usage_error "$b is in both PCI_ALLOWED and PCI_BLOCKED"
        fi
    done
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
MI_DEVNOS=()
MI_PTS=()
SWAP_DEVS=()
# collect_usage: reads the mounts, mountinfo and swaps files once.
collect_usage() {
    local src mnt rest n id devno
    MOUNT_DEVS=() MOUNT_PTS=() MI_DEVNOS=() MI_PTS=() SWAP_DEVS=()
    if [[ -r $PROC_ROOT/mounts ]]; then
        while read -r src mnt rest || [[ -n ${src:-} ]]; do
            if [[ -n ${mnt:-} ]] && n=$(dev_basename "$src"); then
                MOUNT_DEVS+=("$n")
                MOUNT_PTS+=("$mnt")
            fi
            src='' mnt=''
        done <"$PROC_ROOT/mounts"
    fi
    # "id parent major:minor root mountpoint ...": finds mounts whose source does not
    # name the device (/dev/root).
    if [[ -r $PROC_ROOT/self/mountinfo ]]; then
        while read -r id _ devno _ mnt rest || [[ -n ${id:-} ]]; do
            if [[ -n ${mnt:-} ]]; then
                MI_DEVNOS+=("$devno")
                MI_PTS+=("$mnt")
            fi
            id='' mnt=''
        done <"$PROC_ROOT/self/mountinfo"
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
# device or partition whose sysfs directory is DIR (the order of kestrel::pci).
uses_of() {
    local dev=$1 dir=$2 i s h dm devno seen=$'\n'
    for i in "${!MOUNT_DEVS[@]}"; do
        if [[ ${MOUNT_DEVS[i]} == "$dev" ]]; then
            USES+=("$dev mounted on ${MOUNT_PTS[i]}")
            seen+="${MOUNT_PTS[i]}"$'\n'
        fi
    done
    if devno=$(read_file "$dir/dev"); then
        for i in "${!MI_DEVNOS[@]}"; do
            if [[ ${MI_DEVNOS[i]} == "$devno" && $seen != *$'\n'"${MI_PTS[i]}"$'\n'* ]]; then
                USES+=("$dev mounted on ${MI_PTS[i]}")
                seen+="${MI_PTS[i]}"$'\n'
            fi
        done
    fi
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

require_sysfs() {
    if [[ ! -d $SYSFS_ROOT/bus/pci/devices ]]; then
        die "$SYSFS_ROOT/bus/pci/devices does not exist: is sysfs mounted (mount -t sysfs sysfs /sys)?"
    fi
}

cmd_status() {
    local bdfs=() b
    require_sysfs
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

# --- the state config found ----------------------------------------------------------
#
# $STATE_DIR/setup.state holds one record a line, written by config the first time it
# changes something and read by reset:
#   driver BDF DRIVER|none   the driver a controller had before config bound it
#   hugepages KB COUNT       nr_hugepages of the KB pool before config grew it
#   mount PATH               a hugetlbfs config mounted
#   mkdir PATH               the directory config made for it
#   module NAME              a module config loaded
#   noiommu VALUE            enable_unsafe_noiommu_mode before config set it
# A later config never overwrites a record: reset goes back to what the first one found.

state_file() { printf '%s/setup.state' "$STATE_DIR"; }

STATE=()
# load_state: STATE=(records); refuses a file it cannot read or parse.
load_state() {
    local f line n=0
    f=$(state_file)
    STATE=()
    [[ -e $f ]] || return 0
    [[ -r $f ]] || die "cannot read $f"
    while IFS= read -r line || [[ -n $line ]]; do
        n=$((n + 1))
        case $line in
        '' | '#'*) continue ;;
        esac
        if [[ ! $line =~ ^(driver\ [0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\ [A-Za-z0-9_-]+|hugepages\ [1-9][0-9]{0,7}\ (0|[1-9][0-9]{0,9})|mount\ /[^[:space:]]*|mkdir\ /[^[:space:]]*|module\ [A-Za-z0-9_-]+|noiommu\ [A-Za-z0-9]+)$ ]]; then
            die "$f line $n is not a record of this script: '$line'; fix or delete the file (it only tells reset what to restore)"
        fi
        STATE+=("$line")
    done <"$f"
}

# state_get KEY: prints the value of the first record "KEY value" (empty for a record
# "KEY"); fails if there is none.
state_get() {
    local r v
    for r in "${STATE[@]}"; do
        if [[ $r == "$1" || $r == "$1 "* ]]; then
            v=${r#"$1"}
            printf '%s' "${v# }"
            return 0
        fi
    done
    return 1
}

# record KEY [VALUE]: appends "KEY VALUE" unless a record for KEY exists.
record() {
    local f line=$1${2:+ $2}
    if state_get "$1" >/dev/null; then
        return 0
    fi
    f=$(state_file)
    if [[ ! -e $f ]]; then
        mkdir -p "$STATE_DIR" || die "cannot create $STATE_DIR (set STATE_DIR to a writable directory)"
        printf '# kestrel setup.sh: what config found, for reset to restore\n' >"$f" ||
            die "cannot write $f"
    fi
    printf '%s\n' "$line" >>"$f" || die "cannot write $f"
    STATE+=("$line")
}

# forget KEY: removes the record for KEY; deletes the file when no record is left.
forget() {
    local r keep=() f
    f=$(state_file)
    for r in "${STATE[@]}"; do
        if [[ $r != "$1" && $r != "$1 "* ]]; then
            keep+=("$r")
        fi
    done
    STATE=("${keep[@]}")
    if ((${#STATE[@]} == 0)); then
        rm -f "$f"
    else
        { printf '# kestrel setup.sh: what config found, for reset to restore\n'
          printf '%s\n' "${STATE[@]}"; } >"$f" || die "cannot write $f"
    fi
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

TARGETS=()
# select_targets: fills TARGETS from the NVMe controllers, PCI_ALLOWED and PCI_BLOCKED.
select_targets() {
    local all=() b
    TARGETS=()
    split_lines "$(nvme_bdfs | sort)"
    all=("${LINES[@]}")
    for b in "${ALLOWED[@]}"; do
        if [[ ! -e $(pci_dir "$b") ]]; then
            usage_error "PCI_ALLOWED: no PCI device $b (see scripts/setup.sh status)"
        fi
        if ! in_list "$b" "${all[@]}"; then
            usage_error "PCI_ALLOWED: $b is not an NVMe controller (class $(read_file "$(pci_dir "$b")/class" || echo unknown))"
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
    record "module $mod"
}

NOIOMMU_PARAM=''
HUGE_DIR=''
TO_BIND=()
# plan_config: every check config makes before its first action; sets TO_BIND.
plan_config() {
    local b drv refused failed=0 sizes=() d total
    require_sysfs
    select_targets
    collect_usage
    load_state
    NOIOMMU_PARAM=$SYSFS_ROOT/module/vfio/parameters/enable_unsafe_noiommu_mode
    if [[ $NOIOMMU == 1 && ! -e $NOIOMMU_PARAM && -d $SYSFS_ROOT/module/vfio ]]; then
        die "vfio is loaded without noiommu support ($NOIOMMU_PARAM missing): the kernel was built without CONFIG_VFIO_NOIOMMU; use a kernel with it"
    fi
    if total=$(meminfo_kib MemTotal) && ((HUGEMEM * 1024 > total)); then
        usage_error "HUGEMEM=$HUGEMEM MiB is more than this machine's memory ($((total / 1024)) MiB, MemTotal in $PROC_ROOT/meminfo)"
    fi
    HUGE_DIR=$SYSFS_ROOT/kernel/mm/hugepages/hugepages-${HUGEPGSZ}kB
    if [[ ! -e $HUGE_DIR/nr_hugepages ]]; then
        for d in "$SYSFS_ROOT"/kernel/mm/hugepages/hugepages-*kB; do
            d=${d##*/hugepages-}
            sizes+=("${d%kB}")
        done
        if ((${#sizes[@]})); then
            usage_error "HUGEPGSZ=$HUGEPGSZ: this kernel has no $HUGEPGSZ kB hugepages ($HUGE_DIR missing); it has: ${sizes[*]} (kB)"
        fi
        die "no hugepage support ($HUGE_DIR missing): the kernel lacks CONFIG_HUGETLBFS"
    fi
    TO_BIND=()
    for b in "${TARGETS[@]}"; do
        drv=$(driver_of "$b")
        if [[ $drv == vfio-pci ]]; then
            TO_BIND+=("$b")
            continue
        fi
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
        TO_BIND+=("$b")
    done
    if ((failed)); then
        die "nothing was changed"
    fi
}

setup_modules() {
    if [[ $NOIOMMU == 1 ]]; then
        warn "NOIOMMU=1: enabling vfio's UNSAFE noiommu mode. DMA of the devices bound now is"
        warn "NOT confined by an IOMMU: they can read and write ALL memory of this machine."
        warn "Use it only on a machine without an IOMMU, for devices you trust."
        if [[ ! -e $NOIOMMU_PARAM ]]; then
            load_module vfio enable_unsafe_noiommu_mode=1
        fi
        if [[ ! -e $NOIOMMU_PARAM ]]; then
            die "this kernel's vfio has no noiommu support ($NOIOMMU_PARAM missing): it was built without CONFIG_VFIO_NOIOMMU"
        fi
        local cur
        cur=$(read_file "$NOIOMMU_PARAM" || echo N)
        if [[ $cur != Y && $cur != 1 ]]; then
            record noiommu "$cur"
            sysfs_write 1 "$NOIOMMU_PARAM"
        fi
    fi
    if [[ ! -d $SYSFS_ROOT/bus/pci/drivers/vfio-pci ]]; then
        load_module vfio-pci
    fi
    if [[ $NOIOMMU != 1 && ! -d $SYSFS_ROOT/module/vfio_iommu_type1 ]]; then
        load_module vfio_iommu_type1
    fi
}

# hugepage_pool: grows the HUGEPGSZ pool to HUGE_PAGES pages. When the kernel grants
# fewer, puts the pool back as it was, says so and fails.
hugepage_pool() {
    local nr=$HUGE_DIR/nr_hugepages have got now size_mib
    size_mib=$((HUGE_PAGES * HUGEPGSZ / 1024))
    if ((HUGEMEM * 1024 % HUGEPGSZ)); then
        info "HUGEMEM=$HUGEMEM MiB rounded up to $HUGE_PAGES pages of $HUGEPGSZ kB ($size_mib MiB)"
    fi
    have=$(read_file "$nr") || die "cannot read $nr"
    [[ $have =~ ^[0-9]+$ ]] || die "$nr holds '$have', not a number"
    if ((have >= HUGE_PAGES)); then
        info "hugepages: $have x $HUGEPGSZ kB already (HUGEMEM=$HUGEMEM MiB needs $HUGE_PAGES)"
        return 0
    fi
    sysfs_write "$HUGE_PAGES" "$nr"
    got=$(read_file "$nr") || die "cannot read $nr after writing it"
    [[ $got =~ ^[0-9]+$ ]] || die "$nr holds '$got' after writing $HUGE_PAGES"
    if ((got < HUGE_PAGES)); then
        # Give back what was granted: a half-grown pool only takes memory from others.
        printf '%s' "$have" >"$nr" 2>/dev/null || true
        now=$(read_file "$nr" || echo unknown)
        if [[ $now == "$have" ]]; then
            now="put back to $have"
        else
            now="could not be put back to $have: it holds $now"
        fi
        die "asked for $HUGE_PAGES hugepages of $HUGEPGSZ kB (HUGEMEM=$HUGEMEM MiB), the kernel granted $got: memory is short or fragmented. The pool $now; no controller was bound. Use a smaller HUGEMEM, or 'echo 1 > /proc/sys/vm/compact_memory' (or reserve at boot: hugepages=$HUGE_PAGES) and run again"
    fi
    record "hugepages $HUGEPGSZ" "$have"
    info "hugepages: $got x $HUGEPGSZ kB ($size_mib MiB; there were $have)"
}

# hugetlbfs_mount: mounts hugetlbfs at DEV_ROOT/hugepages unless one is mounted; with
# TARGET_USER, with that user's group and mode 1770 so it can create files there.
hugetlbfs_mount() {
    local fstype mnt src rest found='' dir=$DEV_ROOT/hugepages opts
    if [[ -r $PROC_ROOT/mounts ]]; then
        while read -r src mnt fstype rest || [[ -n ${src:-} ]]; do
            if [[ ${fstype:-} == hugetlbfs && -z $found ]]; then
                found=$mnt
            fi
            src=''
        done <"$PROC_ROOT/mounts"
    fi
    if [[ -n $found ]]; then
        if [[ -n $TARGET_USER ]]; then
            info "hugetlbfs is mounted at $found already (left as it is; Kestrel maps hugepages with MAP_HUGETLB and does not need it; for tools that do: mount -o remount,gid=$TARGET_GID,mode=1770 $found)"
        fi
        return 0
    fi
    opts=pagesize=${HUGEPGSZ}K
    if [[ -n $TARGET_USER ]]; then
        opts+=,gid=$TARGET_GID,mode=1770
    fi
    if [[ ! -d $dir ]]; then
        mkdir -p "$dir" || die "cannot create $dir"
        record mkdir "$dir"
    fi
    mount -t hugetlbfs -o "$opts" nodev "$dir" || die "cannot mount hugetlbfs at $dir"
    record mount "$dir"
    info "mounted hugetlbfs at $dir ($opts)"
}

# wait_driver BDF DRIVER: waits up to BIND_WAIT_S seconds for the device to be bound
# (DRIVER none: to no driver).
wait_driver() {
    local i=0 want=$2
    if [[ $want == none ]]; then
        want=''
    fi
    while [[ $(driver_of "$1") != "$want" ]]; do
        if ((i >= BIND_WAIT_S)); then
            return 1
        fi
        sleep 1
        i=$((i + 1))
    done
}

# bind_to BDF DRIVER: binds through driver_override and drivers_probe.
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
    if ! chown "$TARGET_UID:$TARGET_GID" "$node"; then
        warn "$bdf: chown $TARGET_UID:$TARGET_GID $node failed"
        return 1
    fi
    info "$bdf: $node now belongs to $TARGET_USER (uid $TARGET_UID, gid $TARGET_GID)"
}

# memlock_advice: how much TARGET_USER may lock, and how to give it that.
memlock_advice() {
    local kib=$((HUGE_PAGES * HUGEPGSZ))
    info "$TARGET_USER needs a memlock limit of at least the DMA memory it uses (the whole pool: $kib KiB). Give it one of:"
    info "  a line '$TARGET_USER - memlock $kib' (or unlimited) in /etc/security/limits.conf, then log in again"
    info "  LimitMEMLOCK=$((kib * 1024)) (or infinity) in the [Service] section of its systemd unit"
    info "  'ulimit -l $kib' in a root shell before switching to $TARGET_USER"
    info "then check with: kestrel doctor (as $TARGET_USER)"
}

cmd_config() {
    local b drv failed=0 u
    require_root config
    plan_config
    # Checks done: from here on, act.
    hugepage_pool
    hugetlbfs_mount
    setup_modules
    if ((${#TO_BIND[@]} == 0)); then
        info "no NVMe controllers to bind"
    fi
    for b in "${TO_BIND[@]}"; do
        drv=$(driver_of "$b")
        if [[ $drv == vfio-pci ]]; then
            info "$b: already bound to vfio-pci"
        else
            record "driver $b" "${drv:-none}"
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
    if [[ -n $TARGET_USER ]]; then
        # A user other than root needs the container node too (normally mode 0666).
        u=$DEV_ROOT/vfio/vfio
        if [[ -e $u ]]; then
            local mode
            mode=$(stat -c %a "$u" 2>/dev/null || echo '?')
            if [[ $mode != 666 ]]; then
                warn "$u has mode $mode: $TARGET_USER needs to read and write it (normally 0666)"
            fi
        fi
        memlock_advice
    fi
    if ((failed)); then
        exit "$EXIT_FAIL"
    fi
}

# restore_driver BDF DRIVER: from vfio-pci (or no driver) back to DRIVER (none: none).
restore_driver() {
    local b=$1 want=$2 d drv
    d=$(pci_dir "$b")
    drv=$(driver_of "$b")
    if [[ $want != none && ! -d $SYSFS_ROOT/bus/pci/drivers/$want ]]; then
        if ! modprobe "$want"; then
            printf '%s: error: %s: modprobe %s failed; left on %s\n' "$PROG" "$b" "$want" "${drv:-no driver}" >&2
            return 1
        fi
    fi
    if [[ $want == nvme || $want == none ]]; then
        # An empty override lets any driver (nvme) claim the device again.
        sysfs_write $'\n' "$d/driver_override"
    else
        sysfs_write "$want" "$d/driver_override"
    fi
    if [[ -n $drv ]]; then
        sysfs_write "$b" "$d/driver/unbind"
    fi
    if [[ $want != none ]]; then
        sysfs_write "$b" "$SYSFS_ROOT/bus/pci/drivers_probe"
    fi
    if [[ $want != nvme && $want != none ]]; then
        sysfs_write $'\n' "$d/driver_override"
    fi
    if ! wait_driver "$b" "$want"; then
        printf '%s: error: %s did not bind to %s within %s s (driver now: %s); see dmesg\n' \
            "$PROG" "$b" "$want" "$BIND_WAIT_S" "$(driver_of "$b" || true)" >&2
        return 1
    fi
    info "$b: bound to ${want/#none/no driver} (was ${drv:-no driver})"
}

RESET_BDFS=()
RESET_TO=()
# plan_reset: what reset will do, with every refusal before the first action.
plan_reset() {
    local b drv want group node users failed=0
    require_sysfs
    select_targets
    load_state
    RESET_BDFS=() RESET_TO=()
    for b in "${TARGETS[@]}"; do
        drv=$(driver_of "$b")
        want=$(state_get "driver $b") || want=nvme
        if [[ $drv == "$want" || ($want == none && -z $drv) ]]; then
            info "$b: already bound to ${drv:-no driver}"
            forget "driver $b"
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
        RESET_BDFS+=("$b")
        RESET_TO+=("$want")
    done
    if ((failed)); then
        die "nothing was changed"
    fi
}

# restore_machine: the pool, mount, noiommu mode and modules config recorded.
restore_machine() {
    local r key val failed=0 nr got bound m
    for r in "${STATE[@]}"; do
        case $r in
        driver\ *)
            key=${r% *}
            if [[ ! -e $(pci_dir "${key#driver }") ]]; then
                info "${key#driver }: gone from the PCI bus; its record (driver ${r##* }) is dropped"
                forget "$key"
            fi
            ;;
        hugepages\ *)
            key=${r% *} val=${r##* }
            nr=$SYSFS_ROOT/kernel/mm/hugepages/hugepages-${key#hugepages }kB/nr_hugepages
            if printf '%s' "$val" >"$nr" 2>/dev/null; then
                got=$(read_file "$nr" || echo unknown)
                if [[ $got == "$val" ]]; then
                    info "hugepages: ${key#hugepages } kB pool back to $val"
                else
                    warn "hugepages: asked to put the ${key#hugepages } kB pool back to $val, it holds $got (pages still in use stay until freed)"
                fi
                forget "$key"
            else
                printf '%s: error: cannot write %s to %s\n' "$PROG" "$val" "$nr" >&2
                failed=1
            fi
            ;;
        mount\ *)
            val=${r#mount }
            if umount "$val"; then
                info "unmounted hugetlbfs at $val"
                forget mount
                if [[ $(state_get mkdir || true) == "$val" ]]; then
                    rmdir "$val" 2>/dev/null || warn "$val is not empty; left in place"
                    forget mkdir
                fi
            else
                printf '%s: error: cannot unmount %s (in use?); left mounted\n' "$PROG" "$val" >&2
                failed=1
            fi
            ;;
        esac
    done
    if val=$(state_get noiommu); then
        m=$SYSFS_ROOT/module/vfio/parameters/enable_unsafe_noiommu_mode
        if [[ ! -e $m ]] || printf '%s' "$val" >"$m" 2>/dev/null; then
            forget noiommu
        else
            printf '%s: error: cannot write %s to %s\n' "$PROG" "$val" "$m" >&2
            failed=1
        fi
    fi
    # Modules, last loaded first, once no device uses vfio-pci any more.
    bound=("$SYSFS_ROOT"/bus/pci/drivers/vfio-pci/[0-9a-f]*:*)
    for m in vfio_iommu_type1 vfio-pci vfio; do
        state_get "module $m" >/dev/null || continue
        if ((${#bound[@]})); then
            info "left $m loaded: devices are still bound to vfio-pci"
            continue
        fi
        if modprobe -r "$m"; then
            info "unloaded $m"
            forget "module $m"
        else
            printf '%s: error: modprobe -r %s failed; left loaded\n' "$PROG" "$m" >&2
            failed=1
        fi
    done
    return "$failed"
}

cmd_reset() {
    local i failed=0
    require_root reset
    plan_reset
    for i in "${!RESET_BDFS[@]}"; do
        if restore_driver "${RESET_BDFS[i]}" "${RESET_TO[i]}"; then
            forget "driver ${RESET_BDFS[i]}"
        else
            failed=1
        fi
    done
    if ((${#ALLOWED[@]} || ${#BLOCKED[@]})); then
        if state_get hugepages >/dev/null || state_get mount >/dev/null || state_get module >/dev/null; then
            info "hugepages, hugetlbfs and modules config changed stay until a reset without PCI_ALLOWED and PCI_BLOCKED"
        fi
    elif ((failed == 0)); then
        restore_machine || failed=1
    fi
    if ((failed)); then
        exit "$EXIT_FAIL"
    fi
}

main() {
    local cmd=${1:-config}
    if (($# > 1)); then
        usage >&2
        usage_error "one subcommand at most, got: $*"
    fi
    case $cmd in
    config | reset | status) ;;
    help | -h | --help)
        usage
        return 0
        ;;
    *)
        usage >&2
        usage_error "unknown subcommand '$cmd'"
        ;;
    esac
    check_settings
    case $cmd in
    config) cmd_config ;;
    reset) cmd_reset ;;
    status) cmd_status ;;
    esac
}

SYSFS_ROOT=${SYSFS_ROOT:-/sys}
PROC_ROOT=${PROC_ROOT:-/proc}
DEV_ROOT=${DEV_ROOT:-/dev}
STATE_DIR=${STATE_DIR:-/run/kestrel}
PCI_ALLOWED=${PCI_ALLOWED:-}
PCI_BLOCKED=${PCI_BLOCKED:-}
HUGEMEM=${HUGEMEM:-2048}
HUGEPGSZ=${HUGEPGSZ:-2048}
TARGET_USER=${TARGET_USER:-}
NOIOMMU=${NOIOMMU:-0}
DRIVER_OVERRIDE=${DRIVER_OVERRIDE:-}
BIND_WAIT_S=${BIND_WAIT_S:-5}
NVME_CLASS=$((0x010802))

main "$@"
