"""Should an ASHA-stopped trial reach Optuna as COMPLETE (its lower-budget value) or PRUNED?

Ray's OptunaSearch tells a stopped trial COMPLETE with its last value, so TPE models it as if
that value were its result; Optuna's own pruners mark it PRUNED, which TPE ranks below every
completed trial (by the step it reached, then its value). This bench runs both ways on a
synthetic PonderNet-like objective, with the same ASHA rule, many seeds, and prints how good the
best configuration found was, and how much budget was spent.

The objective: a trial's accuracy at iteration t is ``f(x) * (1 - exp(-t / tau(x)))`` plus noise,
where f peaks at lambda_p ~ 0.2, beta ~ 1e-2, max_steps ~ 12 and tau grows with max_steps
(slower learners look worse early: the case where a lower-budget value misleads). A guess at
the shape of real learning curves, not a measurement of them.

    .venv/bin/python docs/evidence/stopped_as_pruned.py [--seeds 30] [--trials 40]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import warnings

import optuna

BUDGET = 2000
RUNGS = (250, 750)  # ASHA with grace 250, reduction factor 3, max_t 2000


def _final(lambda_p: float, beta: float, max_steps: int) -> float:
    return 0.5 + 0.49 * math.exp(-(((lambda_p - 0.2) / 0.25) ** 2)) * math.exp(
        -(((math.log10(beta) + 2) / 1.5) ** 2)
    ) * math.exp(-(((max_steps - 12) / 8) ** 2))


def _at(params: dict[str, float], t: int, rng: random.Random) -> float:
    tau = 150 + 40 * params["max_steps"]
    final = _final(params["lambda_p"], params["beta"], int(params["max_steps"]))
    value = 0.5 + (final - 0.5) * (1 - math.exp(-t / tau))
    return value + rng.gauss(0, 0.005)


def run(seed: int, trials: int, stopped_as: str) -> tuple[float, int]:
    """One study: (true final accuracy of the best configuration found, iterations spent)."""
    rng = random.Random(seed)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, trials // 4)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    rungs: dict[int, list[float]] = {r: [] for r in RUNGS}
    spent = 0
    for _ in range(trials):
        t = study.ask()
        params = {
            "lambda_p": t.suggest_float("lambda_p", 0.05, 0.9),
            "beta": t.suggest_float("beta", 1e-4, 0.1, log=True),
            "max_steps": t.suggest_int("max_steps", 4, 20),
        }
        stopped_at = None
        for r in RUNGS:  # ASHA: stop unless in the top 1/3 of the trials that reached this rung
            value = _at(params, r, rng)
            t.report(value, r)
            rungs[r].append(value)
            ranked = sorted(rungs[r], reverse=True)
            cutoff = ranked[max(0, len(ranked) // 3 - 1)] if len(ranked) >= 3 else -1.0
            if value < cutoff:
                stopped_at = r
                break
        spent += stopped_at or BUDGET
        t.set_user_attr("full", stopped_at is None)
        if stopped_at is None:
            study.tell(t, _at(params, BUDGET, rng))
        elif stopped_as == "pruned":
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(t, value)
    full = [x for x in study.trials if x.user_attrs["full"]]  # a user picks among full-budget trials
    best = max(full, key=lambda x: x.value)
    return _final(best.params["lambda_p"], best.params["beta"], best.params["max_steps"]), spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--trials", type=int, default=40)
    a = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    results = {}
    for how in ("complete", "pruned"):
        runs = [run(seed, a.trials, how) for seed in range(a.seeds)]
        finals = [f for f, _ in runs]
        results[how] = statistics.median(finals)
        print(
            f"stopped as {how:<9} best final accuracy: median {statistics.median(finals):.4f}, "
            f"mean {statistics.mean(finals):.4f}, worst {min(finals):.4f}; "
            f"iterations spent: median {statistics.median(s for _, s in runs):.0f}"
        )
    print(f"ratio pruned/complete (median best final accuracy) {results['pruned'] / results['complete']:.4f}")


if __name__ == "__main__":
    main()
