"""The study's own truth, which a resume and every reader trust, and the Parquet's contract.

- `study.records.records`: one end record per trial (`EndRecord`, `read_end_records`), the
  study's saved spec (`load_study_spec`, `with_config_defaults`), each trial's saved reports
  (`read_reports`: in its end record), `StudyError`;
- `study.records.truth`: those records read once at the start of a resume (`StudyTruth`);
- `study.records.asha_state`: ASHA's saved state (``asha.json`` and the changes since);
- `study.records.journal_copy`: the Optuna journal's copy on an object store;
- `study.records.parquet`: the Parquet contract (`SCHEMA_VERSION`, the trials and history
  tables); `study.records.ranking`: which trials are results, the best and the Pareto front
  (`ranked_trials`, `leaderboard`, `pareto_marks`); `study.records.pareto`: the front's mask.

`study.records.records`' names (its ``__all__``) are re-exported here, on first use
(`study.storage.lazy`): importing a module of this folder imports only those it needs. No Ray, no
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from study.storage.lazy import public_names

if TYPE_CHECKING:  # its names, typed, for mypy and editors
    from study.records.records import *  # noqa: F403

__getattr__ = public_names(__name__, "study.records.records")
