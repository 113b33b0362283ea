"""The commands printed for the user to paste name ``ponder-study`` as the user's shell reaches it
(issue 34: ``.venv/bin/ponder-study`` run without the venv activated printed a bare
``ponder-study resume ...``, which that shell answers "command not found")."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from study.cli import resume_command
from study.run.lease import _command
from study.spec.spec import load_spec
from study.storage.commands import command_name, run_again
from study.storage.storage import StudyPaths

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``ponder-study`` script in a folder that is not on ``PATH``, running as this process."""
    bin_dir = tmp_path / "my venv" / "bin"
    bin_dir.mkdir(parents=True)
    path = bin_dir / "ponder-study"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(path), "resume", "my study"])
    return path


def test_off_path_the_commands_name_the_script_by_its_shorter_path(
    script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = "'my venv/bin/ponder-study'"  # relative to the working directory, quoted
    assert command_name() == here
    assert run_again() == f"{here} resume 'my study'"
    assert resume_command("s", "results") == f"{here} resume s"
    assert resume_command("s", "/data/x") == f"{here} resume s --storage /data/x"
    assert _command("status", StudyPaths("results", "s")) == f"{here} status s"
    monkeypatch.chdir(script.parent)
    assert command_name() == "./ponder-study"  # a bare name would be looked up on PATH
    far = tmp_path.joinpath(*["d"] * 60)
    far.mkdir(parents=True)
    monkeypatch.chdir(far)
    assert command_name() == shlex.quote(str(script))  # absolute: shorter than 60 `../`


def test_the_bare_name_when_path_finds_this_script_or_it_runs_another_way(
    script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{script.parent}:{SYSTEM_PATH}")
    assert command_name() == "ponder-study"
    assert run_again() == "ponder-study resume 'my study'"
    other = tmp_path / "other"  # PATH finds another ponder-study first: this one by its path
    other.mkdir()
    (other / "ponder-study").write_text("#!/bin/sh\n")
    (other / "ponder-study").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:{script.parent}:{SYSTEM_PATH}")
    assert command_name() == "'my venv/bin/ponder-study'"
    monkeypatch.setattr(sys, "argv", ["/somewhere/study/__main__.py", "list"])  # python -m study
    assert command_name() == "ponder-study"


def test_the_installed_script_off_path_prints_a_command_that_pastes(tmp_path: Path) -> None:
    """The venv's real ``ponder-study``, run by its path from a shell without the venv: the
    command `check` gives to continue an existing study runs in that shell."""
    script = Path(sys.executable).parent / "ponder-study"
    if not script.is_file():
        pytest.skip(f"no ponder-study script beside {sys.executable}")
    spec = tmp_path / "studies" / "parity-smoke" / "spec.toml"
    spec.parent.mkdir(parents=True)
    spec.write_text(load_spec("parity-smoke").source)

    def continues(path: str) -> str:
        done = subprocess.run(
            [str(script), "check", "parity-smoke", "--no-estimate", "--storage", "."],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PATH": path},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        found = re.search(r"`([^`]+) resume parity-smoke` continues it", done.stdout)
        assert found, done.stdout
        return found.group(1)

    off = continues(SYSTEM_PATH)
    assert os.path.samefile(tmp_path / shlex.split(off)[0], script), off
    pasted = subprocess.run(
        ["bash", "-c", f"{off} resume --help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": SYSTEM_PATH, "HOME": str(tmp_path)},
        timeout=120,
    )
    assert pasted.returncode == 0 and pasted.stdout.startswith("usage: ponder-study resume"), pasted
    assert continues(f"{script.parent}:{SYSTEM_PATH}") == "ponder-study"
