"""docs/results/mnist-rotation/angles.png: halted accuracy and mean halting step against the
evaluation angle, for every trial of mnist-rotation and mnist-rotation-reference (docs/RESULTS.md,
section 3).

    .venv/bin/python docs/evidence/results_mnist_angles.py
"""

import pandas as pd
from matplotlib.figure import Figure

trials = pd.concat(
    [
        pd.read_parquet(f"results/trials/study={s}").assign(study=s)
        for s in ("mnist-rotation", "mnist-rotation-reference")
    ]
)
angles = [22.5, 45, 67.5, 90]
fig = Figure(figsize=(11, 4.2))
ax_acc, ax_steps = fig.subplots(1, 2)
for _, r in trials.iterrows():
    label = (
        f"{r['study']} {r['trial_id']}: lambda_p {r['lambda_p']:.2f}, beta {r['beta']:.3g}, "
        f"N {r['max_steps']} ({r['status']} at {r['iteration']})"
    )
    ax_acc.plot(angles, [r[f"rot{a:g}/halted_accuracy"] for a in angles], marker="o", label=label)
    ax_steps.plot(angles, [r[f"rot{a:g}/mean_halting_step"] for a in angles], marker="o", label=label)
ax_acc.set(
    xlabel="rotation of the test images (degrees; trained at 22.5)",
    ylabel="halted accuracy",
    title="accuracy",
    xticks=angles,
)
ax_steps.set(
    xlabel="rotation of the test images (degrees; trained at 22.5)",
    ylabel="mean halting step",
    title="pondering steps",
    xticks=angles,
)
for ax in (ax_acc, ax_steps):
    ax.grid(alpha=0.3)
ax_acc.legend(fontsize=7, loc="lower left")
fig.suptitle("MNIST trained at 22.5 degrees, evaluated at 22.5-90 (1,000 test digits, fixed angles)")
fig.tight_layout()
fig.savefig("docs/results/mnist-rotation/angles.png", dpi=90)
