"""Training and evaluation: `Trainer` steps, evaluates, checkpoints and restores one run.

A run yields one metrics dict per evaluation interval. Metric keys are flat, namespaced by
evaluation set: ``test/halted_accuracy``, ``hard/mean_halting_step``, ``train/loss``, ...
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch.nn.utils import clip_grad_norm_
from torch.optim.adam import adam as adam_function

from ponder.compiled import compile_mode, share_compile_cache, should_compile, uses_cuda_graphs
from ponder.config import CompileMode, KLDirection, TaskConfig, config_from_dict, stored_config
from ponder.cpu import keep_freed_memory
from ponder.files import temporary_beside
from ponder.halting import expected_steps, halting_accuracies, log_geometric_prior, sample_halting_step
from ponder.losses import kl_to_prior, per_step_cross_entropy, reconstruction_loss
from ponder.metrics import OUTCOMES, SET_LIST_METRICS, SET_METRICS, TIMING_KEYS, TRAIN_METRICS
from ponder.model import PonderNet, PonderOutput
from ponder.streams import iteration_keys, seed_keys, stream_base, stream_words
from ponder.tasks import accuracy, build_task

__all__ = [
    "OUTCOMES",
    "SET_LIST_METRICS",
    "SET_METRICS",
    "TIMING_KEYS",
    "TRAIN_METRICS",
    "EagerAdam",
    "LossFn",
    "Metrics",
    "StepResult",
    "Trainer",
    "device_label",
    "forward_loss",
    "ponder_loss",
    "resolve_device",
]

Metrics = dict[str, Any]
"""One evaluation's metrics: floats, ints, the outcome string, and per-step lists."""


Losses = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
LossFn = Callable[..., Losses]
"""`forward_loss` with its direction bound: (model, x, y, log prior, beta[, masks]) -> (L, L_rec, L_reg)."""


def ponder_loss(
    out: PonderOutput,
    y: torch.Tensor,
    log_prior: torch.Tensor,
    beta: float | torch.Tensor,
    kl_direction: KLDirection,
) -> Losses:
    """(L, L_rec, L_reg) with L = L_rec + beta * L_reg."""
    rec = reconstruction_loss(out.log_p, per_step_cross_entropy(out.y_hat, y))
    reg = kl_to_prior(out.log_p, log_prior, kl_direction)
    return rec + beta * reg, rec, reg


def forward_loss(
    model: PonderNet,
    x: torch.Tensor,
    y: torch.Tensor,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    kl_direction: KLDirection = "forward",
    masks: torch.Tensor | None = None,
) -> Losses:
    """The training forward pass and its loss, what `Trainer` compiles. lambda_p (through
    ``log_prior``) and ``beta`` are tensor inputs, not constants baked into the graph, so
    trials that differ only in them share one compiled graph and its cache entry. ``masks``: the
    step's dropout masks from the counter stream (`ponder.model.PonderNet.forward`)."""
    return ponder_loss(model(x, masks), y, log_prior, beta, kl_direction)


def device_label(device: torch.device) -> str:
    """The device as the Parquet's ``device`` column and `evaluate` name it: ``cpu``, or
    ``cuda:N <GPU name>`` (the index as this process numbers the GPUs it can see)."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} {torch.cuda.get_device_name(index)}"


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when torch sees a GPU (the one Tune assigned, under Tune), else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    """torch's own function under its ``torch._disable_dynamo`` wrapper (itself where it has none)."""
    return getattr(method, "__wrapped__", method)


class EagerAdam(torch.optim.Adam):
    """``torch.optim.Adam`` that never imports ``torch._dynamo``: the same updates, bit for bit, and
    the same ``state_dict``.

    torch wraps an optimizer's methods (``add_param_group``, ``zero_grad``, ``state_dict``,
    ``load_state_dict``, ``step`` and Adam's functional ``adam``) so that ``torch.compile`` does not
    trace into them, and the wrapper imports ``torch._dynamo`` at its first call: 2.2-2.5 s of CPU
    here in every process that trains (each trial's Ray worker, each ``python -m ponder.train``),
    two fifths of a trial worker's start-up, for a module eager training never uses. A run's
    optimizer runs eagerly whether its step is compiled or not (`ponder.compiled`), so these are
    torch's functions without the wrapper (tests/ponder/test_checkpoint.py compares the two)."""

    add_param_group = _unwrapped(torch.optim.Optimizer.add_param_group)
    zero_grad = _unwrapped(torch.optim.Optimizer.zero_grad)
    state_dict = _unwrapped(torch.optim.Optimizer.state_dict)
    load_state_dict = _unwrapped(torch.optim.Optimizer.load_state_dict)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """torch's ``Adam.step``, without its wrapper's graph breaks (no grad, as it sets)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        adam = _unwrapped(adam_function)
        with torch.no_grad():
            self._accelerator_graph_capture_health_check()
            for group in self.param_groups:
                params: list[torch.Tensor] = []
                grads: list[torch.Tensor] = []
                exp_avgs: list[torch.Tensor] = []
                exp_avg_sqs: list[torch.Tensor] = []
                max_exp_avg_sqs: list[torch.Tensor] = []
                steps: list[torch.Tensor] = []
                has_complex = self._init_group(  # type: ignore[no-untyped-call]
                    group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps
                )
                beta1, beta2 = group["betas"]
                adam(
                    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
                    amsgrad=group["amsgrad"], has_complex=has_complex, beta1=beta1, beta2=beta2,
                    lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                    maximize=group["maximize"], foreach=group["foreach"], capturable=group["capturable"],
                    differentiable=group["differentiable"], fused=group["fused"],
                    grad_scale=getattr(self, "grad_scale", None), found_inf=getattr(self, "found_inf", None),
                    decoupled_weight_decay=group["decoupled_weight_decay"],
                )  # fmt: skip
        return loss


@dataclass
class StepResult:
    """What one training iteration did."""

    loss: float
    loss_rec: float
    loss_reg: float
    grad_norm: float
    finite: bool
    """False when the loss or the gradient norm was not finite: the update was skipped."""


class Trainer:
    """Trains one PonderNet on one task config; every piece of its state is in `state_dict`."""

    def __init__(self, config: TaskConfig, data: object | None = None) -> None:
        """``data``: the task's own data, passed to its builder (`ponder.tasks.build_task`):
        MNIST's `MnistData`; None, the task's default."""
        keep_freed_memory()  # no page faults for the same tensors every iteration
        self.config = config
        self.device = resolve_device(config.device)
        task = build_task(config, self.device, data)
        self.model = task.model
        self.sample_batch = task.sample_batch
        self.eval_sets = task.eval_sets
        self._stream_batch = task.stream_batch
        self.stream_data = task.stream_data
        """What the task's counter batches read besides the words (`ponder.tasks.Task.stream_data`)."""
        self.batch_words = task.stream_words
        """Counter-stream words one training batch reads (`ponder.streams`)."""
        if config.data_stream == "counter":  # the run's stream key, and its words' iteration-free half
            if task.stream_batch is None:
                raise ValueError(
                    f"the {config.task} task has no counter data stream: give its Task a stream_batch, "
                    'or default its config\'s data_stream to "generator"'
                )
            self._stream_key = seed_keys(config.seed)
            self._stream_base = stream_base(self._stream_key, task.stream_words, self.device)
        self._optimizer: torch.optim.Adam | None = None  # made at first use (`optimizer`)
        self._optimizer_state: dict[str, Any] | None = None  # a checkpoint's, until then
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.log_prior = log_geometric_prior(config.lambda_p, config.max_steps, config.prior_tail).to(
            self.device
        )
        self.compiled = should_compile(config.compile, self.device)
        """Whether `train_step` runs the forward pass and loss through ``torch.compile``."""
        self._beta = torch.tensor(config.beta, device=self.device)  # float32, as the loss is
        self._graphs = self.compiled and uses_cuda_graphs(self.device)
        self._forward_loss = self._make_forward_loss(self.compiled)
        self.iteration = 0
        self.nan_events = 0
        self.outcome = "running"
        self.train_time_s = 0.0
        self._sums = {"loss": 0.0, "loss_rec": 0.0, "loss_reg": 0.0, "grad_norm": 0.0}
        self._finite_steps = 0  # finite iterations since the last evaluation
        self._interval_start = (0, 0.0)  # (iteration, train_time_s) at the last evaluation

    @property
    def optimizer(self) -> torch.optim.Adam:
        """Adam over the model's weights (`EagerAdam`), made at first use with the checkpoint's
        state if one was loaded: evaluating a checkpoint never needs it."""
        if self._optimizer is None:
            self._optimizer = EagerAdam(self.model.parameters(), lr=self.config.lr, fused=True)
            if self._optimizer_state is not None:
                self._optimizer.load_state_dict(self._optimizer_state)
                self._optimizer_state = None
        return self._optimizer

    # -- the loss ---------------------------------------------------------------------------
    def loss(self, out: PonderOutput, y: torch.Tensor) -> Losses:
        """(L, L_rec, L_reg) with L = L_rec + beta * L_reg."""
        return ponder_loss(out, y, self.log_prior, self._beta, self.config.kl_direction)

    def _make_forward_loss(self, compiled: bool) -> LossFn:
        """`forward_loss` for this config's KL direction, through ``torch.compile`` if ``compiled``.

        Only the function is compiled, never ``self.model``: the model's state_dict keys stay
        as they are (no ``_orig_mod.``), so checkpoints load either way."""
        direction = self.config.kl_direction

        def fn(
            model: PonderNet,
            x: torch.Tensor,
            y: torch.Tensor,
            log_prior: torch.Tensor,
            beta: torch.Tensor,
            masks: torch.Tensor | None = None,
        ) -> Losses:
            return forward_loss(model, x, y, log_prior, beta, direction, masks)

        if not compiled:
            return fn
        share_compile_cache()
        # static shapes: a run's training batch never changes shape
        return torch.compile(fn, dynamic=False, mode=compile_mode(self.device))

    # -- training -----------------------------------------------------------------------------
    def train_step(self, batch: tuple[torch.Tensor, ...] | None = None) -> StepResult:
        """One iteration on ``batch`` (default: a fresh training batch; ``(x, y)``, or ``(x, y,
        masks)`` from a step's counter stream with dropout of its own). A non-finite loss or
        gradient norm skips the update and counts as a NaN event."""
        start = time.perf_counter()
        x, y, *masks = batch if batch is not None else self.next_batch()
        self.model.train()
        # last iteration's gradients go before the forward pass: under CUDA graphs they live in the
        # graphs' memory, which the next replay overwrites
        self.optimizer.zero_grad(set_to_none=True)
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # a new iteration
        loss, rec, reg = self._forward_loss(self.model, x, y, self.log_prior, self._beta, *masks)
        grad_norm = math.nan
        finite = bool(torch.isfinite(loss))
        if finite:
            loss.backward()  # type: ignore[no-untyped-call]
            max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
            grad_norm = float(clip_grad_norm_(self.model.parameters(), max_norm))
            finite = math.isfinite(grad_norm)
        result = StepResult(float(loss.detach()), float(rec.detach()), float(reg.detach()), grad_norm, finite)
        if finite:
            self.optimizer.step()
            self._sums["loss"] += result.loss
            self._sums["loss_rec"] += result.loss_rec
            self._sums["loss_reg"] += result.loss_reg
            self._sums["grad_norm"] += grad_norm
            self._finite_steps += 1
        else:  # skip the update: no garbage reaches the weights or Adam's moments
            self.optimizer.zero_grad(set_to_none=True)
            self.nan_events += 1
        self.iteration += 1
        self.train_time_s += time.perf_counter() - start
        return result

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        """This iteration's training batch from the run's data stream: the counter stream's words at
        (seed, iteration), or the generator's next draw (``config.data_stream``); ``(x, y)``, and
        the step's dropout masks where it has dropout and draws from the counter stream (MNIST)."""
        if self.config.data_stream == "generator":
            return self.sample_batch(self.generator)
        assert self._stream_batch is not None
        words = stream_words(self._stream_base, iteration_keys(self._stream_key, self.iteration))  # [1, W]
        return self._stream_batch(words)

    def run(self, should_stop: Callable[[], bool] | None = None) -> Iterator[Metrics]:
        """Train to ``config.iterations``, yielding metrics every ``eval_interval`` iterations
        and once at the end; stops early, as ``diverged``, past ``max_nan_events``.

        ``should_stop`` is asked before every iteration: when it says yes the run returns at
        that iteration boundary, still ``running``, so a checkpoint saved then resumes exactly.
        """
        cfg = self.config
        if self.outcome != "running":
            return
        while self.iteration < cfg.iterations:
            if should_stop is not None and should_stop():
                return
            self.train_step()
            if self.nan_events > cfg.max_nan_events:
                self.outcome = "diverged"
            elif self.iteration == cfg.iterations:
                self.outcome = "completed"
            if self.outcome != "running" or self.iteration % cfg.eval_interval == 0:
                yield self.metrics()
            if self.outcome != "running":
                return
        self.outcome = "completed"  # zero iterations asked for, or resumed at the end
        yield self.metrics()

    def set_iterations(self, iterations: int) -> None:
        """Change the run's budget (to train a resumed run longer); a completed run trains on."""
        if iterations < self.iteration:
            raise ValueError(f"{iterations} is below the {self.iteration} iterations already done")
        self.config.iterations = iterations
        if self.outcome == "completed" and iterations > self.iteration:
            self.outcome = "running"

    # -- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> Metrics:
        """Metrics on every fixed evaluation set; deterministic for given weights.

        Per set: halted accuracy (the prediction at a halting step sampled from p), best-step
        accuracy (the best step's accuracy) and stable accuracy (right at the halting step and at
        every later one; see `halting_accuracies`), mean halting step (of those samples),
        expected steps (sum_n n p_n), accuracy at every step, the mean halting distribution, and
        the losses.
        """
        self.model.eval()
        # the same halting draws at every evaluation, so the metric moves only with the weights
        gen = torch.Generator(device=self.device).manual_seed(self.config.seed + 7919)
        metrics: Metrics = {}
        for name, s in self.eval_sets.items():
            out = self.model(s.x)
            loss, rec, reg = self.loss(out, s.y)
            step = sample_halting_step(out.log_p, gen)  # 0-based, NO_STEP if p has NaN  # [B]
            n_steps, batch = out.log_p.shape
            # a prediction with a NaN or inf logit is no answer: argmax/sign would still pick one
            answered = torch.isfinite(out.y_hat.reshape(n_steps, batch, -1)).all(dim=-1)  # [N, B]
            correct = accuracy(out.y_hat, s.y).masked_fill(~answered, math.nan)  # [N, B]
            acc = halting_accuracies(correct, step)  # halted, best-step and stable accuracy
            halts = bool((step >= 0).all())  # every sample has a halting distribution
            metrics.update(
                {
                    # NaN (null in Parquet) when the model's outputs are not finite: never the
                    # 0.5 and step 1 that arg-maxes over NaN make of a diverged model
                    f"{name}/halted_accuracy": acc.halted,
                    f"{name}/best_step_accuracy": acc.best_step,
                    f"{name}/stable_accuracy": acc.stable,
                    f"{name}/mean_halting_step": float((step + 1).float().mean()) if halts else math.nan,
                    f"{name}/expected_steps": float(expected_steps(out.log_p).mean()),
                    f"{name}/per_step_accuracy": correct.mean(dim=1).tolist(),
                    f"{name}/halting_distribution": out.log_p.exp().mean(dim=1).tolist(),
                    f"{name}/loss": float(loss),
                    f"{name}/loss_rec": float(rec),
                    f"{name}/loss_reg": float(reg),
                }
            )
        self.model.train()
        return metrics

    def metrics(self) -> Metrics:
        """Training averages since the last call, the run's counters, and `evaluate`."""
        n = self._finite_steps
        it0, t0 = self._interval_start
        elapsed = self.train_time_s - t0
        metrics: Metrics = {
            "iteration": self.iteration,
            "outcome": self.outcome,
            "nan_events": self.nan_events,
            **{f"train/{k}": (v / n if n else math.nan) for k, v in self._sums.items()},
            "time_s": self.train_time_s,
            "iterations_per_s": (self.iteration - it0) / elapsed if elapsed > 0 else 0.0,
        }
        self._sums = dict.fromkeys(self._sums, 0.0)
        self._finite_steps = 0
        self._interval_start = (self.iteration, self.train_time_s)
        metrics.update(self.evaluate())
        return metrics

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly: weights, Adam, RNGs, counters."""
        state: dict[str, Any] = {
            "config": self.config.to_dict(),
            "model": self.model.state_dict(),
            # a loaded state not yet given to Adam (it is made at first use) passes through as is
            "optimizer": self._optimizer_state or self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "generator_device": self.device.type,  # a CUDA generator's state is not a CPU one's
            "torch_rng": torch.get_rng_state(),
            "iteration": self.iteration,
            "nan_events": self.nan_events,
            "outcome": self.outcome,
            "train_time_s": self.train_time_s,
            "sums": dict(self._sums),
            "finite_steps": self._finite_steps,
            "interval_start": list(self._interval_start),
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved (the config must match this trainer's)."""
        stream = stored_config(state["config"])["data_stream"]
        if stream != self.config.data_stream:  # its batches would silently be another run's
            raise ValueError(
                f"the checkpoint's run trained on the {stream} data stream, this trainer's config says "
                f"{self.config.data_stream}: build the trainer from the checkpoint (Trainer.from_state)"
            )
        self.model.load_state_dict(state["model"])
        self._optimizer, self._optimizer_state = None, state["optimizer"]  # loaded at first use
        if _generator_device(state) == self.device.type:
            self.generator.set_state(state["generator"])
        else:
            # the run moved between CPU and CUDA (a GPU run's checkpoint evaluated here, say): the
            # other device's stream cannot continue here, so the data come from a stream of this
            # device seeded by the config's seed and the iteration, not the one the run began with
            # (whose first batches it has already trained on); weights, Adam and counters restore
            self.generator.manual_seed(_moved_seed(self.config.seed, int(state["iteration"])))
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.iteration = int(state["iteration"])
        self.nan_events = int(state["nan_events"])
        self.outcome = str(state["outcome"])
        self.train_time_s = float(state["train_time_s"])
        self._sums = dict(state["sums"])
        self._finite_steps = int(state["finite_steps"])
        it0, t0 = state["interval_start"]
        self._interval_start = (int(it0), float(t0))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a checkpoint atomically: a reader sees the old file or the new one, never half."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = temporary_beside(path, suffix=".tmp")
        os.close(fd)
        try:
            torch.save(self.state_dict(), tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def from_checkpoint(
        cls,
        source: str | os.PathLike[str] | IO[bytes],
        data: object | None = None,
        device: str | None = None,
        compile: CompileMode | None = None,
    ) -> Trainer:
        """A trainer restored from `save`'s file, a path or an open binary file (``io.BytesIO``
        of bytes read from remote storage), loaded with ``weights_only=True``: tensors and plain
        containers only, so a tampered checkpoint cannot run code."""
        state = torch.load(source, map_location="cpu", weights_only=True)
        return cls.from_state(state, data, device, compile)

    @classmethod
    def from_state(
        cls,
        state: dict[str, Any],
        data: object | None = None,
        device: str | None = None,
        compile: CompileMode | None = None,
    ) -> Trainer:
        """A trainer built from the config inside ``state`` (`state_dict`'s dict) and restored from
        it; ``data`` goes to the task's builder as in `Trainer`; ``device`` replaces the config's
        device (``cpu`` to evaluate a GPU run's checkpoint), ``compile`` its compile mode (compiled
        and eager steps are interchangeable)."""
        values = stored_config(state["config"])  # a checkpoint from before a field: as it meant it
        if device is not None:
            values["device"] = device
        if compile is not None:
            values["compile"] = compile
        trainer = cls(config_from_dict(values), data)
        trainer.load_state_dict(state)
        return trainer


_CPU_GENERATOR_STATE_BYTES = 5056
"""The size of a CPU generator's state (Mersenne Twister); a CUDA one's is 16 bytes (seed, offset)."""


def _moved_seed(seed: int, iteration: int) -> int:
    """The data seed of a run moved to another device type at ``iteration``."""
    return (seed * 1_000_003 + iteration) % 2**63


def _generator_device(state: dict[str, Any]) -> str:
    """The device type whose generator saved ``state["generator"]`` (read off its size in a
    checkpoint written before ``generator_device`` was saved)."""
    if "generator_device" in state:
        return str(state["generator_device"])
    return "cpu" if state["generator"].numel() == _CPU_GENERATOR_STATE_BYTES else "cuda"
