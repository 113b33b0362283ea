"""The spec's JSON Schema: printed by `ponder-study schema`, shipped beside the specs, and what
every shipped spec (and no spec with an unknown key) validates against."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import jsonschema
import pytest

from study.cli import main
from study.spec.spec import SPECS_DIR, list_specs, load_spec

SHIPPED = SPECS_DIR / "spec.schema.json"


@pytest.fixture(scope="module")
def printed() -> dict[str, Any]:
    """What `ponder-study schema` prints, parsed (the CLI in-process: no Ray, no torch)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["schema"]) == 0
    schema: dict[str, Any] = json.loads(out.getvalue())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def errors(schema: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [e.message for e in validator.iter_errors(doc)]


def test_the_shipped_schema_is_the_printed_one(printed: dict[str, Any]) -> None:
    assert json.loads(SHIPPED.read_text()) == printed, (
        "study/spec/specs/spec.schema.json differs from the spec's models: regenerate it: make generate"
    )


def test_the_schema_says_what_it_cannot_check(printed: dict[str, Any]) -> None:
    assert "ponder-study check" in printed["description"]
    assert "corner" in printed["description"] and "metrics" in printed["description"]


@pytest.mark.parametrize("name", list_specs())
def test_every_shipped_spec_names_and_validates_against_the_schema(
    name: str, printed: dict[str, Any]
) -> None:
    text = (SPECS_DIR / f"{name}.toml").read_text()
    assert text.splitlines()[0] == "#:schema ./spec.schema.json"  # taplo / Even Better TOML read this
    assert errors(printed, tomllib.loads(text)) == []


@pytest.mark.parametrize(
    ("where", "edit"),
    [
        ("top level", lambda d: d.update(descripton="x")),
        ("[config]", lambda d: d["config"].update(n_elem=4)),
        ("[space.lambda_p]", lambda d: d["space"]["lambda_p"].update(hgih=0.9)),
        ("[space]", lambda d: d["space"].update(lamda_p={"low": 0.1, "high": 0.9})),
        ("[search]", lambda d: d["search"].update(samples=4)),
        ("[resources]", lambda d: d.setdefault("resources", {}).update(gpus=1)),
        ("[run]", lambda d: d.setdefault("run", {}).update(storag="x")),
    ],
)
def test_a_spec_with_an_unknown_key_does_not_validate(where: str, edit: Any, printed: dict[str, Any]) -> None:
    doc = tomllib.loads(load_spec("parity").source)
    assert errors(printed, doc) == []
    edit(doc)
    assert errors(printed, doc), f"an unknown key in {where} validated"


def test_each_task_has_its_own_fields(printed: dict[str, Any]) -> None:
    """A discriminated union on `task`: parity's fields are not mnist's, and the reverse."""
    parity = tomllib.loads(load_spec("parity").source)
    mnist = tomllib.loads(load_spec("mnist").source)
    parity["config"]["n_embed"] = 32  # an mnist field
    mnist["config"]["n_elems"] = 8  # a parity field
    assert errors(printed, parity) and errors(printed, mnist)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["config"].update(n_elems="8"),  # a string for an int
        lambda d: d["space"]["max_steps"].update(low=2.5),  # an int field's range
        lambda d: d["space"].update(kl_direction={"values": ["forward", "backward"]}),
        lambda d: d["search"].update(num_samples=0),
        lambda d: d.setdefault("resources", {}).update(cpu=0),
        lambda d: d.pop("task"),
    ],
)
def test_types_and_bounds_are_in_the_schema(edit: Any, printed: dict[str, Any]) -> None:
    doc = tomllib.loads(load_spec("parity").source)
    edit(doc)
    assert errors(printed, doc)
