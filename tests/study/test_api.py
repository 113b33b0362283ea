"""The Python API (`import study`) against its CLI twin on the same study: the same files, the same
summary and importance, the same best trial and evaluation, the same report; a kernel's interrupt
in the middle of `study.run`, then `study.resume`; `study.load` of a running study (from another
process) and of a copy on S3 (moto). One study serves every test of the module: `api` runs it from
a Python process of its own, as a notebook's kernel would, on the suite's Ray instance; the test
process reads it and never imports Ray (an in-process driver would read Ray's settings, its token
among them, as whichever earlier test imported Ray left them)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import study
from study.storage.storage import StudyPaths
from tests.study.conftest import REPO, S3, cli, driver_env

NAME = "parity-smoke"
ON_THE_STUDY = pytest.mark.xdist_group("api")
"""The tests of the module's one study, kept in one test process: it runs once."""

_LOAD_WHILE_RUNNING = """
import json, sys, time, study
from study.storage.storage import StudyPaths, read_json

paths = StudyPaths(sys.argv[2], sys.argv[1])
deadline = time.monotonic() + 240
while (read_json(paths.lease) or {}).get("command") != "resume" and time.monotonic() < deadline:
    time.sleep(0.05)  # imported already, waiting for `study.resume` to take the study
s = study.load(sys.argv[1], sys.argv[2])
f = s.freshness()
trials = s.trials()
ended = trials[trials["status"].isin(["completed", "early_stopped"])]["trial_id"]
print(json.dumps({"driver": f.driver, "statuses": f.statuses, "text": str(f), "ended": sorted(ended)}))
"""


_DRIVE = """
import _thread, json, signal, sys, threading, time
import study
from study.records.records import read_end_records
from study.storage.storage import StudyPaths

name, storage = sys.argv[1], sys.argv[2]
paths = StudyPaths(storage, name)


def interrupt_once_a_trial_ended():
    while not read_end_records(paths):
        time.sleep(0.05)
    _thread.interrupt_main()  # SIGINT's handler in the main thread, as a kernel's interrupt: Tune's


out, before = {}, signal.getsignal(signal.SIGINT)
threading.Thread(target=interrupt_once_a_trial_ended, daemon=True).start()
try:
    study.run(name, storage=storage, progress=False)  # joins $RAY_ADDRESS, the suite's instance
except study.StudyInterrupted as e:
    out["interrupted"] = str(e)
import ray

out["handler_back"] = signal.getsignal(signal.SIGINT) is before
out["ray_left"] = not ray.is_initialized()
ends = read_end_records(paths).values()
accuracy = "test/halted_accuracy"
out["ended_before"] = {r.trial_id: [r.outcome, r.iteration, r.last_result[accuracy]] for r in ends}
ray.init(log_to_driver=False)  # a notebook's own: `resume` uses it, and leaves it up
study.resume(name, storage, progress=False)
out["ray_kept"] = ray.is_initialized()
ray.shutdown()
print(json.dumps(out))
"""


@dataclass
class ApiStudy:
    """The module's study: run by `study.run`, interrupted, resumed by `study.resume`."""

    it: study.Study
    storage: Path
    driven: dict[str, Any]
    """What the driving process saw (`_DRIVE`): the interrupt's message, the end records when it
    came, the SIGINT handler and Ray after the run and the resume."""
    seen_running: dict[str, Any]
    """What `study.load` in another process read while the study ran."""
    driver_pid: int


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiStudy]:
    """``parity-smoke`` run by `study.run` in a Python process of its own, as a notebook's kernel
    runs it (the test process never imports Ray); once its first trial has ended, a
    KeyboardInterrupt lands in its main thread as a kernel's interrupt does; then `study.resume`
    finishes it on the Ray that process started (a notebook's ``ray.init()``), and `study.load`
    in another process reads it as the resume runs."""
    storage = tmp_path_factory.mktemp("api")
    seen: dict[str, Any] = {}

    def read_while_it_runs() -> None:  # started first: its imports take seconds
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_WHILE_RUNNING, NAME, str(storage)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        seen.update(json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-3000:]})

    reader = threading.Thread(target=read_while_it_runs, daemon=True)
    reader.start()
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVE, NAME, str(storage)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=driver_env(["run"]),  # the suite's Ray instance, as the CLI's drivers join it
    )
    out, err = driver.communicate(timeout=600)
    reader.join(60)
    assert driver.returncode == 0, err[-3000:]
    yield ApiStudy(study.load(NAME, storage), storage, json.loads(out), seen, driver.pid)


