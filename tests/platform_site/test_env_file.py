"""A newcomer's `manage.py`: after `make run` wrote the local .env, operator commands work in a new shell.

The .env is written by the same code the Makefile runs (platform_site/envfile.py), into a temporary
directory that ENV_FILE points at: the checkout's own .env, if a developer has one, is never touched.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from platform_site.envfile import env_file_write

ROOT = Path(__file__).resolve().parents[2]


def new_shell(env_file: Path) -> dict[str, str]:
    """A shell with nothing exported but ENV_FILE (no DEBUG, SECRET_KEY, DATABASE_URL...)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env["ENV_FILE"] = str(env_file)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_env_file_write_generates_a_key_and_keeps_an_existing_file(tmp_path):
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    assert env_file_write(first) and env_file_write(second)
    lines = dict(line.split("=", 1) for line in first.read_text().splitlines() if line and not line.startswith("#"))
    assert lines["DEBUG"] == "1" and len(lines["SECRET_KEY"]) >= 50
    assert lines["SECRET_KEY"] not in second.read_text()  # generated per file
    assert first.stat().st_mode & 0o077 == 0  # the key is readable by its owner only
    first.write_text("SECRET_KEY=mine\n")
    assert not env_file_write(first)
    assert first.read_text() == "SECRET_KEY=mine\n"


@pytest.mark.slow
def test_operator_commands_work_after_make_run(tmp_path):
    env_file = tmp_path / ".env"
    env_file_write(env_file)
    with env_file.open("a") as f:  # the newcomer's database stays in the temporary directory
        f.write(f"DATABASE_URL=sqlite:///{tmp_path / 'db.sqlite3'}\n")
    env = new_shell(env_file)
    for args in (("migrate", "--noinput"), ("bootstrap",), ("create_tenant", "--slug", "t2", "--name", "T2",
                                                              "--tier", "free")):
        result = manage(env, *args)
        assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    assert "t2" in result.stdout


@pytest.mark.slow
def test_the_environment_overrides_the_env_file(tmp_path):
    """DEBUG=0 exported over a .env that says DEBUG=1 and holds no key: production refuses to start."""
    env_file = tmp_path / ".env"
    env_file.write_text(f"DEBUG=1\nDATABASE_URL=sqlite:///{tmp_path / 'db.sqlite3'}\n")
    env = new_shell(env_file)
    assert manage(env, "check").returncode == 0
    result = manage({**env, "DEBUG": "0"}, "check")
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr
