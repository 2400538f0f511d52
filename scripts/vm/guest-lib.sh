# shellcheck shell=bash
# Guest side of the NVMe/TCP runs (scripts/vm/guest-nvmf.sh and
# scripts/vm/guest-nvmf-bench.sh): the steps both take with the guest
# kernel's initiator and `kestrel serve`. Sourced, not run; the payload
# carries scripts/ into the guest at /kestrel/scripts. The host side is
# scripts/vm/lib.sh.

# Writes the connect options $1 (e.g. "transport=tcp,traddr=...,nqn=...") to
# /dev/nvme-fabrics; prints the new controller's instance number.
fabrics_connect() {
    local opts=$1 line
    exec 3<>/dev/nvme-fabrics || return 1
    if ! printf '%s' "$opts" >&3; then
        exec 3>&-
        return 1
    fi
    IFS= read -r line <&3
    exec 3>&-
    line=${line#instance=}
    echo "${line%%,*}"
}

# The block device of subsystem $1's namespace 1 (waits up to 20 s).
block_of() {
    local nqn=$1 b
    for _ in $(seq 200); do
        for b in /sys/block/nvme*n1; do
            [ -e "$b" ] || continue
            if [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$nqn" ] && [ -b "/dev/${b##*/}" ]; then
                echo "/dev/${b##*/}"
                return 0
            fi
        done
        sleep 0.1
    done
    return 1
}

# Waits up to 60 s for `kestrel serve` (pid $1, output in $2) to say it is
# listening. Returns 0 when it does, 1 when the process exited first, 2 when
# it is still not listening.
serve_wait_listening() {
    local pid=$1 log=$2
    for _ in $(seq 600); do
        grep -q '^kestrel serve: listening' "$log" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    grep -q '^kestrel serve: listening' "$log" && return 0
    return 2
}
