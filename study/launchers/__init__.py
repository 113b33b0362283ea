"""A study started elsewhere than this terminal, and Ray's token kept to the study's owner.

- `study.launchers.slurm`, `study.launchers.slurm_script`: ``ponder-study slurm``, a batch
  script (`SlurmJob`, `render`) that runs a study over Slurm allocations;
- `study.launchers.submit`: a study sent to a Ray cluster's job server (`JobServer`);
- `study.launchers.ray_token`: Ray's authentication token made readable by its owner alone,
  before a local Ray instance starts (`private_token`).

Nothing is imported here.
"""
