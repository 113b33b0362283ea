"""docs/results/parity-extrapolation-cpu/sets.png: per-step accuracy and mean p_n on all four
evaluation sets of the one extrapolation trial (docs/RESULTS.md, section 2; the report's plots show
test, easy and hard only).

    .venv/bin/python docs/evidence/results_extrapolation_sets.py
"""

import pandas as pd
from matplotlib.figure import Figure

r = pd.read_parquet("results/trials/study=parity-extrapolation-cpu").iloc[0]
sets = {
    "test": "test (1-25)",
    "easy": "easy (1-7)",
    "hard": "hard (17-25)",
    "extrapolation": "extrapolation (26-30)",
}
fig = Figure(figsize=(11, 4.2))
ax_acc, ax_p = fig.subplots(1, 2)
for key, label in sets.items():
    acc, p = r[f"{key}/per_step_accuracy"], r[f"{key}/halting_distribution"]
    steps = range(1, len(acc) + 1)
    ax_acc.plot(steps, acc, marker="o", ms=3, label=f"{label}: halted {r[f'{key}/halted_accuracy']:.3f}")
    ax_p.plot(steps, p, marker="o", ms=3, label=f"{label}: mean halt {r[f'{key}/mean_halting_step']:.2f}")
ax_acc.set(xlabel="step n", ylabel="accuracy if halted at step n", title="per-step accuracy")
ax_p.set(xlabel="step n", ylabel="mean p_n over the set", title="halting distribution")
for ax in (ax_acc, ax_p):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle(f"parity-extrapolation-cpu (lambda_p 0.2, beta 0.01, N 20) after {r['iteration']} iterations")
fig.tight_layout()
fig.savefig("docs/results/parity-extrapolation-cpu/sets.png", dpi=90)
