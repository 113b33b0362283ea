"""The kill campaign of ``bench/kill_campaign.py``, seeded and smaller: a real smoke study whose
driver is SIGKILLed (its whole process group) at drawn moments and resumed after each kill."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.study.conftest import REPO, smoke_spec

pytestmark = pytest.mark.slow


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("kill_campaign", REPO / "bench" / "kill_campaign.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kill_campaign"] = module
    spec.loader.exec_module(module)
    return module


def _campaign(tmp_path: Path, **settings: object) -> tuple[int, list[object], str]:
    """Run the bench's campaign in ``tmp_path``: (kills survived, every kill, what it printed)."""
    bench = _bench()
    lines: list[str] = []
    campaign = bench.Campaign(  # type: ignore[attr-defined]
        storage=str(tmp_path / "storage"), log_dir=tmp_path, echo=lines.append, **settings
    )
    survived, kills = bench.run_campaign(campaign)  # type: ignore[attr-defined]
    return survived, kills, "\n".join(lines)


@pytest.mark.parametrize(
    ("last", "command"),
    [
        ("ponder-study: interrupted; resume it with: ponder-study resume k-0 --storage '/a b'",
         ["ponder-study", "resume", "k-0", "--storage", "/a b"]),
        ("Parquet: /s/trials/study=k-0/trials.parquet  (history: /s/history/study=k-0/)",
         ["ponder-study", "resume", "k-0"]),
        ("ponder-study: study 'k-0' is finished (4 trials): nothing to resume; to add trials: "
         "ponder-study resume k-0 --storage /s --more N", ["ponder-study", "resume", "k-0"]),
        ("ponder-study: error: something else", None),
    ],
    ids=["interrupted", "finished", "finished-before-the-resume", "other"],
)  # fmt: skip
def test_the_campaign_reads_what_a_stopped_driver_said_to_run(
    tmp_path: Path, last: str, command: list[str] | None
) -> None:
    """A driver the signal reached after it had found its study finished (seen in CI: a resume
    said "nothing to resume", and the campaign counted its last line as no command to go on)."""
    log = tmp_path / "driver.log"
    log.write_text(f"some output\n{last}\n")
    assert _bench()._pasted_command(log) == command  # type: ignore[attr-defined]


def test_a_study_survives_sigkills_at_drawn_moments(tmp_path: Path) -> None:
    # two kills, the table on for one and off for the other; the breadth (many seeds, a uniform
    # window, signals, S3 and a cluster: --seeds, --uniform, --signals) is bench/kill_campaign.py's
    survived, kills, report = _campaign(tmp_path, kills=2, seed=5, num_samples=6)
    assert len(kills) == 2, report
    assert [k.problems for k in kills] == [[]] * 2, report  # type: ignore[attr-defined]
    assert survived == 2, report
    assert {k.table for k in kills} == {True, False}, report  # type: ignore[attr-defined]  # table on and off
    assert "every check held" in report, report


def test_a_study_survives_signals_and_the_pasted_resume(tmp_path: Path) -> None:
    """The same campaign's --signals mode: Ctrl-C once or twice, SIGTERM, SIGHUP (every fourth
    within a second of the study's creation in Optuna's journal); each driver exits 130 with no
    traceback and its last line is the command the campaign runs next. One trial at a time: the
    subject is the driver's signals, and the SIGKILL campaign above runs the shipped two at a time."""
    spec = smoke_spec(tmp_path, at_once=1)
    survived, kills, report = _campaign(tmp_path, kills=3, seed=11, num_samples=4, signals=True, spec=spec)
    assert len(kills) == 3 and survived == 3, report
    assert "every check held" in report, report
