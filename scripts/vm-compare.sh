#!/usr/bin/env bash
# The in-VM comparison of docs/perf.md, in one run and one table: on QEMU's
# NVMe (null-co backend, so the device model and not a disk is timed),
# 4 KiB random reads on one guest CPU through
#
#   - kestrel perf, the controller through VFIO, busy polling at QD 1, 32
#     and 128, and with --poll-mode hybrid at QD 1 and 32;
#   - fio with Kestrel's ioengine (fio-engine/), same device, QD 32, with
#     fio's default batching and with batches of 32;
#   - fio with io_uring on the guest kernel's nvme driver, polled
#     (--hipri, poll queues) at QD 1, 32 and 128, and at QD 32 and 128 with
#     batches of the queue depth (the kernel's best path per core), and
#     interrupt-driven at QD 32 with the same two batchings as the engine;
#
# in IOMMU and noiommu mode. One guest per mode runs ROUNDS rounds, each
# round every row once in turn, so that the host's drift hits all rows
# alike. Prints, per mode, each row's median IOPS, mean latency and CPU
# over the rounds, then the ratios the issues ask about, taken within each
# round, as median, min and max over the rounds: hybrid against busy
# polling (issue 18's goal: within 10 % at QD 32), Kestrel against the
# kernel's polled io_uring per core (issue 16's: at least 1.5x at QD 32
# and 128) and its QD 1 latency, the engine against io_uring, same job. The
# host's load average at start and end is printed with them.
# Not a pass/fail test: the guest runs under TCG on a shared host, so the
# absolute figures mean little and only ratios within one run compare.
#
# Usage: scripts/vm-compare.sh [--mode iommu|noiommu|both] [--seconds S]
#                              [--rounds N] [--rows NAME,...]
#   --mode     as in scripts/vm-test.sh (default both)
#   --seconds  length of each run (default 10)
#   --rounds   rounds of every row per guest (default 1)
#   --rows     only these rows (names as in the rows list below, e.g.
#              perf-qd32,hybrid-qd32: more rounds of one comparison in the
#              same time); the ratios between rows not run are left out
# Exit status: 0 when every mode ran every row in every round, 2 for a
# usage error, else 1 (a row with no successful round prints "-"). Guest output:
# $KESTREL_VM_CACHE/logs/compare-<mode>.txt.
set -euo pipefail

# shellcheck source=scripts/vm/lib.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/vm/lib.sh"

mode=both secs=10 rounds=1 only=
while (($#)); do
    case $1 in
    --mode) mode=${2:?--mode needs iommu, noiommu or both} && shift 2 ;;
    --seconds) secs=${2:?--seconds needs a number} && shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a number} && shift 2 ;;
    --rows) only=${2:?--rows needs a comma-separated list of row names} && shift 2 ;;
    -h | --help) vm_usage 0 ;;
    *)
        vm_log "unknown argument: $1 (see --help)"
        exit 2
        ;;
    esac
done
usage_error() {
    vm_log "$* (see --help)"
    exit 2
}
vm_modes_of "$mode" || usage_error "--mode must be iommu, noiommu or both, not '$mode'"
modes=("${VM_MODES[@]}")
[[ $secs =~ ^[1-9][0-9]{0,3}$ ]] || usage_error "--seconds takes a whole number of seconds (1..9999), not '$secs'"
[[ $rounds =~ ^[1-9][0-9]{0,2}$ ]] || usage_error "--rounds takes a whole number (1..999), not '$rounds'"

