"""What docs/specs.md tells users to open beside a study: TensorBoard over ``tune/<name>/`` and
optuna-dashboard over the journal. Each is read here the way that tool reads it."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from ray.train._internal.storage import StorageContext
from ray.tune.experiment import Trial
from ray.tune.logger import TBXLoggerCallback
from ray.tune.registry import register_trainable
from tensorboardX.proto import event_pb2

from study.records.records import read_end_records
from study.run.tensorboard import ScalarTensorBoard
from study.search.search import OUTCOME_ATTR, STEP, TUNE_ID_ATTR
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths


def _events(event_file: Path) -> list[Any]:
    """The Events of a TensorBoard event file, in the order written: the file is TFRecord (a
    little-endian u64 length, its CRC, the record, the record's CRC), each record an Event."""
    data, at, events = event_file.read_bytes(), 0, []
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        events.append(event_pb2.Event.FromString(data[at + 12 : at + 12 + length]))
        at += 12 + length + 4
    return events


def _scalars(event_file: Path) -> dict[str, list[float]]:
    """Every scalar in a TensorBoard event file, by tag, in the order written."""
    scalars: dict[str, list[float]] = {}
    for event in _events(event_file):
        for value in event.summary.value:
            if value.HasField("histo"):  # what Tune's own logger draws of a list-valued metric
                scalars.setdefault(f"histogram:{value.tag}", [])
            else:
                scalars.setdefault(value.tag, []).append(value.simple_value)
    return scalars


def test_every_trial_directory_has_tensorboard_scalars_equal_to_its_reports(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    trial_dirs = [d for d in (storage / "tune" / "parity-smoke").iterdir() if d.is_dir()]
    assert len(trial_dirs) == load_spec("parity-smoke").search.num_samples
    for trial in trial_dirs:
        reports = [json.loads(line) for line in (trial / "result.json").read_text().splitlines() if line]
        (events,) = trial.glob("events.out.tfevents.*")
        scalars = _scalars(events)
        for metric in ("test/halted_accuracy", "test/mean_halting_step", "nan_events"):
            written = [float(r[metric]) for r in reports]
            assert scalars[f"ray/tune/{metric}"] == pytest.approx(written, rel=1e-6), (trial.name, metric)
        # scalars only (`study.run.tensorboard.ScalarTensorBoard`): the per-step lists are no histograms
        assert isinstance(reports[0]["test/per_step_accuracy"], list)
        assert not [tag for tag in scalars if tag.startswith("histogram:")], trial.name


REPORTS = [
    {
        "training_iteration": i,
        "iteration": 10 * i,
        "timestamp": 1_700_000_000 + i,
        "time_total_s": 1.5 * i,
        "test/halted_accuracy": 0.5 + 0.1 * i,
        "test/mean_halting_step": 3.25,
        "nan_events": 0,
        "diverged": False,
        "loss": float("nan") if i == 2 else 0.7,  # NaN: left out, as Tune's logger leaves it out
        "lr": float("inf"),
        "test/per_step_accuracy": [0.5, 0.75],
        "config": {"lambda_p": 0.2},
        "nested": {"a": 1.0, "b": {"c": 2}},
    }
    for i in (1, 2, 3)
]


class _Staging(StorageContext):
    """A trial's storage whose driver-side staging directory is under the test's, not Ray's
    session directory (no Ray is started here)."""

    @property
    def experiment_driver_staging_path(self) -> str:
        return f"{self.storage_fs_path}/staging/{self.experiment_dir_name}"


def _logged(callback: TBXLoggerCallback, root: Path) -> Path:
    """``REPORTS`` through ``callback`` as Tune calls it for one trial; the trial's event file."""
    register_trainable("fn", lambda config: None)
    storage = _Staging(storage_path=str(root), experiment_dir_name="study", trial_dir_name="trial")
    trial = Trial("fn", config={"lambda_p": 0.2}, storage=storage, trial_id="abc")
    trial.evaluated_params = {"lambda_p": 0.2}
    callback.log_trial_start(trial)
    for r in REPORTS:
        callback.log_trial_result(r["training_iteration"], trial, dict(r))
    callback.log_trial_end(trial)
    (events,) = Path(trial.local_path).glob("events.out.tfevents.*")
    return events


def test_tensorboard_gets_tunes_scalars_in_one_event_per_report(tmp_path: Path) -> None:
    """`ScalarTensorBoard` writes every scalar Tune's own logger writes (tag, value), at the
    model's iteration (the Parquet's step) where Tune's counts reports, no histogram, and a
    report's scalars as one event instead of one event each."""
    ours = _events(_logged(ScalarTensorBoard(), tmp_path / "ours"))  # type: ignore[no-untyped-call]
    tunes = _events(_logged(TBXLoggerCallback(), tmp_path / "tune"))  # type: ignore[no-untyped-call]

    def by_tag(events: list[Any]) -> dict[str, list[tuple[int, float]]]:
        found: dict[str, list[tuple[int, float]]] = {}
        for e in events:
            for v in e.summary.value:
                if v.HasField("simple_value") and not v.tag.startswith("_hparams_"):
                    found.setdefault(v.tag, []).append((e.step, v.simple_value))
        return found

    at_tunes_steps = {t: [(s // 10, v) for s, v in points] for t, points in by_tag(ours).items()}
    assert at_tunes_steps == by_tag(tunes)
    assert by_tag(ours)["ray/tune/test/halted_accuracy"] == [
        (10 * i, pytest.approx(0.5 + 0.1 * i)) for i in (1, 2, 3)
    ]
    assert [s for s, _ in by_tag(ours)["ray/tune/loss"]] == [10, 30]  # the NaN left out
    assert "ray/tune/nested/b/c" in by_tag(ours)
    assert not [v.tag for e in ours for v in e.summary.value if v.HasField("histo")]
    assert [v.tag for e in tunes for v in e.summary.value if v.HasField("histo")]  # Tune's draws one
    with_scalars = [e for e in ours if any(v.HasField("simple_value") for v in e.summary.value)]
    assert len(with_scalars) == len(REPORTS)  # Tune's: one event per scalar
    assert len([e for e in tunes if any(v.HasField("simple_value") for v in e.summary.value)]) > len(REPORTS)
    hparams = [e for e in ours if any(v.tag.startswith("_hparams_") for v in e.summary.value)]
    assert hparams, "the HParams summary at the trial's end (Tune's)"


def test_the_journal_opens_as_optuna_dashboard_opens_it(smoke: tuple[Path, Any], tmp_path: Path) -> None:
    storage, _ = smoke
    journal = tmp_path / "optuna.journal"  # a copy: the shared study is never touched
    shutil.copy(StudyPaths(str(storage), "parity-smoke").optuna_journal, journal)
    study = optuna.load_study(study_name=None, storage=JournalStorage(JournalFileBackend(str(journal))))
    assert study.study_name == "parity-smoke"
    ends = read_end_records(StudyPaths(str(storage), "parity-smoke"))
    history = pd.read_parquet(storage / "history" / "study=parity-smoke")
    assert set(o.outcome for o in ends.values()) >= {"early_stopped"}  # the case Tune skips
    trials = study.get_trials()
    assert {t.user_attrs[TUNE_ID_ATTR] for t in trials} == set(ends)  # one Optuna trial per Tune trial
    searched = {d.name for d in load_spec("parity-smoke").space}
    for t in trials:
        end = ends[t.user_attrs[TUNE_ID_ATTR]]
        assert set(t.params) == searched
        assert all(t.params[k] == pytest.approx(end.config[k]) for k in searched)
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert t.value == pytest.approx(end.last_result["test/halted_accuracy"])
        # how it ended, which Optuna's state cannot say (an ASHA stop is COMPLETE too)
        assert (t.user_attrs[OUTCOME_ATTR], t.user_attrs[STEP]) == (end.outcome, end.iteration)
        # every report, the one ASHA stopped it on included, at the Parquet's iteration
        reports = history[history["trial_id"] == end.trial_id]
        assert t.intermediate_values == pytest.approx(
            dict(zip(reports["iteration"], reports["test/halted_accuracy"], strict=True))
        )
