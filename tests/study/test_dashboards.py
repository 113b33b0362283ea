"""What docs/specs.md tells users to open beside a study: TensorBoard over ``tune/<name>/`` and
optuna-dashboard over the journal. Each is read here the way that tool reads it."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from tensorboardX.proto import event_pb2

from study.records import read_end_records
from study.search import TUNE_ID_ATTR
from study.spec import load_spec
from study.storage import StudyPaths


def _scalars(event_file: Path) -> dict[str, list[float]]:
    """Every scalar in a TensorBoard event file, by tag, in the order written: the file is TFRecord
    (a little-endian u64 length, its CRC, the record, the record's CRC), each record an Event."""
    data, at, scalars = event_file.read_bytes(), 0, {}
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
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
        # scalars only (`study.runner.ScalarTensorBoard`): the per-step lists are no histograms
        assert isinstance(reports[0]["test/per_step_accuracy"], list)
        assert not [tag for tag in scalars if tag.startswith("histogram:")], trial.name


def test_the_journal_opens_as_optuna_dashboard_opens_it(smoke: tuple[Path, Any], tmp_path: Path) -> None:
    storage, _ = smoke
    journal = tmp_path / "optuna.journal"  # a copy: the shared study is never touched
    shutil.copy(StudyPaths(str(storage), "parity-smoke").optuna_journal, journal)
    study = optuna.load_study(study_name=None, storage=JournalStorage(JournalFileBackend(str(journal))))
    assert study.study_name == "parity-smoke"
    ends = read_end_records(StudyPaths(str(storage), "parity-smoke"))
    trials = study.get_trials()
    assert {t.user_attrs[TUNE_ID_ATTR] for t in trials} == set(ends)  # one Optuna trial per Tune trial
    searched = {d.name for d in load_spec("parity-smoke").space}
    for t in trials:
        end = ends[t.user_attrs[TUNE_ID_ATTR]]
        assert set(t.params) == searched
        assert all(t.params[k] == pytest.approx(end.config[k]) for k in searched)
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert t.value == pytest.approx(end.last_result["test/halted_accuracy"])
