"""The ``ponder-study`` CLI, run for real in a subprocess: bad input gives one clear line on stderr
and exit code 2, before Ray starts, and changes no existing result; help and ``list`` say what
there is."""

from __future__ import annotations

import errno
import hashlib
import json
import shlex
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from study import cli as cli_module
from study.cli import summary
from study.run import diskspace
from study.spec.spec import list_specs, load_spec, parse_spec
from study.storage.storage import StudyPaths, write_parquet
from tests.study.conftest import REPO, cli, trials

pytestmark = pytest.mark.slow

# A valid spec; each spec case below breaks it in one place (``test_base_spec_is_valid`` keeps it so).
BASE = """\
description = "a valid spec that each case breaks in one place"
task = "parity"

[config]
n_elems = 5
n_hidden = 16
batch_size = 32
eval_samples = 200
iterations = 60
eval_interval = 10

[space.lambda_p]
low = 0.05
high = 0.9

[space.beta]
low = 1e-4
high = 0.1

[space.max_steps]
low = 2
high = 8

[search]
sampler = "tpe"
seed = 0
num_samples = 2
max_concurrent = 1

[scheduler]
metric = "test/halted_accuracy"
mode = "max"
grace_period = 10
reduction_factor = 2
"""

# Ray reads $RAY_ADDRESS when the CLI gets no --address: an unusable one makes ray.init() fail
# at once, so a bad input that is not refused before Ray starts shows up as that failure.
NO_RAY = "/no-ray-for-bad-input"