# The rows: "NAME|what it is|command", in the order a round runs them (busy
# and hybrid side by side, so drift within a round hits both alike). Each
# command is prefixed with ": row=NAME@ROUND;" (a no-op) so its output can be
# found again in the log.
fio_common="--thread --rw=randread --bs=4k --norandommap --runtime=$secs --time_based --cpus_allowed=0"
batched="--iodepth_batch_submit=32 --iodepth_batch_complete_max=32"
uring="--filename=\$NVME_BLK --direct=1 --ioengine=io_uring --fixedbufs --registerfiles"
engine="--ioengine=external:\$KESTREL_FIO_ENGINE --kestrel_target=pci:\$BDF \$FIO_NOIOMMU"
perf="\$KESTREL_PAYLOAD perf --target pci:\$BDF \$PERF_NOIOMMU -c 0 -o 4k -w randread -t $secs"
rows=(
    "perf-qd1|kestrel perf, QD 1|$perf -q 1"
    "hybrid-qd1|kestrel perf --poll-mode hybrid, QD 1|$perf --poll-mode hybrid -q 1"
    "perf-qd32|kestrel perf, QD 32|$perf -q 32"
    "hybrid-qd32|kestrel perf --poll-mode hybrid, QD 32|$perf --poll-mode hybrid -q 32"
    "perf-qd128|kestrel perf, QD 128|$perf -q 128"
    "engine-qd32|fio, Kestrel engine, QD 32|fio --name=kestrel $fio_common $engine --iodepth=32"
    "engine-qd32-b|fio, Kestrel engine, QD 32, batched|fio --name=kestrel-batched $fio_common $engine --iodepth=32 $batched"
    "bind|-|bind_kernel"
    "hipri-qd1|fio io_uring polled (--hipri), QD 1|fio --name=uring-hipri $fio_common $uring --hipri --iodepth=1"
    "hipri-qd32|fio io_uring polled (--hipri), QD 32|fio --name=uring-hipri $fio_common $uring --hipri --iodepth=32"
    "hipri-qd128|fio io_uring polled (--hipri), QD 128|fio --name=uring-hipri $fio_common $uring --hipri --iodepth=128"
    "hipri-qd32-b|fio io_uring polled (--hipri), QD 32, batched|fio --name=uring-hipri-batched $fio_common $uring --hipri --iodepth=32 $batched"
    "hipri-qd128-b|fio io_uring polled (--hipri), QD 128, batched|fio --name=uring-hipri-batched $fio_common $uring --hipri --iodepth=128 --iodepth_batch_submit=128 --iodepth_batch_complete_max=128"
    "uring-qd32|fio io_uring, QD 32|fio --name=uring $fio_common $uring --iodepth=32"
    "uring-qd32-b|fio io_uring, QD 32, batched|fio --name=uring-batched $fio_common $uring --iodepth=32 $batched"
    "unbind|-|bind_vfio"
)
# --rows: keep the rows asked for (and the kernel binding around the io_uring
# rows when one of them is asked for); an unknown name is a usage error.
if [[ -n $only ]]; then
    declare -A want=()
    IFS=, read -ra asked <<<"$only"
    for a in "${asked[@]}"; do
        found=0
        for r in "${rows[@]}"; do
            [[ ${r%%|*} == "$a" && $a != bind && $a != unbind ]] && found=1
        done
        if ((!found)); then
            names=()
            for r in "${rows[@]}"; do [[ ${r%%|*} == bind || ${r%%|*} == unbind ]] || names+=("${r%%|*}"); done
            usage_error "--rows: no row named '$a' (rows: ${names[*]})"
        fi
        want[$a]=1
    done
    kernel=0
    for a in "${!want[@]}"; do [[ $a == hipri-* || $a == uring-* ]] && kernel=1; done
    if ((kernel)); then want[bind]=1 want[unbind]=1; fi
    kept=()
    for r in "${rows[@]}"; do [[ -n ${want[${r%%|*}]:-} ]] && kept+=("$r"); done
    rows=("${kept[@]}")
fi
has_row() {
    local r
    for r in "${rows[@]}"; do [[ ${r%%|*} == "$1" ]] && return 0; done
    return 1
}

