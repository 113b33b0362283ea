"""The private names of Ray's this project uses (`study.search.ray_private.PRIVATE`) are still there."""

from __future__ import annotations

import inspect
import math
import os
import pickle
import random
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest
import ray
import ray.train._internal.storage as ray_storage
from ray.tune.schedulers.async_hyperband import _Bracket

from study.search.ray_private import PRIVATE, RAY_CHECKED, _SortedCutoff, incremental_uploads
from study.search.scheduler import PersistentASHA


@pytest.mark.parametrize(("cls", "name"), [(c, n) for c, names in PRIVATE.items() for n in names])
def test_every_private_name_of_ray_used_is_still_there(cls: type, name: str) -> None:
    """An attribute set in ``__init__`` is found in its source; a method or class attribute on
    the class. A failure means the Ray upgrade changed what study/search/ray_private.py relies on."""
    source = inspect.getsource(cls)
    assert hasattr(cls, name) or f"self.{name} =" in source or f"self.{name}:" in source, (
        f"study/search/ray_private.py: Ray {ray.__version__} has no {cls.__name__}.{name} "
        f"(checked against Ray {RAY_CHECKED}); update the adapter before relying on this Ray"
    )


_MONITORS = """
import os, sys
from pathlib import Path
import ray
from study.search.ray_private import stop_local_monitor

def monitors():  # the autoscaler monitors below this process
    from study.run.processes import descendants
    found = []
    for pid, _ in descendants(os.getpid()):
        try:
            if b"autoscaler/_private/monitor.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found

before = stop_local_monitor()
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)  # a cluster's, joined
joined = stop_local_monitor()
ray.shutdown()
ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=1)  # its own
running = monitors()
own = stop_local_monitor()
print(before, joined, len(running), own, len(monitors()), stop_local_monitor())
ray.shutdown()
"""


@pytest.mark.ray
def test_only_the_monitor_of_an_instance_the_process_started_is_killed() -> None:
    """`stop_local_monitor` kills the autoscaler monitor of the driver's own instance (Ray would
    wait out its 1 s of grace at every exit), once, and nothing of a cluster the driver joined."""
    from tests.study.conftest import shared_ray

    address = shared_ray()
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # the shared instance's, as its drivers join it
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", _MONITORS, address], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, joined, running, own, left, again = map(int, done.stdout.split()[-6:])
    assert (before, joined) == (0, 0)  # no Ray yet; a joined cluster's monitor is not the driver's
    assert running == 1 and own == 1 and left == 0 and again == 0


def test_tune_s_json_is_the_same_values_written_by_the_c_encoder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`tune_json_in_c`: Tune's saved form of a trial is the same JSON without its indentation,
    from which Tune restores the trial with its state and statistics; a report's line of
    ``result.json`` is the line Tune wrote, NaN and numpy values included."""
    import json

    import numpy as np
    import ray.tune.experiment.trial as ray_trial
    import ray.tune.logger.json as ray_json_logger
    import ray.tune.trainable.metadata as ray_trial_metadata
    from ray.air._internal.json import SafeFallbackEncoder
    from ray.tune import PlacementGroupFactory
    from ray.tune.experiment import Trial

    from study.search.ray_private import tune_json_in_c

    for module in (ray_trial, ray_trial_metadata, ray_json_logger):  # other tests see Tune's own
        monkeypatch.setattr(module, "json", module.json)
    trial = Trial("__fake", stub=True, config={"lambda_p": 0.2})
    trial.placement_group_factory = PlacementGroupFactory([{"CPU": 1}])  # a stub sets none
    for step in (1, 2, 3):
        trial.update_last_result({"test/halted_accuracy": 0.3 * step, "training_iteration": step})
    indented = trial.get_json_state()
    report = {"a": float("nan"), "b": np.float32(0.5), "c": np.int64(3), "d": [np.bool_(True)], "e": "x"}
    streamed = tmp_path / "streamed.json"
    with streamed.open("w") as f:
        ray_json_logger.json.dump(report, f, cls=SafeFallbackEncoder)
    tune_json_in_c()
    tune_json_in_c()  # once: not wrapped twice
    trial.invalidate_json_state()
    trial.run_metadata.invalidate_cache()
    compact = trial.get_json_state()
    assert all("\n" not in part for part in compact) and all("\n" in part for part in indented)
    assert json.loads(compact[1]) == json.loads(indented[1])
    assert json.loads(compact[0]) == json.loads(indented[0])
    restored = Trial.from_json_state(compact[0], stub=True)
    restored.restore_run_metadata(compact[1])
    assert restored.config == {"lambda_p": 0.2} and restored.trial_id == trial.trial_id
    assert restored.run_metadata.metric_analysis == trial.run_metadata.metric_analysis
    assert restored.last_result["test/halted_accuracy"] == pytest.approx(0.9)
    at_once = tmp_path / "at_once.json"
    with at_once.open("w") as f:
        ray_json_logger.json.dump(report, f, cls=SafeFallbackEncoder)
    assert at_once.read_text() == streamed.read_text()


def test_tune_keeps_running_statistics_of_the_metrics_named_and_elsewhere_of_all() -> None:
    """`running_statistics_of`: within, Tune's statistics of a trial's reports are kept for the
    metrics named alone, computed as Tune computes them; outside, Tune keeps them for every number."""
    from ray.tune.experiment import Trial

    from study.search.ray_private import running_statistics_of

    def reported(n: int) -> Trial:
        trial = Trial("__fake", stub=True)
        for step in range(1, n + 1):
            trial.update_last_result({"acc": 0.1 * step, "loss": 1.0 / step, "training_iteration": step})
        return trial

    plain = reported(6)
    with running_statistics_of(["acc", "training_iteration"]):
        kept = reported(6)
    after = reported(6)
    assert set(kept.run_metadata.metric_analysis) == {"acc", "training_iteration"}
    assert kept.run_metadata.metric_analysis["acc"] == plain.run_metadata.metric_analysis["acc"]
    assert kept.last_result["loss"] == pytest.approx(1 / 6)  # the report itself is whole
    assert (
        set(plain.run_metadata.metric_analysis)
        == set(after.run_metadata.metric_analysis)
        == {
            "acc",
            "loss",
            "training_iteration",
        }
    )


def test_a_rung_s_sorted_cutoff_is_ray_s_bit_for_bit() -> None:
    """`_SortedCutoff` against Ray's own (numpy's nanpercentile of the rung's values), after every
    value a rung gains: floats, ints, ties, NaN (left out), at the reduction factors ASHA takes;
    a float32 value takes Ray's path; a rung replaced by another dict is read afresh."""
    for case in range(400):
        rng = random.Random(case)
        rf = rng.choice([1.5, 2, 2.5, 3, 4])
        cutoff, rung = _SortedCutoff(rf), {}
        for k in range(rng.randint(1, 40)):
            draw = rng.random()
            if draw < 0.05:
                value: Any = float("nan")
            elif draw < 0.15:
                value = rng.randint(-5, 5)
            elif draw < 0.3:
                value = rng.choice([0.25, 0.5, 1.0])
            else:
                value = rng.uniform(-1, 1)
            rung[f"t{k}"] = value
            expected = _ray_cutoff(rung, rf)
            got = cutoff(rung)
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (case, k, got, expected)
    rung = {"a": np.float32(0.25), "b": np.float32(0.7), "c": np.float32(0.5)}  # numpy: in float32
    assert cutoff(rung) == _ray_cutoff(rung, rf) and cutoff(rung).dtype == np.float32
    assert cutoff({}) is None
    assert cutoff({"a": 0.9}) == 0.9  # another dict: not the cache of the one before


