"""``python -m ponder.train`` run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ponder.trainer import TIMING_KEYS

TINY = ["--n-elems", "4", "--max-steps", "4", "--n-hidden", "8", "--batch-size", "16", "--eval-samples", "64"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ponder.train", "--threads", "1", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_json_lines_one_per_evaluation() -> None:
    proc = run(*TINY, "--iterations", "30", "--eval-interval", "10", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [m["iteration"] for m in lines] == [10, 20, 30]
    assert lines[-1]["outcome"] == "completed"
    assert len(lines[-1]["test/per_step_accuracy"]) == 4


def test_progress_lines_and_summary() -> None:
    proc = run(*TINY, "--iterations", "20", "--eval-interval", "10", "--lambda-p", "0.5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("iter ") == 2 and "outcome completed after 20 iterations" in out
    assert '"lambda_p": 0.5' in out and "1/lambda_p = 2.00" in out
    header = next(line for line in out.splitlines() if line.startswith("set "))
    assert "best-step acc" in header and "stable acc" in header


def _json_lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


@pytest.mark.slow  # trains in subprocesses for 10-16 s
def test_resume_trains_on_exactly_as_one_longer_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "run.pt"
    common = [*TINY, "--eval-interval", "10", "--json"]
    first = _json_lines(run(*common, "--iterations", "20", "--checkpoint", str(ckpt)))
    assert ckpt.is_file() and first[-1]["outcome"] == "completed"
    assert _json_lines(run("--resume", str(ckpt), "--json")) == []  # nothing left to do
    more = _json_lines(run("--resume", str(ckpt), "--iterations", "40", "--json"))
    straight = _json_lines(run(*common, "--iterations", "40"))
    assert [m["iteration"] for m in more] == [30, 40]
    # the same numbers as one 40-iteration run (whose first reports still say "running")
    assert [{**m, "outcome": None} for m in first + more] == [{**m, "outcome": None} for m in straight]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--lambda-p", "1.5"], "lambda_p must be in (0, 1]"),
        (["--lambda-p", "0"], "lambda_p must be in (0, 1]"),
        (["--max-steps", "0"], "max_steps must be >= 1"),
        (["--max-steps", "three"], "invalid int value"),
        (["--task", "sudoku"], "invalid choice"),
        (["--beta", "-1"], "beta must be >= 0"),
        (["--task", "mnist", "--n-elems", "3"], "--n-elems is not a flag of task mnist"),
        (["--task", "mnist", "--data-dir", "/nonexistent/mnist"], "no such directory"),
        (["--resume", "/nonexistent/ckpt.pt"], "no such file"),
        (["--bogus"], "unrecognized arguments"),
        (["--kl-direction", "up"], "invalid choice"),
        (["--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--lambda-p", "1.5"],
        ["--max-steps", "three"],
        ["--task", "mnist", "--n-elems", "3"],
        ["--resume", "/nonexistent/ckpt.pt", "--beta", "0.1"],  # a resume refuses it before reading
    ],
)
def test_bad_flags_and_values_answer_before_torch_is_loaded(args: list[str]) -> None:
    """A typo is answered at once, not after two seconds of torch's imports."""
    script = (
        "import sys\nfrom ponder.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr


def test_corrupt_mnist_file_is_one_line(tmp_path: Path) -> None:
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (tmp_path / name).write_bytes(b"\x00\x00\x08\x03" + b"\x00\x00\x00\x05")  # header cut short
    proc = run("--task", "mnist", "--data-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "truncated" in proc.stderr


@pytest.mark.slow  # trains in subprocesses for 10-16 s
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_saves_at_an_iteration_boundary_and_resumes_exactly(tmp_path: Path, sig: int) -> None:
    ckpt = tmp_path / "run.pt"
    common = [*TINY, "--eval-interval", "10", "--json", "--iterations", "100000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ponder.train", "--threads", "1", *common, "--checkpoint", str(ckpt)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())  # it is training: interrupt it
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume with:" in err and "Traceback" not in err
    done = [first] + [json.loads(line) for line in out.splitlines()]
    stopped_at = int(err.split("stopped at iteration ")[1].split()[0])
    assert stopped_at >= done[-1]["iteration"]
    # resumed to the next evaluation, it reports what one uninterrupted run reports there
    target = (stopped_at // 10 + 1) * 10
    resumed = _json_lines(run("--resume", str(ckpt), "--iterations", str(target), "--json"))
    straight = _json_lines(run(*TINY, "--eval-interval", "10", "--json", "--iterations", str(target)))
    assert resumed[-1] == straight[-1]


@pytest.mark.slow  # trains in subprocesses for 10-16 s
def test_resume_refuses_a_changed_config_and_a_shorter_budget(tmp_path: Path) -> None:
    ckpt = tmp_path / "run.pt"
    assert (
        run(*TINY, "--iterations", "10", "--eval-interval", "10", "--checkpoint", str(ckpt)).returncode == 0
    )
    before = ckpt.read_bytes()
    for args, message in (
        (["--lr", "0.1"], "--lr cannot change a resumed run"),
        (["--iterations", "5"], "below the 10 iterations already done"),
    ):
        proc = run("--resume", str(ckpt), *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr
    assert ckpt.read_bytes() == before  # nothing was overwritten


def test_not_a_checkpoint_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "ckpt.pt"
    bad.write_text("hello")
    proc = run("--resume", str(bad))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a ponder checkpoint" in proc.stderr


def test_help_lists_the_config_fields() -> None:
    proc = run("--help")
    assert proc.returncode == 0
    for flag in ("--lambda-p", "--beta", "--max-steps", "--n-elems", "--data-dir", "--json", "--iterations"):
        assert flag in proc.stdout