# The ratios: "A B GOAL what", IOPS of row A over row B within one round
# (GOAL "-" when the issues set none).
ratios=(
    "hybrid-qd1 perf-qd1 - kestrel perf hybrid / busy, QD 1"
    "hybrid-qd32 perf-qd32 >=0.90 kestrel perf hybrid / busy, QD 32"
    "perf-qd1 hipri-qd1 - kestrel perf / io_uring polled, QD 1"
    "perf-qd32 hipri-qd32 >=1.5 kestrel perf / io_uring polled, QD 32"
    "perf-qd128 hipri-qd128 >=1.5 kestrel perf / io_uring polled, QD 128"
    "perf-qd32 hipri-qd32-b >=1.5 kestrel perf / io_uring polled batched, QD 32"
    "perf-qd128 hipri-qd128-b >=1.5 kestrel perf / io_uring polled batched, QD 128"
    "engine-qd32 uring-qd32 - fio Kestrel engine / fio io_uring, QD 32"
    "engine-qd32-b uring-qd32-b - fio Kestrel engine / fio io_uring, QD 32 batched"
)

# vm-bench.sh takes the cache lock for each guest.
vm_log "building the fio engine and the static kestrel app"
(cd "$VM_REPO" && cargo build --release -q -p kestrel-fio) ||
    vm_die "cannot build the fio engine (scripts/fio-test.sh setup installs what it needs)"
