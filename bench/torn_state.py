"""Every one of Tune's state files, with every damage, under a real resume: prints
``torn states survived <k>/<K>`` last.

Two studies: a smoke study stopped (Ctrl-C) after three trials ended, one at a time, and a
finished one (3 trials, then ``resume --more 1``, so Tune saved twice). For each state file
(``tuner.pkl``, ``experiment_state-*.json``, ``search_gen_state-*.json``, ``searcher-state-*.pkl``)
and each damage (cut to half, to one byte, to nothing; the newest removed; every copy removed; an
older copy put back), and for each pair of files damaged at once, a copy of the study gets that
damage and is resumed, by ``resume`` and by ``resume --more 2``. Each must finish with the
expected trials, none twice, the ended ones unchanged, no Optuna trial left RUNNING
(`tests/study/test_torn_state.py` runs three of these cases in the suite).

With ``--then-kill`` each damaged copy's first resume is SIGKILLed (its whole process group)
once one more trial has ended, and a second resume must finish it: a recovery, then a kill
inside it (tests/study/data/stuck-after-sigkill.tar.gz is a study that sequence once left stuck).

    .venv/bin/python bench/torn_state.py            # 2 studies x 2 verbs x (24 + 18) = 168 resumes
    .venv/bin/python bench/torn_state.py --studies finished --verbs more --pair-damages ""
    .venv/bin/python bench/torn_state.py --then-kill --studies interrupted --verbs resume
"""

from __future__ import annotations

import argparse
import itertools
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
    FINISHED_SAMPLES,
    NAME,
    NUM_SAMPLES,
    STATE_FILES,
    check_finished,
    damage,
    ended_trials,
    finish_a_study,
    interrupt_a_study,
)

MORE = 2
"""Trials ``resume --more`` adds."""
STUDIES = {"interrupted": (interrupt_a_study, NUM_SAMPLES), "finished": (finish_a_study, FINISHED_SAMPLES)}
VERBS = {"resume": [], "more": ["--more", str(MORE)]}


def _ended(study: Path) -> int:
    return len(list((study / "studies" / NAME / "ended").glob("*.json")))


def _resume_then_kill(study: Path, flags: list[str]) -> None:
    """A resume SIGKILLed (its whole process group) once one more trial has ended."""
    before = _ended(study)
    d = Driver("resume", NAME, "--storage", str(study), "--quiet", *flags, log=study.with_suffix(".log"))
    try:
        d.wait_until(lambda: _ended(study) > before, poll=0.01)
        d.kill()
    except AssertionError:  # it finished first: the second resume has nothing to do
        d.finish()


def _cases(files: list[str], damages: list[str], pair_damages: list[str]) -> list[list[tuple[str, str]]]:
    """Each case: the (file, damage) pairs applied together to one copy of a study."""
    singles = [[(kind, how)] for kind in files for how in damages]
    pairs = [[(a, how), (b, how)] for a, b in itertools.combinations(files, 2) for how in pair_damages]
    return singles + pairs


def _split(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default=",".join(STATE_FILES), help="comma-separated state files")
    p.add_argument("--damages", default=",".join(DAMAGES), help="comma-separated damages, one file at a time")
    p.add_argument(
        "--pair-damages",
        default="half,all removed,older",
        help="comma-separated damages applied to each pair of files at once ('' for none)",
    )
    p.add_argument("--studies", default=",".join(STUDIES), help="interrupted, finished")
    p.add_argument("--verbs", default=",".join(VERBS), help=f"resume, more (resume --more {MORE})")
    p.add_argument("--then-kill", action="store_true", help="SIGKILL the first resume after a trial ends")
    args = p.parse_args()
    files = _split(args.files)
    cases = _cases(files, _split(args.damages), _split(args.pair_damages))
    where = Path(tempfile.mkdtemp(prefix="torn-state-"))
    t0 = time.monotonic()
    survived, total = 0, 0
    try:
        for study in _split(args.studies):
            make, samples = STUDIES[study]
            (where / study).mkdir()
            storage, older = make(where / study)
            for verb, case in itertools.product(_split(args.verbs), cases):
                label = " + ".join(f"{kind} {how}" for kind, how in case)
                copy = where / study / f"{verb}-{label.replace(' ', '-')}"
                shutil.copytree(storage, copy, symlinks=True)
                before = ended_trials(copy)
                for kind, how in case:
                    damage(copy / "tune" / NAME, older, kind, how)
                flags = VERBS[verb]
                if args.then_kill:  # the killed resume has already added the trials --more asks for
                    _resume_then_kill(copy, flags)
                    flags = []
                done = cli("resume", NAME, "--storage", str(copy), "--quiet", *flags, timeout=300)
                expected = samples + (MORE if verb == "more" else 0)
                problems = [] if done.returncode == 0 else [f"exit {done.returncode}: {done.stderr[-300:]}"]
                problems += check_finished(copy, before, expected) if done.returncode == 0 else []
                total += 1
                survived += not problems
                verdict = "; ".join(problems) or "finished, every check held"
                print(f"{study}, {verb}, {label}: {verdict}", flush=True)
                if not problems:  # a failed copy is kept to look at
                    shutil.rmtree(copy, ignore_errors=True)
    finally:
        stop_shared_ray()
    print(f"{time.monotonic() - t0:.0f} s; storage {where}")
    print(f"torn states survived {survived}/{total}")


if __name__ == "__main__":
    main()
