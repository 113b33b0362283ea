"""What the resume does to Tune's restored trials before any of them starts again."""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

from ray.train._internal.storage import StorageContext
from ray.tune.experiment import Trial
from ray.tune.registry import register_trainable

from study.run.export import ParquetCallback
from study.run.replay import attach_reported_checkpoint
from study.run.tensorboard import ScalarTensorBoard, _EventFile
from study.storage.storage import CHECKPOINT_FILE


def _restored_trial(root: Path, last_report: dict[str, object]) -> Trial:
    register_trainable("train_trial", lambda config: None)
    storage = StorageContext(storage_path=str(root), experiment_dir_name="study", trial_dir_name="trial")
    trial = Trial("train_trial", config={}, storage=storage, trial_id="abc")
    trial.update_last_result(last_report)
    return trial


def _save(trial: Trial, name: str) -> None:
    directory = Path(trial.storage.trial_fs_path) / name
    directory.mkdir(parents=True)
    (directory / CHECKPOINT_FILE).write_bytes(b"weights")


def test_a_stop_between_report_and_checkpoint_resumes_from_the_reported_checkpoint(tmp_path: Path) -> None:
    """Tune's state saved a report naming checkpoint_000001 but registered only checkpoint_000000
    (or none): the trial goes on from the one its last report names, so it reports nothing twice."""
    trial = _restored_trial(tmp_path, {"training_iteration": 2, "checkpoint_dir_name": "checkpoint_000001"})
    assert trial.checkpoint is None
    assert not attach_reported_checkpoint(trial)  # not on the storage: nothing to attach
    _save(trial, "checkpoint_000000")
    _save(trial, "checkpoint_000001")
    assert attach_reported_checkpoint(trial)
    assert trial.checkpoint is not None and trial.checkpoint.path.endswith("/trial/checkpoint_000001")
    assert not attach_reported_checkpoint(trial)  # Tune's own is that one now


def test_a_report_without_checkpoint_attaches_nothing(tmp_path: Path) -> None:
    trial = _restored_trial(tmp_path, {"training_iteration": 1})
    assert not attach_reported_checkpoint(trial)
    assert trial.checkpoint is None


STUCK = Path(__file__).parent / "data" / "stuck-after-sigkill.tar.gz"
"""A study saved before its export and TensorBoard code moved out of `study.runner` (now
`study.run.runner`)."""


def test_a_study_pickled_before_the_runner_split_still_loads() -> None:
    """Tune restores a study from its tuner.pkl, which names the callbacks' classes by the module
    they were in when it was pickled (``study.runner`` for this one, an old name `study.MOVED`
    keeps): they load, as the classes the study uses now."""
    with tarfile.open(STUCK) as tar:
        (member,) = (m for m in tar.getmembers() if m.name.endswith("/tuner.pkl"))
        file = tar.extractfile(member)
        assert file is not None
        data = file.read()
    assert b"study.runner" in data
    tuner = pickle.loads(data)
    callbacks = tuner["_run_config"].callbacks
    assert {type(c) for c in callbacks} == {ParquetCallback, ScalarTensorBoard}
    (board,) = (c for c in callbacks if isinstance(c, ScalarTensorBoard))
    assert board._summary_writer_cls is _EventFile
