#!/usr/bin/env bash
# A real Slurm (Debian's 22.05 packages) for tests and demos: munged + MariaDB + slurmdbd + slurmctld + one
# slurmd on this machine (node `head`, partitions debug and long), state/logs under $HPCTRAIN_SLURM_DIR
# (default /var/tmp/hpctrain-slurm), config at /etc/slurm/slurm.conf where every Slurm client finds it.
# Usage: slurm.sh start|stop|status|env
#
# The same controller serves the namespace nodes of scripts/ci/cluster.sh: when $HPCTRAIN_CLUSTER_DIR/nodes
# lists them (cluster.sh writes it), slurm.conf declares them and their partition `cluster`, and a start that
# finds the daemons running with another node list restarts slurmctld with the new one.  Everything the nodes'
# slurmd must see lies outside /tmp (each node mounts its own /tmp), hence /var/tmp; their spool, pid and log
# files carry the node's name (%n).  The controller is named by this machine's hostname: the host resolves it
# itself, each node resolves it to the bridge address through its own hosts file.  The host's node is `head`
# because Slurm 22.05 treats a node named `localhost` as this host's name and then refuses the other nodes
# ("Duplicated NodeHostName").
#
# Accounting (so that tests can create a QOS with sacctmgr and Slurm enforces it): a private MariaDB
# (datadir $DIR/mariadb/data, unix socket only, no TCP port; options in $DIR/mariadb/my.cnf) and slurmdbd on
# localhost:$HPCTRAIN_SLURMDBD_PORT (6819).  slurmdbd.conf is $DIR/slurmdbd.conf (mode 600, owned by
# SlurmUser=root): slurmdbd looks for it beside $SLURM_CONF, so it is started with SLURM_CONF=$DIR/slurm.conf
# and /etc/slurm holds no slurmdbd.conf.  It reaches MariaDB through MYSQL_UNIX_PORT (the client library's
# socket when StorageHost=localhost) as the database's root, authenticated by the unix socket: no password.
# The cluster 'hpctrain' is registered once (`sacctmgr -i add cluster`), which also gives root an
# association under account root: root is the only user that submits here (tests run as root and the
# loopback sshd logs in as root).  AccountingStorageEnforce=limits makes slurmctld enforce QOS limits
# (MaxWall, MaxSubmitPU) and refuse jobs of users without an association; `qos` is not set, so a job may
# run under a partition's QOS without that QOS being in the user's association.
# Timings (the log line of `start` prints them per phase), measured on 2 cores busy with other tests' pytest:
# first start (empty datadir) 17.6 s = munged + mariadb-install-db + MariaDB 10.1 s, slurmdbd creating its
# tables + cluster registration 6.4 s, slurmctld + slurmd 1.2 s; a restart with the database kept 5.2 s
# (2.2 + 1.3 + 1.7); restarting only a dead slurmdbd 1.1 s (plus 4 s of the health retries); a start that finds
# everything healthy 0.2-0.5 s; `stop` 11-13 s (jobs cancelled, five daemons stopped in turn).
# Traps: (1) slurmctld -c restarts job ids at FirstJobId, and with accounting `sacct -D -j ID` then returns
# the older jobs of that id as earlier runs (hpctrain counts requeues that way): FirstJobId is set past the
# largest id in the database and in the completion file on every start.  (2) sacctmgr finds slurmdbd through
# $CONF, so the new slurm.conf is written before slurmdbd is asked anything, and the cluster is registered
# before slurmctld starts and loads its associations.  (3) With `limits`, a job over a QOS's MaxWall is only
# held (PENDING, QOSMaxWallDurationPerJobLimit; sbatch refuses it only under the QOS flag DenyOnLimit), a job
# over MaxSubmitPU is refused by sbatch (QOSMaxSubmitJobPerUserLimit).  (4) MariaDB's default InnoDB log is
# 96 MiB; 16 MiB keeps the datadir at ~110 MB.  (5) slurmdbd logs "Database settings not recommended values:
# innodb_buffer_pool_size": harmless for a test database.  (6) A start that finds slurmctld alive but
# slurmdbd gone restarts only MariaDB/slurmdbd: slurmctld keeps its jobs and reconnects.
# `sacct -c` (JobCompType=jobcomp/filetxt) still reads the completion file; plain `sacct` now works too.
#
# CPU oversubscription: tests run 4 ranks on a 2-core box.  OverSubscribe=YES only lets *jobs* share CPUs;
# one job with more tasks than the node's CPUs is refused ("Requested node configuration is not available"),
# even with --oversubscribe; only --overcommit gets it through.  Scripts rendered by hpctrain should not
# need a CI-only flag, so the node declares max(nproc, HPCTRAIN_SLURM_CPUS=8) CPUs, and
# `SlurmdParameters=config_overrides` makes slurmd trust that figure instead of draining the node for
# having fewer real cores.  tests/test_infra.py checks all of this.
set -euo pipefail

