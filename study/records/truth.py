"""The study's truth as a resume finds it: its records, read once, under its lease.

Most steps of a resume need some of the study's records: its check of Tune's saved state, the
count of trials still to run, the replay into Tune, the searcher's map between Tune's trials and
Optuna's, ASHA's rungs and stops. On an object store each read of the end records is a listing
and a GET per trial. `read_truth` reads each record once, at the start of a resume, and the
resume hands the one `StudyTruth` to every step (docs/resume.md): the study's spec, every end
record, ASHA's saved state, and the saved reports of the trials that need them (read the first
time they are asked for: a trial's reports never change once it ended). The Optuna journal is
not copied here: the searcher's Optuna storage reads it once and is the live study the resume
goes on appending to.

What the driver writes after the start (the trials that end during the run) is not in it: what
reads those (the callbacks, the export at the end of the run) reads the records again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from study.records.asha_state import read_state
from study.records.records import EndRecord, load_study_spec, read_end_records, read_reports
from study.spec.spec import StudySpec
from study.storage.storage import StudyPaths

__all__ = ["StudyTruth", "read_truth"]


@dataclass(frozen=True)
class StudyTruth:
    """A study's records as they were at the start of a resume (or none, for a new study)."""

    spec: StudySpec
    paths: StudyPaths
    ends: Mapping[str, EndRecord] = field(default_factory=dict)
    """Every trial's end record, by trial id (`study.records.records.read_end_records`)."""
    asha: Mapping[str, Any] | None = None
    """ASHA's saved state, its logged changes applied (None: the study has none)."""
    _reports: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False, compare=False)

    def reports(self, trial_id: str) -> list[dict[str, Any]]:
        """The reports the trial saved when it ended, read the first time they are asked for."""
        if trial_id not in self._reports:
            self._reports[trial_id] = read_reports(self.paths, trial_id)
        return self._reports[trial_id]

    def with_spec(self, spec: StudySpec) -> StudyTruth:
        """The same records under another spec (``resume --more`` writes a larger total)."""
        return dataclasses.replace(self, spec=spec)


def read_truth(name: str, storage: str) -> StudyTruth:
    """Read the study's spec, its ASHA state and every end record, each once."""
    spec, paths = load_study_spec(name, storage)
    asha = read_state(paths.asha)
    reports: dict[str, list[dict[str, Any]]] = {}

    def saved(trial_id: str) -> list[dict[str, Any]]:
        reports[trial_id] = read_reports(paths, trial_id)
        return reports[trial_id]

    stopped = (asha or {}).get("stopped", [])
    ends = read_end_records(paths, stopped=stopped, reports=saved)
    return StudyTruth(spec, paths, ends, asha, reports)
