"""The search: the spec as Tune's param space, Optuna and ASHA, and what they keep across resumes.

- `study.search.search`: `param_space`, `make_searcher` (`DivergenceAwareOptunaSearch`, Optuna
  with its journal on disk), `make_scheduler`;
- `study.search.scheduler`: `PersistentASHA`, whose rungs survive a resume;
- `study.search.journal`: the Optuna journal as the driver keeps it (`StudyJournal`), mended
  after a kill (`repair_journal`, `clear_stale_journal_lock`);
- `study.search.trial_map`: which Tune trial holds which Optuna trial, rebuilt at every resume;
- `study.search.warmstart`: an earlier study's best configurations as a new study's first trials;
- `study.search.ray_private`: every reach into Ray's private attributes, in one place.

`study.search.search`'s names (its ``__all__``) are re-exported here, on first use
(`study.storage.lazy`): a study pickled before the folders names
``study.search.DivergenceAwareOptunaSearch``, and importing this folder for its trial map or warm
start must not import Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from study.storage.lazy import public_names

if TYPE_CHECKING:  # its names, typed, for mypy and editors
    from study.search.search import *  # noqa: F403

__getattr__ = public_names(__name__, "study.search.search")
