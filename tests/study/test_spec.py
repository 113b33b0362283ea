"""Study specs: the shipped ones load, bad ones fail before Ray starts with one line naming the key."""

from __future__ import annotations

import importlib.util
import itertools
import pickle
import tomllib
from pathlib import Path

import pytest

from ponder.config import CONFIGS, MnistConfig, ParityConfig
from study.spec.spec import (
    SPEC_ALIASES,
    SPECS_DIR,
    Dimension,
    SpecError,
    StudySpec,
    list_specs,
    load_spec,
    parse_spec,
)

SHIPPED = [
    "mnist",
    "mnist-rotation",
    "parity",
    "parity-extrapolation",
    "parity-lambda-grid",
    "parity-pareto",
    "parity-smoke",
    "ponder-difficulty-paper",
    "ponder-difficulty-reference",
    "ponder-extrapolation",
    "ponder-honest-confirm-forward",
    "ponder-honest-confirm-reverse",
    "ponder-honest-search",
]

# a small valid spec in parts; a bad case replaces one part
PARTS = {
    "top": 'description = "test"\ntask = "parity"',
    "config": "[config]\nn_elems = 4\nn_hidden = 8\niterations = 100\neval_interval = 10",
    "space": "[space.lambda_p]\nlow = 0.1\nhigh = 0.9\n[space.max_steps]\nlow = 2\nhigh = 6",
    "search": "",
    "scheduler": "[scheduler]\ngrace_period = 20",
    "objectives": "",
    "resources": "",
    "run": "",
}


def make(**parts: str) -> str:
    """The small valid spec's TOML, with some parts replaced."""
    unknown = set(parts) - set(PARTS)
    assert not unknown, unknown
    return "\n".join(text for text in {**PARTS, **parts}.values() if text) + "\n"


def corners(spec: StudySpec) -> list[dict[str, object]]:
    """Every corner of the spec's space: each range's ends, each listed value."""
    points = [d.values if d.values is not None else (d.low, d.high) for d in spec.space]
    return [
        {d.name: v for d, v in zip(spec.space, combo, strict=True)} for combo in itertools.product(*points)
    ]


# -- the shipped specs ---------------------------------------------------------------------------


def test_the_shipped_specs_are_listed() -> None:
    assert list_specs() == SHIPPED
    assert "parity" in list_specs()


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_spec_loads_and_every_corner_is_a_valid_config(name: str) -> None:
    spec = load_spec(name)
    assert spec.name == name
    assert spec.description and "\n" not in spec.description
    assert spec.source == (SPECS_DIR / f"{name}.toml").read_text()
    schema, question = spec.source.splitlines()[:2]
    assert schema == "#:schema ./spec.schema.json", "editors (taplo) read the schema from the first line"
    assert question.startswith("# "), "each spec then says the question it answers"
    if spec.scheduler is None:  # a multi-objective study: no ASHA
        assert spec.multi_objective
    else:
        assert spec.scheduler.grace_period <= spec.iterations
        assert spec.scheduler.grace_period % spec.eval_interval == 0
    for params in corners(spec):
        config = spec.config_for(params)
        assert isinstance(config, CONFIGS[spec.task])
        assert config.iterations == spec.iterations


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_spec_survives_an_override_round_trip(name: str) -> None:
    spec = load_spec(name)
    n = spec.search.num_samples + (0 if spec.search.sampler == "grid" else 1)  # a grid's size is fixed
    more = spec.with_overrides(num_samples=n, storage="s3://bucket/studies")
    assert more.search.num_samples == n
    assert more.run.storage == "s3://bucket/studies"
    assert (more.task, more.config, more.space, more.scheduler, more.objectives) == (
        spec.task,
        spec.config,
        spec.space,
        spec.scheduler,
        spec.objectives,
    )
    # the rewritten source is what a resumed study parses: it must give the same spec back
    assert parse_spec(more.source, more.name) == more


