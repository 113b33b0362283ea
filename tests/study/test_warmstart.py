"""Warm start from an earlier study's best trials, on hand-built trials tables (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from study.cli import drive as cli
from study.search.warmstart import WarmStartError, warm_start_points
from study.spec.spec import load_spec, parse_spec
from study.storage.storage import StudyPaths, write_bytes, write_parquet

SMOKE = load_spec("parity-smoke")
NARROW = parse_spec(
    SMOKE.source.replace("[space.max_steps]\nlow = 2\nhigh = 8", "[space.max_steps]\nlow = 2\nhigh = 5"),
    "narrow",
)


def _earlier() -> pd.DataFrame:
    """Four ended trials of the smoke spec, best first: a and b with max_steps 8 and 7 (outside
    ``NARROW``'s [2, 5]), c and d inside; e is still running."""
    return pd.DataFrame(
        {
            "trial_id": list("abcde"),
            "status": ["completed", "completed", "early_stopped", "completed", "running"],
            "test/halted_accuracy": [0.9, 0.8, 0.7, 0.6, 0.95],
            "lambda_p": [0.2, 0.3, 0.4, 0.5, 0.6],
            "beta": [0.01, 0.01, 0.01, 0.01, 0.01],
            "max_steps": [8, 7, 4, 3, 8],
            "seed": [1, 2, 3, 4, 5],
        }
    )


def test_trials_outside_the_space_are_skipped_with_what_to_widen() -> None:
    """The best trials outside the new space are skipped (--top cannot help: they are the best),
    the others go first; the note names how many and the widening that includes them."""
    start = warm_start_points(NARROW, SMOKE, _earlier(), 3, "intr")
    assert start.trial_ids == ["c"] and start.points == [
        {"lambda_p": 0.4, "beta": 0.01, "max_steps": 4, "seed": 3}
    ]
    assert start.skipped == ["a", "b"]
    note = start.note("intr")
    assert note is not None and "\n" not in note
    assert "skipped 2 " in note and "widen [space.max_steps] to [2, 8]" in note, note
    assert "--top" not in note
    assert warm_start_points(SMOKE, SMOKE, _earlier(), 3, "intr").note("intr") is None


@pytest.mark.parametrize("top", [1, 2])
def test_none_left_is_refused_in_one_line_with_what_works(top: int) -> None:
    """Nothing left to start from: refused, saying what to widen and the --top that reaches the
    best trial inside the space (a lower --top cannot help)."""
    with pytest.raises(WarmStartError) as e:
        warm_start_points(NARROW, SMOKE, _earlier(), top, "intr")
    message = str(e.value)
    assert "\n" not in message and "lower --top" not in message, message
    assert "outside this spec's range [2, 5]" in message and "widen [space.max_steps] to [2, 8]" in message
    assert ("max_steps = 8, 7 " in message) == (top == 2), message
    assert message.endswith("or give --top 3 to reach its best trial inside it"), message
    none_inside = parse_spec(
        SMOKE.source.replace("[space.max_steps]\nlow = 2\nhigh = 8", "[space.max_steps]\nlow = 9\nhigh = 12"),
        "wide",
    )
    with pytest.raises(WarmStartError) as e:
        warm_start_points(none_inside, SMOKE, _earlier(), top, "intr")
    assert "--top" not in str(e.value) and "widen [space.max_steps] to [" in str(e.value), str(e.value)


def test_a_categorical_dimension_says_which_values_to_add() -> None:
    spec = parse_spec(
        SMOKE.source.replace("[space.max_steps]\nlow = 2\nhigh = 8", "[space.max_steps]\nvalues = [3, 4]"),
        "choices",
    )
    start = warm_start_points(spec, SMOKE, _earlier(), 4, "intr")
    assert start.trial_ids == ["c", "d"]
    assert "add 8, 7 to [space.max_steps] values" in (start.note("intr") or "")


def test_the_cli_prints_the_note_and_refuses_when_none_is_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --warm-start`'s reading of the earlier study: the note, then what goes first."""
    paths = StudyPaths(str(tmp_path), "intr")
    write_bytes(paths.spec, SMOKE.source.encode())
    write_parquet(paths.trials_parquet, pa.Table.from_pandas(_earlier(), preserve_index=False))
    points = cli._warm_start("intr", str(tmp_path), NARROW, 3)
    out = capsys.readouterr().out.splitlines()
    assert len(points) == 1
    assert out[0].startswith("warm start: skipped 2 of the best trials of intr (a, b)"), out
    assert out[1] == "warm start: 1 best trial of intr (c) goes first", out
    with pytest.raises(WarmStartError, match="widen"):
        cli._warm_start("intr", str(tmp_path), NARROW, 2)