def _broken(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


# (id, CLI arguments, spec TOML written to {spec} or None, substrings the one stderr line must hold);
# {storage} is the smoke study's storage, {tmp} the test's temporary directory.
RUN_SPEC = ("run", "{spec}", "--storage", "{storage}")
CASES: list[tuple[str, tuple[str, ...], str | None, tuple[str, ...]]] = [
    # -- CLI arguments
    ("no-command", (), None, ("required", "COMMAND")),
    ("unknown-command", ("frobnicate",), None, ("invalid choice", "'frobnicate'")),
    ("run-without-spec", ("run", "--storage", "{storage}"), None, ("required", "spec")),
    (
        "num-samples-zero",
        ("run", "parity-smoke", "--num-samples", "0", "--storage", "{storage}"),
        None,
        ("--num-samples", ">= 1", "0"),
    ),
    (
        "num-samples-not-int",
        ("run", "parity-smoke", "--num-samples", "abc", "--storage", "{storage}"),
        None,
        ("--num-samples", "'abc'"),
    ),
    (
        "unknown-shipped-spec",
        ("run", "parity-smok", "--storage", "{storage}"),
        None,
        ("'parity-smok'", "did you mean 'parity-smoke'", *list_specs()),
    ),
    (
        "missing-spec-file",
        ("run", "{tmp}/missing.toml", "--storage", "{storage}"),
        None,
        ("no spec file", "missing.toml"),
    ),
    (
        "bad-name",
        ("run", "parity-smoke", "--name", "bad name/with slash", "--storage", "{storage}"),
        None,
        ("name", "'bad name/with slash'"),
    ),
    ("empty-storage", ("run", "parity-smoke", "--storage", ""), None, ("--storage", "empty")),
    (
        "existing-study",
        ("run", "parity-smoke", "--storage", "{storage}"),
        None,
        ("'parity-smoke'", "already exists", "resume"),
    ),
    (
        "storage-through-a-file",
        ("run", "parity-smoke", "--storage", "{spec}/studies"),
        "",
        ("bad-spec.toml is a file, not a folder", "give a folder"),
    ),
    (  # a pseudo filesystem: reported as a full disk, exit 1, after Ray had started
        "storage-not-writable",
        ("run", "parity-smoke", "--storage", "/proc/ponder-study"),
        None,
        ("/proc/ponder-study cannot be written", "give a folder you can write to"),
    ),
    (
        "resume-storage-not-writable",
        ("resume", "parity-smoke", "--storage", "/proc/ponder-study"),
        None,
        ("/proc/ponder-study cannot be written",),
    ),
    ("resume-unknown", ("resume", "no-such-study", "--storage", "{storage}"), None, ("'no-such-study'",)),
    ("status-unknown", ("status", "no-such-study", "--storage", "{storage}"), None, ("'no-such-study'",)),
    ("export-unknown", ("export", "no-such-study", "--storage", "{storage}"), None, ("'no-such-study'",)),
    ("report-unknown", ("report", "no-such-study", "--storage", "{storage}"), None, ("'no-such-study'",)),
    (
        "evaluate-unknown-trial",
        ("evaluate", "parity-smoke", "--trial", "nope", "--storage", "{storage}"),
        None,
        ("'nope'",),
    ),
    (
        "evaluate-repeats-zero",
        ("evaluate", "parity-smoke", "--repeats", "0", "--storage", "{storage}"),
        None,
        ("--repeats", ">= 1"),
    ),
    # -- spec files
    (
        "spec-unknown-top-key",
        RUN_SPEC,
        _broken("[search]", "[serach]"),
        ("serach", "unknown key", "did you mean 'search'"),
    ),
    (
        "spec-lambda-p-above-1",
        RUN_SPEC,
        _broken("low = 0.05\nhigh = 0.9", "low = 0.05\nhigh = 1.5"),
        ("space.lambda_p.high", "1.5"),
    ),
    (
        "spec-beta-negative",
        RUN_SPEC,
        _broken("low = 1e-4\nhigh = 0.1", "low = -0.1\nhigh = 0.1"),
        ("space.beta.low", "-0.1"),
    ),
    (
        "spec-max-steps-zero",
        RUN_SPEC,
        _broken("low = 2\nhigh = 8", "low = 0\nhigh = 8"),
        ("space.max_steps.low",),
    ),
    (
        "spec-empty-range",
        RUN_SPEC,
        _broken("low = 0.05\nhigh = 0.9", "low = 0.5\nhigh = 0.5"),
        ("space.lambda_p", "above low"),
    ),
    (
        "spec-wrong-type",
        RUN_SPEC,
        _broken("num_samples = 2", 'num_samples = "eight"'),
        ("search.num_samples", "'eight'"),
    ),
    (
        "spec-unreported-metric",
        RUN_SPEC,
        _broken('metric = "test/halted_accuracy"', 'metric = "test/f1_score"'),
        ("scheduler.metric", "test/f1_score"),
    ),
    (
        "spec-invalid-toml",
        RUN_SPEC,
        _broken("n_hidden = 16", "n_hidden = = 16"),
        ("not valid TOML", "bad-spec.toml"),
    ),
]


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root``: a file's sha256, ``dir`` for a directory."""
    snap = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        snap[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return snap


def _diff(before: dict[str, str], after: dict[str, str]) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    return f"added {added[:5]}, removed {removed[:5]}, changed {changed[:5]}"


def test_base_spec_is_valid() -> None:
    """The spec the cases break is itself valid, so each case fails on its one change."""
    assert parse_spec(BASE, "bad-spec").search.num_samples == 2


@pytest.mark.parametrize(("args", "toml", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    args: tuple[str, ...],
    toml: str | None,
    expected: tuple[str, ...],
    smoke: tuple[Path, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage, _ = smoke
    spec = tmp_path / "bad-spec.toml"
    if toml is not None:
        spec.write_text(toml)
    argv = [a.format(storage=storage, tmp=tmp_path, spec=spec) for a in args]
    monkeypatch.setenv("RAY_ADDRESS", NO_RAY)
    before = _snapshot(storage)
    assert any(p.endswith("trials.parquet") for p in before)  # the smoke study's results are there

    start = time.monotonic()
    done = cli(*argv, timeout=120)
    took = time.monotonic() - start

    assert NO_RAY not in done.stderr, f"Ray was started before the input was refused:\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stdout, done.stdout[-3000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"want one line on stderr, got {len(lines)}:\n{done.stderr[-2000:]}"
    (line,) = lines
    assert line.startswith("ponder-study") and "error:" in line, line
    for text in expected:
        assert text in line, (text, line)
    assert _snapshot(storage) == before, _diff(before, _snapshot(storage))
    print(f"{took:.1f}s: {line}")  # shown by pytest -rP
    assert took < 60, f"refusing bad input took {took:.1f}s"


def _help(*args: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "300")  # argparse wraps at the terminal's width, hyphens included
    done = cli(*args, "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == "", done.stderr[-2000:]
    return " ".join(done.stdout.split())


def test_version_names_what_a_bug_report_needs_without_loading_it() -> None:
    script = (
        "import sys\n"
        "from study.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, 'torch' in sys.modules, 'ray' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.stderr.split() == ["0", "False", "False"], done.stderr  # exit 0, nothing heavy imported
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"ponder-study {version('ponder-study')} (torch {version('torch')}, ray "), line
    assert f"optuna {version('optuna')}" in line and f"Python {sys.version.split()[0]}" in line, line
    command = cli("--version", timeout=60)  # the command itself: exit 0, the same line
    assert (command.returncode, command.stdout, command.stderr) == (0, line + "\n", ""), command


@pytest.mark.parametrize("verb", [["run", "parity-smoke"], ["list"], ["slurm", "parity-smoke"]])
def test_a_deleted_current_folder_is_refused_in_one_line(tmp_path: Path, verb: list[str]) -> None:
    """A shell still in a folder that was deleted (``rm -rf`` from another terminal): `run` used to
    start the study, then fail inside ``ray.init`` with a FileNotFoundError and say to resume a
    study it had not written; `list` blamed the storage."""
    gone, storage = tmp_path / "gone", tmp_path / "storage"
    gone.mkdir()
    command = shlex.join([sys.executable, "-m", "study", *verb, "--storage", str(storage)])
    done = subprocess.run(
        ["bash", "-c", f"cd {shlex.quote(str(gone))} && rmdir {shlex.quote(str(gone))} && exec {command}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        "ponder-study: error: the current folder no longer exists (deleted or moved since this shell "
        "entered it); cd to a folder that exists and run this again\n"
    )
    assert not storage.exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux's always-full device)")
@pytest.mark.parametrize("argv", [["check", "parity", "--no-estimate"], ["schema"], ["--version"]])
def test_output_to_a_full_disk_is_one_line_exit_1(argv: list[str]) -> None:
    """``ponder-study check parity > report.txt`` on a full disk: one line naming the error, not a
    traceback (`check` printed one) or exit 0 (``--version``)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "study", *argv], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert (done.returncode, done.stderr) == (1, "ponder-study: error: [Errno 28] No space left on device\n")


OUTPUT_CLOSED = """
import sys
from study.cli.base import output_closed
assert not output_closed(BrokenPipeError())  # stdout's reader is there: a storage's or Ray's pipe
assert not output_closed(OSError())
print("ready", flush=True)
sys.stdin.readline()  # the test closes its end of stdout, then sends a line
assert output_closed(BrokenPipeError())
print("not written", flush=True)  # stdout now goes to /dev/null: no second error
"""


def test_a_broken_pipe_is_the_outputs_only_when_stdouts_reader_has_gone() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", OUTPUT_CLOSED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    proc.stdout.close()
    proc.stdin.write("\n")
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "parity-smoke", "--num-samples", "0"],
        ["run", "parity-smok"],
        ["run", "parity-smoke", "--storage", "/proc/ponder-study"],
        ["resume", "parity-smoke", "--more", "0"],
    ],
    ids=["num-samples", "spec-name", "storage", "more"],
)
def test_bad_input_to_run_or_resume_is_refused_before_ray_is_imported(argv: list[str]) -> None:
    """Refused in about half the time (0.6 s instead of 1.2 s, measured): importing Ray was most
    of a refusal's cost."""
    script = (
        "import sys\n"
        "from study.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    print(e.code, file=sys.stderr)\n"
        "print('ray' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.stdout.split() == ["False"], done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == "2", done.stderr


def test_help_says_what_each_command_does(monkeypatch: pytest.MonkeyPatch) -> None:
    top = _help(monkeypatch=monkeypatch)
    assert top.startswith("usage: ponder-study")
    for command in ("run", "resume", "status", "export", "report", "evaluate", "list"):
        assert f" {command} " in top, command
    assert "Ray Tune" in top and "Parquet" in top

    run = _help("run", monkeypatch=monkeypatch)
    assert run.startswith("usage: ponder-study run")
    assert "Start a new study from a spec" in run
    for name in list_specs():
        assert name in run, name
    for option in ("--num-samples", "--name", "--storage", "--address", "--quiet"):
        assert option in run, option

    resume = _help("resume", monkeypatch=monkeypatch)
    assert resume.startswith("usage: ponder-study resume")
    assert "interrupted study" in resume and "checkpoint" in resume
    assert "--storage" in resume


def test_every_commands_help_begins_with_what_it_does() -> None:
    """Each command's `--help` opens with a sentence of its own (``list`` said "List.")."""
    commands = cli_module.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) >= {"run", "resume", "status", "export", "report", "evaluate", "list", "check"}
    for name, parser in commands.items():
        assert parser.description and len(parser.description.split()) >= 5, (name, parser.description)


def test_help_in_a_narrow_terminal_never_splits_a_specs_name() -> None:
    """argparse wraps at hyphens by default: ``ponder-`` / ``honest-search`` on two lines, which
    a user cannot paste. The CLI wraps at spaces only."""
    done = cli("run", "--help", env={"COLUMNS": "60"}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    words = {w.strip("(),.") for w in done.stdout.split()}
    for name in list_specs():
        assert name in words, name


def test_list_shows_the_shipped_specs_and_the_studies(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    done = cli("list", "--storage", str(storage), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    out = done.stdout
    assert f"studies under {storage}:" in out, out
    specs, studies = out.split(f"studies under {storage}:")
    spec_names = [line.split()[0] for line in specs.splitlines()[1:] if line.strip()]
    assert spec_names == list_specs(), out
    rows = {line.split()[0]: line for line in studies.splitlines() if line.strip()}
    assert list(rows) == ["parity-smoke"], out
    counts = trials(storage, "parity-smoke")["status"].value_counts()
    assert counts.sum() == load_spec("parity-smoke").search.num_samples
    for status, n in counts.items():
        assert f"{n} {status}" in rows["parity-smoke"], (status, n, out)


def test_a_run_that_finishes_leaves_stderr_empty(smoke: tuple[Path, Any]) -> None:
    """stderr is for what went wrong: a study that ran to the end says nothing there (Optuna's
    INFO notice of the study it created was a line of every run)."""
    _, done = smoke
    assert done.stderr == "", done.stderr[-2000:]


def test_an_unusable_ray_address_is_one_line_and_leaves_no_study(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    before = _snapshot(storage)
    args = ("run", "parity-smoke", "--name", "fresh", "--address", "/bogus", "--storage", str(storage))
    done = cli(*args, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert "/bogus" in line and "--address" in line, line
    assert _snapshot(storage) == before, _diff(before, _snapshot(storage))  # the name is still free


def test_a_malformed_fault_drill_is_refused_before_ray_starts(
    smoke: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, _ = smoke
    monkeypatch.setenv("RAY_ADDRESS", NO_RAY)
    monkeypatch.setenv("PONDER_STUDY_FAULT", "raise-at-20")
    done = cli("run", "parity-smoke", "--name", "drill", "--storage", str(storage), timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert "PONDER_STUDY_FAULT" in line and "raise@<iteration>" in line, line
    assert not (storage / "studies" / "drill").exists()


def test_the_storage_variable_is_the_default_storage(
    smoke: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """$PONDER_STUDY_STORAGE (set once on a cluster's nodes) stands in for --storage."""
    storage, _ = smoke
    monkeypatch.setenv("PONDER_STUDY_STORAGE", str(storage))
    done = cli("status", "parity-smoke", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{load_spec('parity-smoke').search.num_samples} trials" in done.stdout
    assert str(storage) in done.stdout  # the Parquet it names is under that storage


@pytest.mark.parametrize(("mode", "top"), [("min", "b"), ("max", "a")])
def test_the_summary_puts_the_objectives_best_end_on_top(tmp_path: Path, mode: str, top: str) -> None:
    """A study minimising its objective lists its lowest values first, one maximising its highest."""
    paths = StudyPaths(str(tmp_path), "s")
    table = pa.table(
        {"trial_id": ["a", "b", "c"], "status": ["completed"] * 3, "train/loss": [0.9, 0.1, 0.5]}
    )
    write_parquet(paths.trials_parquet, table)
    lines = summary(paths, "train/loss", mode).splitlines()
    rows = lines[lines.index("top 3 by train/loss:") + 2 :][:3]
    assert [r.split()[0] for r in rows] == [top, "c", "a" if top == "b" else "b"]


def test_an_interrupted_runs_summary_ranks_only_trials_with_a_result(tmp_path: Path) -> None:
    """Tune saves a running trial as pending: one that has reported is shown running, and only
    trials that ended with a result are ranked; the others are listed apart."""
    paths = StudyPaths(str(tmp_path), "s")
    table = pa.table(
        {
            "trial_id": ["a", "b", "c", "d"],
            "status": ["completed", "early_stopped", "pending", "pending"],
            "iteration": [60, 20, 30, None],
            "test/halted_accuracy": [0.9, 0.7, 0.95, None],
        }
    )
    write_parquet(paths.trials_parquet, table)
    lines = summary(paths).splitlines()
    counts = dict(reversed(c.split()) for c in lines[0].split(": ", 2)[2].split(", "))
    assert counts == {"completed": "1", "early_stopped": "1", "running": "1", "pending": "1"}, lines[0]
    top = lines.index("top 2 by test/halted_accuracy:")
    assert [r.split()[:2] for r in lines[top + 2 : top + 4]] == [["a", "completed"], ["b", "early_stopped"]]
    assert lines[top + 4] == "2 not ranked (no final result):", lines
    assert [r.split()[:2] for r in lines[top + 6 : top + 8]] == [["c", "running"], ["d", "pending"]]


def test_list_sizes_the_name_column_to_the_longest_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = "a-study-name-well-over-twenty-four-characters"
    for name in (long, "short"):
        (tmp_path / "studies" / name).mkdir(parents=True)
        (tmp_path / "studies" / name / "spec.toml").write_text(load_spec("parity-smoke").source)
    assert cli_module.main(["list", "--storage", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert len(rows) == len(list_specs()) + 2
    starts = {len(line) - len(line[2:].split(maxsplit=1)[1]) for line in rows}  # the second column
    assert starts == {2 + len(long) + 1}, rows


def test_a_storage_to_read_that_is_no_folder_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`list` and `status` of a storage that is a file or does not exist say so, not "no study
    named ..." or "no studies yet" (exit 0); a fresh clone's `list` (the default storage, not
    made yet) still lists the specs."""
    monkeypatch.delenv("PONDER_STUDY_STORAGE", raising=False)
    monkeypatch.chdir(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args, expected in [
        (["list", "--storage", str(afile)], f"storage {afile} is a file, not a folder"),
        (["status", "x", "--storage", str(afile)], f"storage {afile} is a file, not a folder"),
        (["list", "--storage", str(tmp_path / "typo")], f"storage {tmp_path / 'typo'} does not exist"),
        (["status", "x", "--storage", str(tmp_path / "typo")], f"storage {tmp_path / 'typo'} does not exist"),
        (["status", "x"], "storage results (the default, no --storage given) does not exist here"),
    ]:
        with pytest.raises(SystemExit) as stop:
            cli_module.main(args)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and expected in err, (args, err)
    assert cli_module.main(["list"]) == 0
    assert "no studies under results yet" in capsys.readouterr().out


def test_one_plot_is_one_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import study.reports.report

    def one(name: str, storage: str, out: str | None = None) -> study.reports.report.Report:
        return study.reports.report.Report(
            str(tmp_path), "index.html", {"a": "a.png", "b": "b.png"}, {"b": "no data"}
        )

    monkeypatch.setattr(study.reports.report, "write_report", one)
    assert cli_module.main(["report", "x", "--storage", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("wrote 1 plot (1 without data: b) and index.html")


def test_the_command_loads_neither_torch_nor_ray_to_check_input_or_read_a_study() -> None:
    """`--help`, a bad spec and `status` answer without torch or Ray (about 1 s of imports
    each): only the commands that train, evaluate or drive Tune load them."""
    code = (
        "import sys\n"
        "from study import cli\n"
        "from study.records.records import load_study_spec\n"
        "from study.spec.spec import load_spec\n"
        "load_spec('parity-smoke')\n"
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_evaluate_answers_a_wrong_trial_without_loading_torch(smoke: tuple[Path, object]) -> None:
    """A typo in a trial id is answered from the study's Parquet, before torch is loaded."""
    storage, _ = smoke
    code = (
        "import sys\n"
        "from study.reports.trial_choice import EvaluateError, choose_trial\n"
        "try:\n"
        f"    choose_trial('parity-smoke', {str(storage)!r}, 'nope')\n"
        "except EvaluateError as e:\n"
        "    print(e, flush=True)\n"
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules), flush=True)\n"
        "import os; os._exit(0)  # past pyarrow's teardown, which can abort at exit (study.cli.verbs.entry)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    why, loaded = out.stdout.strip().splitlines()
    assert "no trial 'nope' in study 'parity-smoke'" in why, out.stdout
    assert loaded == "[]", out.stdout + out.stderr
    done = cli("evaluate", "parity-smoke", "--trial", "nope", "--storage", str(storage))
    assert done.returncode == 2, done.stderr
    assert "no trial 'nope' in study 'parity-smoke'" in done.stderr.strip().splitlines()[-1], done.stderr


def test_a_full_disk_is_named_whatever_error_it_caused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one line says "no space left" for an ENOSPC raised from deeper down, and for any error
    while the storage's disk is (nearly) full: a library that met the full disk first may have
    gone on and then failed reading a file the disk cut short (a JSONDecodeError, seen in CI)."""
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.json"))
    try:
        try:
            raise full
        except OSError as e:
            raise RuntimeError("Tune could not save its state") from e
    except RuntimeError as e:
        assert diskspace.full_disk(e, str(tmp_path)) == (str(tmp_path / "x.json"), "")
    try:
        json.loads('{"trial_data": [1')
    except ValueError as e:
        torn = e
    assert diskspace.full_disk(torn, str(tmp_path / "not" / "yet")) is None  # this disk has room
    assert diskspace.full_disk(torn, "s3://bucket/x") is None
    monkeypatch.setattr(diskspace, "_NEARLY_FULL", 1 << 62)  # every disk is "nearly full"
    where, free = diskspace.full_disk(torn, str(tmp_path / "not" / "yet")) or ("", "")
    assert where == str(tmp_path / "not" / "yet") and free.endswith("KiB free")
    assert diskspace.full_disk(torn, "/proc/x") is None  # no blocks at all: not a full disk


@pytest.mark.parametrize("exit_by", ["entry", "sys.exit"])
def test_the_command_exits_past_the_interpreters_c_teardown(exit_by: str) -> None:
    """`study.cli.verbs.entry` runs Python's exit work (atexit handlers, flushed streams) and then skips
    the interpreter's finalization, where libtorch and pyarrow together can abort (exit 134): an
    object still alive at exit is never finalized. ``sys.exit``, the control, finalizes it, so
    the check can tell the two apart."""
    end = "study.cli.verbs.entry()" if exit_by == "entry" else "print(1, flush=True); sys.exit(0)"
    code = (
        "import atexit, sys\n"
        "import study.cli.verbs\n"
        "class Alive:\n"
        "    def __del__(self):\n"
        "        print('finalized', flush=True)\n"
        "alive = Alive()\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "sys.argv = ['ponder-study', 'schema']\n"
        f"{end}\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.rstrip().splitlines()
    assert "atexit ran" in lines, done.stdout[-500:]
    if exit_by == "entry":
        assert lines[-1] == "atexit ran" and "finalized" not in lines, lines[-3:]
        schema = json.loads(done.stdout[: done.stdout.rindex("atexit ran")])  # printed whole first
        assert schema["$schema"].startswith("https://json-schema.org/")
    else:
        assert lines[-1] == "finalized", lines[-3:]


_SWALLOWED = """
import os, signal, sys
from study.run.stops import install_stop_handlers, raise_a_swallowed_stop

install_stop_handlers()


class Finaliser:
    def __del__(self) -> None:
        {raise_in_finaliser}
        for _ in range(100_000):  # the signal's handler runs here, inside the finaliser
            pass


Finaliser()  # its exception cannot propagate: Python hands it to sys.unraisablehook
print("went on", flush=True)
try:
    raise_a_swallowed_stop()
except KeyboardInterrupt:
    sys.exit(130)
"""

_SIGTERM_SELF = "os.kill(os.getpid(), signal.SIGTERM)"


@pytest.mark.parametrize(
    ("raise_in_finaliser", "code", "shown"),
    [
        ("os.kill(os.getpid(), signal.SIGINT)", 130, None),  # a Ctrl-C the finaliser swallowed
        # the SIGTERM handler ray.init installs while it runs, its SystemExit(15) swallowed
        (f"signal.signal(signal.SIGTERM, lambda n, f: sys.exit(n)); {_SIGTERM_SELF}", 130, None),
        ("raise ValueError('a real bug')", 0, "ValueError: a real bug"),  # any other exception is shown
        ("sys.exit(3)", 0, "SystemExit: 3"),  # and any other exit
    ],
    ids=["ctrl-c", "ray-sigterm", "other-exception", "other-exit"],
)
def test_a_stop_swallowed_where_python_cannot_raise_is_silent_and_raised_again(
    raise_in_finaliser: str, code: int, shown: str | None
) -> None:
    """A Ctrl-C that lands where Python cannot raise (an at-fork hook while Ray starts, a
    finaliser) printed "Exception ignored in ... Traceback" before the clean exit 130 (seen in a
    suite run); so would a SIGTERM while ``ray.init``'s own handler is in. Real signal, real
    finaliser, the command's own handlers."""
    script = _SWALLOWED.replace("{raise_in_finaliser}", raise_in_finaliser)
    run = [sys.executable, "-c", script]
    done = subprocess.run(run, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == code, done.stderr
    assert "went on" in done.stdout  # the exception did not propagate (it cannot there)
    assert ("Traceback" in done.stderr) is (shown is not None), done.stderr
    assert shown is None or shown in done.stderr, done.stderr


_STOPPED_IN_AN_IMPORT = """
import os, signal, sys
import study.cli.drive as drive
import study.cli.verbs as cli
from study.run.stops import install_stop_handlers

install_stop_handlers()


class Field:  # a descriptor as pydantic's, in a class body as ray.data's (imported by ray.tune)
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.{how})  # the stop lands here: Python 3.11 wraps it
        for _ in range(100_000):
            pass


def importing_the_runner():
    class Catalog:
        token = Field()


drive._runner = importing_the_runner
sys.argv = ["ponder-study", "run", "parity-smoke", "--storage", sys.argv[1]]
cli.entry()
"""


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_a_stop_inside_an_imports_class_body_is_an_interruption_not_an_error(
    how: str, tmp_path: Path
) -> None:
    """A Ctrl-C 1 s into a resume, while ``import ray.tune`` defined a class, was reported as
    "error: RuntimeError: Error calling __set_name__ ..." (seen in the signals campaign): Python
    3.11 wraps a KeyboardInterrupt raised there. A real signal, the command's own handlers."""
    script = _STOPPED_IN_AN_IMPORT.replace("{how}", how)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 130, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ponder-study: interrupted; "), done.stderr
    assert f"--storage {tmp_path}" in last and "error" not in last, done.stderr
    assert "Traceback" not in done.stderr


def test_caused_by_ctrl_c_reads_the_whole_chain_of_causes() -> None:
    from study.cli.base import caused_by_ctrl_c

    def wrapped() -> RuntimeError:
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as stop:
                raise RuntimeError("Error calling __set_name__") from stop
        except RuntimeError as outer:
            try:
                raise ValueError("while handling it") from None
            except ValueError:
                return outer

    assert caused_by_ctrl_c(wrapped())
    assert caused_by_ctrl_c(ValueError().with_traceback(None)) is False
    handled = ValueError("raised while handling")
    handled.__context__ = KeyboardInterrupt()
    assert caused_by_ctrl_c(handled)
    loop = RuntimeError("a cycle")
    loop.__context__ = loop
    assert not caused_by_ctrl_c(loop)


_STOPPED_WHILE_PARSING = """
import os, signal, sys
import study.cli.verbs as cli
from study.run.stops import install_stop_handlers

install_stop_handlers()
build_parser = cli.build_parser


def interrupted_parser():
    os.kill(os.getpid(), signal.{how})  # the stop lands as the arguments are read
    return build_parser()


cli.build_parser = interrupted_parser
sys.argv = ["ponder-study", "resume", "my study", "--storage", "/data/x"]
cli.entry()
"""


@pytest.mark.parametrize("how", ["SIGINT", "SIGHUP"])
def test_a_stop_while_the_arguments_are_read_says_the_command_to_run_again(how: str) -> None:
    """A stop after the imports but before `run`/`resume` handle stops themselves ended with a
    bare "interrupted" (seen in the signals campaign: a SIGHUP 0.6 s into a resume): the last
    line must still be the command to continue. A real signal, the command's own handlers."""
    script = _STOPPED_WHILE_PARSING.replace("{how}", how)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 130, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith("run it again: ponder-study resume 'my study' --storage /data/x"), done.stderr
    assert "Traceback" not in done.stderr
