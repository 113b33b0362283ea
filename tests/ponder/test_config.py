"""Configs: defaults, validation, and the names shared with CLI and study."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest

from ponder.config import (
    CONFIGS,
    CompileMode,
    ConfigError,
    KLDirection,
    MnistConfig,
    ParityConfig,
    PriorTail,
    config_from_dict,
    fields_of,
)
from tests.ponder.majority import majority_task


def test_the_knobs_have_their_study_names() -> None:
    for cls in CONFIGS.values():
        names = {f.name for f in dataclasses.fields(cls)}
        assert {"lambda_p", "beta", "max_steps", "lr", "batch_size", "n_hidden", "seed"} <= names
    assert {"n_elems", "n_nonzero_min", "n_nonzero_max"} <= {f.name for f in dataclasses.fields(ParityConfig)}


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"lambda_p": 0.0}, "lambda_p"),
        ({"lambda_p": 1.01}, "lambda_p"),
        ({"beta": -0.1}, "beta"),
        ({"max_steps": 0}, "max_steps"),
        ({"lr": 0.0}, "lr"),
        ({"n_nonzero_max": 16}, "n_nonzero_max"),
        ({"n_nonzero_min": 5, "n_nonzero_max": 4}, "n_nonzero_max"),
        ({"kl_direction": "sideways"}, "kl_direction"),
        ({"prior_tail": "drop"}, "prior_tail"),
        ({"max_steps": "20"}, "max_steps"),
        ({"max_steps": 2.5}, "max_steps"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_values_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ParityConfig(**overrides)  # type: ignore[arg-type]


def test_lambda_p_one_and_beta_zero_are_allowed() -> None:
    config = ParityConfig(lambda_p=1.0, beta=0, max_steps=1)
    assert config.beta == 0.0 and isinstance(config.beta, float)


def test_dict_round_trip_and_unknown_keys() -> None:
    config = MnistConfig(eval_rotations=(10.0, 20.0), lambda_p=0.3)
    assert config_from_dict(config.to_dict()) == config
    assert config_from_dict(ParityConfig(n_elems=8).to_dict()) == ParityConfig(n_elems=8)
    with pytest.raises(ConfigError, match="lamda_p"):
        config_from_dict({"task": "parity", "lamda_p": 0.3})
    with pytest.raises(ConfigError, match="task"):
        config_from_dict({"task": "sudoku"})


def test_parity_range_defaults_to_the_whole_vector() -> None:
    assert ParityConfig(n_elems=30).nonzero_range == (1, 30)
    assert ParityConfig(n_elems=30, n_nonzero_max=25).nonzero_range == (1, 25)


def test_every_field_of_every_task_has_a_type_and_a_doc() -> None:
    with majority_task():  # a task defined outside ponder/ too
        configs = dict(CONFIGS)
    assert set(configs) == {"parity", "mnist", "majority"}
    for cls in configs.values():
        infos = fields_of(cls)
        assert [f.name for f in infos] == [f.name for f in dataclasses.fields(cls)]
        for f in infos:
            assert f.kind in (bool, float, int, str, tuple), f"{cls.__name__}.{f.name}: {f.type!r}"
            assert (f.item is not None) == (f.kind is tuple), f.name
            assert f.doc and "\n" not in f.doc, f"{cls.__name__}.{f.name} has no docstring"
            assert f.default is not dataclasses.MISSING, f.name
            assert not f.choices or all(isinstance(c, f.kind) for c in f.choices), f.name


def test_fields_of_reads_types_choices_defaults_and_docs() -> None:
    parity = {f.name: f for f in fields_of(ParityConfig)}
    assert parity["lambda_p"].type is float and parity["lambda_p"].default == 0.2
    assert parity["max_steps"].kind is int and not parity["max_steps"].optional
    assert parity["n_nonzero_max"].kind is int and parity["n_nonzero_max"].optional
    assert parity["n_nonzero_max"].default is None
    assert parity["kl_direction"].choices == get_args(KLDirection) == ("forward", "reverse")
    assert parity["prior_tail"].choices == get_args(PriorTail)
    assert parity["compile"].choices == get_args(CompileMode) and parity["compile"].kind is str
    assert parity["device"].kind is str and parity["device"].choices == ()
    assert parity["beta"].doc == "Weight of the KL regulariser in L = L_rec + beta * KL. >= 0."
    mnist = {f.name: f for f in fields_of(MnistConfig)}
    assert mnist["lr"].default == 1e-3 and mnist["lambda_p"].default == 0.2  # a subclass's, a base's
    assert mnist["eval_rotations"].kind is tuple and mnist["eval_rotations"].item is float
    assert mnist["data_dir"].kind is str and mnist["data_dir"].optional
    assert mnist["dropout"].doc == "Dropout in the step's MLP."


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"kl_direction": "sideways"}, "kl_direction must be forward or reverse, got 'sideways'"),
        ({"prior_tail": 1}, "prior_tail must be renormalise, last_step or truncate, got 1"),
        ({"compile": "maybe"}, "compile must be auto, on or off, got 'maybe'"),
        ({"max_steps": "20"}, "max_steps must be int, got '20'"),
        ({"beta": True}, "beta must be float, got True"),
        ({"n_nonzero_max": "3"}, "n_nonzero_max must be int, got '3'"),
    ],
)
def test_type_and_choice_errors_say_what_is_allowed(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        ParityConfig(**overrides)  # type: ignore[arg-type]
    assert str(e.value) == message