target_dir=$(cd "$VM_REPO" && cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
engine_so=$target_dir/release/libkestrel_fio.so
[[ -r $engine_so ]] || vm_die "no fio engine at $engine_so"
vm_build_static kestrel-app kestrel
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The guest has a /kestrel directory: the payload goes in under another name.
cp "$VM_BUILT" "$work/kestrel-perf"

{
    echo '# generated by scripts/vm-compare.sh'
    # shellcheck disable=SC2016 # expanded in the guest
    echo 'if [ "${KESTREL_NOIOMMU:-0}" = 1 ]; then FIO_NOIOMMU=--kestrel_noiommu=1 PERF_NOIOMMU=--noiommu; else FIO_NOIOMMU=--kestrel_noiommu=0 PERF_NOIOMMU=; fi'
    for ((round = 1; round <= rounds; round++)); do
        for r in "${rows[@]}"; do
            echo ": row=${r%%|*}@$round; ${r##*|}"
        done
    done
    # Where the guest takes the queue's MSI-X interrupt while a hybrid poller runs on
    # CPU 0 (the vector is steered to the poller's CPU): the line of vector 1
    # (its only I/O queue) in /proc/interrupts twice, 3 s apart, the growing
    # count showing the CPU. It waits for perf alone: a bare `wait` would also
    # wait for the guest runner's output process substitution, which never ends.
    echo ": irq-placement; ${perf//-t $secs/-t 20} --poll-mode hybrid -q 32 >/dev/null 2>&1 & p=\$!; sleep 10; grep -F \"vfio-msix[1](\" /proc/interrupts; sleep 3; grep -F \"vfio-msix[1](\" /proc/interrupts; wait \$p"
} >"$work/compare.cmds"

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(loadavg)
vm_log "host: $(nproc) CPUs, load average $load_start"
# One guest per mode: boot, then every row of every round at $secs plus fio's
# start-up under TCG.
export KESTREL_VM_TIMEOUT=${KESTREL_VM_TIMEOUT:-$((300 + rounds * ${#rows[@]} * (secs + 30)))}
rc=0
mkdir -p "$VM_CACHE/logs"
for m in "${modes[@]}"; do
    vm_log "mode $m: $rounds round(s) of ${#rows[@]} rows of $secs s"
    if ! "$VM_REPO/scripts/vm-bench.sh" --mode "$m" --binary "$work/kestrel-perf" \
        --fio-engine "$engine_so" --cmds "$work/compare.cmds" >"$work/run-$m.log" 2>&1; then
        vm_log "mode $m: the run reported failures: $(tail -n 3 "$work/run-$m.log" | tr '\n' ' ')"
        rc=1
    fi
    # The guest's output, from this run's own copy of its console (the
    # cache's output-<mode>.txt may already be another run's).
    sed -n "s/^\[guest-$m\] //p" "$work/run-$m.log" >"$VM_CACHE/logs/compare-$m.txt"
done
load_end=$(loadavg)

# Prints "NAME ROUND IOPS LAT_US CPU_PCT" for every row found in guest output
# $1: fio's "IOPS=12.3k", "lat (usec): ... avg=..." (not clat/slat) and
# "cpu : usr=X%, sys=Y%"; kestrel perf's "Total IOPS MiB/s Average ..." line
# and its poller's "CPU N %". A figure not found, or a command that failed,
# prints "-".
parse() {
    awk '
    function num(v,  m) {
        m = 1
        if (v ~ /[kK]$/) m = 1e3
        else if (v ~ /[mM]$/) m = 1e6
        sub(/[kKmM]$/, "", v)
        return v * m
    }
    function reset(k) { iops[k] = "-"; lat[k] = "-"; cpu[k] = "-" }
    /^=== vm-bench command [0-9]+: : row=/ {
        key = $6; sub(/^row=/, "", key); sub(/;$/, "", key); sub(/@/, " ", key)
        reset(key); order[++n] = key; next
    }
    /^=== vm-bench command [0-9]+: status/ { if (key != "" && $6 != "0") reset(key); key = ""; next }
    key == "" { next }
    iops[key] == "-" && match($0, /IOPS=[0-9.]+[kKmM]?/) {
        iops[key] = sprintf("%.0f", num(substr($0, RSTART + 5, RLENGTH - 5)))
    }
    lat[key] == "-" && $0 ~ /^[ \t]+lat \((nsec|usec|msec)\):/ && match($0, /avg=[0-9.]+/) {
        v = substr($0, RSTART + 4, RLENGTH - 4)
        if ($0 ~ /nsec/) v /= 1000; else if ($0 ~ /msec/) v *= 1000
        lat[key] = sprintf("%.1f", v)
    }
    cpu[key] == "-" && $1 == "cpu" && $2 == ":" && match($0, /usr=[0-9.]+%, sys=[0-9.]+/) {
        split(substr($0, RSTART, RLENGTH), f, /[=%, ]+/)
        cpu[key] = sprintf("%.0f", f[2] + f[4])
    }
    iops[key] == "-" && $1 == "Total" && NF >= 6 && $2 ~ /^[0-9.]+$/ {
        iops[key] = sprintf("%.0f", $2); lat[key] = sprintf("%.1f", $4)
    }
    cpu[key] == "-" && $1 == "core" && match($0, /CPU [0-9.]+ %/) {
        cpu[key] = sprintf("%.0f", substr($0, RSTART + 4, RLENGTH - 6))
    }
    END { for (i = 1; i <= n; i++) print order[i], iops[order[i]], lat[order[i]], cpu[order[i]] }
    ' "$1"
}

# IOPS, LAT and CPU of "MODE/NAME/ROUND".
declare -A IOPS LAT CPU
# shellcheck disable=SC2034 # LAT and CPU are read through over_rounds' nameref
for m in "${modes[@]}"; do
    f=$VM_CACHE/logs/compare-$m.txt
    [[ -f $f ]] || continue
    while read -r name round i l c; do
        IOPS[$m/$name/$round]=$i
        LAT[$m/$name/$round]=$l
        CPU[$m/$name/$round]=$c
    done < <(parse "$f")
done

# "MEDIAN MIN MAX COUNT" of the numbers among the lines of stdin ("-"
# skipped), or "- - - 0".
stats() {
    { grep -E '^[0-9.]+$' || true; } | sort -g |
        awk '{ v[++n] = $1 }
        END {
            if (n == 0) { print "- - - 0"; exit }
            med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
            printf "%.10g %.10g %.10g %d\n", med, v[1], v[n], n
        }'
}
# Figures of array $1 for row $3 of mode $2 over the rounds.
over_rounds() {
    local -n arr=$1
    local k out=()
    for ((k = 1; k <= rounds; k++)); do
        out+=("${arr[$2/$3/$k]:--}")
    done
    printf '%s\n' "${out[@]}"
}
# The per-round ratios of IOPS of row $2 over row $3 in mode $1.
round_ratios() {
    local k a b
    for ((k = 1; k <= rounds; k++)); do
        a=${IOPS[$1/$2/$k]:--} b=${IOPS[$1/$3/$k]:--}
        if [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ ]] && ((b > 0)); then
            awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f\n", a / b }'
        else
            echo -
        fi
    done
}
fmt() { # number $1 with $2 decimals, or "-"
    if [[ $1 == - ]]; then echo -; else awk -v v="$1" -v d="$2" 'BEGIN { printf "%.*f", d, v }'; fi
}

echo
echo "vm-compare: 4 KiB random reads, $secs s per row, $rounds round(s) per mode in one guest each," \
    "one guest CPU, QEMU NVMe (null-co) under TCG; host: $(nproc) CPUs, load average $load_start at start, $load_end at end"
if ((rounds > 1)); then
    echo "Each figure is the median over the rounds; a cell with fewer rounds than $rounds says how many (\"n=K\")."
fi
echo
header="| row |"
rule="|---|"
for m in "${modes[@]}"; do
    header+=" $m IOPS | $m mean latency (us) | $m CPU % |"
    rule+="---:|---:|---:|"
done
echo "$header"
echo "$rule"
for r in "${rows[@]}"; do
    name=${r%%|*} rest=${r#*|}
    what=${rest%%|*}
    [[ $what == - ]] && continue
    line="| $what |"
    for m in "${modes[@]}"; do
        read -r med _ _ n < <(over_rounds IOPS "$m" "$name" | stats)
        cell=$(fmt "$med" 0)
        ((n > 0 && n < rounds)) && cell+=" (n=$n)"
        ((n < rounds)) && rc=1
        read -r lmed _ < <(over_rounds LAT "$m" "$name" | stats)
        read -r cmed _ < <(over_rounds CPU "$m" "$name" | stats)
        line+=" $cell | $(fmt "$lmed" 1) | $(fmt "$cmed" 0) |"
    done
    echo "$line"
done

echo
header="| ratio of IOPS, within a round | goal |"
rule="|---|---|"
for m in "${modes[@]}"; do
    if ((rounds > 1)); then
        header+=" $m median | $m min | $m max |"
        rule+="---:|---:|---:|"
    else
        header+=" $m |"
        rule+="---:|"
    fi
done
echo "$header"
echo "$rule"
for ratio in "${ratios[@]}"; do
    read -r a b goal what <<<"$ratio"
    if ! has_row "$a" || ! has_row "$b"; then continue; fi
    line="| $what | ${goal/>=/≥ } |"
    for m in "${modes[@]}"; do
        read -r med lo hi n < <(round_ratios "$m" "$a" "$b" | stats)
        line+=" $(fmt "$med" 2)"
        ((n > 0 && n < rounds)) && line+=" (n=$n)"
        line+=" |"
        ((rounds > 1)) && line+=" $(fmt "$lo" 2) | $(fmt "$hi" 2) |"
    done
    echo "$line"
done
# QD 1 latency: the two medians side by side (issue 16 asks for both).
if has_row perf-qd1 && has_row hipri-qd1; then
    line="| QD 1 mean latency (us), kestrel perf busy vs io_uring polled (medians) | - |"
    for m in "${modes[@]}"; do
        read -r kl _ < <(over_rounds LAT "$m" perf-qd1 | stats)
        read -r ul _ < <(over_rounds LAT "$m" hipri-qd1 | stats)
        line+=" $(fmt "$kl" 1) vs $(fmt "$ul" 1) |"
        ((rounds > 1)) && line+=" | |"
    done
    echo "$line"
fi

if ((rounds > 1)); then
    echo
    echo "IOPS per round:"
    echo
    for m in "${modes[@]}"; do
        echo "| $m |$(for ((k = 1; k <= rounds; k++)); do printf ' round %d |' "$k"; done)"
        echo "|---|$(for ((k = 1; k <= rounds; k++)); do printf -- '---:|'; done)"
        for r in "${rows[@]}"; do
            name=${r%%|*} rest=${r#*|}
            what=${rest%%|*}
            [[ $what == - ]] && continue
            echo "| $what |$(over_rounds IOPS "$m" "$name" | sed 's/^/ /; s/$/ |/' | tr -d '\n')"
        done
        echo
    done
fi
exit "$rc"
