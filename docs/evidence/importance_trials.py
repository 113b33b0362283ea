"""How many ended trials an importance needs: fANOVA against PED-ANOVA on small studies.

Synthetic Optuna studies over the smoke spec's four searched fields (lambda_p, beta log-scaled,
max_steps, seed), random sampling; the objective moves with lambda_p alone,
``1 - (lambda_p - 0.2)^2`` plus Gaussian noise (sd 0.05). For each study size and evaluator
(`optuna.importance.FanovaImportanceEvaluator` with seed 0, `PedAnovaImportanceEvaluator` with
its defaults), ``--studies`` studies are drawn with different seeds and the script prints how
often lambda_p comes first and the time per evaluation. `study.reports.importance.MIN_TRIALS` and the
choice of fANOVA rest on it; the figures are for this one strong effect, a guess for others.

    python docs/evidence/importance_trials.py [--studies 30] [--sizes 3 4 6 8 12 16 24]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import optuna
from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator, get_param_importances


def _study(n: int, seed: int) -> optuna.Study:
    rng = np.random.default_rng(seed)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(n):
        t = study.ask()
        lambda_p = t.suggest_float("lambda_p", 0.05, 0.9)
        t.suggest_float("beta", 1e-4, 0.1, log=True)
        t.suggest_int("max_steps", 2, 8)
        t.suggest_int("seed", 0, 9999)
        study.tell(t, 1 - (lambda_p - 0.2) ** 2 + rng.normal(0, 0.05))
    return study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=30)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 4, 6, 8, 12, 16, 24])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    evaluators = {
        "fANOVA": lambda: FanovaImportanceEvaluator(seed=0),
        "PED-ANOVA": lambda: PedAnovaImportanceEvaluator(),
    }
    for name, make in evaluators.items():
        for n in args.sizes:
            first, spent = 0, 0.0
            for seed in range(args.studies):
                study = _study(n, seed)
                started = time.perf_counter()
                ranked = get_param_importances(study, evaluator=make())
                spent += time.perf_counter() - started
                first += next(iter(ranked)) == "lambda_p"
            print(
                f"{name:9s} {n:3d} trials: lambda_p first in {first}/{args.studies} studies, "
                f"{spent / args.studies * 1000:.0f} ms per evaluation"
            )


if __name__ == "__main__":
    main()
