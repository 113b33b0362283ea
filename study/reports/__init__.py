"""What is read from a study and shown: every module here reads a study's files and changes none.

- `study.reports.summary`: a study's summary table and the list of specs and studies;
- `study.reports.report`: the HTML report (`write_report`), from `study.reports.data` (the study
  as the report reads it), `study.reports.plots` (its six figures) and `study.reports.html`;
- `study.reports.importance`: which searched field mattered (Optuna's fANOVA, from the journal);
- `study.reports.seeds`: means and 95 % intervals over seeds;
- `study.reports.live`: ``status --watch``, every trial as it runs;
- `study.reports.evaluate`, `study.reports.trial_choice`: ``ponder-study evaluate``, one trial's
  checkpoint run with real early exit, and which trial that is.

Nothing is imported here (the plots import matplotlib, ``evaluate`` torch).
"""
