"""The search: the spec as Tune's param space, Optuna and ASHA, and what they keep across resumes.

- `study.search.search`: `param_space`, `make_searcher` (`DivergenceAwareOptunaSearch`, Optuna
  with its journal on disk), `make_scheduler`;
- `study.search.scheduler`: `PersistentASHA`, whose rungs survive a resume;
- `study.search.journal`: the Optuna journal as the driver keeps it (`StudyJournal`), mended
  after a kill (`repair_journal`, `clear_stale_journal_lock`);
- `study.search.trial_map`: which Tune trial holds which Optuna trial, rebuilt at every resume;
- `study.search.warmstart`: an earlier study's best configurations as a new study's first trials;
- `study.search.ray_private`: every reach into Ray's private attributes, in one place.

`study.search.search`'s names are re-exported here, on first use: a study pickled before the
folders names ``study.search.DivergenceAwareOptunaSearch``, and importing this folder for its
trial map or warm start must not import Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from study.search.search import (
        OUTCOME_ATTR,
        STEP,
        TUNE_ID_ATTR,
        DivergenceAwareOptunaSearch,
        OptunaSpace,
        Reports,
        SamplerRecipe,
        SearcherStateError,
        make_scheduler,
        make_searcher,
        optuna_storage,
        param_space,
        tpe_startup_trials,
    )

__all__ = [
    "OUTCOME_ATTR",
    "STEP",
    "TUNE_ID_ATTR",
    "DivergenceAwareOptunaSearch",
    "OptunaSpace",
    "Reports",
    "SamplerRecipe",
    "SearcherStateError",
    "make_scheduler",
    "make_searcher",
    "optuna_storage",
    "param_space",
    "tpe_startup_trials",
]


def __getattr__(name: str) -> Any:
    """`study.search.search`'s names, imported (with Ray) when first asked for."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from study.search import search

    return getattr(search, name)