def test_the_default_study_is_sized_for_two_cores() -> None:
    spec = load_spec("parity")
    assert spec.task == "parity"
    assert spec.resources.cpu * spec.search.max_concurrent <= 2
    assert spec.resources.gpu == 0
    assert spec.scheduler is not None and spec.scheduler.metric == "test/halted_accuracy"
    assert {d.name for d in spec.space} == {"lambda_p", "beta", "max_steps"}


def test_the_extrapolation_spec_reports_an_extrapolation_set() -> None:
    spec = load_spec("parity-extrapolation")
    config = spec.config_for({d.name: d.low for d in spec.space})
    assert isinstance(config, ParityConfig)
    assert config.nonzero_range == (1, 25) and config.n_elems == 30


def test_the_rotation_spec_trains_rotated() -> None:
    config = load_spec("mnist-rotation").config_for({"lambda_p": 0.2, "beta": 0.01, "max_steps": 5})
    assert isinstance(config, MnistConfig)
    assert config.train_rotation == 22.5
    assert config.eval_rotations == (22.5, 45.0, 67.5, 90.0)


# -- config_for ----------------------------------------------------------------------------------


def test_config_for_merges_fixed_and_searched_values_in_their_types() -> None:
    spec = parse_spec(make(), "small")
    config = spec.config_for({"lambda_p": 1, "max_steps": 5.0})  # as JSON or Parquet may give them back
    assert isinstance(config, ParityConfig)
    assert config.lambda_p == 1.0 and type(config.lambda_p) is float
    assert config.max_steps == 5 and type(config.max_steps) is int
    assert (config.n_elems, config.n_hidden, config.iterations, config.eval_interval) == (4, 8, 100, 10)
    assert config.beta == ParityConfig().beta  # neither fixed nor searched: the dataclass default


def test_dimensions_know_their_kind() -> None:
    text = make(
        space="[space.beta]\nlow = 1e-4\nhigh = 0.1\nlog = true\n[space.max_steps]\nlow = 2\nhigh = 6\n"
        '[space.kl_direction]\nvalues = ["forward", "reverse"]'
    )
    beta, max_steps, kl = parse_spec(text, "kinds").space
    assert beta == Dimension("beta", 1e-4, 0.1, log=True)
    assert max_steps == Dimension("max_steps", 2, 6, integer=True)
    assert type(max_steps.low) is int and type(beta.low) is float
    assert kl.categorical and kl.values == ("forward", "reverse") and kl.low is None


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"lambda_p": 0.5}, "params.max_steps"),
        ({"lambda_p": 0.5, "max_steps": 3, "beta": 0.1}, "params.beta"),
        ({"lambda_p": 1.5, "max_steps": 3}, "params.lambda_p"),
    ],
)
def test_config_for_refuses_params_that_do_not_fit(params: dict[str, float], key: str) -> None:
    spec = parse_spec(make(), "small")
    with pytest.raises(SpecError) as info:
        spec.config_for(params)
    assert str(info.value).startswith(f"{key}: ")


def test_iterations_default_to_the_dataclass_and_grace_to_a_quarter_on_the_grid() -> None:
    spec = parse_spec(make(config="[config]\neval_interval = 300", scheduler=""), "defaults")
    assert spec.iterations == ParityConfig().iterations == 20_000
    assert spec.scheduler.grace_period == 4800  # 5000 rounded down to a multiple of 300


def test_the_longest_max_steps_is_the_spaces_top_else_the_fixed_value_else_the_default() -> None:
    assert parse_spec(make(), "small").longest_max_steps == 6  # the range's top
    listed = make(space="[space.max_steps]\nvalues = [3, 9, 5]")
    assert parse_spec(listed, "listed").longest_max_steps == 9
    fixed = make(config=PARTS["config"] + "\nmax_steps = 7", space="[space.lambda_p]\nlow = 0.1\nhigh = 0.9")
    assert parse_spec(fixed, "fixed").longest_max_steps == 7
    default = make(space="[space.lambda_p]\nlow = 0.1\nhigh = 0.9")
    assert parse_spec(default, "default").longest_max_steps == ParityConfig().max_steps


