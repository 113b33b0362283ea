"""Two studies' trials files, the second (sorting last) with an extra column; each reader in one line."""

import os
import shutil
import sys

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

root = os.path.join(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ponder-readers", "trials")


def build(same_schema, common):
    shutil.rmtree(root, ignore_errors=True)
    a = pa.table({"trial_id": ["a"], "x": [1.0]})
    b = pa.table({"trial_id": ["b"], "x": [2.0], "rot30/acc": [0.5]})
    if same_schema:
        a = a.append_column("rot30/acc", pa.nulls(1, pa.float64()))
    for name, t in (("a-parity", a), ("z-mnist", b)):
        os.makedirs(f"{root}/study={name}")
        pq.write_table(t, f"{root}/study={name}/trials.parquet")
    if common:
        pq.write_metadata(pa.unify_schemas([a.schema, b.schema]), f"{root}/_common_metadata")


readers = {
    "pandas": lambda: pd.read_parquet(root),
    "pyarrow.dataset": lambda: ds.dataset(root, partitioning="hive").to_table().to_pandas(),
    "polars": lambda: pl.read_parquet(f"{root}/*/*.parquet", hive_partitioning=True).to_pandas(),
    "duckdb": lambda: duckdb.sql(f"SELECT * FROM read_parquet('{root}/*/*.parquet')").df(),
}
for label, same, common in (
    ("differing files", False, False),
    ("differing + _common_metadata", False, True),
    ("one schema", True, False),
):
    build(same, common)
    out = []
    for name, read in readers.items():
        try:
            df = read()
            out.append(f"{name}: {'rot30 kept' if 'rot30/acc' in df.columns else 'rot30 DROPPED'}")
        except Exception as e:
            out.append(f"{name}: {type(e).__name__}")
    print(f"{label:30s}", "; ".join(out))
