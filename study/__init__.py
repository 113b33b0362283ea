"""The Ray Tune layer of ponder-study: the only package that imports Ray.

The path of a study, one module a step:

- `study.spec`: a TOML spec, validated before Ray starts (`load_spec`, `SpecError`);
- `study.search`: the spec as Tune's param space, Optuna (journal on disk) and ASHA;
- `study.scheduler`: `PersistentASHA`, whose rungs survive a resume;
- `study.trainable`: `train_trial`, one `ponder.Trainer` run reported to Tune, NaN-safe;
- `study.runner`: `run_study`, `resume_study`, `export`; on restore it replays the study's
  records into Tune, Optuna and ASHA before any trial starts;
- `study.export`: the study's Parquet from Tune's trials and its records, and the Parquet
  callback that writes each trial's rows as it ends;
- `study.tune_state`: Tune's saved state files, set aside when torn, pruned, merged before a restore;
- `study.tensorboard`: TensorBoard's scalars, written from the driver without torch;
- `study.stops`: every stop of the driver (Ctrl-C, SIGTERM, SIGHUP), from its first line;
- `study.records`: one end record per trial, the truth a resume and every reader trust;
- `study.lease`: one driver per study (a flock locally, conditional PUTs on S3);
- `study.warmstart`: an earlier study's best configurations as a new study's first trials;
- `study.parquet`: the Parquet contract (its schema version is `study.parquet.SCHEMA_VERSION`);
- `study.storage`, `study.study_paths`, `study.filesystems`, `study.files`: where a study's files
  live (`StudyPaths`), local or on a pyarrow filesystem, and how they are read and written;
- `study.summary`, `study.report`: a study's summary table and its HTML report;
- `study.slurm`: the Slurm batch job that runs a study over allocations;
- `study.launch`, `study.cli` (one `Command` a verb, listed in `study.cli.COMMANDS`),
  `study.commands`, `study.hints`: ``ponder-study`` and the commands it prints.

Nothing is imported here, so ``ponder-study --help`` does not wait for Ray.
"""

__all__: list[str] = []