# -- bad specs -----------------------------------------------------------------------------------
ACC_MAX, STEPS_MIN = '"test/halted_accuracy" = "max"', '"test/mean_halting_step" = "min"'

BAD = [
    # (id, parts, key the message must start with, a phrase it must contain)
    ("syntax", {"run": "[run]\nstorage = "}, "", "line"),
    ("unknown-top", {"top": 'descripton = "x"\ntask = "parity"'}, "descripton", "did you mean 'description'"),
    ("unknown-config", {"config": "[config]\nn_elem = 4"}, "config.n_elem", "did you mean 'n_elems'"),
    (
        "unknown-dim-key",
        {"space": "[space.lambda_p]\nlow = 0.1\nhgih = 0.9"},
        "space.lambda_p.hgih",
        "'high'",
    ),
    ("unknown-search", {"search": "[search]\nsamples = 4"}, "search.samples", "num_samples"),
    ("unknown-scheduler", {"scheduler": "[scheduler]\ngrace = 20"}, "scheduler.grace", "grace_period"),
    ("unknown-resources", {"resources": "[resources]\ngpus = 1"}, "resources.gpus", "'gpu'"),
    ("unknown-run", {"run": "[run]\nstorag = 'x'"}, "run.storag", "'storage'"),
    (
        "unknown-field-in-space",
        {"space": "[space.lamda_p]\nlow = 0.1\nhigh = 0.9"},
        "space.lamda_p",
        "lambda_p",
    ),
    ("task-missing", {"top": 'description = "x"'}, "task", "parity"),
    ("task-unknown", {"top": 'task = "sudoku"'}, "task", "parity, mnist"),
    ("task-in-config", {"config": "[config]\ntask = 'mnist'"}, "config.task", "top"),
    ("description-not-a-string", {"top": 'description = 3\ntask = "parity"'}, "description", "one-line"),
    ("config-string-for-int", {"config": '[config]\nn_elems = "10"'}, "config.n_elems", "remove the quotes"),
    ("config-float-for-int", {"config": "[config]\nn_elems = 10.0"}, "config.n_elems", "write 10"),
    ("config-bool-for-int", {"config": "[config]\nbatch_size = true"}, "config.batch_size", "integer"),
    ("config-string-for-float", {"config": "[config]\nlr = '1e-3'"}, "config.lr", "remove the quotes"),
    (
        "config-bad-literal",
        {"config": "[config]\nkl_direction = 'forwards'"},
        "config.kl_direction",
        "forward",
    ),
    ("config-out-of-range", {"config": "[config]\ngrad_clip = -1.0"}, "config.grad_clip", ">= 0"),
    ("config-no-iterations", {"config": "[config]\niterations = 0"}, "config.iterations", ">= 1"),
    (
        "config-interval-above-budget",
        {"config": "[config]\niterations = 100\neval_interval = 200"},
        "config.eval_interval",
        "lower eval_interval",
    ),
    (
        "config-cuda-without-gpu",
        {"config": "[config]\ndevice = 'cuda'\niterations = 100\neval_interval = 10"},
        "config.device",
        "resources.gpu",
    ),
    ("space-empty", {"space": ""}, "space", "[space.<field>]"),
    ("space-not-a-table", {"space": "[space]\nlambda_p = 0.5"}, "space.lambda_p", "set it in [config]"),
    ("space-iterations", {"space": "[space.iterations]\nlow = 10\nhigh = 20"}, "space.iterations", "budget"),
    (
        "space-eval-interval",
        {"space": "[space.eval_interval]\nlow = 10\nhigh = 20"},
        "space.eval_interval",
        "",
    ),
    (
        "space-also-fixed",
        {"space": "[space.n_hidden]\nlow = 4\nhigh = 8"},
        "space.n_hidden",
        "also fixed in [config]",
    ),
    (
        "space-lambda-above-1",
        {"space": "[space.lambda_p]\nlow = 0.1\nhigh = 1.5"},
        "space.lambda_p.high",
        "(0, 1]",
    ),
    ("space-negative-beta", {"space": "[space.beta]\nlow = -0.1\nhigh = 0.1"}, "space.beta.low", ">= 0"),
    ("space-zero-steps", {"space": "[space.max_steps]\nlow = 0\nhigh = 5"}, "space.max_steps.low", ">= 1"),
    (
        "space-float-int-bound",
        {"space": "[space.max_steps]\nlow = 2.5\nhigh = 5"},
        "space.max_steps.low",
        "integer",
    ),
    (
        "space-empty-range",
        {"space": "[space.lambda_p]\nlow = 0.5\nhigh = 0.5"},
        "space.lambda_p.high",
        "above low",
    ),
    ("space-missing-high", {"space": "[space.lambda_p]\nlow = 0.5"}, "space.lambda_p.high", "missing"),
    (
        "space-log-from-zero",
        {"space": "[space.beta]\nlow = 0\nhigh = 0.1\nlog = true"},
        "space.beta.low",
        "> 0",
    ),
    (
        "space-log-not-bool",
        {"space": "[space.beta]\nlow = 0.1\nhigh = 1\nlog = 1"},
        "space.beta.log",
        "true or false",
    ),
    (
        "space-range-and-values",
        {"space": "[space.lambda_p]\nlow = 0.1\nvalues = [0.2]"},
        "space.lambda_p.low",
        "not both",
    ),
    ("space-empty-values", {"space": "[space.lambda_p]\nvalues = []"}, "space.lambda_p.values", "non-empty"),
    (
        "space-bad-value",
        {"space": "[space.lambda_p]\nvalues = [0.5, 2.0]"},
        "space.lambda_p.values",
        "(0, 1]",
    ),
    (
        "space-repeated-value",
        {"space": "[space.lambda_p]\nvalues = [0.5, 0.5]"},
        "space.lambda_p.values",
        "twice",
    ),
    (
        "space-bad-literal",
        {"space": "[space.kl_direction]\nvalues = ['forward', 'backward']"},
        "space.kl_direction.values",
        "forward, reverse",
    ),
    (
        "space-range-on-string",
        {"space": "[space.device]\nlow = 1\nhigh = 2"},
        "space.device",
        "values = [...]",
    ),
    (
        "space-corner-conflict",
        {
            "config": "[config]\nn_nonzero_max = 6\niterations = 100\neval_interval = 10",
            "space": "[space.n_elems]\nlow = 4\nhigh = 8",
        },
        "config.n_nonzero_max",
        "at n_elems=4",
    ),
    ("search-sampler", {"search": "[search]\nsampler = 'bayes'"}, "search.sampler", "tpe, random, qmc, gp"),
    ("search-no-samples", {"search": "[search]\nnum_samples = 0"}, "search.num_samples", ">= 1"),
    ("search-no-concurrency", {"search": "[search]\nmax_concurrent = 0"}, "search.max_concurrent", ">= 1"),
    ("search-seed-string", {"search": "[search]\nseed = 'x'"}, "search.seed", "integer"),
    ("search-seed-negative", {"search": "[search]\nseed = -1"}, "search.seed", "2**32"),
    (
        "metric-unknown",
        {"scheduler": "[scheduler]\nmetric = 'test/accuracy'"},
        "scheduler.metric",
        "halted_accuracy",
    ),
    (
        "metric-no-such-set",
        {"scheduler": "[scheduler]\nmetric = 'extrapolation/halted_accuracy'"},
        "scheduler.metric",
        "sets: test, easy, hard",
    ),
    (
        "metric-list",
        {"scheduler": "[scheduler]\nmetric = 'test/per_step_accuracy'"},
        "scheduler.metric",
        "list",
    ),
    (
        "metric-train",
        {"scheduler": "[scheduler]\nmetric = 'train/accuracy'"},
        "scheduler.metric",
        "train/loss",
    ),
    ("mode-unknown", {"scheduler": "[scheduler]\nmode = 'maximise'"}, "scheduler.mode", '"max" or "min"'),
    ("mode-backwards", {"scheduler": "[scheduler]\nmode = 'min'"}, "scheduler.mode", 'mode = "max"'),
    (
        "grace-below-interval",
        {"scheduler": "[scheduler]\ngrace_period = 5"},
        "scheduler.grace_period",
        "multiple of 10",
    ),
    (
        "grace-above-budget",
        {"scheduler": "[scheduler]\ngrace_period = 200"},
        "scheduler.grace_period",
        "budget",
    ),
    ("grace-zero", {"scheduler": "[scheduler]\ngrace_period = 0"}, "scheduler.grace_period", ">= 1"),
    (
        "reduction-one",
        {"scheduler": "[scheduler]\ngrace_period = 20\nreduction_factor = 1"},
        "scheduler.reduction_factor",
        "above 1",
    ),
    (
        "brackets-zero",
        {"scheduler": "[scheduler]\ngrace_period = 20\nbrackets = 0"},
        "scheduler.brackets",
        ">= 1",
    ),
    ("cpu-zero", {"resources": "[resources]\ncpu = 0"}, "resources.cpu", "above 0"),
    ("gpu-negative", {"resources": "[resources]\ngpu = -1"}, "resources.gpu", ">= 0"),
    ("gpu-fraction-above-one", {"resources": "[resources]\ngpu = 1.5"}, "resources.gpu", "whole number"),
    ("fuse-zero", {"resources": "[resources]\nfuse = 0"}, "resources.fuse", ">= 1"),
    ("fuse-over-two-gpus", {"resources": "[resources]\ngpu = 2\nfuse = 4"}, "resources.gpu", "on one GPU"),
    (
        "fuse-below-rays-share",
        {"resources": "[resources]\ncpu = 1\nfuse = 20000"},
        "resources.fuse",
        "5e-05 CPU, below Ray's smallest share (0.0001): fuse at most 10000 with cpu = 1",
    ),
    (
        "fuse-gpu-below-rays-share",
        {"resources": "[resources]\ncpu = 2\ngpu = 0.5\nfuse = 8000"},
        "resources.fuse",
        "6.3e-05 GPU, below Ray's smallest share (0.0001): fuse at most 5000 with gpu = 0.5",
    ),
    ("cpu-below-rays-share", {"resources": "[resources]\ncpu = 0.00001"}, "resources.cpu", "at least 0.0001"),
    ("storage-empty", {"run": "[run]\nstorage = ''"}, "run.storage", "non-empty"),
    ("failures-negative", {"run": "[run]\nmax_failures = -1"}, "run.max_failures", ">= 0"),
    ("table-not-a-table", {"top": 'task = "parity"\nrun = 3'}, "run", "must be a table"),
    (
        "objectives-with-asha",
        {"objectives": f"[objectives]\n{ACC_MAX}\n{STEPS_MIN}"},
        "scheduler",
        "ASHA compares trials on one metric",
    ),
    (
        "objectives-only-one",
        {"scheduler": "", "objectives": f"[objectives]\n{ACC_MAX}"},
        "objectives",
        "single-objective",
    ),
    (
        "objectives-unknown-metric",
        {"scheduler": "", "objectives": f'[objectives]\n"test/halted_acc" = "max"\n{STEPS_MIN}'},
        'objectives."test/halted_acc"',
        "did you mean 'test/halted_accuracy'",
    ),
    (
        "objectives-worst-direction",
        {"scheduler": "", "objectives": f'[objectives]\n"test/halted_accuracy" = "min"\n{STEPS_MIN}'},
        'objectives."test/halted_accuracy"',
        'use mode = "max"',
    ),
    (
        "objectives-bad-mode",
        {"scheduler": "", "objectives": f'[objectives]\n{ACC_MAX}\n"test/mean_halting_step" = "less"'},
        'objectives."test/mean_halting_step"',
        '"max" or "min"',
    ),
    (
        "objectives-list-metric",
        {"scheduler": "", "objectives": f'[objectives]\n{ACC_MAX}\n"test/per_step_accuracy" = "max"'},
        'objectives."test/per_step_accuracy"',
        "per-step list",
    ),
]


