"""The README's commands, pasted in order into a fresh shell (issue 34: its tour answered
"ponder-study: command not found"): its code blocks run by bash in a copy of the repository,
with a minimal environment and the venv not on ``PATH`` until the README activates it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"
STAMP = VENV / ".installed"  # the Makefile's STAMP: `make` builds no venv while it is current

VENV_PIP = 'test "$(command -v pip)" = "$VIRTUAL_ENV/bin/pip"'

SUBSTITUTES: dict[str, tuple[str, str]] = {
    # README command (comment cut) -> (what runs instead, why)
    "make study": (
        "make -n study",
        "the real one runs the default `parity` study (80 s on 2 cores); `-n` checks that the target "
        "exists and builds no venv, and its recipe is the tour's own `ponder-study run`",
    ),
    "make test": ("make -n test", "the whole suite (ten minutes), from inside the suite"),
    "ponder-study check parity": (
        "ponder-study check parity --no-estimate",
        "the estimate times the model's iterations (3-4 s of CPU, an eighth of this test's): "
        "the rest of the check runs",
    ),
    "ponder-study status parity-smoke --watch": (
        "timeout --preserve-status -s INT 10 ponder-study status parity-smoke --watch",
        "it redraws until Ctrl-C: a SIGINT after 10 s, which it leaves on with exit 0",
    ),
    "pip install tensorboard && tensorboard --logdir results/tune/parity-smoke": (
        f"{VENV_PIP}\ntest -d results/tune/parity-smoke",
        "no download in a test: the venv's pip is the one the shell finds, and the folder is there",
    ),
    "pip install optuna-dashboard && optuna-dashboard results/studies/parity-smoke/optuna.journal": (
        f"{VENV_PIP}\ntest -s results/studies/parity-smoke/optuna.journal",
        "no download in a test: the venv's pip is the one the shell finds, and the journal is there",
    ),
}
"""The README's commands that do not run as written, each replaced by cheap ones (a line each:
``set -e`` stops at any) that check what they can. Every other line runs as the README gives
it, `ponder-study run parity-smoke` (the one study) included. The shell's environment adds to a
fresh one only the tests' shared Ray instance (``RAY_ADDRESS``, as `tests.study.conftest.cli`
gives every driver: a driver's own instance costs about 5 s of CPU) and ``OMP_NUM_THREADS=1``
(as ``make test``)."""

SHELL_FENCES = ("sh", "bash", "console")


def _blocks(text: str) -> list[tuple[str, str]]:
    """The README's fenced code blocks, in order: (language, body)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def _command(line: str) -> str:
    """A shell line without its comment (the README's commands quote no ``#``)."""
    return re.sub(r"(^|\s)#.*$", "", line).strip()


def _shell_commands(text: str) -> list[str]:
    return [
        c
        for lang, body in _blocks(text)
        if lang in SHELL_FENCES
        for c in map(_command, body.splitlines())
        if c
    ]


def readme_script(text: str) -> str:
    """The README's shell and Python blocks as one bash script, substitutes in, each command
    announced (``>>> command``) so that a failure shows which one."""
    lines = ["set -e", "if command -v ponder-study; then echo 'on PATH before the venv is'; exit 1; fi"]
    for lang, body in _blocks(text):
        if lang in SHELL_FENCES:
            for command in filter(None, map(_command, body.splitlines())):
                lines.append(f"echo {shlex.quote('>>> ' + command)}")
                lines.append(SUBSTITUTES.get(command, (command, ""))[0])
        elif lang == "python":  # in the venv's `python`, as the README says
            lines.append("echo '>>> the python block'")
            lines.append(f"python - <<'PYTHON'\n{body}PYTHON")
    return "\n".join(lines) + "\necho '>>> the end'\n"


def test_every_substitute_is_for_a_command_the_readme_shows() -> None:
    shown = _shell_commands((REPO / "README.md").read_text())
    assert not set(SUBSTITUTES) - set(shown), set(SUBSTITUTES) - set(shown)
    assert any(c.startswith("source .venv/bin/activate") for c in shown)
    assert "python -m study" not in (REPO / "README.md").read_text()  # `python`: not found


def test_every_ponder_study_command_the_readme_shows_parses() -> None:
    """Each ``ponder-study ...`` of a code block or an inline span, read by the CLI's parser:
    a verb alone must be one of its commands, a whole command line must parse."""
    from study.cli import build_parser

    text = (REPO / "README.md").read_text()
    spans = [" ".join(s.split()) for s in re.findall(r"`(ponder-study [^`]+)`", text)]
    commands = [c for c in _shell_commands(text) if c.startswith("ponder-study ")]
    parser = build_parser()
    verbs = next(a for a in parser._actions if a.dest == "command").choices
    assert verbs is not None
    checked = 0
    for command in {*spans, *commands}:
        args = shlex.split(command)[1:]
        if "..." in args or args[0].startswith("--"):  # an elision; --version: the shell runs it
            continue
        checked += 1
        if len(args) == 1 and args[0] in verbs:
            continue
        try:
            parser.parse_args(args)
        except SystemExit as e:
            raise AssertionError(f"the README's `{command}` does not parse") from e
    assert checked >= 8, checked


def _copy_of_the_repository(to: Path) -> None:
    """The files git knows (tracked, or new and not ignored) and the built venv, linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    (to / ".venv").symlink_to(VENV)
    # a clone's files predate the venv built from them: `make` must not build it again (here it
    # would rebuild the linked one), whatever edits this checkout's pyproject.toml had since
    built = STAMP.stat().st_mtime
    os.utime(to / "pyproject.toml", (built - 1, built - 1))


@pytest.mark.slow
def test_the_readme_pastes_into_a_fresh_shell_in_order(tmp_path: Path) -> None:
    """Every shell line of the README, in order, in one bash (the Python block in its
    ``python``), in a copy of the repository, ``HOME`` empty: each must exit 0."""
    from tests.study.conftest import driver_env

    if not STAMP.exists() or shutil.which("make") is None:
        pytest.skip("needs the built venv (make venv) and make")
    clone, home = tmp_path / "clone", tmp_path / "home"
    clone.mkdir()
    home.mkdir()
    _copy_of_the_repository(clone)
    joined = driver_env(["run"])  # the shared Ray instance (or the caller's own RAY_ADDRESS)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        **{k: joined[k] for k in ("RAY_ADDRESS", "RAY_AUTH_MODE") if k in joined},
        "RAY_AUTH_TOKEN_PATH": str(Path.home() / ".ray" / "auth_token"),  # its token: the real HOME's
    }
    script = readme_script((REPO / "README.md").read_text())
    done = subprocess.run(
        ["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=400
    )
    out = done.stdout
    announced = [line for line in out.splitlines() if line.startswith(">>> ")]
    where = announced[-1] if announced else "(before the first command)"
    assert done.returncode == 0, f"{where} failed:\n{out[-3000:]}\n{done.stderr[-3000:]}"
    assert announced[-1] == ">>> the end"
    make_study = out.split(">>> make study", 1)[1].split(">>> ", 1)[0]
    assert "ponder-study run parity" in make_study and "-m venv" not in make_study, make_study
    assert re.search(r"^ponder-study \S+ \(torch", out, flags=re.M), out[:3000]  # --version
    assert "study parity-smoke: 6 trials" in out  # status, and the watch
    assert (clone / "results" / "reports" / "parity-smoke" / "index.html").is_file()
    python_block = out.split(">>> the python block", 1)[1]
    assert "parity-smoke" in python_block and "test/halted_accuracy" in python_block
