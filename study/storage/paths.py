"""Where a study's files lie under its storage root: `StudyPaths`, one property or method a file.

A study named N under the storage root R::

    R/tune/N/                      Tune's experiment: trial dirs, checkpoints, experiment state
    R/studies/N/spec.toml          the spec the study was started with (``resume`` reads it)
    R/studies/N/optuna.journal     the Optuna study (``optuna-dashboard`` opens it); on an object
                                   store, a copy of the driver's local journal (`journal_cache`)
    R/studies/N/asha.json          ASHA's rungs and the trials it stopped (Ray does not keep them);
                                   locally, the changes since are in asha.json.log (study.records.asha_state)
    R/studies/N/ended/T.json       how trial T ended (outcome, config, last report, checkpoint,
                                   its state in ASHA), then its reports: written once when it ends,
                                   the record a resume and every reader trust even when Tune's own
                                   state lags behind it (`study.records.records`)
    R/studies/N/lease.json         who runs the study now (host, pid, since when), `study.run.lease`
    R/studies/N/parquet.json       how current the study's Parquet is (`study.run.live_parquet`)
    R/studies/N/reports/T.jsonl    trial T's reports, in a study whose end records did not keep them
    R/studies/N/started/T.json     Tune's state of trial T, written before T starts (a resume
                                   adds it to Tune's saved state if that lags)
    R/trials/study=N/trials.parquet    one row per final trial (as of the last refresh)
    R/trials/study=N/trial-T.parquet   trial T's row while it is not final (errored, running)
    R/history/study=N/history.parquet  one row per report of the final trials when compacted
    R/history/study=N/trial-B.parquet  the reports of the trials that became final since, a file
                                       per refresh (B: `batch-...`), or of a trial not final (B: T)
"""

from __future__ import annotations

from dataclasses import dataclass

from study.storage.files import file_size
from study.storage.filesystems import is_remote, join, journal_cache, resolve

__all__ = ["CHECKPOINT_FILE", "FRAGMENT_PREFIX", "StudyPaths"]


CHECKPOINT_FILE = "trainer.pt"
"""The trainer's file inside each Tune checkpoint directory (written by the trainable, read by
`evaluate`); here, where both reach it without importing Ray."""


FRAGMENT_PREFIX = "trial-"
"""A per-trial file of a study's ``trials`` or ``history`` folder (`StudyPaths.fragment`)."""


@dataclass(frozen=True)
class StudyPaths:
    """The locations of one study's files (see the module docstring)."""

    root: str
    name: str

    @property
    def tune_root(self) -> str:
        """Tune's ``storage_path``; the experiment is ``tune_root/name``."""
        return join(self.root, "tune")

    @property
    def experiment(self) -> str:
        return join(self.root, "tune", self.name)

    @property
    def study_dir(self) -> str:
        return join(self.root, "studies", self.name)

    @property
    def spec(self) -> str:
        return join(self.study_dir, "spec.toml")

    @property
    def asha(self) -> str:
        return join(self.study_dir, "asha.json")

    @property
    def ended(self) -> str:
        """The ledger of studies started before end records (trial id -> checkpoint)."""
        return join(self.study_dir, "ended.json")

    @property
    def ended_dir(self) -> str:
        """``<trial_id>.json``: each ended trial's end record (`study.records.records`)."""
        return join(self.study_dir, "ended")

    def end_record(self, trial_id: str) -> str:
        return join(self.study_dir, "ended", f"{trial_id}.json")

    @property
    def lease(self) -> str:
        """Who holds the study now (`study.run.lease`)."""
        return join(self.study_dir, "lease.json")

    @property
    def root_fs_path(self) -> str:
        """The storage root as a path inside its filesystem (``bucket/prefix`` for S3)."""
        return resolve(self.root)[1]

    @property
    def reports_dir(self) -> str:
        """``<trial_id>.jsonl``: each ended trial's reports, saved before a ledger records it."""
        return join(self.study_dir, "reports")

    @property
    def optuna_journal(self) -> str:
        """A local file: Optuna's journal needs a file lock, which object stores do not have."""
        if is_remote(self.root):
            return journal_cache(self.root, self.name)
        return join(self.study_dir, "optuna.journal")

    @property
    def optuna_journal_copy(self) -> str | None:
        """The journal's copy in the study directory, for a remote root (None for a local one)."""
        return join(self.study_dir, "optuna.journal") if is_remote(self.root) else None

    @property
    def trials_dataset(self) -> str:
        return join(self.root, "trials")

    @property
    def trials_parquet(self) -> str:
        return join(self.table_dir("trials"), self.compacted_name("trials"))

    @property
    def history_parquet(self) -> str:
        return join(self.table_dir("history"), self.compacted_name("history"))

    @staticmethod
    def compacted_name(kind: str) -> str:
        """The name of a study's compacted ``trials`` or ``history`` file in its folder."""
        return f"{kind}.parquet"

    @staticmethod
    def fragment_name(trial_id: str) -> str:
        """The name of one trial's fragment in a study's ``trials`` or ``history`` folder."""
        return f"{FRAGMENT_PREFIX}{trial_id}.parquet"

    def table_dir(self, kind: str) -> str:
        """The study's folder of the ``trials`` or ``history`` dataset: its compacted file
        (``<kind>.parquet``) and one fragment per trial not in it (``trial-<id>.parquet``)."""
        return join(self.root, kind, f"study={self.name}")

    def fragment(self, kind: str, trial_id: str) -> str:
        """One trial's rows of the ``trials`` or ``history`` dataset, written when it ends."""
        return join(self.table_dir(kind), self.fragment_name(trial_id))

    @property
    def parquet_state(self) -> str:
        """How current the study's Parquet is: when it was last written, and what it held."""
        return join(self.study_dir, "parquet.json")

    @property
    def started_dir(self) -> str:
        """``<trial_id>.json``: Tune's own saved state of each trial, written before it starts."""
        return join(self.study_dir, "started")

    def started_record(self, trial_id: str) -> str:
        return join(self.study_dir, "started", f"{trial_id}.json")

    def exists(self) -> bool:
        """Whether a study of this name was started here (its spec was saved): asked of the
        storage (one HEAD on an object store), the spec itself not read."""
        fs, path = resolve(self.spec)
        return file_size(fs, path) is not None
