"""The lambda_p grid's hard set (11-15 non-zero) from each trial's final checkpoint
(docs/RESULTS.md, section 1): is some step right, and does p put its mass there?

    .venv/bin/python docs/evidence/results_oracle.py
"""

from pathlib import Path

import pandas as pd
import torch

from ponder.tasks import accuracy
from ponder.trainer import Trainer

t = pd.read_parquet("results/trials/study=parity-lambda-grid")
for _, r in t.sort_values(["lambda_p", "seed"]).iterrows():
    tr = Trainer.from_checkpoint(Path(r.checkpoint_path) / "trainer.pt")
    s = tr.eval_sets["hard"]
    tr.model.eval()
    with torch.no_grad():
        out = tr.model(s.x)
    correct, p = accuracy(out.y_hat, s.y), out.log_p.exp()  # both [N, B]
    print(
        r.lambda_p,
        r.seed,
        f"right at some step {correct.max(0).values.mean():.3f}",
        f"E_p[right] {(p * correct).sum(0).mean():.3f}",
        f"right at step N {correct[-1].mean():.3f}",
    )
