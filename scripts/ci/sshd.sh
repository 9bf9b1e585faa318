#!/usr/bin/env bash
# An OpenSSH server on 127.0.0.1:2222 standing in for a supercomputer login node (laptop-style submission).
# Everything lives under $HPCTRAIN_SSHD_DIR (default /tmp/hpctrain-sshd): host key, a client key that is the
# only authorized key, sshd_config, pid/log, and ssh_config with `Host hpctrain-test-login` for `ssh -F`.
# Usage: sshd.sh start|stop|status|env
set -euo pipefail

DIR=${HPCTRAIN_SSHD_DIR:-/tmp/hpctrain-sshd}
PORT=${HPCTRAIN_SSHD_PORT:-2222}
ADDR=127.0.0.1
ALIAS=hpctrain-test-login
SSH_CONFIG=$DIR/ssh_config

log() { echo "[sshd.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }

pid_alive() {
    [[ -s $DIR/sshd.pid ]] && kill -0 "$(cat "$DIR/sshd.pid")" 2>/dev/null
}

answers() {
    # A real login through the client config: key, known host and port all have to be right.
    [[ -f $SSH_CONFIG ]] && timeout 10 ssh -F "$SSH_CONFIG" -o ControlMaster=no -o ControlPath=none \
        "$ALIAS" true </dev/null >/dev/null 2>&1
}

write_files() {
    mkdir -p "$DIR"
    chmod 0700 "$DIR"
    [[ -s $DIR/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -C hpctrain-test-host \
        -f "$DIR/ssh_host_ed25519_key"
    [[ -s $DIR/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C hpctrain-test-client -f "$DIR/id_ed25519"
    chmod 0600 "$DIR/ssh_host_ed25519_key" "$DIR/id_ed25519"
    cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
    chmod 0600 "$DIR/authorized_keys"
    local hostkey
    hostkey=$(cut -d' ' -f1,2 "$DIR/ssh_host_ed25519_key.pub")
    printf '[%s]:%s %s\n[localhost]:%s %s\n' "$ADDR" "$PORT" "$hostkey" "$PORT" "$hostkey" >"$DIR/known_hosts"
    cat >"$DIR/sshd_config" <<EOF
# written by hpctrain scripts/ci/sshd.sh
Port $PORT
ListenAddress $ADDR
HostKey $DIR/ssh_host_ed25519_key
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PrintMotd no
MaxSessions 64
MaxStartups 64:30:128
LogLevel INFO
EOF
    cat >"$SSH_CONFIG" <<EOF
# written by hpctrain scripts/ci/sshd.sh; use with: ssh -F $SSH_CONFIG $ALIAS CMD
Host $ALIAS
    HostName $ADDR
    Port $PORT
    User root
    IdentityFile $DIR/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $DIR/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
EOF
}

do_start() {
    mkdir -p "$DIR"
    exec 9>"$DIR/lock"
    flock -w 60 9 || die "could not lock $DIR/lock"
    if pid_alive && answers; then
        log "already running on $ADDR:$PORT (ssh -F $SSH_CONFIG $ALIAS)"
        return 0
    fi
    [[ -x /usr/sbin/sshd ]] || die "openssh-server not installed: run 'bash scripts/install.sh' first"
    command -v ssh >/dev/null || die "openssh-client not installed: run 'bash scripts/install.sh' first"
    stop_sshd
    write_files
    mkdir -p /run/sshd  # privilege separation directory sshd insists on
    chmod 0755 /run/sshd
    /usr/sbin/sshd -t -f "$DIR/sshd_config" || die "sshd rejects $DIR/sshd_config"
    # sshd detaches by itself; -E sends its log to a file; fd 9 (our lock) must not stay open in it.
    /usr/sbin/sshd -f "$DIR/sshd_config" -E "$DIR/sshd.log" </dev/null >/dev/null 2>&1 9>&- \
        || { tail -n 20 "$DIR/sshd.log" >&2 || true; die "sshd failed to start"; }
    for _ in $(seq 50); do
        if answers; then
            log "started on $ADDR:$PORT (ssh -F $SSH_CONFIG $ALIAS)"
            return 0
        fi
        sleep 0.2
    done
    tail -n 20 "$DIR/sshd.log" >&2 || true
    die "sshd started but 'ssh -F $SSH_CONFIG $ALIAS true' fails"
}

stop_sshd() {
    pid_alive || { rm -f "$DIR/sshd.pid"; return 0; }
    local pid
    pid=$(cat "$DIR/sshd.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$DIR/sshd.pid"
}

do_stop() {
    mkdir -p "$DIR"
    exec 9>"$DIR/lock"
    flock -w 60 9 || die "could not lock $DIR/lock"
    stop_sshd
    log "stopped (keys kept in $DIR)"
}

do_status() {
    if pid_alive && answers; then
        echo "sshd: running (pid $(cat "$DIR/sshd.pid")) on $ADDR:$PORT; ssh -F $SSH_CONFIG $ALIAS"
    else
        echo "sshd: not running (or not answering) on $ADDR:$PORT"
        return 1
    fi
}

do_env() {
    echo "export HPCTRAIN_SSH_CONFIG=$SSH_CONFIG"
    echo "export HPCTRAIN_SSH_HOST=$ALIAS"
    echo "export HPCTRAIN_SSH_KEY=$DIR/id_ed25519"
    echo "export HPCTRAIN_SSH_KNOWN_HOSTS=$DIR/known_hosts"
    echo "export HPCTRAIN_SSH_PORT=$PORT"
    echo "export HPCTRAIN_SSHD_DIR=$DIR"
}

case "${1:-}" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    env) do_env ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
