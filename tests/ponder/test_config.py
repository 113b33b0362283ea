"""Configs: defaults, validation, and the names shared with CLI and study."""

from __future__ import annotations

import dataclasses

import pytest

from ponder.config import CONFIGS, ConfigError, MnistConfig, ParityConfig, config_from_dict


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
