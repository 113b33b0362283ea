"""Every table of docs/RESULTS.md, from the studies' Parquet alone (``results/trials``,
``results/history``): run from the repository root after the studies of its sections.

    .venv/bin/python docs/evidence/results_tables.py

pandas' ``to_markdown`` needs ``tabulate``, which is not installed, hence the small `md` helper;
the page rounds some columns to two decimals.
"""

import pandas as pd


def md(df, index=True):
    """A DataFrame as a Markdown table (pandas' to_markdown needs tabulate, not installed)."""
    df = df.reset_index() if index else df
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    rows = [list(map(str, df.columns)), *([cell(v) for v in r] for r in df.itertuples(index=False))]
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join([lines[0], "|" + " --- |" * len(rows[0]), *lines[1:]])


def trials(name):
    return pd.read_parquet(f"results/trials/study={name}")


# 1. lambda_p grid: per lambda_p, over its two seeds
t = trials("parity-lambda-grid")
print(
    md(
        t.groupby("lambda_p").agg(
            acc_mean=("test/halted_accuracy", "mean"),
            acc_min=("test/halted_accuracy", "min"),
            acc_max=("test/halted_accuracy", "max"),
            easy_acc=("easy/halted_accuracy", "mean"),
            hard_acc=("hard/halted_accuracy", "mean"),
            steps_test=("test/mean_halting_step", "mean"),
            steps_easy=("easy/mean_halting_step", "mean"),
            steps_hard=("hard/mean_halting_step", "mean"),
            nan_events=("nan_events", "sum"),
            status=("status", lambda s: ",".join(sorted(set(s)))),
        )
    )
)
print(
    md(
        t.sort_values(["lambda_p", "seed"])[
            [
                "lambda_p",
                "seed",
                "test/halted_accuracy",
                "easy/mean_halting_step",
                "hard/mean_halting_step",
                "nan_events",
                "status",
                "wall_time_s",
            ]
        ],
        index=False,
    )
)

# 1b. the grid's per-step curves: p_n mass before step 5, mode of p_n, first step with
#     per-step accuracy >= 0.99, per-step accuracy at the last step (N = 20)
rows = []
for _, r in t.sort_values(["lambda_p", "seed"]).iterrows():
    row = {"lambda_p": r["lambda_p"], "seed": r["seed"]}
    for s in ["easy", "hard"]:
        p, acc = list(r[f"{s}/halting_distribution"]), list(r[f"{s}/per_step_accuracy"])
        row[f"{s} p(n<5)"] = sum(p[:4])
        row[f"{s} mode"] = p.index(max(p)) + 1
        row[f"{s} first n acc>=0.99"] = next((n + 1 for n, a in enumerate(acc) if a >= 0.99), "-")
        row[f"{s} acc at n=20"] = acc[-1]
    rows.append(row)
print(md(pd.DataFrame(rows), index=False))

# 2. extrapolation: the one trial, every evaluation set
e = trials("parity-extrapolation-cpu").iloc[0]
metrics = ["halted_accuracy", "mean_halting_step", "expected_steps"]
print(
    md(
        pd.DataFrame(
            {s: {m: e[f"{s}/{m}"] for m in metrics} for s in ["test", "easy", "hard", "extrapolation"]}
        ).T
    )
)
print(e[["status", "iteration", "best_iteration", "nan_events", "wall_time_s"]].to_dict())

# 2b. extrapolation: every report (the learning curve in numbers)
h = pd.read_parquet("results/history/study=parity-extrapolation-cpu")
print(
    md(
        h[
            [
                "iteration",
                "iterations_per_s",
                "time_total_s",
                "test/halted_accuracy",
                "extrapolation/halted_accuracy",
                "train/loss_rec",
            ]
        ],
        index=False,
    )
)

# 3. MNIST rotation: per trial, each angle (the shipped study; the reference implementations' settings)
m = pd.concat([trials(s).assign(study=s) for s in ("mnist-rotation", "mnist-rotation-reference")])
angles = ["rot22.5", "rot45", "rot67.5", "rot90"]
print(
    md(
        m[
            ["study", "trial_id", "lambda_p", "beta", "max_steps", "status", "iteration"]
            + [f"{a}/halted_accuracy" for a in angles]
            + [f"{a}/mean_halting_step" for a in angles]
            + ["nan_events", "wall_time_s"]
        ],
        index=False,
    )
)
