#!/usr/bin/env bash
# A Slurm cluster of real nodes on this one machine, for the tests of everything that crosses a node boundary.
# Each compute node (node01 ... nodeNN) is a network namespace on a Linux bridge with its own address, plus UTS,
# IPC and mount namespaces: its own hostname, boot id, System V IPC, /tmp, node-local scratch ($SCRATCH) and
# /dev/shm, its own hosts file and resolv.conf (bind-mounted on /etc) and its own slurmd.  /tmp and the scratch
# are directories on this machine's disk ($DIR/NODE/tmp, $DIR/NODE/scratch: node-local disks, not memory, so that
# a staged environment of gigabytes costs no RAM), mounted inside the node only and emptied when it boots;
# /dev/shm is a tmpfs.  The nodes share the host's PID space and kernel.  The
# rest of the host's file system is the cluster's shared file system.  The head node is the host itself:
# slurmctld, slurmdbd and the loopback sshd of scripts/ci/slurm.sh and sshd.sh, which serve the namespace nodes
# beside the host's own node `head` (its partitions debug and long keep the host's /tmp, which the rest of the
# suite's temporary directories live in).  docs/testing.md says what this shows and what it cannot.
#
# Usage: cluster.sh start [--nodes N]      bring up N nodes (default 5, as scripts/test.sh, or $HPCTRAIN_CLUSTER_NODES), idempotent
#        cluster.sh stop                   remove every node, namespace, link, mount and the bridge
#        cluster.sh status | env           each node's state | shell exports for tests
#        cluster.sh link NODE rate RATE    limit the node's link both ways (tc htb; RATE as tc reads it: 200mbit)
#        cluster.sh link NODE cut|restore  take the link down | up again with no rate limit
#        cluster.sh node NODE kill         SIGKILL every process of the node (slurmd included): Slurm sees it
#                                          stop answering and marks it DOWN after SlurmdTimeout
#        cluster.sh node NODE start        boot it again if it was killed (a fresh /tmp and scratch, a new
#                                          slurmd); a node Slurm took for dead gets its slurmd restarted
#        cluster.sh tmp NODE full|restore  a full /tmp on the node (a 1 MiB tmpfs over it, filled) | its own again
#        cluster.sh exec NODE CMD...       run CMD on the node (its network, hostname and mounts)
#
# Each node's hosts file maps its own name to 127.0.1.1 before its bridge address, as Debian's installer
# writes /etc/hosts: code that takes "my hostname's address" as the address other nodes reach gets loopback,
# the classic first multi-node failure.  The other nodes and the head resolve to their bridge addresses.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${HPCTRAIN_CLUSTER_DIR:-/var/tmp/hpctrain-cluster}
export HPCTRAIN_CLUSTER_DIR=$DIR
BRIDGE=${HPCTRAIN_CLUSTER_BRIDGE:-hpctrainbr0}
NET=${HPCTRAIN_CLUSTER_NET:-10.251.0}           # a /24 of the private range; the head is .1, nodeK is .(10+K)
HEAD_ADDR=$NET.1
NODE_CPUS=${HPCTRAIN_CLUSTER_CPUS:-2}
NODE_MEMORY_MB=${HPCTRAIN_CLUSTER_MEMORY_MB:-2048}
SCRATCH=${HPCTRAIN_CLUSTER_SCRATCH:-/local/scratch}
SHM_MB=${HPCTRAIN_CLUSTER_SHM_MB:-512}          # a limit: memory is used only as files fill it
NETNS_PREFIX=hpctrain-
START_TIMEOUT=${HPCTRAIN_CLUSTER_START_TIMEOUT:-90}
NODES_FILE=$DIR/nodes                            # "NAME ADDRESS CPUS MEMORY_MB" per node: slurm.sh reads it