@ON_THE_STUDY
def test_an_interrupt_stops_the_run_resumably_and_resume_loses_nothing(api: ApiStudy) -> None:
    driven = api.driven
    assert f"study.resume({NAME!r}, storage={str(api.storage)!r})" in driven["interrupted"], driven
    assert driven["handler_back"]  # the caller's Ctrl-C handler is back
    assert driven["ray_left"] and driven["ray_kept"]  # a Ray it joined it left; the caller's own it kept
    ended_before = driven["ended_before"]
    assert 1 <= len(ended_before) < 6, ended_before
    trials = api.it.trials()
    assert len(trials) == 6 and trials["trial_id"].is_unique
    assert set(trials["status"]) <= {"completed", "early_stopped"}, trials["status"]
    ended = trials.set_index("trial_id")
    for trial_id, (outcome, iteration, accuracy) in ended_before.items():  # kept as it ended
        assert (ended.at[trial_id, "status"], ended.at[trial_id, "iteration"]) == (outcome, iteration)
        assert ended.at[trial_id, "test/halted_accuracy"] == accuracy
    history = api.it.history()
    assert not history.duplicated(["trial_id", "iteration"]).any()  # no report twice
    assert set(history["trial_id"]) == set(trials["trial_id"])
    optuna_trials = api.it.optuna().trials
    assert len(optuna_trials) == 6  # no trial asked for twice
    assert sorted(t.value for t in optuna_trials) == sorted(trials["test/halted_accuracy"])


@ON_THE_STUDY
def test_load_reads_a_running_study_from_another_process(api: ApiStudy) -> None:
    seen = api.seen_running
    assert "error" not in seen, seen.get("error")
    assert seen["driver"] is not None and f"(pid {api.driver_pid} on host " in seen["driver"], seen
    assert "running now: `resume`" in seen["text"], seen["text"]
    assert set(api.driven["ended_before"]) <= set(seen["ended"]), seen  # what had ended, read as it runs


@ON_THE_STUDY
def test_the_api_runs_the_study_the_cli_runs(api: ApiStudy, smoke: tuple[Path, object]) -> None:
    """`study.run` and ``ponder-study run`` of one spec: the same saved spec, the same Parquet
    schema, the same first (seeded, random) configurations, trained to the same metrics."""
    cli_storage, _ = smoke
    spec = {}
    for storage in (api.storage, cli_storage):
        text = Path(StudyPaths(str(storage), NAME).spec).read_text()
        spec[storage] = text.replace(str(storage), "<storage>")
    assert spec[api.storage] == spec[cli_storage]
    schemas = [
        pq.read_table(StudyPaths(str(s), NAME).table_dir(kind)).schema.remove_metadata()  # the folder
        for s in (api.storage, cli_storage)
        for kind in ("trials", "history")
    ]
    assert schemas[:2] == schemas[2:]
    cli_study = study.load(NAME, cli_storage)
    for number in (0, 1):  # TPE's random start, seeded: the same two first trials
        mine, theirs = (s.optuna().trials[number] for s in (api.it, cli_study))
        assert mine.params == theirs.params
        curves = [
            h[h["trial_id"] == t.user_attrs["tune_trial_id"]].set_index("iteration")
            for h, t in ((api.it.history(), mine), (cli_study.history(), theirs))
        ]
        common = curves[0].index.intersection(curves[1].index)
        assert len(common) >= 1
        pd.testing.assert_series_equal(
            curves[0].loc[common, "test/halted_accuracy"], curves[1].loc[common, "test/halted_accuracy"]
        )


@ON_THE_STUDY
def test_status_reads_as_the_study_summary_and_importance(api: ApiStudy) -> None:
    done = cli("status", NAME, "--storage", str(api.storage))
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == f"{api.it.summary()}\n{api.it.importance()}"
    top = done.stdout.split(" by test/halted_accuracy:\n", 1)[1].splitlines()[1].split()[0]
    assert api.it.best()["trial_id"] == top
    files = pd.read_parquet(api.storage / "trials" / f"study={NAME}").sort_values("trial_id")
    mine = api.it.trials().sort_values("trial_id")
    pd.testing.assert_frame_equal(mine.reset_index(drop=True), files.reset_index(drop=True))
    history = pd.read_parquet(api.storage / "history" / f"study={NAME}")
    key = ["trial_id", "report"]
    pd.testing.assert_frame_equal(
        api.it.history().sort_values(key).reset_index(drop=True),
        history.sort_values(key).reset_index(drop=True),
    )


