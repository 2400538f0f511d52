#!/bin/bash
# shellcheck disable=SC2317 # the helpers are called from the eval'd list
# Runs inside the guest of scripts/vm-bench.sh: every command of the list
# file $1 (one a line; blank lines and lines starting with # are skipped),
# one after the other in this bash (so what one sets, the next sees), with
# two helpers:
#
#   bind_kernel   give the controller to the kernel's nvme driver and set
#                 $NVME_BLK to its first namespace (e.g. /dev/nvme0n1)
#   bind_vfio     give it back to vfio-pci (as it is when the list starts)
#
# The binding persists from one command to the next. Prints a header per
# command and a closing table (status, time, the first IOPS figure the
# command printed); exits with the number of failed commands.
set -u
list=${1:?usage: guest-bench.sh COMMAND-LIST}
sysdev=/sys/bus/pci/devices/${BDF:?}

driver_of() {
    if [ -e "$sysdev/driver" ]; then basename "$(readlink "$sysdev/driver")"; else echo none; fi
}

rebind() {
    local want=$1
    if [ "$want" = vfio-pci ]; then
        echo vfio-pci >"$sysdev/driver_override"
    else
        # An empty line clears the override, so drivers_probe picks nvme.
        echo >"$sysdev/driver_override"
    fi
    [ -e "$sysdev/driver" ] && echo "$BDF" >"$sysdev/driver/unbind"
    echo "$BDF" >/sys/bus/pci/drivers_probe
    [ "$(driver_of)" = "$want" ] || {
        echo "guest-bench: $BDF is bound to $(driver_of), not $want" >&2
        return 1
    }
}

bind_vfio() { rebind vfio-pci; }

bind_kernel() {
    local i ns
    rebind nvme || return 1
    # The namespace's block device shows up after the controller's bring-up.
    for i in $(seq 100); do
        for ns in "$sysdev"/nvme/nvme*/nvme*n1; do
            if [ -e "$ns" ] && [ -b "/dev/${ns##*/}" ]; then
                NVME_BLK=/dev/${ns##*/}
                echo "guest-bench: $BDF on nvme, namespace $NVME_BLK (after $((i - 1)) waits)"
                return 0
            fi
        done
        sleep 0.1
    done
    echo "guest-bench: no namespace block device for $BDF after 10 s" >&2
    return 1
}

NVME_BLK=
export NVME_BLK
n=0
failed=0
summary=()
while IFS= read -r line || [ -n "$line" ]; do
    case $line in "" | "#"*) continue ;; esac
    n=$((n + 1))
    echo "=== vm-bench command $n: $line"
    start=$EPOCHREALTIME
    # Not a subshell (the output goes through a process substitution, not a
    # pipe): bind_kernel's NVME_BLK and the binding carry over.
    eval "$line" </dev/null > >(tee "/tmp/bench-$n.out") 2>&1
    rc=$?
    end=$EPOCHREALTIME
    wait "$!" 2>/dev/null
    # The first IOPS figure the command printed (fio: "IOPS=22.4k").
    iops=$(grep -oiE 'iops[=: ]+[0-9.]+[kKmM]?' "/tmp/bench-$n.out" | head -n 1 | grep -oE '[0-9.]+[kKmM]?$')
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    echo "=== vm-bench command $n: status $rc in ${secs}s"
    [ "$rc" = 0 ] || failed=$((failed + 1))
    summary+=("$(printf '%3d  %6s  %8ss  %7s  %s' "$n" "$rc" "$secs" "${iops:--}" "$line")")
done <"$list"

echo "=== vm-bench summary (driver now $(driver_of))"
printf '%3s  %6s  %9s  %7s  %s\n' "#" status time IOPS command
printf '%s\n' "${summary[@]}"
echo "vm-bench: $n commands, $failed failed"
[ "$failed" -le 100 ] || failed=100
exit "$failed"
