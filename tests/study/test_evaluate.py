"""``evaluate``: a trained smoke trial's checkpoint run with real early exit, against its Parquet row."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import torch

from study.records.ranking import ENDED_WITH_RESULT
from study.reports.evaluate import (
    EvaluateError,
    Evaluation,
    SetEvaluation,
    evaluate_trial,
    format_evaluation,
)
from study.storage.storage import StudyPaths, read_bytes, read_table, write_bytes, write_parquet
from tests.study.conftest import S3, trials

NAME = "parity-smoke"
Smoke = tuple[Path, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def best(smoke: Smoke) -> Evaluation:
    return evaluate_trial(NAME, str(smoke[0]))


def _row(storage: Path, trial_id: str) -> pd.Series:
    df = trials(storage, NAME).set_index("trial_id")
    return df.loc[trial_id]


def _check_against_parquet(e: Evaluation, row: pd.Series) -> None:
    """Early exit runs fewer steps than the full unroll, with the accuracy the trial recorded."""
    assert (e.max_steps, e.iteration) == (row["max_steps"], row["iteration"])
    assert e.lambda_p == pytest.approx(row["lambda_p"]) and e.beta == pytest.approx(row["beta"])
    columns = [c for c in row.index if c.endswith("/halted_accuracy") and not c.startswith("best/")]
    assert {s.name for s in e.sets} == {c.split("/")[0] for c in columns if pd.notna(row[c])}
    for s in e.sets:
        n, r = s.n, float(row[f"{s.name}/halted_accuracy"])
        assert n == row["eval_samples"] == 200
        # the step function ran fewer times per sample than the full unroll's max_steps
        assert s.step_calls_per_sample == pytest.approx(s.mean_halting_step)
        assert 1.0 <= s.step_calls_per_sample < e.max_steps
        assert 1 <= s.step_calls_per_batch <= e.max_steps
        # other coins than training's, the same law: equal within the binomial standard error
        assert abs(s.halted_accuracy - r) <= 4 * math.sqrt(r * (1 - r) / n) + 1 / n, (s, r)
        assert s.recorded_halted_accuracy == pytest.approx(r)
        # training's own path on the loaded weights gives the recorded number back (to a sample)
        assert abs(s.full_unroll_accuracy - r) <= 1 / n + 1e-6, (s, r)
        assert len(s.early_exit_times) == len(s.full_unroll_times) == e.repeats
        assert s.early_exit_s > 0 and s.full_unroll_s > 0
        assert s.speedup == pytest.approx(s.full_unroll_s / s.early_exit_s)


def test_the_default_is_the_best_ended_trial_by_the_studys_metric(smoke: Smoke, best: Evaluation) -> None:
    storage, _ = smoke
    df = trials(storage, NAME)
    ended = df[df["status"].isin(ENDED_WITH_RESULT)]
    assert best.chosen_by == "test/halted_accuracy (max)"
    row = _row(storage, best.trial_id)
    assert row["status"] in ENDED_WITH_RESULT
    assert row["test/halted_accuracy"] == ended["test/halted_accuracy"].max()
    assert best.checkpoint == row["checkpoint_path"] and best.device == "cpu"
    _check_against_parquet(best, row)


def test_a_named_trial_is_evaluated(smoke: Smoke, best: Evaluation) -> None:
    storage, _ = smoke
    df = trials(storage, NAME)
    others = df[df["status"].isin(ENDED_WITH_RESULT) & (df["trial_id"] != best.trial_id)]
    trial_id = str(others.sort_values("max_steps", ascending=False)["trial_id"].iloc[0])
    e = evaluate_trial(NAME, str(storage), trial_id, repeats=2)
    assert (e.trial_id, e.chosen_by, e.repeats) == (trial_id, None, 2)
    _check_against_parquet(e, _row(storage, trial_id))


def test_the_table_shows_each_set_against_the_full_unroll(best: Evaluation) -> None:
    text = format_evaluation(best)
    print(text)
    assert f"trial {best.trial_id}" in text and "best by test/halted_accuracy (max)" in text
    lines = text.splitlines()
    for s in best.sets:
        line = next(line for line in lines if line.startswith(f"{s.name} "))
        assert f"{s.halted_accuracy:.3f}" in line and f"{s.recorded_halted_accuracy:.3f}" in line
        assert f"of {best.max_steps}" in line
        assert line.endswith(f"{s.speedup:.2f}x" if s.times_differ else " -")
        saved = s.step_calls_per_batch < best.max_steps
        assert (f"{s.name}: halting saved no step call" in text) is not saved


def _evaluation(calls: int, early: tuple[float, ...], full: tuple[float, ...]) -> Evaluation:
    """An evaluation of one set of 200 samples, ``calls`` step calls on the batch of max_steps 6,
    each pass timed ``len(early)`` times."""
    s = SetEvaluation(
        name="test",
        n=200,
        halted_accuracy=0.62,
        mean_halting_step=1.94,
        step_calls_per_sample=1.94,
        step_calls_per_batch=calls,
        early_exit_times=early,
        full_unroll_accuracy=0.605,
        full_unroll_times=full,
        recorded_halted_accuracy=0.605,
    )
    return Evaluation(NAME, "t0", "completed", "/ckpt", 60, 0.5, 0.01, 6, "cpu", len(early), None, [s])


def _row_of(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("test "))


CAUSES = ("because", "only from", "cost time", "fewer samples")
"""Words of a cause: the figures show the step calls made, not why a pass took its time."""


def test_a_ratio_inside_the_timings_spread_is_neither_printed_nor_explained() -> None:
    # a loaded machine: one full unroll took 44.5 ms and the next 0.66 ms, around early exit's
    text = format_evaluation(_evaluation(6, (0.0011, 0.0012, 0.0010), (0.0445, 0.00066, 0.0009)))
    row = _row_of(text)
    assert row.endswith(" -") and "x" not in row.split()[-1]
    assert "900 us (660 us-44.50 ms)" in row and "1.10 ms (1.00-1.20)" in row  # median (range)
    assert "test: halting saved no step call: some sample pondered to step 6 (max_steps)" in text
    assert not any(cause in text for cause in CAUSES), text


def test_a_ratio_outside_the_spread_is_printed_with_no_cause() -> None:
    # every early-exit timing above every full unroll's, no step saved: the ratio, and no "why"
    text = format_evaluation(_evaluation(6, (0.0020, 0.0021, 0.0022), (0.0011, 0.0012, 0.0013)))
    assert _row_of(text).endswith(" 0.57x") and "saved no step call" in text
    assert not any(cause in text for cause in CAUSES), text
    # fewer step calls than max_steps and apart: the ratio, and no note
    text = format_evaluation(_evaluation(4, (0.0010, 0.0011, 0.0012), (0.0020, 0.0021, 0.0022)))
    assert _row_of(text).endswith(" 1.91x") and "saved no step" not in text


def test_one_timing_a_pass_says_so_and_shows_no_range() -> None:
    text = format_evaluation(_evaluation(4, (0.001,), (0.002,)))
    assert "the median (range) of 1 run each" in text and "(" not in _row_of(text)


def _one_line(exc: pytest.ExceptionInfo[EvaluateError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


def test_an_unknown_trial_or_study_is_one_line_naming_what_there_is(smoke: Smoke) -> None:
    storage, _ = smoke
    with pytest.raises(EvaluateError) as exc:
        evaluate_trial(NAME, str(storage), "nosuchtrial")
    message = _one_line(exc)
    assert "'nosuchtrial'" in message and str(trials(storage, NAME)["trial_id"].iloc[0]) in message
    with pytest.raises(EvaluateError) as exc:
        evaluate_trial("no-such-study", str(storage))
    assert "'no-such-study'" in _one_line(exc) and NAME in str(exc.value)


def _copy_study(smoke: Smoke, root: str, checkpoint: Any = "keep", trial_id: str | None = None) -> str:
    """The smoke study's spec and trials Parquet under ``root``; ``checkpoint`` replaces the
    ``checkpoint_path`` of ``trial_id`` (a path, or None)."""
    src, dst = StudyPaths(str(smoke[0]), NAME), StudyPaths(root, NAME)
    spec = read_bytes(src.spec)
    table = read_table(src.trials_parquet)
    assert spec is not None and table is not None
    write_bytes(dst.spec, spec)
    if checkpoint != "keep":
        paths = [
            checkpoint if t == trial_id else p
            for t, p in zip(table["trial_id"].to_pylist(), table["checkpoint_path"].to_pylist(), strict=True)
        ]
        i = table.schema.get_field_index("checkpoint_path")
        table = table.set_column(i, "checkpoint_path", pa.array(paths, pa.string()))
    write_parquet(dst.trials_parquet, table)
    return root


def test_a_study_without_parquet_or_checkpoint_is_one_line(smoke: Smoke, tmp_path: Path) -> None:
    root = str(tmp_path / "fresh")
    write_bytes(StudyPaths(root, NAME).spec, read_bytes(StudyPaths(str(smoke[0]), NAME).spec) or b"")
    with pytest.raises(EvaluateError) as exc:
        evaluate_trial(NAME, root)
    assert "no trials Parquet yet" in _one_line(exc) and f"ponder-study export {NAME}" in str(exc.value)

    trial_id = str(trials(smoke[0], NAME)["trial_id"].iloc[0])
    root = _copy_study(smoke, str(tmp_path / "no-checkpoint"), None, trial_id)
    with pytest.raises(EvaluateError) as exc:
        evaluate_trial(NAME, root, trial_id)
    assert "has no checkpoint" in _one_line(exc)

    empty = tmp_path / "checkpoint_000009"
    empty.mkdir()
    root = _copy_study(smoke, str(tmp_path / "gone"), str(empty), trial_id)
    with pytest.raises(EvaluateError) as exc:
        evaluate_trial(NAME, root, trial_id)
    assert "trainer.pt is missing" in _one_line(exc)


class _Payload:
    """Unpickling this runs ``os.mkdir(marker)``: what a tampered checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def test_a_checkpoint_is_loaded_weights_only(smoke: Smoke, best: Evaluation, tmp_path: Path) -> None:
    state = torch.load(Path(best.checkpoint) / "trainer.pt", weights_only=True)
    state["extra"] = _Payload(tmp_path / "ran")
    tampered = tmp_path / "checkpoint_000000"
    tampered.mkdir()
    torch.save(state, tampered / "trainer.pt")
    root = _copy_study(smoke, str(tmp_path / "tampered"), str(tampered), best.trial_id)
    with pytest.raises(EvaluateError) as exc:
        evaluate_trial(NAME, root, best.trial_id)
    assert "weights-only" in _one_line(exc) and "UnpicklingError" in str(exc.value)
    assert not (tmp_path / "ran").exists()  # refused without running the payload


def test_a_study_on_s3_is_evaluated_from_its_uris(smoke: Smoke, best: Evaluation, s3: S3) -> None:
    root = f"{s3.bucket()}/ponder"
    remote = f"{root}/tune/{NAME}/{Path(best.checkpoint).name}"
    write_bytes(f"{remote}/trainer.pt", (Path(best.checkpoint) / "trainer.pt").read_bytes())
    _copy_study(smoke, root, remote, best.trial_id)
    e = evaluate_trial(NAME, root)  # the best by the copied Parquet, its checkpoint read from S3
    assert (e.trial_id, e.checkpoint, e.iteration) == (best.trial_id, remote, best.iteration)
    assert [s.halted_accuracy for s in e.sets] == [s.halted_accuracy for s in best.sets]  # seeded coins
