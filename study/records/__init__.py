"""The study's own truth, which a resume and every reader trust, and the Parquet's contract.

- `study.records.records`: one end record per trial (`EndRecord`, `read_end_records`), the
  study's saved spec (`load_study_spec`, `with_config_defaults`), each trial's saved reports
  (`read_reports`), `StudyError`;
- `study.records.truth`: those records read once at the start of a resume (`StudyTruth`);
- `study.records.asha_state`: ASHA's saved state (``asha.json`` and the changes since);
- `study.records.journal_copy`: the Optuna journal's copy on an object store;
- `study.records.parquet`: the Parquet contract (`SCHEMA_VERSION`, the trials and history
  tables, the leaderboard); `study.records.pareto`: the Pareto-optimal trials it marks.

`study.records.records`' names are re-exported here, on first use: importing a module of this
folder imports no other. No Ray, no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from study.records.records import (
        END_OUTCOMES,
        EndRecord,
        StudyError,
        ended_trial_ids,
        finished_study,
        has_ended,
        load_study_spec,
        read_end_record,
        read_end_records,
        read_ended,
        read_reports,
        relative_to_root,
        with_config_defaults,
        write_end_record,
    )

__all__ = [
    "END_OUTCOMES",
    "EndRecord",
    "StudyError",
    "ended_trial_ids",
    "finished_study",
    "has_ended",
    "load_study_spec",
    "read_end_record",
    "read_end_records",
    "read_ended",
    "read_reports",
    "relative_to_root",
    "with_config_defaults",
    "write_end_record",
]


def __getattr__(name: str) -> Any:
    """`study.records.records`'s names, imported when first asked for."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from study.records import records

    return getattr(records, name)
