"""Fused training: K parity runs stacked as one model train, report and checkpoint as their plain runs."""

from __future__ import annotations

import dataclasses
import io
import math
import threading
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch

from bench import fused_speed
from ponder.config import MnistConfig, ParityConfig
from ponder.fused.adam import RowAdam
from ponder.fused.halting import fused_log_halting_distribution, padded_log_prior
from ponder.fused.key import fusable_key
from ponder.fused.loss import fused_ponder_loss
from ponder.fused.parity import gru_unroll as fused_gru_unroll
from ponder.fused.plan import COMPILED_STEPS
from ponder.fused.trainer import FusedTrainer
from ponder.halting import log_geometric_prior, log_halting_distribution
from ponder.model import PonderOutput
from ponder.trainer import TIMING_KEYS, Metrics, Trainer, ponder_loss
from tests.ponder.test_compile import COMPILES, shared_cache  # noqa: F401  (a fixture)

TINY = {"n_elems": 6, "n_hidden": 16, "batch_size": 16, "eval_samples": 100, "device": "cpu"}
RTOL, ATOL = 1e-4, 1e-5


def _config(**values: object) -> ParityConfig:
    return ParityConfig(**{**TINY, "iterations": 30, "eval_interval": 10, **values})  # type: ignore[arg-type]


# members that differ in everything a member may have of its own
A = _config(lambda_p=0.2, beta=0.01, lr=3e-3, seed=0, max_steps=6)
B = _config(lambda_p=0.5, beta=0.1, lr=1e-2, seed=1, max_steps=4, prior_tail="last_step", grad_clip=0.0)
C = _config(lambda_p=0.3, beta=0.05, lr=5e-3, seed=2, max_steps=5, grad_clip=0.3, iterations=20)
D = _config(lambda_p=0.1, beta=0.02, lr=2e-3, seed=3, max_steps=3, n_nonzero_max=4, eval_interval=5)


