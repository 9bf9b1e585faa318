"""LocalTransport and SSHTransport against real processes: the loopback sshd of scripts/ci/sshd.sh (the
session fixture ``sshd`` in tests/conftest.py), a port with nothing listening, a wrong key, a full tmpfs.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.errors import TransportError
from hpctrain.submission.transport import (
    CommandFailed,
    LocalTransport,
    SSHTransport,
    Transport,
    classify_ssh_failure,
    default_control_dir,
    run_script,
)

if TYPE_CHECKING:
    from conftest import SshLogin

pytestmark = pytest.mark.sshd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



@pytest.fixture
def ssh(sshd: SshLogin, short_dir: Path) -> Iterator[SSHTransport]:
    t = SSHTransport(sshd.host, ssh_config=str(sshd.config), control_dir=str(short_dir), connect_timeout=5)
    yield t
    t.close()


@pytest.fixture
def wrong_key_config(sshd: SshLogin, tmp_path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong")], check=True)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host {sshd.host}\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
        f"  IdentityFile {tmp_path}/wrong\n  IdentitiesOnly yes\n  UserKnownHostsFile {sshd.known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
    )
    return cfg


# --- SSH ---------------------------------------------------------------------------------------------------


def test_a_script_past_the_command_line_limit_runs_over_ssh(ssh: SSHTransport, tmp_path: Path) -> None:
    """A 400 KiB script with 3,000 hostile arguments: over ssh the remote command is ONE argument of the login
    shell (at most 128 KiB on Linux), so the script and its arguments travel on stdin."""
    marker = tmp_path / "pwned"
    args = [f"{i} it's $(touch {marker}) " + "x" * 100 for i in range(3000)]
    script = "".join(f": {'y' * 120}\n" for _ in range(3000)) + 'printf "%s\\0" "$@"'
    assert len(script.encode()) + sum(map(len, args)) > 3 * 128 * 1024
    got = run_script(ssh, script, args, timeout=60, check=True)
    assert got.stdout.split("\0")[:-1] == args
    assert not marker.exists()


def test_hostile_arguments_arrive_verbatim(ssh: SSHTransport, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = ["a b", "it's", '"dq"', f"$(touch {marker})", f"`touch {marker}`", "line1\nline2",
               f"; touch {marker}", "*", "-n", "", "back\\slash", "$HOME", "tab\there", "ünï"]
    got = ssh.run(["printf", "%s\\0", *hostile], timeout=30)
    assert got.stdout.split("\0")[:-1] == hostile
    assert not marker.exists()
    assert isinstance(ssh, Transport)


def test_put_get_roundtrip(ssh: SSHTransport, tmp_path: Path) -> None:
    src = tmp_path / "src file.bin"
    payload = os.urandom(100_000) + b"\n$(touch x)'\"\n"
    src.write_bytes(payload)
    remote_dir = tmp_path / "remote dir 'q'"
    ssh.mkdir_p(str(remote_dir / "sub"))
    ssh.put(src, str(remote_dir / "sub" / "job.sh"))
    assert (remote_dir / "sub" / "job.sh").read_bytes() == payload
    assert not list((remote_dir / "sub").glob("*tmp*"))
    back = tmp_path / "back.bin"
    ssh.get(str(remote_dir / "sub" / "job.sh"), back)
    assert back.read_bytes() == payload
    with pytest.raises(TransportError, match="cannot read .*nope"):
        ssh.get(str(tmp_path / "nope"), back)


def test_one_master_serves_many_commands(ssh: SSHTransport, sshd: SshLogin) -> None:
    ssh.close()
    assert not ssh.check_master()
    since = sshd.log_offset()
    client_ports, master_pids = set(), set()
    for _ in range(6):
        # $SSH_CONNECTION = "client_ip client_port server_ip server_port": one TCP connection, one port
        out = ssh.run(["sh", "-c", 'echo "$SSH_CONNECTION"'], timeout=30).stdout.split()
        client_ports.add(out[1])
        check = subprocess.run(ssh.ssh_argv(None, "-O", "check"), capture_output=True, text=True, timeout=10)
        master_pids.add(re.search(r"pid=(\d+)", check.stderr).group(1))  # type: ignore[union-attr]
    assert ssh.check_master()
    assert len(client_ports) == 1 and len(master_pids) == 1
    # sshd logged exactly one login for that connection since the test began
    assert sshd.logins(client_ports.pop(), since) == 1
    ssh.close()
    assert not ssh.check_master()


def test_unreachable_port(short_dir: Path) -> None:
    port = _free_port()  # nothing listens there
    t = SSHTransport("root@127.0.0.1", ssh_config="/dev/null", control_dir=str(short_dir),
                     connect_timeout=5, extra_opts=("-o", f"Port={port}"))
    with pytest.raises(TransportError, match="unreachable") as e:
        t.run(["true"], timeout=30)  # the timeout message would say "did not answer": this must not
    assert "Connection refused" in str(e.value)


def test_name_does_not_resolve(short_dir: Path) -> None:
    t = SSHTransport("nobody@no-such-host.invalid", ssh_config="/dev/null", control_dir=str(short_dir),
                     connect_timeout=5)
    with pytest.raises(TransportError, match="unreachable, its name does not resolve"):
        t.run(["true"], timeout=30)


def test_unknown_remote_alias_is_named_as_such(short_dir: Path) -> None:
    """Without --ssh-config ssh reads only the user's own config: an alias defined elsewhere does not resolve,
    and the message says so (about --remote), not about the site profile's login_host."""
    t = SSHTransport("no-such-alias-hpctrain", control_dir=str(short_dir), connect_timeout=5)
    with pytest.raises(TransportError, match="its name does not resolve") as e:
        t.run(["true"], timeout=30)
    text = str(e.value)
    assert "'no-such-alias-hpctrain' (from --remote)" in text and "--ssh-config FILE" in text
    assert "login_host" not in text
    given = classify_ssh_failure("me@alias", 255, "ssh: Could not resolve hostname alias: Name or service not known",
                                 "/etc/my_ssh_config")
    assert given is not None and "/etc/my_ssh_config has `Host alias`" in str(given)


