"""`run` and `resume`: a study run or resumed from Python, a notebook's kernel included; and what
``ponder-study run`` and ``resume`` share with them once each has checked its input (`start`,
`warm_points`, `finished`): two doors to one driver, `study.run.runner`.

Where the Python door differs from the command, and why:

- it returns a `Study` (or raises) where the command prints a summary and exits with a code;
- a stop (a kernel's interrupt is a SIGINT, as Ctrl-C is; SIGTERM) stops the study as it stops
  the command: Tune saves its state, the Parquet is written, the lease and the Ray instance the
  driver started go; then `StudyInterrupted`, a KeyboardInterrupt, says how to resume it. The
  caller's signal handlers and Optuna's log level are put back as they were;
- a Ray instance the caller started (``ray.init()`` in the notebook, or ``address=``) is joined
  and left running; one it starts itself is stopped at the end, its processes with it;
- in a Jupyter kernel, Tune's progress table is one output under the cell, redrawn in place
  (`study.run.progress`); ``progress=False`` shows none;
- errored trials are a `StudyWarning` and the study is returned: `resume` retries them.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from study.api.reading import Study, import_optuna, load
from study.api.specs import SpecLike, StorageLike, check_storage, given_storage, study_spec
from study.records.records import StudyError
from study.spec.spec import SpecError, StudySpec, check_name
from study.storage.hints import DEFAULT_STORAGE, count

if TYPE_CHECKING:
    from study.run.runner import StudyOutcome

__all__ = [
    "StudyInterrupted",
    "StudyWarning",
    "finished",
    "resume",
    "resume_call",
    "run",
    "start",
    "warm_points",
]


class StudyInterrupted(KeyboardInterrupt):
    """A run or resume stopped by Ctrl-C (a kernel's interrupt) or SIGTERM: the study is kept as
    it was at the stop, resumable; the message says how to go on."""


class StudyWarning(UserWarning):
    """A study that ended with errored trials (`study.resume` retries them)."""


def resume_call(name: str, storage: str, more: str | None = None) -> str:
    """The Python line that continues a study (``storage`` named unless it is the default)."""
    where = "" if storage == DEFAULT_STORAGE else f", storage={storage!r}"
    return f"study.resume({name!r}{where}{'' if more is None else f', more={more}'})"


def start(
    spec: StudySpec,
    *,
    points: Sequence[Mapping[str, Any]] = (),
    address: str | None = None,
    verbose: int = 1,
    resume_hint: str | None = None,
    on_written: Callable[[], None] | None = None,
) -> StudyOutcome:
    """Run the new study ``spec`` to its end (`study.run.runner.run_study`), ``points`` its first
    trials (`warm_points`); ``on_written`` is called once the study is on the storage, resumable
    from then on. Each door checks its input first, its own way."""
    from study.run import runner
    from study.run.stops import raise_a_swallowed_stop

    raise_a_swallowed_stop()  # a stop during that import (Ray's)
    return runner.run_study(
        spec,
        address=address,
        verbose=verbose,
        warm_start=points,
        resume_hint=resume_hint,
        on_written=on_written,
    )


def warm_points(
    source: str, storage: str, spec: StudySpec, top: int, say: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """The study ``source``'s ``top`` best trials as ``spec``'s first points
    (`study.search.warmstart`), what goes first said through ``say``; `WarmStartError` when none
    can."""
    from study.search.warmstart import read_warm_start

    seeds = read_warm_start(source, storage, spec, top)
    say("\n".join(seeds.lines(source)))
    return seeds.points


def finished(name: str, storage: str) -> tuple[str, int] | None:
    """(its summary, its trial count) for a study with nothing left to resume, read before Ray
    starts; None if it has work left, or cannot be read here (the resume then says what is wrong)."""
    from study.records.records import finished_study, load_study_spec
    from study.reports.summary import summary

    try:
        spec, paths = load_study_spec(name, storage)
        if not finished_study(paths, spec.search.num_samples):
            return None
    except (StudyError, SpecError, OSError, ValueError):
        return None
    return summary(paths, spec.metric, spec.mode), spec.search.num_samples


def run(
    spec: SpecLike,
    *,
    name: str | None = None,
    num_samples: int | None = None,
    storage: StorageLike | None = None,
    warm_start: str | None = None,
    top: int = 5,
    address: str | None = None,
    progress: bool = True,
) -> Study:
    """Run a new study to its end, as ``ponder-study run`` does, and return it.

    ``spec``: a shipped spec's name (``"parity-smoke"``), the path of a ``.toml`` file, a dict with
    the TOML's structure (then ``name`` is required), or a `StudySpec`. ``name``, ``num_samples``
    and ``storage`` override the spec's (``storage``: else ``$PONDER_STUDY_STORAGE``, else the
    spec's ``[run] storage``). ``warm_start``: an earlier study under the same storage whose
    ``top`` best trials are this study's first. Ray: an instance this process has started
    (``ray.init()``) is used and left running; else the cluster at ``address`` (else
    ``$RAY_ADDRESS``) is joined; else a local instance is started and stopped at the end.
    ``progress``: Tune's table (redrawn under the cell in a notebook).

    Raises, before Ray starts and with nothing written: `SpecError` (the key and the fix),
    `StorageError`, `StudyError` (a name that exists: resume it), `WarmStartError`, `LeaseHeld`.
    A stop (Ctrl-C, a kernel's interrupt, SIGTERM) raises `StudyInterrupted`, the study kept,
    resumable with `study.resume`. Errored trials: a `StudyWarning`; `study.resume` retries them.
    """
    the_spec = study_spec(spec, name=name, num_samples=num_samples, storage=storage)
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise SpecError(f"top must be a positive integer, got {top!r}", "top")
    where = the_spec.run.storage
    check_storage(where, write=True)
    written = [False]

    def hint() -> str:
        if written[0]:
            return f"study {the_spec.name!r} stopped; resume it with {resume_call(the_spec.name, where)}"
        return f"study {the_spec.name!r} stopped before anything was written; run it again"

    with _driving(hint):
        points = [] if warm_start is None else warm_points(warm_start, where, the_spec, top)
        outcome = start(
            the_spec,
            points=points,
            address=address,
            verbose=1 if progress else 0,
            resume_hint=resume_call(the_spec.name, where),
            on_written=lambda: written.__setitem__(0, True),
        )
    return _ended(outcome)


def resume(
    name: str,
    storage: StorageLike | None = None,
    *,
    more: int = 0,
    address: str | None = None,
    progress: bool = True,
) -> Study:
    """Finish an interrupted study, or give it ``more`` trials, as ``ponder-study resume`` does,
    and return it: finished trials are not run again, unfinished ones continue from their last
    checkpoint, Optuna's and ASHA's state are kept, a study left half-written by a kill is mended
    from its records. A finished study with ``more=0`` is returned as it is, without Ray.

    ``storage``: else ``$PONDER_STUDY_STORAGE``, else ``"results"``. ``address`` and ``progress``:
    as for `study.run`. Raises `StudyError` (no such study, one that cannot go on, ``more`` on a
    grid), `StorageError`, `LeaseHeld` (another driver holds it); a stop raises
    `StudyInterrupted`; errored trials are a `StudyWarning`.
    """
    check_name(name, "name")
    if not isinstance(more, int) or isinstance(more, bool) or more < 0:
        raise StudyError(f"more must be a whole number of trials to add (0 or more), got {more!r}")
    where = given_storage(storage) or DEFAULT_STORAGE
    check_storage(where, write=True)
    if not more and (done := finished(name, where)) is not None:
        print(
            f"study {name!r} is finished ({count(done[1], 'trial')}): nothing to resume; "
            f"to add trials: {resume_call(name, where, more='N')}"
        )
        return load(name, where)
    with _driving(lambda: f"study {name!r} stopped; resume it with {resume_call(name, where)}"):
        from study.run import runner

        outcome = runner.resume_study(name, where, address=address, verbose=1 if progress else 0, more=more)
    return _ended(outcome)


@contextlib.contextmanager
def _driving(hint: Callable[[], str]) -> Iterator[None]:
    """Around a run or resume from Python: a stop stops it as it stops the command and comes out
    as `StudyInterrupted` (``hint()``: how to go on); Optuna's notices quiet (a new study in the
    journal, at every run), its log level put back afterwards."""
    from study.run.stops import caused_by_ctrl_c, stops_as_ctrl_c

    optuna = import_optuna()
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # in a kernel, Ray's imports note at INFO, twice, that ipywidgets (which no study uses) is missing
    widgets = logging.getLogger("ray.widgets.util")
    widgets_level = widgets.level
    widgets.setLevel(logging.WARNING)
    try:
        with stops_as_ctrl_c():
            yield
    except (KeyboardInterrupt, Exception) as e:
        if isinstance(e, KeyboardInterrupt) or caused_by_ctrl_c(e):  # also one an import's class body wrapped
            raise StudyInterrupted(hint()) from None
        raise
    finally:
        optuna.logging.set_verbosity(level)
        widgets.setLevel(widgets_level)


def _ended(outcome: StudyOutcome) -> Study:
    """The study a run or resume ended with; `StudyInterrupted` if Tune stopped before every trial
    ended (it takes Ctrl-C over while it runs, and returns), a warning for errored trials."""
    name, storage = outcome.paths.name, outcome.paths.root
    errored = outcome.statuses.get("errored", 0)
    if errored:
        warnings.warn(
            f"study {name!r}: {count(errored, 'trial')} errored (see their error column); "
            f"{resume_call(name, storage)} retries them",
            StudyWarning,
            stacklevel=3,
        )
    elif not outcome.finished:
        hint = resume_call(name, storage)
        raise StudyInterrupted(f"study {name!r} stopped before its trials all ended; resume it with {hint}")
    return load(name, storage)
