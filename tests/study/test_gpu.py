"""A study on a real GPU: four parity-smoke trials with a quarter of the GPU each, all at once on the
one device, then `evaluate` on the GPU and on the CPU. Skipped where torch finds no CUDA device
(the placement logic itself is tested on fake GPUs in test_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from study.records.ranking import ENDED_WITH_RESULT
from study.reports.evaluate import evaluate_trial
from study.spec.check import measure
from study.spec.spec import load_spec
from tests.study.conftest import cli, history, trials
from tests.study.test_evaluate import _check_against_parquet

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]
NAME = "gpu-quarter"


def _peak_overlap(h: pd.DataFrame) -> int:
    """The most trials training at one moment: a trial spans from its first report's timestamp
    less that report's time_total_s to its last report's timestamp (whole seconds)."""
    ts = (h["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds()  # a UTC datetime column
    start = (ts - h["time_total_s"]).groupby(h["trial_id"]).min()
    end = ts.groupby(h["trial_id"]).max()
    return max(int(((start <= t) & (end >= t)).sum()) for t in start)


def test_four_trials_share_the_one_gpu_at_once_and_evaluate_on_it(tmp_path: Path) -> None:
    spec = tmp_path / f"{NAME}.toml"
    spec.write_text(
        load_spec("parity-smoke")
        .source.replace("num_samples = 6", "num_samples = 4")
        .replace("max_concurrent = 2", "max_concurrent = 4")
        .replace("gpu = 0\n", "gpu = 0.25\n")
    )
    storage = tmp_path / "results"
    done = cli("run", str(spec), "--storage", str(storage), own_ray=True, timeout=600)  # Ray sees the GPU
    assert done.returncode == 0, done.stderr[-3000:]

    df = trials(storage, NAME)
    assert len(df) == 4 and set(df["status"]) <= set(ENDED_WITH_RESULT), df["status"]
    assert (df["gpu_ids"] == "0").all(), df["gpu_ids"]  # Ray gave each its quarter of GPU 0
    assert df["device"].str.startswith("cuda:0 ").all(), df["device"]  # and it trained there
    assert _peak_overlap(history(storage, NAME)) == 4

    best = evaluate_trial(NAME, str(storage), device="cuda")
    assert best.device.startswith("cuda:0 ")  # named as the Parquet names it
    _check_against_parquet(best, df.set_index("trial_id").loc[best.trial_id])
    # the GPU trial's checkpoint on the CPU: the same weights, what does not hang on the coins agrees
    on_cpu = cli("evaluate", NAME, "--storage", str(storage), "--device", "cpu", "--trial", best.trial_id)
    assert on_cpu.returncode == 0, on_cpu.stderr[-2000:]
    assert f"trial {best.trial_id}" in on_cpu.stdout and "; on cpu," in on_cpu.stdout


def test_checks_estimate_times_a_whole_fused_group_on_a_gpu(tmp_path: Path) -> None:
    """On a GPU a member-iteration keeps getting cheaper with K: the estimate times all 32 members,
    not the 16 a CPU's estimate stops at."""
    spec = tmp_path / "fused-gpu.toml"
    spec.write_text(load_spec("parity-smoke").source.replace("gpu = 0\n", "gpu = 1\nfuse = 32\n"))
    e = measure(load_spec(str(spec)), budget_s=0.5, members=32)
    assert e.device.startswith("cuda") and e.members == 32 and e.s_per_iteration > 0
