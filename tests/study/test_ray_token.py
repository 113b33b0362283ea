"""Ray's token file is its owner's alone (`study.ray_token.private_token`)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from study.ray_token import private_token


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