@pytest.mark.parametrize(
    ("parts", "key", "phrase"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_a_bad_spec_fails_with_one_line_naming_the_key(parts: dict[str, str], key: str, phrase: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(make(**parts), "bad")
    message = str(info.value)
    assert "\n" not in message
    assert info.value.key == key
    if key:
        assert message.startswith(f"{key}: "), message
    assert phrase in message, message


def test_the_small_spec_itself_is_valid() -> None:
    spec = parse_spec(make(), "small")
    assert spec.name == "small" and spec.task == "parity"


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('task = "parity"\n[config\n')
    with pytest.raises(SpecError, match=r"broken\.toml: not valid TOML: .*line 2"):
        load_spec(str(path))


def test_a_metric_on_a_set_some_corners_lack_is_refused() -> None:
    # extrapolation exists only where n_nonzero_max < n_elems: not at the high corner
    text = make(
        config="[config]\nn_elems = 8\niterations = 100\neval_interval = 10",
        space="[space.n_nonzero_max]\nlow = 4\nhigh = 8",
        scheduler="[scheduler]\ngrace_period = 20\nmetric = 'extrapolation/halted_accuracy'",
    )
    with pytest.raises(SpecError, match=r"^scheduler\.metric: .*at every point of the space"):
        parse_spec(text, "some-corners")
    ok = text.replace("high = 8", "high = 7")
    assert parse_spec(ok, "all-corners").scheduler.metric == "extrapolation/halted_accuracy"


def test_fused_mnist_is_a_spec_of_the_counter_stream_only() -> None:
    """Fused MNIST draws every member's dropout masks from its counter stream (the default): a spec
    fixing or searching the generator stream (runs made before counter streams) is refused."""
    source = load_spec("mnist").source.replace("[resources]", "[resources]\nfuse = 4")
    assert parse_spec(source, "mnist-fused").resources.fuse == 4
    refused = r'^resources.fuse: fused mnist draws every member.s randomness .*set data_stream = "counter"'
    fixed = source.replace("[config]\n", '[config]\ndata_stream = "generator"\n')
    searched = source.replace(
        "[search]", '[space.data_stream]\nvalues = ["counter", "generator"]\n\n[search]'
    )
    for text in (fixed, searched):
        with pytest.raises(SpecError, match=refused):
            parse_spec(text, "mnist-fused")


def test_a_bad_name_is_refused() -> None:
    with pytest.raises(SpecError, match=r"^name: "):
        parse_spec(make(), "my study")


@pytest.mark.parametrize("name", ["007", "2024-01-01", "1.5"])
def test_a_name_without_a_letter_is_refused(name: str) -> None:
    """pandas reads study=007 back as the number 7: the partition's type is inferred."""
    with pytest.raises(SpecError, match=r"^name: .*must hold a letter"):
        parse_spec(make(), name)


def test_spec_errors_survive_pickling() -> None:  # Ray ships exceptions between processes
    with pytest.raises(SpecError) as info:
        parse_spec(make(search="[search]\nnum_samples = 0"), "bad")
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and copy.key == "search.num_samples"


# -- loading and overrides -----------------------------------------------------------------------


def test_an_unknown_name_lists_the_shipped_specs() -> None:
    with pytest.raises(SpecError) as info:
        load_spec("parity-smok")
    message = str(info.value)
    assert message.startswith("spec: ") and "did you mean 'parity-smoke'" in message
    for name in SHIPPED:
        assert name in message


@pytest.mark.parametrize(("old", "new"), sorted(SPEC_ALIASES.items()))
def test_a_former_spec_name_loads_the_renamed_spec_and_names_the_study_by_it(old: str, new: str) -> None:
    """A renamed shipped spec keeps its old name working: the same spec, and a study named as
    before, so that the ``status`` and ``resume`` of a study started by the old name find it."""
    assert new in SHIPPED and old not in list_specs()
    spec, renamed = load_spec(old), load_spec(new)
    assert spec.name == old and renamed.name == new
    assert spec.source == renamed.source and spec.with_overrides(name=new) == renamed


def test_a_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no spec file"):
        load_spec(str(tmp_path / "nope.toml"))


def test_a_spec_loads_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(make())
    spec = load_spec(str(path))
    assert spec.name == "mine"
    assert spec.source == path.read_text()


def test_with_overrides_changes_what_it_is_asked_to() -> None:
    spec = load_spec("parity-smoke")
    renamed = spec.with_overrides(name="smoke-2")
    assert renamed.name == "smoke-2" and renamed.source == spec.source  # the name is not in the TOML
    more = spec.with_overrides(num_samples=3, storage="/tmp/elsewhere")
    assert (more.search.num_samples, more.run.storage) == (3, "/tmp/elsewhere")
    assert more.source.startswith("\n".join(spec.source.splitlines()[:2]))  # the question it answers is kept
    assert "num_samples = 3" in more.source
    assert tomllib.loads(more.source)["search"]["num_samples"] == 3
    assert spec.with_overrides() == spec


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"name": "bad name"}, "name"),
        ({"name": "-leading-dash"}, "name"),
        ({"name": ""}, "name"),
        ({"num_samples": 0}, "search.num_samples"),
        ({"num_samples": True}, "search.num_samples"),
        ({"storage": " "}, "run.storage"),
    ],
)
def test_with_overrides_validates(overrides: dict[str, object], key: str) -> None:
    spec = load_spec("parity-smoke")
    with pytest.raises(SpecError) as info:
        spec.with_overrides(**overrides)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"{key}: ")
    assert "\n" not in str(info.value)


