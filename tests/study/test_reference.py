"""The reference tables of the docs (`study.cli.reference`, `study.spec.reference`) are the code's:
every spec key with its default, every verb with its flags, every exit code."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from ponder.config import CONFIGS
from study.cli import base
from study.cli.reference import BLOCKS, MARK, REGENERATE, cli_reference, fill, main, verb_rows
from study.spec.models import SchedulerSpec, SearchSpec, spec_model
from study.spec.reference import UNSET, config_rows, section_rows, spec_reference

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_generated_table_in_the_docs_is_the_codes(page: Path) -> None:
    text = page.read_text()
    assert fill(text) == text, (
        f"{page.relative_to(REPO)}: a table generated from the code differs from it; run `{REGENERATE}`"
    )


def test_the_specs_page_holds_the_spec_keys_and_the_verbs_and_the_api_page_its_names() -> None:
    blocks = {
        page: sorted(m.group(2) for m in MARK.finditer((REPO / "docs" / page).read_text()))
        for page in ("specs.md", "api.md")
    }
    assert blocks == {"specs.md": ["cli", "spec-keys"], "api.md": ["api"]}
    assert sorted(BLOCKS) == ["api", "cli", "spec-keys"]


def test_a_stale_table_is_rewritten_and_an_unknown_one_refused() -> None:
    page = "intro\n<!-- generated: spec-keys -->\n| old |\n<!-- end of generated: spec-keys -->\nafter\n"
    new = fill(page)
    assert "| old |" not in new and spec_reference() in new and new.endswith("after\n")
    with pytest.raises(KeyError, match="no generated table named 'nope'"):
        fill("<!-- generated: nope -->\n<!-- end of generated: nope -->")


def test_check_names_a_stale_page_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.md"
    stale = "<!-- generated: cli -->\n| old |\n<!-- end of generated: cli -->\n"
    page.write_text(stale)
    assert main(["--check", str(page)]) == 1
    assert page.read_text() == stale and "page.md: differs from the code" in capsys.readouterr().err
    assert main([str(page)]) == 0 and main(["--check", str(page)]) == 0
    assert cli_reference() in page.read_text()


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]


def test_each_task_default_in_the_table_is_its_config_dataclasss() -> None:
    """Read back from the rendered table, against `ponder.config` itself (not the spec models the
    table is made from): a default the models changed on the way would show here."""
    header, *rows = [_cells(r) for r in spec_reference().split("\n\n")[-1].splitlines() if r.startswith("|")]
    rows = rows[1:]  # the --- line
    by_field = {row[0].strip("`"): row for row in rows}
    for task, cls in CONFIGS.items():
        column = header.index(f"{task} default")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            shown = by_field[f.name][column]
            if default is None:
                assert shown == UNSET, (task, f.name, shown)
            else:
                value = shown.strip("`").strip('"').replace("[", "").replace("]", "")
                expected = default if isinstance(default, tuple) else (default,)
                got = [
                    type(e)(v) if not isinstance(e, str) else v
                    for e, v in zip(expected, value.split(", "), strict=True)
                ]
                assert tuple(got) == tuple(expected), (task, f.name, shown)


def test_every_key_a_spec_takes_has_a_row() -> None:
    keys = {row[0] for row in section_rows()}
    for section, model in (("search", SearchSpec), ("scheduler", SchedulerSpec)):
        assert {f"`[{section}] {name}`" for name in model.model_fields} <= keys
    for name in ("resources", "run"):
        table = spec_model("parity").model_fields[name].annotation
        assert {f"`[{name}] {key}`" for key in table.model_fields} <= keys  # type: ignore[union-attr]
    fields = {row[0].strip("`") for row in config_rows()}
    assert fields == {f.name for cls in CONFIGS.values() for f in dataclasses.fields(cls)}


def test_the_defaults_the_issue_found_missing_are_in_the_table() -> None:
    rows = {row[0]: row for row in section_rows()}
    assert rows["`[scheduler] brackets`"][2] == "`1`"
    assert "a quarter of config.iterations" in rows["`[scheduler] grace_period`"][3]
    assert "qmc and gp need scipy" in rows["`[search] sampler`"][3]


def test_every_verb_shows_every_flag_it_takes() -> None:
    from study.cli.verbs import COMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    rows = {row[0].strip("`"): row for row in verb_rows()}
    assert list(rows) == [c.name for c in COMMANDS]
    for name, parser in sub.choices.items():
        if name == "slurm":
            from study.launchers.slurm import build_parser as slurm_parser

            parser = slurm_parser()
        flags = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
        shown = set(re.findall(r"--[\w-]+", rows[name][1]))
        assert shown == flags, name


def test_every_exit_code_the_cli_uses_is_in_the_table() -> None:
    codes = {v for k, v in vars(base).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert codes | {0} == set(base.EXIT_CODES)
    table = cli_reference()
    for code in base.EXIT_CODES:
        assert re.search(rf"^\| {code} \| ", table, re.M), code
