"""Ray's token file is its owner's alone (`study.launchers.ray_token.private_token`)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from study.launchers.ray_token import private_token


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_missing_token_is_written_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr("os.umask", lambda mask: 0)  # never consulted: the mode is explicit
    token = private_token(tmp_path / ".ray" / "auth_token")
    assert token is not None and _mode(token) == 0o600 and len(token.read_text()) == 64
    assert _mode(token.parent) == 0o700


def test_a_readable_token_is_narrowed_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token Ray wrote earlier (0644) keeps its value: clusters started with it still accept it."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    path = tmp_path / "auth_token"
    path.write_text("abc123")
    path.chmod(0o644)
    assert private_token(path) == path
    assert (_mode(path), path.read_text()) == (0o600, "abc123")


def test_nothing_is_written_when_token_auth_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert private_token(tmp_path / "auth_token") is None
    assert not (tmp_path / "auth_token").exists()


_JOIN = """
from ray._raylet import GcsClient
GcsClient(address={address!r}).internal_kv_get(b"any", namespace=None, timeout=30)
"""
"""What every driver, node and job does first: a call to the instance's GCS."""


@pytest.mark.ray
@pytest.mark.parametrize(
    ("auth", "refusal"),
    [
        ({"RAY_AUTH_MODE": "token"}, None),  # its owner's token (~/.ray/auth_token): let in
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, "InvalidAuthToken"),  # a wrong one
        ({"RAY_AUTH_MODE": "disabled"}, "InvalidAuthToken"),  # none at all
    ],
)
def test_a_local_instance_lets_in_only_a_driver_with_its_token(
    auth: dict[str, str], refusal: str | None
) -> None:
    """A local instance started as the CLI starts its own (the tests' shared one is) takes only
    callers that hold its token: on a shared machine, the token file's mode is what keeps others
    out (Ray 2.60 listens on every interface, whatever node IP it is given)."""
    from tests.study.conftest import shared_ray

    address = shared_ray()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | auth
    done = subprocess.run(
        [sys.executable, "-c", _JOIN.format(address=address)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if refusal is None:
        assert done.returncode == 0, done.stderr[-2000:]
    else:
        assert done.returncode != 0 and refusal in done.stderr, done.stderr[-2000:]