def test_mnist_rotation_sets_are_metrics_and_the_rotation_list_is_not_searchable() -> None:
    source = load_spec("mnist-rotation").source
    on_rot90 = source.replace('metric = "test/halted_accuracy"', 'metric = "rot90/halted_accuracy"')
    assert parse_spec(on_rot90, "rot90").scheduler.metric == "rot90/halted_accuracy"
    with pytest.raises(
        SpecError, match=r"^scheduler\.metric: .*sets: test, rot22\.5, rot45, rot67\.5, rot90"
    ):
        parse_spec(source.replace('metric = "test/halted_accuracy"', 'metric = "rot30/halted_accuracy"'), "x")
    searched = (
        source.replace("eval_rotations = [22.5, 45, 67.5, 90]", "") + "[space.eval_rotations]\nvalues = [1]\n"
    )
    with pytest.raises(SpecError, match=r"^space\.eval_rotations: .*cannot be searched"):
        parse_spec(searched, "x")


def test_a_sampler_needs_its_package() -> None:
    text = make(search="[search]\nsampler = 'cmaes'")
    if importlib.util.find_spec("cmaes") is None:
        with pytest.raises(SpecError, match=r"^search\.sampler: .*pip install cmaes"):
            parse_spec(text, "cmaes")
    else:
        assert parse_spec(text, "cmaes").search.sampler == "cmaes"
    assert parse_spec(make(search="[search]\nsampler = 'random'"), "random").search.sampler == "random"


