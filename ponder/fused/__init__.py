"""Fused training: up to K runs of one task trained as one model, each still a plain run outside.

Read top to bottom; each module imports only those above it:

- `ponder.fused.layout`: `ParamLayout`, a member's parameters as one row of the group's ``[K, P]``
  tensor in the plain model's ``named_parameters()`` order, and `PlainNames`, through which a
  fused step reads the plain model's layers by object (the names are the model's own, written
  nowhere else), refusing at once a plain parameter or layer it does not read;
- `ponder.fused.halting`, `ponder.fused.loss`: what every task shares: the halting distribution
  masked per member (each its own max_steps), the padded prior, PonderNet's loss per member;
- `ponder.fused.layers`: batched twins of the plain layers a step is built of (``nn.Linear``,
  ``nn.Conv2d``, ...), one set of ops for K members;
- `ponder.fused.step`: `FusedStep`, the twin of `ponder.model.StepFunction` (``encode``,
  ``unroll``, ``heads``) over K rows, and `fused_forward_loss`, the twin of
  `ponder.trainer.forward_loss`;
- `ponder.fused.parity`, `ponder.fused.mnist`: each task's fused step, beside its plain step
  (`ponder.steps`) in the same words; a task names its own in its `ponder.tasks.TaskDef`'s
  ``fused`` (`ponder.tasks.Fusion`);
- `ponder.fused.key`: which runs may share a group, read from the task registry;
- `ponder.fused.adam`: Adam over rows; `ponder.fused.plan`: a group's per-row inputs;
- `ponder.fused.trainer`: `FusedTrainer`, the group.

Why and how much it pays: docs/fused.md.
"""

from __future__ import annotations

__all__: list[str] = []
