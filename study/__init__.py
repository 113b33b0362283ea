"""The Ray Tune layer of ponder-study: the only package that imports Ray.

Studies (Optuna + ASHA over lambda_p, beta, max_steps), the Tune trainable around
`ponder.Trainer`, Parquet analysis and resume are built here next; this package
holds nothing yet.
"""

__all__: list[str] = []