def _ray_cutoff(rung: dict[str, Any], rf: float) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN rung
        return _Bracket(1, 10, rf, 0).cutoff(rung)


def test_asha_s_brackets_keep_sorted_cutoffs_through_a_pickle(tmp_path: Path) -> None:
    """PersistentASHA's brackets use the sorted cutoffs, and so does one Tune unpickles (its cache
    left behind, read afresh from the rungs)."""
    asha = PersistentASHA(state_uri=str(tmp_path / "asha.json"), metric="acc", mode="max", max_t=40)
    rung = asha._brackets[0]._rungs[-1][1]
    rung.update({"a": 0.1, "b": 0.4, "c": 0.3})
    assert asha._brackets[0].cutoff(rung) == _ray_cutoff(rung, asha._brackets[0].rf)
    again = pickle.loads(pickle.dumps(asha))
    cutoff = again._brackets[0].cutoff
    assert isinstance(cutoff, _SortedCutoff) and not cutoff._seen
    rung = again._brackets[0]._rungs[-1][1]
    assert cutoff(rung) == _ray_cutoff(rung, again._brackets[0].rf)


def test_tune_s_experiment_uploads_copy_the_files_changed_since_the_last(tmp_path: Path) -> None:
    """Tune's syncer, once `incremental_uploads` is in force: the first upload copies every file
    of the staging folder, the next only those written since (a trial's new report, a new trial's
    folder), a failed one marks nothing copied; what was copied is not pickled with the syncer
    (Tune pickles it with its experiment while a copy runs); an upload with exclusions is Tune's."""
    incremental_uploads()
    staging, storage = tmp_path / "staging", tmp_path / "storage"
    (staging / "trial_a").mkdir(parents=True)
    (staging / "experiment_state.json").write_text("{}")
    (staging / "trial_a" / "result.json").write_text('{"i": 1}\n')
    syncer = ray_storage._FilesystemSyncer(storage_filesystem=pafs.LocalFileSystem())

    def upload() -> int:
        function, kwargs = syncer._sync_up_command(str(staging), str(storage))
        assert function.__name__ == "_upload_changed"
        return int(function(**kwargs))

    assert upload() == 2
    assert (storage / "trial_a" / "result.json").read_text() == '{"i": 1}\n'
    assert upload() == 0
    with open(staging / "trial_a" / "result.json", "a") as f:
        f.write('{"i": 2}\n')
    (staging / "trial_b").mkdir()
    (staging / "trial_b" / "params.json").write_text('{"beta": 0.1}')
    assert upload() == 2
    assert (storage / "trial_a" / "result.json").read_text() == '{"i": 1}\n{"i": 2}\n'
    assert (storage / "trial_b" / "params.json").read_text() == '{"beta": 0.1}'
    (staging / "experiment_state.json").write_text('{"trials": 2}')
    (storage / "experiment_state.json").unlink()
    (storage / "experiment_state.json").mkdir()  # the copy fails: a folder where the file goes
    with pytest.raises(OSError):
        upload()
    (storage / "experiment_state.json").rmdir()
    assert upload() == 1 and (storage / "experiment_state.json").read_text() == '{"trials": 2}'
    copy = pickle.loads(pickle.dumps(syncer))  # as Tune pickles it with its experiment, mid-copy
    function, kwargs = copy._sync_up_command(str(staging), str(storage))
    assert function(**kwargs) == 3  # none of the original's record went with it
    function, _ = syncer._sync_up_command(str(staging), str(storage), exclude=["*.pkl"])
    assert function.__name__ != "_upload_changed"  # Tune's own, which honours the exclusions