log() { echo "[cluster.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

node_name() { printf 'node%02d' "$1"; }
node_index() { [[ $1 =~ ^node0*([1-9][0-9]*)$ ]] && echo "${BASH_REMATCH[1]}"; }
node_addr() { echo "$NET.$(( 10 + $(node_index "$1") ))"; }
netns() { echo "$NETNS_PREFIX$1"; }
veth() { echo "v-$1"; }                          # the host's end of the node's link (IFNAMSIZ: 15 characters)
holder_pid_file() { echo "$DIR/$1/holder.pid"; }

slurm_env() { eval "$(bash "$HERE/slurm.sh" env)"; }

known_nodes() {  # the nodes of the running layout, one per line
    [[ -s $NODES_FILE ]] && cut -d' ' -f1 "$NODES_FILE" || true
}

require_node() {  # require_node NODE: a node of this cluster
    [[ -n $(node_index "$1") ]] && known_nodes | grep -qx -- "$1" \
        || die "no node '$1' in this cluster (nodes: $(known_nodes | tr '\n' ' ')); start it with 'cluster.sh start'"
}

holder_pid() {  # the pid holding the node's namespaces, if alive
    local f pid
    f=$(holder_pid_file "$1")
    [[ -s $f ]] || return 1
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null && [[ $(readlink "/proc/$pid/ns/net") == "$(readlink_netns "$1")" ]] && echo "$pid"
}

readlink_netns() {  # the namespace id of the node's network namespace, as /proc/PID/ns/net reads
    local f=/var/run/netns/$(netns "$1")
    [[ -e $f ]] || return 0
    echo "net:[$(stat -L -c %i "$f")]"
}

netns_pids() { ip netns pids "$(netns "$1")" 2>/dev/null || true; }

slurmd_pid() {
    local f pid
    slurm_env
    f=$HPCTRAIN_SLURM_DIR/slurmd-$1.pid
    [[ -s $f ]] || return 1
    pid=$(cat "$f")
    netns_pids "$1" | grep -qx "$pid" && echo "$pid"
}

slurm_state() { timeout 10 sinfo -h -N -n "$1" -o %t 2>/dev/null | head -n1 || true; }

# ------------------------------------------------------------------------------------------------ network
setup_bridge() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$HEAD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
}

setup_link() {  # setup_link NODE: its network namespace, veth pair and addresses
    local ns v addr
    ns=$(netns "$1"); v=$(veth "$1"); addr=$(node_addr "$1")
    [[ -e /var/run/netns/$ns ]] || ip netns add "$ns"
    if ! ip link show "$v" >/dev/null 2>&1; then
        ip link add "$v" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$v" master "$BRIDGE" up
    ip -n "$ns" addr replace "$addr/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route replace default via "$HEAD_ADDR" dev eth0
}

write_hosts() {  # write_hosts NODE NODES...: the node's /etc/hosts
    local self=$1 n
    shift
    mkdir -p "$DIR/$self"
    {
        echo "# written by hpctrain scripts/ci/cluster.sh for $self"
        echo "127.0.0.1 localhost"
        echo "127.0.1.1 $self"
        echo "$HEAD_ADDR $(hostname)"
        for n in "$@"; do echo "$(node_addr "$n") $n"; done
        echo "::1 localhost ip6-localhost ip6-loopback"
    } >"$DIR/$self/hosts.tmp"
    mv "$DIR/$self/hosts.tmp" "$DIR/$self/hosts"
    # A node already up has the file it booted with bound on its /etc/hosts: that inode, which the rename above
    # unlinked, not this name. Where its content differs (a start with more nodes than are running), the new
    # file is bound there in its place, or the running nodes could not resolve the added ones. (The kernel mounts
    # nothing over an unlinked file: the old binding goes first, for the instant between the two calls.)
    local pid
    if pid=$(holder_pid "$self") && ! cmp -s "$DIR/$self/hosts" "/proc/$pid/root/etc/hosts"; then
        nsenter -t "$pid" -m -- sh -c 'umount /etc/hosts && mount --bind "$1" /etc/hosts' - "$DIR/$self/hosts"
    fi
    # The host's name server is not reachable from the bridge: a name that is not in the hosts file would wait
    # for it for 20 s. Asking a closed port on the node's own loopback fails at once instead.
    printf '# written by hpctrain scripts/ci/cluster.sh: no DNS on the nodes, names come from /etc/hosts\n%s\n%s\n' \
        "nameserver 127.0.0.1" "options timeout:1 attempts:1" >"$DIR/$self/resolv.conf"
}

