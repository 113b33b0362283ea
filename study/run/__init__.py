"""Running a study: the one place that drives Ray Tune, and what the driver does beside.

This folder's module is also the function ``study.run(spec, ...)`` (`study.api.driving.run`):
``study/__init__.py`` makes it callable, and calling it runs a study through `study.run.runner`.

- `study.run.runner`: `run_study`, `resume_study`, `export`;
- `study.run.replay`: on restore, the study's records (read once, `study.records.truth`)
  replayed into Tune, Optuna and ASHA before any trial starts;
- `study.run.trainable`: `train_trial`, one `ponder.Trainer` run reported to Tune, NaN-safe;
- `study.run.export`, `study.run.dataset`: the study's Parquet from Tune's trials and its records
  (`ParquetCallback` writes each trial's rows as it ends), in one schema for the whole dataset;
- `study.run.tune_state`, `study.run.tune_logs`: Tune's saved state tended before a restore, and
  its log records as one line each;
- `study.run.stops`: every stop of the driver (Ctrl-C, SIGTERM, SIGHUP), from its first line;
- `study.run.lease`: one driver per study (a flock locally, conditional PUTs on S3);
- `study.run.processes`, `study.run.diskspace`, `study.run.tensorboard`: the processes a command
  started, a full disk said as such, TensorBoard's scalars written without torch;
- `study.run.progress`: Tune's progress table, printed, or redrawn in place in a Jupyter kernel.

Nothing is imported here: `study.run.stops` is the entry point's first import, before Ray.
"""
