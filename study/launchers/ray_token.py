"""Ray's authentication token kept to the study's owner.

A local Ray instance turns token authentication on and keeps the token in ``~/.ray/auth_token``,
which Ray writes with the umask's mode (0644 here): on a shared machine whose home folders are
0755, any user could read it and run code as the study's owner on the study's Ray. Before a
local instance starts, the token is made (or made again) readable by its owner alone.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["TOKEN_PATH", "private_token"]

TOKEN_PATH = Path("~/.ray/auth_token")
"""Where Ray 2.60 keeps the token of a local instance (``_get_default_token_path``)."""


def private_token(path: Path = TOKEN_PATH) -> Path | None:
    """Make Ray's token file owner-only: written here with mode 0600 if it is missing (Ray then
    reads it instead of writing one), its mode narrowed if it is ours; returns the file, or None
    where token authentication is off (``RAY_AUTH_MODE=disabled``)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    path = path.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        info = path.stat()
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
            path.chmod(0o600)
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # 64 hex digits, as Ray writes its own
    return path