# ------------------------------------------------------------------------------------------------ nodes
boot_node() {  # boot_node NODE: the process that holds its hostname and mounts, then its slurmd
    local node=$1 pid ns f
    ns=$(netns "$node")
    f=$(holder_pid_file "$node")
    if ! pid=$(holder_pid "$node"); then
        rm -f "$f"
        [[ -d $SCRATCH ]] || { mkdir -p "$SCRATCH" && touch "$DIR/created-scratch"; }
        # A boot starts with empty local disks; the old contents (a staged environment: gigabytes) are deleted
        # in the background.
        discard "$DIR/$node/tmp" "$DIR/$node/scratch"
        mkdir -p "$DIR/$node/tmp" "$DIR/$node/scratch"
        chmod 1777 "$DIR/$node/tmp" "$DIR/$node/scratch"
        # The holder sets the node up inside fresh UTS, IPC and mount namespaces (propagation private: nothing
        # mounted here reaches the host), writes its pid and sleeps; fd 9 (our lock) is not inherited.  Its own
        # boot id: UCX (the MPICH wheel's transport) takes processes with one boot id and one PID space for one
        # machine and would pass messages between nodes through shared memory and process_vm_readv, past the
        # network that the link controls act on.
        setsid nsenter --net="/var/run/netns/$ns" unshare --uts --ipc --mount --propagation private \
            bash -c 'set -e
                hostname "$1"
                cat /proc/sys/kernel/random/uuid >"$2/boot_id"
                mount --bind "$2/boot_id" /proc/sys/kernel/random/boot_id
                mount --bind "$2/tmp" /tmp
                mount --bind "$2/scratch" "$3"
                mount -t tmpfs -o "size=${4}m,mode=1777" tmpfs /dev/shm
                mount --bind "$2/hosts" /etc/hosts
                mount --bind "$2/resolv.conf" /etc/resolv.conf
                echo $$ >"$2/holder.pid.tmp"
                mv "$2/holder.pid.tmp" "$2/holder.pid"
                exec sleep infinity' \
            holder "$node" "$DIR/$node" "$SCRATCH" "$SHM_MB" \
            </dev/null >>"$DIR/log/$node.holder.log" 2>&1 9>&- &
        for _ in $(seq 100); do
            pid=$(holder_pid "$node") && break
            sleep 0.1
        done
        [[ -n ${pid:-} ]] || { cat "$DIR/log/$node.holder.log" >&2; die "$node: its namespaces did not come up"; }
    fi
    local st
    st=$(slurm_state "$node")
    if [[ $st == down* || $st == *'*' ]] && slurmd_pid "$node" >/dev/null; then
        # Up, but Slurm took it for dead (a cut link): slurmctld pings a DOWN node rarely, while a slurmd
        # registers when it starts, and ReturnToService=2 then brings the node back.
        kill -TERM "$(slurmd_pid "$node")" 2>/dev/null || true
        for _ in $(seq 50); do slurmd_pid "$node" >/dev/null || break; sleep 0.1; done
    fi
    if ! slurmd_pid "$node" >/dev/null; then
        # slurmd forks into the background by itself; its pid, log and spool carry the node's name.
        nsenter -t "$pid" -n -u -m slurmd -N "$node" </dev/null >>"$DIR/log/$node.slurmd.stdout" 2>&1 9>&- \
            || die "$node: slurmd did not start; see $DIR/log/$node.slurmd.stdout and the slurmd log"
    fi
}