def _measured(text: str) -> list[list[str]]:
    """An evaluation's table without its timings: per set, its name, n, the accuracies, the mean
    halting step and the step calls (``1.95 of 6``, ``6 of 6``)."""
    return [line.split()[:11] for line in text.splitlines() if re.match(r"(test|easy|hard) +\d+ ", line)]


@ON_THE_STUDY
def test_evaluate_and_model_are_the_clis_evaluation(api: ApiStudy) -> None:
    import torch

    done = cli("evaluate", NAME, "--storage", str(api.storage), "--repeats", "1")
    assert done.returncode == 0, done.stderr
    mine = api.it.evaluate(repeats=1)
    assert mine.trial_id == api.it.best()["trial_id"]
    assert str(mine).splitlines()[:3] == done.stdout.splitlines()[:3]  # the trial, its checkpoint
    assert _measured(str(mine)) == _measured(done.stdout) and len(_measured(done.stdout)) == 3
    model = api.it.model()
    assert not model.training
    test = next(s for s in mine.sets if s.name == "test")
    x = torch.randint(-1, 2, (test.n, 5)).float()
    out = model.infer(x)
    assert out.halting_step.min() >= 1 and out.halting_step.max() <= mine.max_steps


@ON_THE_STUDY
def test_report_and_plots_are_the_clis_report(api: ApiStudy, tmp_path: Path) -> None:
    done = cli("report", NAME, "--storage", str(api.storage), "--out", str(tmp_path / "cli"))
    assert done.returncode == 0, done.stderr
    mine = api.it.report(tmp_path / "api")
    assert sorted(p.name for p in (tmp_path / "api").iterdir()) == sorted(
        p.name for p in (tmp_path / "cli").iterdir()
    )
    for kind, path in mine.plots.items():
        theirs = (tmp_path / "cli" / f"{kind}.png").read_bytes()
        assert Path(path).read_bytes() == theirs, kind
        figure = api.it.plot(kind)
        assert figure.axes, kind
        if kind in ("sensitivity", "halting_distribution"):  # drawn to the pixel (1 s each)
            png = tmp_path / f"{kind}.png"
            figure.savefig(png, format="png", dpi=100)  # the report's resolution
            assert png.read_bytes() == theirs, kind
    with pytest.raises(study.ReportError, match="sensitivity"):
        api.it.plot("sensitivty")