def test_authentication_failure(sshd: SshLogin, wrong_key_config: Path, short_dir: Path) -> None:
    t = SSHTransport(sshd.host, ssh_config=str(wrong_key_config), control_dir=str(short_dir))
    with pytest.raises(TransportError, match=f"authentication to {sshd.host} failed") as e:
        t.run(["true"], timeout=30)
    assert "Permission denied" in str(e.value) and "ssh-add" in str(e.value)


def test_missing_remote_command(ssh: SSHTransport) -> None:
    # sbatch exists on this very machine, so hide it with PATH on the remote side
    with pytest.raises(TransportError, match="hpctrain-no-such-tool not found on hpctrain-test-login"):
        ssh.run(["hpctrain-no-such-tool", "--version"], timeout=30)
    with pytest.raises(TransportError, match="sbatch not found on .*load the Slurm module"):
        ssh.run(["sh", "-c", 'PATH=/nonexistent; sbatch "$@"', "sh", "--version"], timeout=30)


def test_remote_nonzero_exit(ssh: SSHTransport) -> None:
    assert ssh.run(["sh", "-c", "echo oops >&2; exit 3"], timeout=30, check=False).returncode == 3
    with pytest.raises(CommandFailed, match="exited 3: oops") as e:
        ssh.run(["sh", "-c", "echo oops >&2; exit 3"], timeout=30)
    assert e.value.completed.returncode == 3
    # a remote exit 255 that is not ssh's own failure stays a plain exit status
    assert ssh.run(["sh", "-c", "exit 255"], timeout=30, check=False).returncode == 255


def test_remote_input_bytes(ssh: SSHTransport) -> None:
    assert ssh.run(["wc", "-c"], timeout=30, input=b"x" * 12345).stdout.strip() == "12345"


def test_timeout(ssh: SSHTransport) -> None:
    with pytest.raises(TransportError, match="sleep on hpctrain-test-login did not answer within 1 s"):
        ssh.run(["sleep", "20"], timeout=1)