kill_node() {  # every process in the node's network namespace, then its holder; waits until none is left
    local node=$1 pids
    for _ in $(seq 50); do
        pids=$(netns_pids "$node")
        [[ -n $pids ]] || { rm -f "$(holder_pid_file "$node")"; return 0; }
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    die "$node: processes still alive after SIGKILL: $(netns_pids "$node" | tr '\n' ' ')"
}

stop_node() {  # slurmd gets SIGTERM first (it tells the controller), then everything left is killed
    local node=$1 pid
    if pid=$(slurmd_pid "$node"); then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    kill_node "$node"
}

wait_ready() {  # every node idle (or running jobs) in Slurm; nodes left down or drained by a test are resumed
    local node st pending t=$EPOCHREALTIME
    for _ in $(seq $(( START_TIMEOUT * 2 ))); do
        pending=()
        for node in "$@"; do
            st=$(slurm_state "$node")
            case $st in
                idle|mix|alloc|comp*) ;;
                down|drain*|drng|fail*)  # answering, but left down by an earlier kill or drained by a test
                    scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
                    pending+=("$node=$st") ;;
                *) pending+=("$node=${st:-?}") ;;
            esac
        done
        (( ${#pending[@]} == 0 )) && return 0
        sleep 0.5
    done
    die "nodes not ready after ${START_TIMEOUT} s: ${pending[*]} (see $HPCTRAIN_SLURM_DIR/log/slurmd-NODE.log)"
}

# ------------------------------------------------------------------------------------------------ commands
do_start() {
    local n=${HPCTRAIN_CLUSTER_NODES:-5}
    while (( $# )); do
        case $1 in
            --nodes) n=${2:-}; shift 2 || die "--nodes needs a number" ;;
            *) die "start: unknown argument '$1' (usage: cluster.sh start [--nodes N])" ;;
        esac
    done
    [[ $n =~ ^[0-9]+$ ]] && (( n >= 1 && n <= 99 )) || die "--nodes must be 1 ... 99, not '$n'"
    [[ $(id -u) == 0 ]] || die "needs root (network, UTS and mount namespaces)"
    local cmd
    for cmd in ip nsenter unshare tc slurmd sinfo; do
        command -v "$cmd" >/dev/null || die "'$cmd' not found: run 'bash scripts/install.sh' first"
    done
    local head
    head=$(hostname)
    [[ $head != localhost ]] && getent hosts "$head" >/dev/null \
        || die "this machine's hostname '$head' does not resolve here; the nodes reach slurmctld by it"
    mkdir -p "$DIR/log" "$DIR/shared"
    chmod 1777 "$DIR/shared"
    exec 9>"$DIR/lock"
    flock -w 120 9 || die "could not lock $DIR/lock"
    local t0=$EPOCHREALTIME names=() i node
    # What an interrupted background delete left behind goes now, in the background again.
    if compgen -G "$DIR/trash.*" >/dev/null; then setsid rm -rf "$DIR"/trash.* </dev/null >/dev/null 2>&1 9>&- & fi
    for (( i = 1; i <= n; i++ )); do names+=("$(node_name "$i")"); done
    # Nodes of an earlier, larger layout go first.
    for node in $(known_nodes); do
        [[ " ${names[*]} " == *" $node "* ]] || remove_node "$node"
    done
    setup_bridge
    for node in "${names[@]}"; do
        setup_link "$node"
        write_hosts "$node" "${names[@]}"
    done
    for node in "${names[@]}"; do
        echo "$node $(node_addr "$node") $NODE_CPUS $NODE_MEMORY_MB"
    done >"$NODES_FILE.tmp"
    mv "$NODES_FILE.tmp" "$NODES_FILE"
    local t_net=$EPOCHREALTIME
    bash "$HERE/slurm.sh" start 9>&-
    slurm_env
    local t_head=$EPOCHREALTIME
    for node in "${names[@]}"; do boot_node "$node"; done
    wait_ready "${names[@]}"
    log "started in $(elapsed "$t0") s (network $(awk -v a="$t0" -v b="$t_net" 'BEGIN{printf "%.1f", b-a}') s," \
        "head $(awk -v a="$t_net" -v b="$t_head" 'BEGIN{printf "%.1f", b-a}') s, nodes $(elapsed "$t_head") s):" \
        "${names[*]} idle in partition 'cluster' on $BRIDGE $NET.0/24, shared directory $DIR/shared"
}

remove_node() {  # a node's processes, namespace and link
    local node=$1 ns
    ns=$(netns "$node")
    stop_node "$node"
    ip link del "$(veth "$node")" 2>/dev/null || true
    [[ -e /var/run/netns/$ns ]] && ip netns del "$ns"
    discard "${DIR:?}/$node"
}

discard() {  # discard PATH...: moved aside at once, deleted in the background (a staged environment is thousands
    # of files: minutes on a busy disk, which neither a boot nor the end of a test run waits for)
    local trash
    trash=$(mktemp -d "$DIR/trash.XXXXXX")
    mv "$@" "$trash/" 2>/dev/null || true
    setsid rm -rf "$trash" </dev/null >/dev/null 2>&1 9>&- &
}

do_stop() {
    mkdir -p "$DIR"
    exec 9>"$DIR/lock"
    flock -w 120 9 || die "could not lock $DIR/lock"
    local node ns
    # Every namespace this script may have made, listed or not (a layout file lost with a crash).
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        [[ $ns == "$NETNS_PREFIX"node* ]] || continue
        node=${ns#"$NETNS_PREFIX"}
        remove_node "$node"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -f "$NODES_FILE"
    if [[ -e $DIR/created-scratch ]]; then
        rmdir "$SCRATCH" 2>/dev/null && rmdir "$(dirname "$SCRATCH")" 2>/dev/null || true
        rm -f "$DIR/created-scratch"
    fi
    log "stopped (namespaces, links, bridge and mounts removed; the head's Slurm lists the nodes until its" \
        "next start; logs kept in $DIR/log)"
}

do_status() {
    local rc=0 node pid st link rate
    if [[ ! -s $NODES_FILE ]]; then
        echo "no cluster (start it with: cluster.sh start)"
        return 1
    fi
    ip link show "$BRIDGE" >/dev/null 2>&1 && echo "bridge $BRIDGE: $HEAD_ADDR/24" || { echo "bridge $BRIDGE: missing"; rc=1; }
    for node in $(known_nodes); do
        link=$(cat "/sys/class/net/$(veth "$node")/operstate" 2>/dev/null || echo missing)
        rate=$(tc class show dev "$(veth "$node")" 2>/dev/null | grep -o 'rate [^ ]*' | head -n1 || true)
        st=$(slurm_state "$node")
        if pid=$(holder_pid "$node") && slurmd_pid "$node" >/dev/null; then
            echo "$node $(node_addr "$node"): up (holder $pid, slurmd $(slurmd_pid "$node")), link $link${rate:+ ($rate)}, slurm ${st:-?}"
        else
            echo "$node $(node_addr "$node"): down, link $link${rate:+ ($rate)}, slurm ${st:-?}"
            rc=1
        fi
        [[ $link == up ]] || rc=1
    done
    return $rc
}

do_env() {
    echo "export HPCTRAIN_CLUSTER_DIR=$DIR"
    echo "export HPCTRAIN_CLUSTER_NODE_NAMES='$(known_nodes | tr '\n' ' ' | sed 's/ $//')'"
    echo "export HPCTRAIN_CLUSTER_PARTITION=cluster"
    echo "export HPCTRAIN_CLUSTER_SHARED=$DIR/shared"
    echo "export HPCTRAIN_CLUSTER_SCRATCH=$SCRATCH"
    echo "export HPCTRAIN_CLUSTER_HEAD_ADDR=$HEAD_ADDR"
}

do_link() {  # do_link NODE rate RATE | cut | restore
    local node=${1:-} what=${2:-} v ns
    require_node "$node"
    v=$(veth "$node"); ns=$(netns "$node")
    case $what in
        rate)
            [[ ${3:-} =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] \
                || die "link $node rate: give a rate as tc reads it (200mbit, 1gbit), not '${3:-}'"
            # htb on both ends: the host's end limits what reaches the node, the node's eth0 what leaves it.
            tc qdisc replace dev "$v" root handle 1: htb default 1
            tc class replace dev "$v" parent 1: classid 1:1 htb rate "$3" ceil "$3" quantum 60000
            tc -n "$ns" qdisc replace dev eth0 root handle 1: htb default 1
            tc -n "$ns" class replace dev eth0 parent 1: classid 1:1 htb rate "$3" ceil "$3" quantum 60000
            log "$node: link limited to $3 each way" ;;
        cut)
            ip link set "$v" down
            log "$node: link cut" ;;
        restore)
            ip link set "$v" up
            tc qdisc del dev "$v" root 2>/dev/null || true
            tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
            log "$node: link up, no rate limit" ;;
        *) die "usage: cluster.sh link NODE rate RATE|cut|restore" ;;
    esac
}