@ON_THE_STUDY
def test_resume_of_a_finished_study_and_list_are_the_clis(
    api: ApiStudy, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = Path(StudyPaths(str(api.storage), NAME).spec)
    written = spec_file.stat().st_mtime_ns
    done = cli("resume", NAME, "--storage", str(api.storage))
    assert done.returncode == 0 and "is finished (6 trials): nothing to resume" in done.stdout
    again = study.resume(NAME, api.storage)
    said = capsys.readouterr().out
    assert f"is finished (6 trials): nothing to resume; to add trials: study.resume({NAME!r}" in said
    assert again.summary() == api.it.summary() and spec_file.stat().st_mtime_ns == written
    listed = cli("list", "--storage", str(api.storage))
    assert re.search(rf"^  {NAME} +\S", listed.stdout, flags=re.M), listed.stdout
    assert study.list_studies(api.storage) == [NAME]


@ON_THE_STUDY
def test_load_reads_a_copy_on_s3_as_the_study_itself(api: ApiStudy, s3: S3) -> None:
    bucket = s3.bucket()
    pafs.copy_files(str(api.storage), f"{bucket.removeprefix('s3://')}/moved", destination_filesystem=s3.fs())
    there = study.load(NAME, f"{bucket}/moved")
    key = "trial_id"
    pd.testing.assert_frame_equal(
        there.trials().sort_values(key).reset_index(drop=True),
        api.it.trials().sort_values(key).reset_index(drop=True),
    )
    assert there.best()["trial_id"] == api.it.best()["trial_id"]
    assert str(there.importance()) == str(api.it.importance())  # its journal's copy, on S3
    assert _measured(str(there.evaluate(repeats=1))) == _measured(str(api.it.evaluate(repeats=1)))
    assert there.freshness().driver is None
    with pytest.raises(study.StudyError, match=f"studies there: {NAME}"):
        study.load("no-such-study", f"{bucket}/moved")


# -- no Ray: the checks before anything starts, and what `import study` costs ----------------------


def test_check_is_the_clis_check_as_data() -> None:
    done = cli("check", NAME, "--no-estimate")
    assert done.returncode == 0, done.stderr
    checked = study.check(NAME, estimate=False)
    assert str(checked) == done.stdout.rstrip("\n")
    assert (checked.trials, checked.budget, checked.fuse, checked.wall_s) == (6, 360, 1, None)
    assert checked.least_budget < checked.budget and checked.at_once == min(2, checked.fits)


_BAD_DICT = """
import json, sys, tomllib
import study
from pathlib import Path

doc = tomllib.loads(Path(sys.argv[2]).read_text())
doc["space"]["lamda_p"] = doc["space"].pop("lambda_p")
try:
    study.run(doc, name="typo", storage=sys.argv[1])
except study.SpecError as e:
    print(json.dumps({"key": e.key, "message": str(e), "ray": "ray" in sys.modules,
                      "torch": "torch" in sys.modules}))
"""


def test_a_dict_spec_with_a_bad_key_raises_before_ray_and_writes_nothing(tmp_path: Path) -> None:
    shipped = REPO / "study" / "spec" / "specs" / f"{NAME}.toml"
    storage = tmp_path / "results"
    args = [sys.executable, "-c", _BAD_DICT, str(storage), str(shipped)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    refused = json.loads(done.stdout)
    assert refused["key"].startswith("space.lamda_p"), refused
    assert "lambda_p" in refused["message"] and "\n" not in refused["message"]
    assert refused["ray"] is False  # refused before Ray was imported, as the CLI refuses
    assert not storage.exists() and list(tmp_path.iterdir()) == []


def test_a_spec_the_api_cannot_take_is_refused_naming_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(study.SpecError, match="pass name="):
        study.run({"task": "parity"}, storage=tmp_path)
    with pytest.raises(study.SpecError, match="num_samples must be a positive integer"):
        study.run(NAME, num_samples=0, storage=tmp_path)
    with pytest.raises(study.SpecError, match="not a spec"):
        study.check(3.5)  # type: ignore[arg-type]
    with pytest.raises(study.StorageError, match="is a file"):
        (tmp_path / "file").write_text("")
        study.run(NAME, storage=tmp_path / "file" / "results")
    with pytest.raises(study.StudyError, match="no study named 'nope'"):
        study.load("nope", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


_IMPORT = """
import json, sys, study
names = {name: type(getattr(study, name)).__name__ for name in study.__all__ if name != "Evaluation"}
print(json.dumps({"ray": "ray" in sys.modules, "torch": "torch" in sys.modules, "names": names,
                  "run": callable(study.run), "folder": study.run.__name__, "dir": dir(study)}))
"""


def test_import_study_imports_neither_ray_nor_torch() -> None:
    """In a fresh interpreter: every public name, asked for, imports neither (the plots, a model
    and a run import them when called), but `study.Evaluation`, the result of a checkpoint run
    with torch, whose module is torch's."""
    done = subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert (found["ray"], found["torch"]) == (False, False)
    assert found["run"] and found["folder"] == "study.run"  # the folder, callable: `study.run(spec)`
    assert set(study.__all__) <= set(found["dir"])
    assert found["names"]["Study"] == "type" and found["names"]["load"] == "function"


def test_every_public_name_is_typed_and_the_package_says_so() -> None:
    import importlib.resources
    import inspect
    import tomllib

    assert importlib.resources.files("study").joinpath("py.typed").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["study"]
    functions = [getattr(study, n) for n in study.__all__ if inspect.isfunction(getattr(study, n))]
    methods = [m for _, m in inspect.getmembers(study.Study, inspect.isfunction) if m.__name__[0] != "_"]
    assert len(functions) >= 5 and len(methods) >= 10
    untyped = []
    for fn in [*functions, *methods]:
        signature = inspect.signature(fn)
        if signature.return_annotation is inspect.Signature.empty:
            untyped.append(f"{fn.__qualname__} -> ?")
        untyped += [
            f"{fn.__qualname__}({p.name})"
            for p in signature.parameters.values()
            if p.name != "self" and p.annotation is inspect.Parameter.empty
        ]
    assert not untyped, untyped
    assert inspect.signature(study.run).parameters["spec"].annotation == "SpecLike"


def test_the_api_page_lists_every_public_name_from_its_own_module() -> None:
    """docs/api.md's reference (`study.api.reference`, generated) names each of `study.__all__`,
    read from the module `study` takes it from."""
    from study.api.reference import HOMES

    assert set(HOMES) | {"MOVED"} == set(study.__all__)
    for name, module in HOMES.items():
        assert getattr(study, name) is getattr(sys.modules[module], name) or name == "run", name
    page = (REPO / "docs" / "api.md").read_text()
    for name in HOMES:
        assert f"`study.{name}" in page, name