def test_remote_disk_full(ssh: SSHTransport, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); classifier tested below")
    try:
        big = tmp_path / "big"
        big.write_bytes(os.urandom(256 * 1024))
        with pytest.raises(TransportError, match="no space left on hpctrain-test-login"):
            ssh.put(big, str(full / "ckpt.bin"))
        assert not (full / "ckpt.bin").exists()
        with pytest.raises(TransportError, match="no space left"):
            ssh.run(["dd", "if=/dev/zero", f"of={full}/x", "bs=64k", "count=4"], timeout=30)
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_classifier_on_recorded_stderr() -> None:
    cases = {
        "ssh: connect to host 10.255.0.1 port 22: Connection timed out\r\n": "host unreachable",
        "ssh: Could not resolve hostname login.nowhere: Name or service not known\r\n": "does not resolve",
        "root@127.0.0.1: Permission denied (publickey).\r\n": "authentication",
        "kex_exchange_identification: Connection closed by remote host\r\n": "host unreachable",
    }
    for stderr, words in cases.items():
        err = classify_ssh_failure("h", 255, stderr)
        assert err is not None and words in str(err), stderr
    assert classify_ssh_failure("h", 1, "Permission denied") is None
    assert classify_ssh_failure("h", 255, "my tool failed its own way") is None


def test_control_dir_is_short() -> None:
    assert len(default_control_dir()) + 41 <= 100
    with pytest.raises(TransportError, match="too long for a unix socket"):
        SSHTransport("h", control_dir="/tmp/" + "x" * 80)
    with pytest.raises(TransportError, match="invalid ssh destination"):
        SSHTransport("-oProxyCommand=touch /tmp/x")


# --- local -------------------------------------------------------------------------------------------------


def test_local_missing_program() -> None:
    with pytest.raises(TransportError, match="hpctrain-no-sbatch not found on this machine; is this a login"):
        LocalTransport().run(["hpctrain-no-sbatch"], timeout=10)


def test_local_run_and_errors(tmp_path: Path) -> None:
    t = LocalTransport()
    assert isinstance(t, Transport)
    assert t.run(["printf", "%s|", "a b", "$(x)"], timeout=10).stdout == "a b|$(x)|"
    assert t.run(["cat"], timeout=10, input=b"hi").stdout == "hi"
    assert t.run(["false"], timeout=10, check=False).returncode == 1
    with pytest.raises(CommandFailed, match="exited 2"):
        t.run(["sh", "-c", "echo bad >&2; exit 2"], timeout=10)
    with pytest.raises(TransportError, match="did not answer within 0.5 s"):
        t.run(["sleep", "10"], timeout=0.5)
    with pytest.raises(TransportError, match="no space left on this machine"):
        t.run(["sh", "-c", "echo 'cat: write error: No space left on device' >&2; exit 1"], timeout=10)
    src = tmp_path / "a"
    src.write_text("x")
    t.put(src, str(tmp_path / "d" / "e" / "b"))
    assert (tmp_path / "d" / "e" / "b").read_text() == "x"
    t.get(str(tmp_path / "d" / "e" / "b"), tmp_path / "c")
    assert (tmp_path / "c").read_text() == "x"
    t.mkdir_p(str(tmp_path / "m" / "n"))
    assert (tmp_path / "m" / "n").is_dir()


@pytest.mark.parametrize("stderr", [
    "sh: 1: sbatch: not found", "bash: line 1: sbatch: command not found", "zsh: command not found: sbatch",
    "sbatch: Command not found.", "env: 'sbatch': No such file or directory",
])
def test_missing_program_named_from_shell_stderr(stderr: str) -> None:
    # the scheduler command may be wrapped (sh -c 'module load slurm; sbatch ...'): name it from stderr
    with pytest.raises(TransportError, match="^sbatch not found on this machine: load the Slurm module"):
        LocalTransport().run(["sh", "-c", f"echo \"{stderr}\" >&2; exit 127"], timeout=10)