do_node() {  # do_node NODE kill | start
    local node=${1:-}
    require_node "$node"
    exec 9>"$DIR/lock"
    flock -w 120 9 || die "could not lock $DIR/lock"
    case ${2:-} in
        kill) kill_node "$node"; log "$node: every process killed (Slurm marks it DOWN after SlurmdTimeout)" ;;
        start)
            slurm_env
            boot_node "$node"
            wait_ready "$node"
            log "$node: up and idle in Slurm" ;;
        *) die "usage: cluster.sh node NODE kill|start" ;;
    esac
}

do_tmp() {  # do_tmp NODE full | restore
    local node=${1:-} pid
    require_node "$node"
    pid=$(holder_pid "$node") || die "$node is down (boot it with 'cluster.sh node $node start')"
    case ${2:-} in
        full)
            # A small tmpfs over the node's /tmp, filled to the last block: what a job sees on a node whose
            # local disk another job filled (writes fail with ENOSPC), without filling this machine's disk.
            nsenter -t "$pid" -m -- mount -t tmpfs -o size=1m,mode=1777 hpctrain-full-tmp /tmp
            nsenter -t "$pid" -m -- sh -c 'dd if=/dev/zero of=/tmp/.filler bs=4k 2>/dev/null; true'
            log "$node: /tmp full" ;;
        restore)
            while nsenter -t "$pid" -m -- grep -q '^hpctrain-full-tmp /tmp ' /proc/self/mounts 2>/dev/null; do
                nsenter -t "$pid" -m -- umount -l /tmp || break
            done
            log "$node: /tmp is its own again" ;;
        *) die "usage: cluster.sh tmp NODE full|restore" ;;
    esac
}

do_exec() {  # do_exec NODE CMD...
    local node=${1:-} pid
    require_node "$node"
    shift
    (( $# )) || die "usage: cluster.sh exec NODE CMD..."
    pid=$(holder_pid "$node") || die "$node is down (boot it with 'cluster.sh node $node start')"
    exec nsenter -t "$pid" -n -u -m -- "$@"
}

case "${1:-}" in
    start) shift; do_start "$@" ;;
    stop) do_stop ;;
    status) do_status ;;
    env) do_env ;;
    link) shift; do_link "$@" ;;
    node) shift; do_node "$@" ;;
    tmp) shift; do_tmp "$@" ;;
    exec) shift; do_exec "$@" ;;
    *) echo "usage: $0 start [--nodes N]|stop|status|env|link NODE rate RATE|cut|restore|node NODE kill|start|tmp NODE full|restore|exec NODE CMD..." >&2
       exit 2 ;;
esac
