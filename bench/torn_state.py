"""Every one of Tune's state files, with every damage, under a real resume: prints
``torn states survived <k>/<K>`` last.

A smoke study is stopped (Ctrl-C) after three trials ended, one at a time; for each state file
(``tuner.pkl``, ``experiment_state-*.json``, ``search_gen_state-*.json``, ``searcher-state-*.pkl``)
and each damage (cut to half, to one byte, to nothing; removed; an older copy put back, taken
when the first trial ended) a copy of the study gets that damage and is resumed. Each must finish
with ``num_samples`` trials, none twice, the ended ones unchanged, Optuna level with them
(`tests/study/test_torn_state.py` runs four of these cases in the suite).

With ``--then-kill`` each damaged copy's first resume is SIGKILLed (its whole process group)
once one more trial has ended, and a second resume must finish it: the sequence (a recovery,
then a kill inside it) that left the study of issue 33 stuck.

    .venv/bin/python bench/torn_state.py            # 4 files x 5 damages = 20 resumes
    .venv/bin/python bench/torn_state.py --then-kill
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.study.conftest import Driver, cli, stop_shared_ray  # noqa: E402
from tests.study.test_torn_state import (  # noqa: E402
    DAMAGES,
    NAME,
    STATE_FILES,
    check_finished,
    damage,
    ended_trials,
    interrupt_a_study,
)


def _ended(study: Path) -> int:
    return len(list((study / "studies" / NAME / "ended").glob("*.json")))


def _resume_then_kill(study: Path) -> None:
    """A resume SIGKILLed (its whole process group) once one more trial has ended."""
    before = _ended(study)
    d = Driver("resume", NAME, "--storage", str(study), "--quiet", log=study.with_suffix(".log"))
    try:
        d.wait_until(lambda: _ended(study) > before, poll=0.01)
        d.kill()
    except AssertionError:  # it finished first: the second resume has nothing to do
        d.finish()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default=",".join(STATE_FILES), help="comma-separated state files")
    p.add_argument("--damages", default=",".join(DAMAGES), help="comma-separated damages")
    p.add_argument("--then-kill", action="store_true", help="SIGKILL the first resume after a trial ends")
    args = p.parse_args()
    where = Path(tempfile.mkdtemp(prefix="torn-state-"))
    t0 = time.monotonic()
    try:
        storage, older = interrupt_a_study(where)
        survived, cases = 0, 0
        for kind in args.files.split(","):
            for how in args.damages.split(","):
                copy = where / f"{kind}-{how.replace(' ', '-')}"
                shutil.copytree(storage, copy, symlinks=True)
                before = ended_trials(copy)
                damage(copy / "tune" / NAME, older, kind, how)
                if args.then_kill:
                    _resume_then_kill(copy)
                done = cli("resume", NAME, "--storage", str(copy), "--quiet", timeout=300)
                problems = [] if done.returncode == 0 else [f"exit {done.returncode}: {done.stderr[-300:]}"]
                problems += check_finished(copy, before) if done.returncode == 0 else []
                cases += 1
                survived += not problems
                print(f"{kind}, {how}: {'; '.join(problems) or 'finished, every check held'}", flush=True)
    finally:
        stop_shared_ray()
    print(f"{time.monotonic() - t0:.0f} s; storage {where}")
    print(f"torn states survived {survived}/{cases}")


if __name__ == "__main__":
    main()
