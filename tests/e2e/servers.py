"""Private Redis and PostgreSQL servers for fault tests: started, stopped and restarted by the test,
never the shared ones (127.0.0.1:6379 and :5432 serve everyone else's tests).

PostgreSQL refuses to run as root: a root test runs `initdb` and `pg_ctl` as the `postgres` user, in a
folder of its own under the system temp dir. Ports come from E2E_PORT_RANGE ("8750-8799") when set,
else from the kernel.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.e2e.processes import free_port

_taken: set[int] = set()


def port_pick() -> int:
    """A free port: the first free one in E2E_PORT_RANGE, else one the kernel picks."""
    spec = os.environ.get("E2E_PORT_RANGE", "")
    if not spec:
        return free_port()
    low, high = (int(part) for part in spec.split("-"))
    for port in range(low, high + 1):
        if port in _taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _taken.add(port)
        return port
    raise RuntimeError(f"no free port in E2E_PORT_RANGE={spec}")


def _wait_port(port: int, *, up: bool, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            is_up = sock.connect_ex(("127.0.0.1", port)) == 0
        if is_up == up:
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} still {'down' if up else 'up'} after {timeout} s")


class PrivateRedis:
    """redis-server with the deploy's persistence (appendonly, fsync every second) in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port_pick()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--protected-mode", "no"],
            stdout=open(self.directory / "redis.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        _wait_port(self.port, up=True)

    def stop(self) -> None:
        """SIGTERM: Redis writes its append-only file and exits (a restart, as an operator's)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            self.popen.wait(30)
        _wait_port(self.port, up=False)


class PrivatePostgres:
    """A PostgreSQL cluster of its own (trust auth on 127.0.0.1), stopped and started by the test."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="e2e-pg-"))
        self.data = self.directory / "data"
        self.port = port_pick()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/llm_e2e"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.directory, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, *command: str) -> None:
        subprocess.run([*self._as, *command], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.directory / "pg.log"), "-o", options, "-w", "start")
        _wait_port(self.port, up=True)

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE llm_e2e")

    def stop(self) -> None:
        """A fast shutdown: every connection is cut, as in a restart."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        _wait_port(self.port, up=False)

    def destroy(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - already stopped
            pass
        shutil.rmtree(self.directory, ignore_errors=True)
