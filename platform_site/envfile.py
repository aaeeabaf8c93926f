"""The local `.env` that `make run` writes when there is none: a generated SECRET_KEY and DEBUG=1.

platform_site.settings reads it (ENV_FILE names another file), so `manage.py`
works in a new shell with nothing exported. Standard library only: the
Makefile runs this file as a script, and the tests call `env_file_write`.
An existing file is left as it is.

    python platform_site/envfile.py [PATH]    # default: .env
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

HEADER = (
    "# Local development settings, written by `make run` (platform_site/envfile.py); git-ignored.\n"
    "# Variables set in the environment override these. Production sets its own (deploy/env.example).\n"
)


def env_file_write(path: str | os.PathLike) -> bool:
    """Write a development .env at `path` unless one exists; True when this call wrote it."""
    try:
        fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the key is a secret: owner only
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{HEADER}SECRET_KEY={secrets.token_urlsafe(50)}\nDEBUG=1\n")
    return True


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else ".env"
    if env_file_write(target):
        print(f"Wrote {target}: a generated SECRET_KEY, DEBUG=1 (local development only)")
