"""``python -m ponder.train`` run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_checkpoint_then_resume_finishes_the_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "run.pt"
    first = run(*TINY, "--iterations", "20", "--eval-interval", "10", "--checkpoint", str(ckpt), "--json")
    assert first.returncode == 0 and ckpt.is_file()
    # a run already completed has nothing left; a longer one is started by a new config
    again = run("--resume", str(ckpt), "--json")
    assert again.returncode == 0 and again.stdout == ""


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
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


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