def _recording(trainer: Trainer) -> list[float]:
    """The losses ``trainer`` computes from now on, one per iteration, as it trains."""
    losses: list[float] = []
    step = trainer.train_step

    def train_step(batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> object:
        result = step(batch)
        losses.append(result.loss)
        return result

    trainer.train_step = train_step  # type: ignore[method-assign,assignment]
    return losses


def _plain(config: ParityConfig) -> tuple[list[float], list[Metrics]]:
    """A plain run's loss at every iteration and its metrics, as `Trainer.run` yields them."""
    trainer = Trainer(config)
    losses = _recording(trainer)
    return losses, list(trainer.run())


def train_to_end(fused: FusedTrainer) -> tuple[dict[int, list[float]], dict[int, list[Metrics]]]:
    """Step the group until no member runs: each slot's loss at every iteration it trained, and
    the metrics that fell due for it, by slot."""
    losses: dict[int, list[float]] = defaultdict(list)
    reports: dict[int, list[Metrics]] = defaultdict(list)
    while fused.running:
        due = fused.step()
        for slot, result in fused.last_results.items():
            losses[slot].append(result.loss)
        for slot, metrics in due.items():
            reports[slot].append(metrics)
    return losses, reports


def _assert_same_metrics(fused: Metrics, plain: Metrics) -> None:
    assert set(fused) == set(plain)
    for key, want in plain.items():
        got = fused[key]
        if key in TIMING_KEYS:
            continue
        if isinstance(want, str | int):
            assert got == want, key
        else:
            assert got == pytest.approx(want, rel=RTOL, abs=ATOL, nan_ok=True), key


def _assert_same_losses(fused: list[float], plain: list[float]) -> None:
    assert len(fused) == len(plain)
    assert fused == pytest.approx(plain, rel=RTOL, abs=ATOL)


def test_members_train_evaluate_and_finish_as_their_plain_runs() -> None:
    """A and B train from the start, D leaves at iteration 12 (mid-interval), C joins D's freed
    slot at 14; one slot stays free throughout. Every member's losses and metrics are its plain run's."""
    fused = FusedTrainer(4, "cpu")
    slots = {"A": fused.join(A), "B": fused.join(B), "D": fused.join(D)}
    losses: dict[str, list[float]] = {name: [] for name in "ABCD"}
    reports: dict[str, list[Metrics]] = {name: [] for name in "ABCD"}
    for iteration in range(1, 40):
        if iteration == 13:
            fused.leave(slots.pop("D"))
        if iteration == 15:
            slots["C"] = fused.join(C)
            assert slots["C"] == 2  # D's slot, cleared
        due = fused.step()
        for name, slot in slots.items():
            if slot in fused.last_results:
                losses[name].append(fused.last_results[slot].loss)
            if slot in due:
                reports[name].append(due[slot])
    assert fused.running == [] and fused.slots == [0, 1, 2]  # finished members keep their slots

    for name, config, cut in (("A", A, None), ("B", B, None), ("C", C, None), ("D", D, 12)):
        plain_losses, plain_reports = _plain(config)
        if cut is not None:  # D left after 12 iterations: its metrics at 5 and 10
            plain_losses, plain_reports = plain_losses[:cut], plain_reports[:2]
        _assert_same_losses(losses[name], plain_losses)
        assert [m["iteration"] for m in reports[name]] == [m["iteration"] for m in plain_reports]
        for got, want in zip(reports[name], plain_reports, strict=True):
            _assert_same_metrics(got, want)
    assert reports["A"][-1]["outcome"] == "completed" and reports["C"][-1]["iteration"] == 20


def test_run_until_event_returns_the_metrics_as_they_fall_due() -> None:
    fused = FusedTrainer(2, "cpu")
    a, d = fused.join(A), fused.join(D)
    events = []
    while fused.running:
        due = fused.run_until_event()
        events.append({slot: m["iteration"] for slot, m in due.items()})
    assert events == [{d: 5}, {a: 10, d: 10}, {d: 15}, {a: 20, d: 20}, {d: 25}, {a: 30, d: 30}]


def test_a_group_compiles_as_its_members_compile_says_on_its_device() -> None:
    """``auto`` is eager on a CPU, as for a plain run; ``on`` compiles; members that differ in it
    cannot share a group (one step runs them all)."""
    eager = FusedTrainer(2, "cpu")
    eager.join(A)  # compile = "auto": eager on the CPU
    assert not eager.compiled
    with pytest.raises(ValueError, match="compile is 'on' but this fused group's is 'auto'"):
        eager.join(_config(compile="on"))
    on = FusedTrainer(2, "cpu")
    on.join(_config(compile="on"))
    assert on.compiled  # nothing compiled yet: torch.compile waits for the first step
    assert FusedTrainer(2, "cpu", compile=False).compiled is False


def test_a_compiled_group_unrolls_the_longest_steps_it_was_told_of_so_it_compiles_once() -> None:
    """Eager, a group unrolls its longest running member's steps; compiled, one shape: the study's
    longest max_steps from the start (``unroll``), in steps of COMPILED_STEPS, never fewer later."""
    eager = FusedTrainer(3, "cpu", compile=False, unroll=12)
    eager.join(A)  # max_steps 6
    assert eager.unrolled_steps == 6
    compiled = FusedTrainer(3, "cpu", compile=True, unroll=12)
    assert compiled.unrolled_steps == 0  # no member
    slot = compiled.join(A)
    assert compiled.unrolled_steps == 12
    compiled.join(_config(max_steps=13))  # longer than it was told: the next multiple of 4
    assert compiled.unrolled_steps == 16 == -(-13 // COMPILED_STEPS) * COMPILED_STEPS
    compiled.leave(compiled.slots[-1])
    compiled.hold(slot)
    compiled.join(B)  # max_steps 4: the compiled shape stays
    assert compiled.unrolled_steps == 16


@pytest.mark.slow
@COMPILES
@pytest.mark.usefixtures("shared_cache")
def test_compiled_members_train_in_a_thread_as_their_plain_eager_runs() -> None:
    """``compile = "on"``: the group's step compiled (every slot to the longest max_steps, a free
    slot padded), stepped in a thread of its own as a fuser steps it: each member's losses and
    reports are still its plain eager run's."""
    # 3 and 2 steps: a short unroll (4, a free slot padded too) compiles in half the time of 8
    configs = [
        dataclasses.replace(c, compile="on", iterations=10, eval_interval=5, max_steps=n)
        for c, n in ((A, 3), (B, 2))
    ]
    fused = FusedTrainer(3, "cpu")
    slots = [fused.join(c) for c in configs]
    assert fused.compiled
    torch._dynamo.utils.counters.clear()
    trained: list[tuple[dict[int, list[float]], dict[int, list[Metrics]]]] = []
    worker = threading.Thread(target=lambda: trained.append(train_to_end(fused)))
    worker.start()
    worker.join()
    (losses, reports) = trained[0]
    for slot, config in zip(slots, configs, strict=True):
        plain_losses, plain_reports = _plain(dataclasses.replace(config, compile="off"))
        _assert_same_losses(losses[slot], plain_losses)
        assert len(reports[slot]) == len(plain_reports) == 2
        for got, want in zip(reports[slot], plain_reports, strict=True):
            _assert_same_metrics(got, want)
    # data, forward and loss are one graph (no break), and an iteration reads nothing back
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    fused.join(configs[0])
    fused.step()
    with fused_speed.counting() as count:
        fused.step()
    assert count.syncs == 0, count.ops


def test_a_held_member_waits_and_goes_on_as_its_plain_run() -> None:
    """A is held after its first report while D trains on; released, A goes on as if never held."""
    fused = FusedTrainer(2, "cpu")
    a, d = fused.join(A), fused.join(D)
    a_losses: list[float] = []
    reports: list[Metrics] = []
    held_for = 0
    while a in fused.slots and fused._members[a].trainer.outcome == "running":
        due = fused.step()
        if a in fused.last_results:
            a_losses.append(fused.last_results[a].loss)
        if a in due:
            reports.append(due[a])
            fused.hold(a)
        if a not in fused.running and d in fused.running:
            held_for += 1
            if held_for == 7:
                fused.release(a)
        elif a not in fused.running:
            fused.release(a)
    assert held_for >= 7  # D trained while A was held
    plain_losses, plain_reports = _plain(A)
    _assert_same_losses(a_losses, plain_losses)
    for got, want in zip(reports, plain_reports, strict=True):
        _assert_same_metrics(got, want)


def test_a_members_state_dict_is_a_plain_checkpoint_that_continues_exactly() -> None:
    fused = FusedTrainer(2, "cpu")
    a, b = fused.join(A), fused.join(B)
    for _ in range(13):  # past the evaluation at 10: the checkpoint holds partial averages
        fused.step()
    buffer = io.BytesIO()
    torch.save(fused.state_dict(b), buffer)  # a checkpoint file, as a driver writes one
    buffer.seek(0)
    plain = Trainer.from_checkpoint(buffer)
    assert plain.iteration == 13 and plain.config == B
    plain_losses = _recording(plain)
    plain_reports = list(plain.run())
    fused_losses, fused_reports = [], []
    while b in fused.running:
        due = fused.step()
        fused_losses.append(fused.last_results[b].loss)
        if b in due:
            fused_reports.append(due[b])
    _assert_same_losses(fused_losses, plain_losses)
    for got, want in zip(fused_reports, plain_reports, strict=True):
        _assert_same_metrics(got, want)
    assert a in fused.slots


def test_a_member_joined_from_a_plain_checkpoint_continues_it_exactly() -> None:
    first = Trainer(B)
    for _ in range(10):
        first.train_step()
    first.metrics()  # as its run does at 10; then three more iterations, mid-interval
    for _ in range(3):
        first.train_step()
    state = first.state_dict()
    plain = Trainer.from_state(_copy(state))  # a copy: a restored torch Adam trains the state's tensors
    plain_losses = _recording(plain)
    plain_reports = list(plain.run())

    fused = FusedTrainer(2, "cpu")
    fused.join(A)
    b = fused.join(B, state)
    fused_losses, fused_reports = [], []
    while b in fused.running:
        due = fused.step()
        fused_losses.append(fused.last_results[b].loss)
        if b in due:
            fused_reports.append(due[b])
    _assert_same_losses(fused_losses, plain_losses)
    assert [m["iteration"] for m in fused_reports] == [20, 30]
    for got, want in zip(fused_reports, plain_reports, strict=True):
        _assert_same_metrics(got, want)


def _copy(state: dict[str, object]) -> dict[str, object]:
    """``state`` through a checkpoint file's bytes, as a resumed run reads it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, object] = torch.load(buffer, weights_only=True)
    return loaded


Sampler = Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def _poisoned(sample: Sampler) -> Sampler:
    """``sample`` with NaN inputs: every loss it leads to is NaN."""

    def poisoned(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = sample(gen)
        return x * math.nan, y

    return poisoned


@pytest.mark.parametrize("how", ["nan-data", "nan-weights", "huge-lr"])
def test_a_diverging_member_leaves_the_others_as_their_plain_runs(how: str) -> None:
    """A member whose losses are NaN (its data poisoned, as the plain trainer's test does, or its
    weights NaN in its row of the stacked weights) counts NaN events and ends diverged as its plain
    run does; one with an absurd lr goes its own way (it survives lr 1e6 here, as its plain run
    does); either way the other members' losses and metrics stay their plain runs'. Poisoned data
    needs the generator stream (its draws go through the trainer's sampler, which the test
    poisons): that case checks a group of runs made before counter streams."""
    stream = "generator" if how == "nan-data" else "counter"
    good = {a: dataclasses.replace(config, data_stream=stream) for a, config in (("a", A), ("b", B))}
    bad_config = _config(
        seed=5, max_steps=5, lr=1e6 if how == "huge-lr" else 3e-3, max_nan_events=3, data_stream=stream
    )
    state = None
    if how == "nan-weights":
        state = _copy(Trainer(bad_config).state_dict())
        state["model"]["step.cell.weight_hh"].fill_(math.nan)  # type: ignore[index]
    fused = FusedTrainer(3, "cpu")
    a, bad, b = fused.join(good["a"]), fused.join(bad_config, state), fused.join(good["b"])
    plain_bad = Trainer(bad_config) if state is None else Trainer.from_state(_copy(state))
    if how == "nan-data":
        bad_trainer = fused.trainer(bad)
        bad_trainer.sample_batch = _poisoned(bad_trainer.sample_batch)
        plain_bad.sample_batch = _poisoned(plain_bad.sample_batch)
    losses, reports = train_to_end(fused)
    for slot, config in ((a, good["a"]), (b, good["b"])):
        plain_losses, plain_reports = _plain(config)
        _assert_same_losses(losses[slot], plain_losses)
        for got, want in zip(reports[slot], plain_reports, strict=True):
            _assert_same_metrics(got, want)
    plain_last = list(plain_bad.run())[-1]
    last = reports[bad][-1]
    if how == "huge-lr":  # too chaotic to compare number for number: the same fate
        assert last["outcome"] == plain_last["outcome"] == "completed"
    else:
        assert last["outcome"] == "diverged" and last["nan_events"] == 4 and last["iteration"] == 4
        assert math.isnan(last["train/loss"])
        assert math.isnan(last["test/halted_accuracy"]) == (how == "nan-weights")
        _assert_same_metrics(last, plain_last)
    assert bad in fused.slots and bad not in fused.running  # it stopped, its slot kept until leave
    fused.leave(bad)
    assert bad in fused.free_slots


def test_a_config_that_cannot_fuse_is_refused_naming_the_field() -> None:
    fused = FusedTrainer(3, "cpu")
    fused.join(A)
    with pytest.raises(ValueError, match="n_hidden is 32 but this fused group's is 16"):
        fused.join(_config(n_hidden=32))
    with pytest.raises(ValueError, match="batch_size"):
        fused.join(_config(batch_size=8))
    mnist = MnistConfig(max_steps=3, n_hidden=16, device="cpu")
    with pytest.raises(ValueError, match="task is 'mnist' but this fused group's is 'parity'"):
        fused.join(mnist)
    old_mnist = dataclasses.replace(mnist, data_stream="generator")  # dropout from the global RNG
    with pytest.raises(ValueError, match='set data_stream = "counter"'):
        fusable_key(old_mnist)
    assert fusable_key(A) == fusable_key(B) == fusable_key(D)  # what members may differ in
    fused.join(B)
    fused.join(D)
    with pytest.raises(ValueError, match="all 3 slots are taken"):
        fused.join(C)
    done = Trainer(_config(iterations=0))
    list(done.run())
    fused.leave(0)
    with pytest.raises(ValueError, match="completed already"):
        fused.join(done.config, done.state_dict())


def test_an_unroll_that_stops_each_row_at_its_own_steps_computes_what_the_full_one_does() -> None:
    """Rows ordered longest first and ``active`` giving the rows still stepping: each row's states
    over its own N_k steps, and the gradient of anything read from them, are the full unroll's."""
    torch.manual_seed(0)
    members, batch, inputs, hidden, n_steps = 4, 5, 3, 8, 6
    own_steps = [6, 4, 4, 1]  # longest first, as `FusedTrainer` orders its rows
    active = [sum(m > n for m in own_steps) for n in range(n_steps)]
    x = torch.randn(members, batch, inputs)
    weights = [
        torch.randn(members, 3 * hidden, inputs),
        torch.randn(members, 3 * hidden, hidden),
        torch.randn(members, 3 * hidden),
        torch.randn(members, 3 * hidden),
    ]
    read = torch.randn(members, n_steps, batch, hidden)  # what a loss reads of each state
    valid = (torch.arange(n_steps)[None, :] < torch.tensor(own_steps)[:, None])[..., None, None]
    results = []
    for steps in (None, active):
        params = [w.clone().requires_grad_() for w in weights]
        states = fused_gru_unroll(x, *params, n_steps, steps)  # [K, N, B, H]
        (states * read * valid).sum().backward()  # type: ignore[no-untyped-call]
        results.append((states.detach() * valid, [p.grad for p in params]))
    (full, full_grads), (short, short_grads) = results
    assert torch.allclose(short, full, atol=1e-6)
    for got, want in zip(short_grads, full_grads, strict=True):
        assert got is not None and want is not None
        assert torch.allclose(got, want, atol=1e-5)


def test_the_masked_halting_distribution_and_loss_are_each_members_own() -> None:
    """Member k's log p over its own N_k steps is the plain one; past them p is 0 and nothing in
    the loss or its gradient is NaN."""
    torch.manual_seed(0)
    n_steps, batch = 6, 5
    max_steps = torch.tensor([6, 3, 1])
    logits = (torch.randn(3, n_steps, batch) * 3).requires_grad_()
    log_p = fused_log_halting_distribution(logits, max_steps)
    y_hat, y = torch.randn(3, n_steps, batch), torch.randint(0, 2, (3, batch)).float()
    priors = [
        log_geometric_prior(lp, int(n), "renormalise")
        for lp, n in zip((0.2, 0.5, 0.9), max_steps, strict=True)
    ]
    log_prior = torch.stack([padded_log_prior(p, n_steps) for p in priors])
    beta = torch.tensor([0.01, 0.1, 1.0])
    for direction in ("forward", "reverse"):
        loss, rec, reg = fused_ponder_loss(y_hat, log_p, y, log_prior, beta, max_steps, direction)
        loss.sum().backward(retain_graph=True)  # type: ignore[no-untyped-call]
        assert logits.grad is not None and torch.isfinite(logits.grad).all()
        for k, n in enumerate(max_steps.tolist()):
            own = log_halting_distribution(logits[k, :n].detach())
            assert torch.allclose(log_p[k, :n], own, atol=1e-6)
            assert bool((log_p[k, n:] == -math.inf).all())
            assert float(logits.grad[k, n:].abs().sum()) == 0.0  # steps past N_k get no gradient
            out = PonderOutput(y_hat[k, :n], logits[k, :n].detach(), own)
            want = ponder_loss(out, y[k], priors[k], beta[k], direction)
            got = (loss[k].detach(), rec[k].detach(), reg[k].detach())
            assert [float(g) for g in got] == pytest.approx([float(w) for w in want], rel=1e-5)
        logits.grad = None


def test_row_adam_is_torch_adam_per_row_with_its_own_step_count_and_lr() -> None:
    torch.manual_seed(0)
    rows, size = 3, 40
    params = torch.randn(rows, size)
    plain = [params[k].clone().requires_grad_() for k in range(rows)]
    lrs = [1e-3, 3e-3, 1e-2]
    optimizers = [torch.optim.Adam([p], lr=lr, fused=True) for p, lr in zip(plain, lrs, strict=True)]
    adam = RowAdam(rows, size, torch.device("cpu"))
    for it in range(20):
        grad = torch.randn(rows, size)
        update = [True, it % 3 != 0, it >= 5]  # row 1 skips (NaN gradient), row 2 joins late
        grad[1] = grad[1] if update[1] else math.nan
        adam.step(params, grad, torch.tensor(update), torch.tensor(lrs, dtype=torch.float64))
        for k in range(rows):
            if update[k]:
                plain[k].grad = grad[k].clone()
                optimizers[k].step()
    for k in range(rows):
        state = optimizers[k].state[plain[k]]
        assert adam.step_count(k) == int(state["step"])
        assert torch.allclose(params[k], plain[k].detach(), rtol=0, atol=1e-6)
        assert torch.allclose(adam.exp_avg_sq[k], state["exp_avg_sq"], rtol=1e-5, atol=1e-8)


def test_a_member_joined_at_its_budget_completes_at_once_as_its_plain_run() -> None:
    """`Trainer.run` of a run already at its budget trains nothing and reports it completed."""
    first = Trainer(_config(iterations=5))
    for _ in range(5):
        first.train_step()
    state = first.state_dict()
    fused = FusedTrainer(2, "cpu")
    a = fused.join(A)
    done = fused.join(first.config, _copy(state))
    due = fused.step()
    assert set(due) == {done} and fused.running == [a] and fused.last_results.keys() == {a}
    (plain,) = Trainer.from_state(_copy(state)).run()
    assert due[done]["outcome"] == "completed" and due[done]["iteration"] == 5
    _assert_same_metrics(due[done], plain)


def test_an_iteration_dispatches_the_same_ops_at_any_k_and_reads_nothing_back() -> None:
    """One draw of every member's batch, the counters on the device: a fused iteration between
    reports dispatches as many aten ops at K = 16 as at K = 2 (each a launch on a GPU) and makes
    no host sync; a report reads the device (its metrics are host numbers)."""
    (between_2, _), (between_16, report_16) = fused_speed.count_fused(2), fused_speed.count_fused(16)
    assert between_16.total == between_2.total, (between_16.ops - between_2.ops) + (
        between_2.ops - between_16.ops
    )
    assert between_2.syncs == between_16.syncs == 0
    assert report_16.syncs >= 16  # `counting` sees reads: each member's evaluation makes some


def test_an_emptied_group_takes_a_member_of_the_other_stream() -> None:
    """A group's data stream is its members' (a fused key field): once every member left, a member
    of the other stream forms the group anew and trains as its plain run."""
    fused = FusedTrainer(1, "cpu")
    fused.leave(fused.join(A))
    old = dataclasses.replace(A, data_stream="generator")
    slot = fused.join(old)
    losses = []
    for _ in range(3):
        fused.step()
        losses.append(fused.last_results[slot].loss)
    plain = Trainer(old)
    _assert_same_losses(losses, [plain.train_step().loss for _ in range(3)])
