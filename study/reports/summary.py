"""A study's summary table and the list of specs and studies, as ``ponder-study`` prints them.

The summary comes from the study's Parquet, mended by its end records (the truth: a driver
stopped before it rewrote the Parquet leaves trials there that have ended). Parquet and the
records are read when a summary is made: importing this module (``ponder-study --help``) loads
neither reader.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from study.spec.spec import list_specs, load_spec
from study.storage.hints import count, export_command
from study.storage.storage import StudyPaths, list_studies, parquet_state, read_study_table

__all__ = ["SUMMARY_COLUMNS", "current_trials", "listing", "summary", "trials_table"]

SUMMARY_COLUMNS = [
    "trial_id",
    "status",
    "lambda_p",
    "beta",
    "max_steps",
    "iteration",
    "test/halted_accuracy",
    "test/mean_halting_step",
    "nan_events",
    "pareto",
]


def trials_table(paths: StudyPaths) -> pd.DataFrame | None:
    """The study's trials table, an older schema's config nulls filled from the config's defaults."""
    from study.records.parquet import fill_config_defaults

    table = read_study_table(paths, "trials")
    return None if table is None else fill_config_defaults(table.to_pandas())


def summary(paths: StudyPaths, metric: str = "test/halted_accuracy", mode: str = "max", top: int = 10) -> str:
    """Trials by status, the top trials by ``metric`` (``mode``: which end is the top) among those
    that ended with a result, then the others (running ones first, by ``metric``: a study in
    progress shows its leaders without ranking them), from the study's Parquet.

    The study's end records are the truth: a trial they hold that the Parquet lacks or shows
    running (a driver stopped before it rewrote the Parquet) is shown ended, from its record."""
    df, stale = current_trials(paths)
    if df is None or df.empty:
        return f"study {paths.name}: no trial has finished yet"
    counts = df["status"].value_counts()
    lines = [
        f"study {paths.name}: {count(len(df), 'trial')}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    ]
    columns = [c for c in dict.fromkeys([*SUMMARY_COLUMNS, metric]) if c in df.columns]
    from study.records.ranking import leaderboard, ranked_trials  # the report's and evaluate's order

    ranked = ranked_trials(df, metric, mode)
    best = ranked.head(top)[columns]
    rest = leaderboard(df.drop(index=ranked.index), metric, mode).head(top)[columns]
    with pd.option_context(
        "display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format
    ):
        if best.empty:
            lines.append(f"no trial has ended with a result for {metric} yet")
        else:
            lines.append(f"top {len(best)} by {metric}:")
            lines.append(best.to_string(index=False))
        if not rest.empty:
            lines.append(f"{len(df) - len(ranked)} not ranked (no final result):")
            lines.append(rest.to_string(index=False))
    lines.append(f"Parquet: {paths.trials_parquet}  (history: {paths.table_dir('history')}/)")
    lines += _currency(paths, stale)
    return "\n".join(lines)


def _currency(paths: StudyPaths, stale: int) -> list[str]:
    """How current the Parquet is: when its driver last wrote it, and the ended trials it lacks."""
    state = parquet_state(paths)
    lines = []
    if state is not None and not state.get("final"):
        written = datetime.fromisoformat(str(state["written"]))
        ago = max(0, int((datetime.now(UTC) - written).total_seconds()))
        lines.append(
            f"the Parquet was written {written:%H:%M:%S} UTC ({ago} s ago) with "
            f"{count(int(state.get('trials', 0)), 'trial')}: while a study runs it is rewritten at most "
            "every [run] parquet_refresh_s seconds, and whole when its run ends"
        )
    if stale:
        one = stale == 1
        lines.append(
            f"{count(stale, 'ended trial')} {'is' if one else 'are'} not in the Parquet yet, shown here "
            f"from {'its end record' if one else 'their end records'}: a running driver writes "
            f"{'it' if one else 'them'} at its next refresh, `{export_command(paths.name, paths.root)}` now"
        )
    return lines


def current_trials(paths: StudyPaths) -> tuple[pd.DataFrame | None, int]:
    """The study's trials as `summary` shows them (None before any is in the Parquet or the
    records): its Parquet, an older schema's config nulls filled; every trial its end records
    hold shown ended; a pending trial that has reported shown running. And how many ended
    trials the Parquet lacked (a driver stopped, or not yet done, before it wrote them)."""
    df, stale = _with_end_records(trials_table(paths), paths)
    return (df if df is None or df.empty else _started_shown_running(df)), stale


def _started_shown_running(df: pd.DataFrame) -> pd.DataFrame:
    """A ``pending`` trial that has reported is shown ``running``: Tune saves a running trial as
    pending, so an interrupted study's Parquet holds its running trials as pending."""
    if "iteration" not in df.columns:
        return df
    started = (df["status"] == "pending") & (pd.to_numeric(df["iteration"], errors="coerce") > 0)
    if not started.any():
        return df
    df = df.copy()
    df.loc[started, "status"] = "running"
    return df


def _with_end_records(df: pd.DataFrame | None, paths: StudyPaths) -> tuple[pd.DataFrame | None, int]:
    """The trials table with every end record's trial shown ended; how many it had to mend.
    The records are read only when the table lacks one (at 10,000 trials, 10,000 files); a
    Parquet written whole took in the ledgers of a study from before end records."""
    from study.records.records import END_OUTCOMES, ended_trial_ids, read_end_records

    shown = {} if df is None else dict(zip(df["trial_id"], df["status"], strict=True))
    whole = bool((parquet_state(paths) or {}).get("final"))
    if all(shown.get(t) in END_OUTCOMES for t in ended_trial_ids(paths, ledgers=not whole)):
        return df, 0
    ends = read_end_records(paths)
    mend = [e for e in ends.values() if shown.get(e.trial_id) not in END_OUTCOMES]
    if not mend:
        return df, 0
    rows = []
    for e in mend:
        row = {k: v for k, v in e.last_result.items() if not isinstance(v, (dict, list))}
        row.update({k: v for k, v in e.config.items() if not isinstance(v, (dict, list))})
        row.update(trial_id=e.trial_id, status=e.outcome, iteration=e.iteration)
        rows.append(row)
    extra = pd.DataFrame(rows)
    if df is None:
        return extra, len(mend)
    kept = df[~df["trial_id"].isin([e.trial_id for e in mend])]
    return pd.concat([kept, extra[[c for c in extra.columns if c in df.columns]]], ignore_index=True), len(
        mend
    )


def listing(storage: str) -> str:
    """The shipped specs and the studies under ``storage``, names in one column as wide as the longest."""
    specs, studies = list_specs(), list_studies(storage)
    width = max(len(name) for name in [*specs, *studies])
    lines = ["specs (ponder-study run SPEC):"]
    for name in specs:
        lines.append(f"  {name:{width}s} {load_spec(name).description}")
    lines.append(f"studies under {storage}:" if studies else f"no studies under {storage} yet")
    for name in studies:
        df = trials_table(StudyPaths(storage, name))
        counts = "" if df is None else ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().items())
        lines.append(f"  {name:{width}s} {counts or 'no trial finished yet'}")
    return "\n".join(lines)