@pytest.mark.parametrize("sampler", ["tpe", "random", "qmc", "gp", "grid"])
def test_every_sampler_a_spec_accepts_is_built(sampler: str, tmp_path: Path) -> None:
    """What the spec lets through, `study.search.search` can build (real Optuna samplers)."""
    from study.search.search import make_searcher  # imports Ray: only here
    from study.storage.storage import StudyPaths

    spec = load_spec("parity-lambda-grid" if sampler == "grid" else "parity-smoke")
    text = spec.source.replace(f'sampler = "{spec.search.sampler}"', f'sampler = "{sampler}"')
    assert f'sampler = "{sampler}"' in text
    searcher = make_searcher(parse_spec(text, "parity-smoke"), StudyPaths(str(tmp_path), "x"))
    assert searcher.searcher._sampler.__class__.__name__.lower().startswith(sampler[:2])


def test_a_multi_objective_spec_has_no_asha_and_a_front_of_its_objectives() -> None:
    spec = parse_spec(make(scheduler="", objectives=f"[objectives]\n{ACC_MAX}\n{STEPS_MIN}"), "pareto")
    assert spec.scheduler is None and spec.multi_objective
    assert spec.objectives == (("test/halted_accuracy", "max"), ("test/mean_halting_step", "min"))
    assert (spec.metric, spec.mode) == ("test/halted_accuracy", "max")  # the primary: "best" in tables
    assert spec.front_objectives == spec.objectives
    again = spec.with_overrides(name="again", num_samples=3)  # the objectives survive a rewrite
    assert again.objectives == spec.objectives and again.scheduler is None