DIR=${HPCTRAIN_SLURM_DIR:-/var/tmp/hpctrain-slurm}
CONF=/etc/slurm/slurm.conf
MARKER="# written by hpctrain scripts/ci/slurm.sh"
NODE=head
CLUSTER_NODES=${HPCTRAIN_CLUSTER_DIR:-/var/tmp/hpctrain-cluster}/nodes
PARTITION=debug
START_TIMEOUT=${HPCTRAIN_SLURM_START_TIMEOUT:-60}
CLUSTER=hpctrain
DBD_PORT=${HPCTRAIN_SLURMDBD_PORT:-6819}
DB_DIR=$DIR/mariadb
DB_SOCKET=$DB_DIR/mysqld.sock
DB_PID=$DB_DIR/mariadbd.pid
DBD_PID=$DIR/slurmdbd.pid
MUNGE_KEY=/etc/munge/munge.key
MUNGE_PID=/run/munge/munged.pid

log() { echo "[slurm.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }

elapsed() {  # elapsed START [END]: seconds between two $EPOCHREALTIME values (END: now), to 0.1 s
    awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN { printf "%.1f", b - a }'
}

pid_alive() {  # pid_alive PIDFILE
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_state() {
    timeout 10 sinfo -h -N -n "$NODE" -o %t 2>/dev/null | head -n1 || true
}

pids_named() {  # pids_named NAME...: pids in this network namespace whose command name is one of NAMEs
    local p comm name here
    here=$(readlink /proc/$$/ns/net)
    for p in /proc/[0-9]*; do
        comm=$(cat "$p/comm" 2>/dev/null) || continue
        # A namespace node's slurmd (scripts/ci/cluster.sh) is not the host's.
        [[ $(readlink "$p/ns/net" 2>/dev/null) == "$here" ]] || continue
        for name in "$@"; do
            [[ $comm == "$name" ]] && printf '%s ' "${p#/proc/}"
        done
    done
    return 0
}

munge_ok() {
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

db_ok() {
    pid_alive "$DB_PID" && timeout 10 mariadb-admin --no-defaults --socket="$DB_SOCKET" -uroot ping >/dev/null 2>&1
}

clusters() {  # the clusters slurmdbd knows (sacctmgr reads $CONF for the slurmdbd address); fails if none answers
    timeout 10 sacctmgr -n -P show cluster format=Cluster 2>&1
}

dbd_ok() {
    pid_alive "$DBD_PID" && [[ $(clusters) == *"$CLUSTER"* ]]
}

slurm_up() {
    pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd-$NODE.pid" && munge_ok || return 1
    local st
    st=$(node_state)
    [[ $st == idle* || $st == mix* || $st == alloc* || $st == comp* ]]
}

healthy() {
    slurm_up && db_ok && dbd_ok
}

declared_cpus() {
    local n want
    n=$(nproc)
    want=${HPCTRAIN_SLURM_CPUS:-8}
    (( want > n )) && echo "$want" || echo "$n"
}

real_memory_mb() {
    # Half of the memory available now, at most 16 GiB, at least 1 GiB: safely below what slurmd sees.
    local avail_kb mb
    avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
    mb=$(( avail_kb / 1024 / 2 ))
    (( mb > 16384 )) && mb=16384
    (( mb < 1024 )) && mb=1024
    echo "$mb"
}

first_job_id() {  # one past the largest job id in the accounting database and in the completion file
    local db comp
    db=$(timeout 10 mariadb --no-defaults --socket="$DB_SOCKET" -uroot -N -B \
        -e "SELECT COALESCE(MAX(id_job), 0) FROM slurm_acct_db.${CLUSTER}_job_table" 2>/dev/null || true)
    comp=$(grep -o '^JobId=[0-9]*' "$DIR/jobcomp.txt" 2>/dev/null | cut -d= -f2 | sort -n | tail -n1 || true)
    [[ $db =~ ^[0-9]+$ ]] || db=0
    [[ $comp =~ ^[0-9]+$ ]] || comp=0
    if (( db > comp )); then echo $(( db + 1 )); else echo $(( comp + 1 )); fi
}

controller_host() {  # this machine's hostname where it resolves here (the nodes need it), else localhost
    local h
    h=$(hostname)
    if [[ -n $h && $h != localhost ]] && getent hosts "$h" >/dev/null 2>&1; then echo "$h"; else echo localhost; fi
}

cluster_layout() {  # the namespace nodes cluster.sh asked for: lines "NAME ADDRESS CPUS MEMORY_MB" (none: empty)
    [[ -s $CLUSTER_NODES ]] && grep -E '^node[0-9]+ [0-9.]+ [0-9]+ [0-9]+$' "$CLUSTER_NODES" || true
}

cluster_conf() {  # slurm.conf lines of the namespace nodes and their partition
    local layout name addr cpus mem names=()
    layout=$(cluster_layout)
    [[ -n $layout ]] || return 0
    while read -r name addr cpus mem; do
        echo "NodeName=$name NodeHostname=$name NodeAddr=$addr CPUs=$cpus Boards=1 SocketsPerBoard=1" \
             "CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem Feature=namespace State=UNKNOWN"
        names+=("$name")
    done <<<"$layout"
    local IFS=,
    echo "PartitionName=cluster Nodes=${names[*]} Default=NO MaxNodes=${#names[@]} MaxTime=02:00:00" \
         "DefaultTime=00:30:00 State=UP OverSubscribe=NO"
}

write_conf() {
    local cpus mem first ctl
    cpus=$(declared_cpus)
    mem=$(real_memory_mb)
    first=$(first_job_id)
    ctl=$(controller_host)
    if [[ -e $CONF ]] && ! grep -qF "$MARKER" "$CONF" && [[ ${HPCTRAIN_SLURM_FORCE:-0} != 1 ]]; then
        die "$CONF exists and was not written by this script; move it away or set HPCTRAIN_SLURM_FORCE=1"
    fi
    mkdir -p "$(dirname "$CONF")"
    cat >"$DIR/slurm.conf" <<EOF
$MARKER (state under $DIR); rewritten on every start
ClusterName=hpctrain
SlurmctldHost=$ctl
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# Credentials expire after 10 s instead of 120 s: a requeued job is runnable again after ~12 s.
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
MinJobAge=600
KillWait=10
InactiveLimit=0
FirstJobId=$first
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStorageEnforce=limits
JobAcctGatherType=jobacct_gather/none
# Finished jobs also go to a text file, read by sacct -c (no backticks: this is an unquoted heredoc).
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
MailProg=/bin/true
SlurmdDebug=info
# A node whose slurmd stops answering is DOWN after 30 s (default 300): tests kill namespace nodes.
SlurmdTimeout=30
NodeName=$NODE NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=long Nodes=$NODE Default=NO MaxTime=INFINITE State=UP OverSubscribe=YES
$(cluster_conf)
EOF
    cluster_layout >"$DIR/cluster-layout"
    cp "$DIR/slurm.conf" "$CONF"
    chmod 0644 "$CONF"
}

layout_changed() {  # the running daemons were started with another list of namespace nodes
    [[ "$(cluster_layout)" != "$(cat "$DIR/cluster-layout" 2>/dev/null || true)" ]]
}

start_munge() {
    if munge_ok; then
        return 0
    fi
    getent passwd munge >/dev/null || die "no 'munge' user: run 'bash scripts/install.sh' first"
    if [[ ! -s $MUNGE_KEY ]]; then
        mkdir -p "$(dirname "$MUNGE_KEY")"
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    fi
    chown munge:munge "$MUNGE_KEY" "$(dirname "$MUNGE_KEY")"
    chmod 0400 "$MUNGE_KEY"
    chmod 0700 "$(dirname "$MUNGE_KEY")"
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 0755 /run/munge
    if pid_alive "$MUNGE_PID"; then
        kill "$(cat "$MUNGE_PID")" 2>/dev/null || true
        sleep 1
    fi
    # --force: a stale socket left by a killed munged must not stop the new one.
    runuser -u munge -- /usr/sbin/munged --force </dev/null >>"$DIR/log/munged.stdout" 2>&1 9>&- \
        || die "munged failed to start; see /var/log/munge/munged.log"
    for _ in $(seq 50); do
        munge_ok && return 0
        sleep 0.1
    done
    die "munged started but 'munge -n | unmunge' fails; see /var/log/munge/munged.log"
}

write_db_conf() {
    mkdir -p "$DB_DIR" "$DIR/log"
    cat >"$DB_DIR/my.cnf" <<EOF
$MARKER; rewritten on every start
[mariadbd]
datadir=$DB_DIR/data
socket=$DB_SOCKET
pid-file=$DB_PID
log-error=$DIR/log/mariadb.log
skip-networking
user=root
innodb_buffer_pool_size=64M
innodb_log_file_size=16M
innodb_lock_wait_timeout=900
EOF
    cat >"$DIR/slurmdbd.conf" <<EOF
$MARKER; rewritten on every start
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DBD_PID
LogFile=$DIR/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chown root:root "$DIR/slurmdbd.conf"
    chmod 0600 "$DIR/slurmdbd.conf"
}

start_mariadb() {
    db_ok && return 0
    stop_pidfile "$DB_PID" mariadbd
    if [[ ! -d $DB_DIR/data/mysql ]]; then
        rm -rf "$DB_DIR/data"
        mariadb-install-db --defaults-file="$DB_DIR/my.cnf" --auth-root-authentication-method=socket \
            --skip-test-db </dev/null >"$DIR/log/mariadb-install.log" 2>&1 9>&- \
            || { tail -n 20 "$DIR/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi
    # mariadbd does not detach by itself: setsid + & makes it a daemon outside this script's process group.
    setsid mariadbd --defaults-file="$DB_DIR/my.cnf" </dev/null >>"$DIR/log/mariadb.stdout" 2>&1 9>&- &
    for _ in $(seq $(( START_TIMEOUT * 5 ))); do
        db_ok && return 0
        sleep 0.2
    done
    tail -n 20 "$DIR/log/mariadb.log" >&2 || true
    die "mariadbd did not answer on $DB_SOCKET within ${START_TIMEOUT} s"
}

start_slurmdbd() {
    dbd_ok && return 0
    stop_pidfile "$DBD_PID" slurmdbd
    SLURM_CONF=$DIR/slurm.conf MYSQL_UNIX_PORT=$DB_SOCKET setsid slurmdbd \
        </dev/null >>"$DIR/log/slurmdbd.stdout" 2>&1 9>&- || { show_logs; die "slurmdbd failed to start"; }
    local out="" answered=0
    for _ in $(seq $(( START_TIMEOUT * 5 ))); do
        if out=$(clusters); then answered=1; break; fi
        sleep 0.2
    done
    (( answered )) || { show_logs; die "slurmdbd does not answer sacctmgr within ${START_TIMEOUT} s: $out"; }
    if [[ $out != *"$CLUSTER"* ]]; then
        timeout 30 sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster $CLUSTER failed"
    fi
    dbd_ok || { show_logs; die "slurmdbd does not list cluster $CLUSTER after registering it"; }
}

show_logs() {
    local f
    for f in "$DIR/log/slurmctld.log" "$DIR/log/slurmd-$NODE.log" "$DIR/log/slurmctld.stdout" "$DIR/log/slurmd.stdout" \
             "$DIR/log/slurmdbd.log" "$DIR/log/slurmdbd.stdout" "$DIR/log/mariadb.log"; do
        [[ -s $f ]] || continue
        echo "----- tail $f" >&2
        tail -n 25 "$f" >&2
    done
}

do_start() {
    mkdir -p "$DIR"
    exec 9>"$DIR/lock"
    flock -w 120 9 || die "could not lock $DIR/lock (another start/stop still running?)"
    if pid_alive "$DIR/slurmctld.pid" && [[ -s $DIR/slurm.conf ]] && ! cmp -s "$DIR/slurm.conf" "$CONF"; then
        # Clients (sbatch, sacct) read $CONF on every call: put back the config the daemons run with.
        log "warning: $CONF changed under the running daemons; restoring it from $DIR/slurm.conf"
        cp "$DIR/slurm.conf" "$CONF"
    fi
    local i
    for i in 1 2 3; do
        if layout_changed; then
            log "the namespace nodes changed ($CLUSTER_NODES): restarting slurmctld and slurmd with them"
            break
        fi
        if healthy; then
            log "already running (node $NODE $(node_state), state in $DIR)"
            return 0
        fi
        # Daemons alive but slow to answer (a loaded box): do not kill everyone's jobs on the first miss.
        pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd-$NODE.pid" && (( i < 3 )) || break
        sleep 2
    done
    if ! layout_changed && slurm_up && grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$DIR/slurm.conf" 2>/dev/null; then
        # Only MariaDB or slurmdbd is down: bring them back under the running slurmctld, whose jobs live on.
        local t1=$EPOCHREALTIME
        write_db_conf
        start_mariadb
        start_slurmdbd
        if healthy; then
            log "accounting restarted in $(elapsed "$t1") s under the running slurmctld (state in $DIR)"
            return 0
        fi
    fi
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null \
        || die "Slurm/munge/slurmdbd/MariaDB not installed: run 'bash scripts/install.sh' first"
    local t0 foreign t_db t_dbd
    t0=$EPOCHREALTIME
    # A half-started set (e.g. slurmd died) is restarted from scratch.
    stop_slurm_daemons
    foreign=$(pids_named slurmctld slurmd)
    [[ -z $foreign ]] || die "Slurm daemons not started by this script are running (pids: $foreign); stop them first"
    pid_alive "$DBD_PID" || foreign=$(pids_named slurmdbd)
    [[ -z $foreign ]] || die "a slurmdbd not started by this script is running (pids: $foreign); stop it first"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    start_munge
    write_db_conf
    start_mariadb
    t_db=$EPOCHREALTIME
    # Clients (sacctmgr here) need the new $CONF, with the slurmdbd address, before slurmdbd is asked anything.
    write_conf
    start_slurmdbd
    t_dbd=$EPOCHREALTIME
    # -c: start from a clean job/node state.  Daemons fork and detach; their stdio goes to files so that a
    # caller capturing our output (pytest's subprocess) never waits on a pipe a daemon still holds, and the
    # lock fd 9 is closed for them so the lock is released when this script exits.
    : >"$DIR/log/slurmctld.stdout"
    : >"$DIR/log/slurmd.stdout"
    setsid slurmctld -c </dev/null >>"$DIR/log/slurmctld.stdout" 2>&1 9>&- \
        || { show_logs; die "slurmctld failed to start"; }
    setsid slurmd -N "$NODE" </dev/null >>"$DIR/log/slurmd.stdout" 2>&1 9>&- \
        || { show_logs; die "slurmd failed to start"; }
    local st=""
    for _ in $(seq $(( START_TIMEOUT * 2 ))); do
        st=$(node_state)
        if [[ $st == idle* ]]; then
            log "started in $(elapsed "$t0") s (munged + MariaDB $(elapsed "$t0" "$t_db") s, slurmdbd" \
                "$(elapsed "$t_db" "$t_dbd") s, slurmctld + slurmd $(elapsed "$t_dbd") s): node $NODE idle," \
                "CPUs=$(declared_cpus)," \
                "partitions $PARTITION (default) + long, accounting by slurmdbd :$DBD_PORT, state in $DIR"
            return 0
        fi
        if [[ $st == down* || $st == drain* ]]; then
            # ReturnToService=2 should avoid this; bring it back once.
            scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
        fi
        sleep 0.5
    done
    show_logs
    die "node $NODE not idle after ${START_TIMEOUT} s (last state: '${st:-no answer from slurmctld}')"
}

stop_pidfile() {  # stop_pidfile PIDFILE NAME
    local pid
    pid_alive "$1" || { rm -f "$1"; return 0; }
    pid=$(cat "$1")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$1"; return 0; }
        sleep 0.1
    done
    log "$2 (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$1"
}

stop_slurm_daemons() {
    if pid_alive "$DIR/slurmctld.pid"; then
        # Cancel jobs first so no slurmstepd (and user processes) outlive the daemons.
        local jobs
        jobs=$(timeout 10 squeue -h -t PD,R,CG,S -o %A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            timeout 10 scancel $jobs 2>/dev/null || true
            for _ in $(seq 20); do
                [[ -z $(timeout 5 squeue -h -t R,CG -o %A 2>/dev/null || true) ]] && break
                sleep 0.5
            done
        fi
    fi
    stop_pidfile "$DIR/slurmd-$NODE.pid" slurmd
    stop_pidfile "$DIR/slurmctld.pid" slurmctld
}

do_stop() {
    mkdir -p "$DIR"
    exec 9>"$DIR/lock"
    flock -w 120 9 || die "could not lock $DIR/lock"
    stop_slurm_daemons
    stop_pidfile "$DBD_PID" slurmdbd
    stop_pidfile "$DB_PID" mariadbd
    stop_pidfile "$MUNGE_PID" munged
    log "stopped (state and accounting database kept in $DIR)"
}

do_status() {
    local rc=0 name f
    for name in slurmctld "slurmd-$NODE"; do
        f="$DIR/$name.pid"
        if pid_alive "$f"; then echo "$name: running (pid $(cat "$f"))"; else echo "$name: stopped"; rc=1; fi
    done
    if munge_ok; then echo "munged: running"; else echo "munged: stopped"; rc=1; fi
    if db_ok; then echo "mariadbd: running (pid $(cat "$DB_PID"), socket $DB_SOCKET)"
    else echo "mariadbd: stopped"; rc=1; fi
    if dbd_ok; then echo "slurmdbd: running (pid $(cat "$DBD_PID"), port $DBD_PORT, cluster $CLUSTER registered)"
    else echo "slurmdbd: stopped or not answering"; rc=1; fi
    echo "node $NODE: $(node_state || true)"
    echo "config: $CONF; state: $DIR"
    [[ $rc == 0 ]] && healthy || rc=1
    return $rc
}

do_env() {
    echo "export SLURM_CONF=$CONF"
    echo "export HPCTRAIN_SLURM_DIR=$DIR"
    echo "export HPCTRAIN_SLURM_PARTITION=$PARTITION"
    echo "export HPCTRAIN_SLURM_NODE=$NODE"
    echo "export HPCTRAIN_SLURM_CPUS=$(declared_cpus)"
}

case "${1:-}" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    env) do_env ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
