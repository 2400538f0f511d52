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

# Binds PCI device $BDF to driver $1 (vfio-pci or nvme); true when it is bound
# to it afterwards.
bind_driver() {
    local sysdev=/sys/bus/pci/devices/${BDF:?}
    if [ -e "$sysdev/driver" ]; then
        [ "$(basename "$(readlink "$sysdev/driver")")" = "$1" ] && return 0
        echo "$BDF" >"$sysdev/driver/unbind"
    fi
    if [ "$1" = nvme ]; then
        echo >"$sysdev/driver_override"
    else
        echo "$1" >"$sysdev/driver_override"
    fi
    echo "$BDF" >/sys/bus/pci/drivers_probe
    [ "$(basename "$(readlink "$sysdev/driver" 2>/dev/null)")" = "$1" ]
}

# The block device of namespace 1 of PCI controller $BDF on the kernel's nvme
# driver (waits up to 10 s).
local_block() {
    local ns
    for _ in $(seq 100); do
        for ns in /sys/bus/pci/devices/"${BDF:?}"/nvme/nvme*/nvme*n1; do
            [ -e "$ns" ] && [ -b "/dev/${ns##*/}" ] && echo "/dev/${ns##*/}" && return 0
        done
        sleep 0.1
    done
    return 1
}

# Exports block device or file $2 as namespace 1 of subsystem $1 through the
# kernel's nvmet, on TCP port $4 of 127.0.0.1 (nvmet port ID $3), open to any
# host, configured through configfs. A regular file is served with buffered
# I/O (tmpfs has no O_DIRECT). Creates what is missing; the namespace is
# enabled again with $2.
nvmet_export() {
    local nqn=$1 dev=$2 pid=$3 svc=$4 T=/sys/kernel/config/nvmet s p
    s=$T/subsystems/$nqn p=$T/ports/$pid
    grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config || return 1
    [ -d "$T" ] || modprobe nvmet || return 1
    if [ ! -d "$s" ]; then
        mkdir "$s" && echo 1 >"$s/attr_allow_any_host" && mkdir "$s/namespaces/1" || return 1
    fi
    if [ ! -d "$p" ]; then
        mkdir "$p" && echo ipv4 >"$p/addr_adrfam" && echo tcp >"$p/addr_trtype" &&
            echo 127.0.0.1 >"$p/addr_traddr" && echo "$svc" >"$p/addr_trsvcid" || return 1
    fi
    [ -e "$p/subsystems/$nqn" ] || ln -s "$s" "$p/subsystems/$nqn" || return 1
    echo 0 >"$s/namespaces/1/enable"
    echo -n "$dev" >"$s/namespaces/1/device_path" || return 1
    [ -f "$dev" ] && echo 1 >"$s/namespaces/1/buffered_io"
    echo 1 >"$s/namespaces/1/enable"
}