def test_a_single_accuracy_objective_is_traded_against_its_sets_thinking_time() -> None:
    spec = parse_spec(make(), "asha")
    assert not spec.multi_objective and spec.scheduler is not None
    assert spec.front_objectives == (("test/halted_accuracy", "max"), ("test/mean_halting_step", "min"))
    scheduler = '[scheduler]\nmetric = "test/loss"\nmode = "min"\ngrace_period = 20'
    loss = parse_spec(make(scheduler=scheduler), "l")
    assert loss.front_objectives == (("test/loss", "min"),)


@pytest.mark.parametrize("metric", ["test/stable_accuracy", "hard/best_step_accuracy"])
def test_the_pondering_diagnostics_are_objectives_maximised(metric: str) -> None:
    """A study can search for honest pondering: ASHA's metric or one of several objectives."""
    scheduler = f'[scheduler]\nmetric = "{metric}"\nmode = "max"\ngrace_period = 20'
    spec = parse_spec(make(scheduler=scheduler), "diagnostic")
    assert spec.scheduler is not None and (spec.metric, spec.mode) == (metric, "max")
    with pytest.raises(SpecError, match=r'^scheduler\.mode: .*use mode = "max"'):
        parse_spec(make(scheduler=scheduler.replace('"max"', '"min"')), "diagnostic")
    objectives = f'[objectives]\n"{metric}" = "max"\n{STEPS_MIN}'
    multi = parse_spec(make(scheduler="", objectives=objectives), "diagnostic")
    assert multi.objectives == ((metric, "max"), ("test/mean_halting_step", "min"))


