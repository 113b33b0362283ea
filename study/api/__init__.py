"""The Python API, which ``import study`` re-exports (`study.__all__`): a study run, resumed and
read from Python, a notebook's kernel included, on the same code path as ``ponder-study``.

- `study.api.specs`: a spec given as a shipped spec's name, a path, a dict or a `StudySpec`,
  and a storage given or read from ``$PONDER_STUDY_STORAGE``; `check`;
- `study.api.driving`: `run` and `resume`, and what the CLI's ``run`` and ``resume`` share with
  them once their input is checked (`start`, `warm_points`, `finished`); `StudyInterrupted`;
- `study.api.reading`: `Study` (its trials, history, best trial, model, evaluation, plots,
  Optuna study, importance, report), `load`, `list_studies`; no Ray;
- `study.api.reference`: every public name as docs/api.md's reference (``make generate``).

The layer between ``study.cli`` and the folders it drives (``study.run``, ``study.reports``):
the CLI imports it, never the other way. Nothing is imported here: ``import study`` imports
neither Ray nor torch, and each function imports what it needs when called.
"""
