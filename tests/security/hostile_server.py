"""One real uvicorn process for the hostile-input tests: the Schemathesis run, tests/security's.

The embedded mode (the real model on the CPU) on its own SQLite file, or on
the PostgreSQL database it is given (dropped and created first), with
what the hostile tests need set: a body deadline of 1 s, an Origin
allow-list, DEBUG logging with uvicorn's access log on, and its own random
SECRET_KEY, API key pepper and admin password, so that the log test knows
every secret the process holds. Its port: tests.e2e.servers.port_pick.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from tests.e2e.processes import Proc, api_key_new, http_wait, manage, postgres_database_reset, process_env
from tests.e2e.servers import port_pick

ALLOWED_ORIGIN = "https://app.example.com"
BODY_TIMEOUT_S = 1


class HostileServer:
    def __init__(self, tmp: Path, *, database_url: str | None = None) -> None:
        self.secrets = {
            "SECRET_KEY": secrets.token_urlsafe(50),
            "API_KEY_PEPPER": secrets.token_urlsafe(40),
            "ADMIN_PASSWORD": "adm-" + secrets.token_urlsafe(18),
        }
        self.database_url = database_url or f"sqlite:///{tmp / 'hostile.sqlite3'}"
        if self.database_url.startswith("postgres"):
            postgres_database_reset(self.database_url)
        self.env = process_env(
            DATABASE_URL=self.database_url, ENGINE_KV_CACHE_MB="128", LOG_LEVEL="DEBUG",
            REQUEST_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S), WEBSOCKET_ALLOWED_ORIGINS=ALLOWED_ORIGIN,
            **self.secrets,
        )
        manage(self.env, "migrate", "--noinput", "-v", "0")
        manage(self.env, "bootstrap", "--admin-password", self.secrets["ADMIN_PASSWORD"])
        self.keys = {tier: api_key_new(self.env, tenant=f"h-{tier}", tier=tier) for tier in ("free", "pro", "enterprise")}
        self.port = port_pick()
        command = [sys.executable, "-m", "uvicorn", "platform_site.asgi:application", "--host", "127.0.0.1",
                   "--port", str(self.port), "--lifespan", "off"]  # with the access log, as deployed
        self.log_path = tmp / "hostile-web.log"
        self.proc = Proc("hostile-web", command, self.env, self.log_path)
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/realtime"
        http_wait(f"{self.url}/healthz", self.proc)

    def stop(self) -> None:
        self.proc.stop()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def hostile_server_shared(tmp_path_factory, config) -> HostileServer:
    """One per test session, for the modules that need it: on SQLite, or under `make test-postgres`
    (DATABASE_URL set) on its own PostgreSQL database, named after DATABASE_URL's with `_hostile` added."""
    server = getattr(config, "_hostile_server", None)
    if server is None:
        url = os.environ.get("DATABASE_URL", "")
        database_url = f"{url}_hostile" if url.startswith("postgres") else None
        server = HostileServer(tmp_path_factory.mktemp("hostile"), database_url=database_url)
        config._hostile_server = server
        config.add_cleanup(server.stop)
    return server