def test_a_grid_is_every_combination_of_listed_values_once() -> None:
    spec = load_spec("parity-lambda-grid")
    assert spec.search.sampler == "grid" and spec.search.num_samples == 5 * 2
    grid = make(space="[space.lambda_p]\nvalues = [0.1, 0.5]\n[space.max_steps]\nvalues = [2, 4, 6]")
    assert parse_spec(grid + '[search]\nsampler = "grid"\n', "g").search.num_samples == 6


@pytest.mark.parametrize(
    ("search", "key", "phrase"),
    [
        ('[search]\nsampler = "grid"', "space.max_steps", "values = [...]"),  # a range is not a grid
        ('[search]\nsampler = "grid"\nnum_samples = 4', "search.num_samples", "the grid has 2 points"),
    ],
)
def test_a_grid_needs_values_and_its_own_size(search: str, key: str, phrase: str) -> None:
    space = "[space.lambda_p]\nvalues = [0.1, 0.5]\n[space.max_steps]\nlow = 2\nhigh = 6"
    if "num_samples" in search:
        space = "[space.lambda_p]\nvalues = [0.1, 0.5]"
    with pytest.raises(SpecError) as info:
        parse_spec(make(space=space, search=search), "g")
    assert info.value.key == key and phrase in str(info.value), str(info.value)


@pytest.mark.parametrize(("num_samples", "startup"), [(4, 2), (8, 2), (12, 3), (40, 10), (400, 10)])
def test_tpe_starts_modelling_within_the_study(num_samples: int, startup: int, tmp_path: Path) -> None:
    """Optuna's TPE default (10 random trials first) would make an 8-trial study random search."""
    from study.search.search import make_searcher  # imports Ray: only here
    from study.storage.storage import StudyPaths

    spec = load_spec("parity").with_overrides(num_samples=num_samples)
    searcher = make_searcher(spec, StudyPaths(str(tmp_path), "x"))
    assert searcher.searcher._sampler._n_startup_trials == startup
