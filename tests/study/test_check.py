"""`ponder-study check`: a spec's figures before launch, without Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from study.cli import main
from study.spec import check
from study.spec.check import Estimate, asha_milestones, least_trial_iterations, trials_at_once
from study.spec.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


def run_check(*args: str) -> tuple[int, str, list[str]]:
    """``ponder-study check ARGS`` in a fresh interpreter: exit code, stdout, and which of torch
    and ray it imported."""
    code = (
        "import os, sys\n"
        "from study.cli import main\n"
        f"rc = main(['check', *{list(args)!r}])\n"
        "print('LOADED', sorted(m for m in ('torch', 'ray') if m in sys.modules), flush=True)\n"
        "os._exit(rc)  # past pyarrow's teardown, which can abort at exit (study.cli.verbs.entry)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    text, _, loaded = out.stdout.rpartition("LOADED ")
    return out.returncode, text + out.stderr, ast.literal_eval(loaded)


def test_check_parity_prints_the_studys_figures_and_never_imports_ray(tmp_path: Path) -> None:
    spec = load_spec("parity")
    rc, out, loaded = run_check("parity", "--storage", str(tmp_path))
    assert rc == 0, out
    assert loaded == ["torch"], "the estimate trains with torch; Ray is never imported"
    n, iters = spec.search.num_samples, spec.iterations
    assert f"trials: {n} (tpe sampler" in out
    assert f"{n} trials x {iters:,} iterations = {n * iters:,} trial-iterations" in out
    assert spec.scheduler is not None
    rungs = asha_milestones(spec.scheduler.grace_period, iters, spec.scheduler.reduction_factor)
    assert f"cut it to {least_trial_iterations(n, iters, rungs, spec.scheduler.reduction_factor):,}" in out
    for d in spec.space:
        assert f"\n  {d.name} " in out
    assert f"resources per trial: {spec.resources.cpu:g} CPU" in out
    assert f"at most {spec.search.max_concurrent} (max_concurrent)" in out
    assert str(tmp_path / "trials" / "study=parity" / "trials.parquet") in out
    assert "no study named 'parity' there yet" in out
    assert "ESTIMATE" in out and "measured here on cpu" in out


def test_check_says_how_a_fused_spec_places_its_trials(tmp_path: Path) -> None:
    source = load_spec("parity-smoke").source.replace("gpu = 0\n", "gpu = 0\nfuse = 8\n")
    spec = tmp_path / "fused.toml"
    spec.write_text(source)
    rc, out, _ = run_check(str(spec), "--no-estimate", "--storage", str(tmp_path))
    assert rc == 0, out
    assert "fused: up to 8 trials trained as one model per CPU group" in out
    assert "a group's step runs eager (compile = 'auto')" in out  # auto compiles on CUDA only
    assert "each trial reserves 0.125 CPU" in out
    assert "note: 2 trials at once fill 1 of the " in out  # the smoke spec runs 2 at once
    assert "groups of 8)" in out  # what the machine fits, whatever max_concurrent says
    gpu = tmp_path / "fused-gpu.toml"
    gpu.write_text(source.replace("gpu = 0\n", "gpu = 1\n"))
    rc, out, _ = run_check(str(gpu), "--no-estimate", "--storage", str(tmp_path))
    assert rc == 0, out
    assert "fused: up to 8 trials trained as one model per GPU" in out
    assert "a group's step runs compiled (compile = 'auto')" in out  # as a plain trial's on CUDA


def fused_source(fuse: int, max_concurrent: int, num_samples: int) -> str:
    """parity-smoke with ``fuse`` and the trial counts given."""
    source = load_spec("parity-smoke").source.replace("gpu = 0\n", f"gpu = 0\nfuse = {fuse}\n")
    source = source.replace("max_concurrent = 2", f"max_concurrent = {max_concurrent}")
    return source.replace("num_samples = 6", f"num_samples = {num_samples}")


def test_a_fused_estimate_counts_groups_not_trials_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 trials at once on 2 CPUs are 2 groups of 8, each making its members' iterations one
    after another: the wall time divides by 2, not 16."""
    spec_file = tmp_path / "fused.toml"
    spec_file.write_text(fused_source(fuse=8, max_concurrent=16, num_samples=32))
    spec = load_spec(str(spec_file))
    assert spec.search.num_samples == 32
    asked: list[int] = []

    def measured(spec: object, members: int = 1) -> Estimate:
        asked.append(members)
        return Estimate(0.004, 0.03, 100, "cpu", 1, "lambda_p=0.5", members)

    monkeypatch.setattr(check, "measure", measured)
    monkeypatch.setattr(check.os, "cpu_count", lambda: 2)
    out = check.check_spec(str(spec_file), str(tmp_path))
    assert asked == [8]
    evaluations = 32 * -(-spec.iterations // spec.eval_interval)
    wall = (32 * spec.iterations * 0.004 + evaluations * 0.03) / 2
    assert "4.0 ms a member-iteration (a fused iteration of 8 members: 32 ms)" in out
    assert f"32 trials, 2 groups of 8 at once: about {check._duration(wall)} (" in out, out
    spec_file.write_text(fused_source(fuse=8, max_concurrent=16, num_samples=8))  # all 8 in one group
    assert "8 trials, 1 group of 8 at once" in check.check_spec(str(spec_file), str(tmp_path))


def test_a_fused_estimate_times_a_fused_group_per_member_iteration() -> None:
    spec = load_spec("parity-smoke")
    e = check.measure(spec, budget_s=0.2, members=3)
    assert e.members == 3 and e.iterations >= 3 and e.device == "cpu"
    assert 0 < e.s_per_iteration < 1 and e.s_per_evaluation > 0
    assert check.measure(spec, budget_s=0.2).members == 1


def test_a_fused_groups_memory_is_measured_a_member_and_grows_with_its_members() -> None:
    """The peak of an iteration's tensors, a member's share, at the longest max_steps a member
    may have: the same for 2 members and for 4 (a group's memory is K times it), and at least the
    activations one member's backward keeps ([N, B, 3H] float32 of its GRU's gates)."""
    spec = load_spec("parity-smoke")
    small, large = (check.measure(spec, budget_s=0.05, members=k) for k in (2, 4))
    assert small.bytes_per_member == pytest.approx(large.bytes_per_member, rel=0.2)
    config = spec.config_for({d.name: check._centre(d) for d in spec.space})
    gates = spec.longest_max_steps * config.batch_size * 3 * config.n_hidden * 4
    assert gates < large.bytes_per_member < 100 * gates
    assert check.measure(spec, budget_s=0.05).bytes_per_member == 0  # a plain trial: not a group


@pytest.mark.parametrize(
    ("trials", "max_concurrent", "fuse", "groups", "note"),
    [
        # 8 trials, fuse 16, 2 at once on 2 CPUs: a group of 16 never fills, and one CPU idles
        (8, 2, 16, 2, "2 trials at once fill 1 of the 2 groups this machine holds, and the other idles: "
         "fuse = 4 with [search] max_concurrent = 8 trains 8 trials at once in 2 groups of up to 4"),
        (8, 4, 8, 2, "4 trials at once fill 1 of the 2 groups"),  # all in one group on one CPU
        (8, 16, 8, 2, "fuse = 4 trains 8 trials at once in 2 groups of up to 4"),  # max_concurrent is enough
        (6, 2, 8, 1, "at most 2 trials at once (max_concurrent), so a group holds no more than that; "
         "raise [search] max_concurrent to 6 to fill it with all 6"),  # one GPU
        (32, 2, 8, 1, "raise [search] max_concurrent to 8 to fill one"),
        (4, 4, 8, 16, "fuse = 1 trains 4 trials at once each in its own process"),
        (32, 16, 8, 2, None),  # two full groups
        (1, 1, 8, 2, None),  # one trial: nothing to spread
        (8, 8, 8, 0, None),  # no room here: a cluster runs it
    ],
)  # fmt: skip
def test_a_fused_spec_that_leaves_groups_idle_or_unfilled_says_what_would_not(
    trials: int, max_concurrent: int, fuse: int, groups: int, note: str | None
) -> None:
    got = check.fusion_note(trials, max_concurrent, fuse, groups)
    assert got == note if note is None else (got is not None and note in got), got


@pytest.mark.parametrize(
    ("fuse", "fit", "max_concurrent", "members"),
    [(1, 16, 16, 1), (8, 16, 16, 8), (8, 2, 16, 2), (8, 16, 4, 4), (8, 0, 16, 8), (8, 0, 4, 4)],
)
def test_a_group_holds_fuse_trials_or_fewer_where_fewer_run_at_once(
    tmp_path: Path, fuse: int, fit: int, max_concurrent: int, members: int
) -> None:
    spec = tmp_path / "fused.toml"
    spec.write_text(fused_source(fuse=fuse, max_concurrent=max_concurrent, num_samples=32))
    assert check.group_members(load_spec(str(spec)), fit) == members


def test_without_the_estimate_neither_torch_nor_ray_is_imported(tmp_path: Path) -> None:
    rc, out, loaded = run_check("parity-lambda-grid", "--no-estimate", "--storage", str(tmp_path))
    assert rc == 0, out
    assert loaded == []
    spec = load_spec("parity-lambda-grid")
    sizes = [len(d.values or ()) for d in spec.space]
    assert f"trials: {sizes[0] * sizes[1]} (grid: {sizes[0]} lambda_p x {sizes[1]}" in out
    assert "not estimated (--no-estimate)" in out


def test_an_existing_study_is_named_with_the_command_that_continues_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "studies" / "parity-smoke").mkdir(parents=True)
    (tmp_path / "studies" / "parity-smoke" / "spec.toml").write_text(load_spec("parity-smoke").source)
    assert main(["check", "parity-smoke", "--no-estimate", "--storage", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "already exists there: `run` would refuse it; `ponder-study resume parity-smoke`" in out


def test_asha_without_a_rung_below_the_budget_says_every_trial_runs_it_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = load_spec("ponder-honest-confirm-forward")  # grace_period = iterations
    assert spec.scheduler is not None and spec.scheduler.grace_period == spec.iterations
    assert main(["check", spec.name, "--no-estimate", "--storage", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ASHA has no rung below the budget (grace_period 20,000): every trial runs its whole budget" in out
    assert "rungs at  iterations" not in out and "cut it to" not in out


def test_a_bad_spec_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(load_spec("parity").source.replace("high = 0.9", "high = 1.5", 1))
    with pytest.raises(SystemExit) as info:
        main(["check", str(bad)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ponder-study: error: space.lambda_p.high: lambda_p must be")


@pytest.mark.parametrize(("grace", "max_t", "factor"), [(750, 3000, 3.0), (10, 100, 2.0), (250, 2250, 3.0)])
def test_asha_milestones_are_rays(grace: int, max_t: int, factor: float) -> None:
    from ray.tune.schedulers.async_hyperband import _Bracket  # imports Ray, starts nothing

    rays = sorted(int(m) for m, _ in _Bracket(grace, max_t, factor, s=0)._rungs)
    assert asha_milestones(grace, max_t, factor) == [m for m in rays if m < max_t]


def test_asha_at_best_keeps_a_fraction_at_each_rung() -> None:
    # 9 trials, rungs 10 and 30 of 90, factor 3: 9 run to 10, 3 on to 30, 1 to 90
    assert least_trial_iterations(9, 90, [10, 30], 3.0) == 9 * 10 + 3 * 20 + 1 * 60
    assert least_trial_iterations(4, 100, [], 2.0) == 400  # no rung below the budget: no cut


def test_trials_at_once_is_bounded_by_cpus_gpus_and_max_concurrent() -> None:
    assert trials_at_once(4, 1, 0, 2, 0) == 2
    assert trials_at_once(2, 1, 0, 16, 0) == 2
    assert trials_at_once(8, 1, 0.25, 16, 1) == 4
    assert trials_at_once(8, 1, 1, 16, 0) == 0
