"""Asking Optuna for the next trial ahead, while the driver waits on the trials: in a thread,
or, for TPE once its ask grows, in processes of their own (`AsksAhead`, the searcher's part).

TPE's ask walks the study's whole history: about 10 ms at 1,000 trials and 100 ms at 10,000 on
the 2-core machine. Asked ahead in a thread, it still holds the interpreter the driver's thread
needs for everything else; in `ProcessAsker`'s child it runs on another core. When the driver
still waits on every draw, a second child draws beside the first (`AskerPool`, up to
`askers_max`).

The child keeps a mirror of the study: an Optuna in-memory study holding every trial of the
driver's study that is not WAITING (parameters, state, values, reports), sent as the driver makes
and ends them, and the trials it drew itself, RUNNING until the driver says how they ended (TPE's
constant liar sees the running trials as the driver's study holds them). Its sampler is the
study's (`study.search.search.SamplerRecipe`), so an ask there draws what the driver's own ask
would draw from the same history; the driver then makes its trial with those parameters
(enqueued, then asked).

What a stop costs: nothing. The child holds no state of its own: a kill of the driver ends it
(its input closes), and a resume starts another from the journal. If it dies or fails, the driver
asks in the thread again, after one warning. Needs neither Ray nor torch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import IO, Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from study.search.journal import n_trials

__all__ = [
    "ASKS_JUDGED",
    "ASK_IN_PROCESS",
    "ASK_IN_PROCESS_MS",
    "ASK_WAIT_MS",
    "AskerPool",
    "AsksAhead",
    "Census",
    "ProcessAsker",
    "ask_in_process_s",
    "ask_wait_s",
    "askers_max",
    "close_askers",
]

log = logging.getLogger("ponder-study")

Made = tuple[int, int, tuple[float, ...] | None, dict[str, Any], dict[int, float]]
"""A trial the mirror is to hold: (key, state, values, parameters, reports by step)."""

Ended = tuple[int, int, tuple[float, ...] | None, dict[int, float]]
"""A mirrored trial that left RUNNING: (key, state, values, reports by step)."""

Census = list[tuple[int, tuple[float, ...] | None, tuple[tuple[str, Any], ...]]]
"""Trials as (state, values, sorted parameters): the mirror's, checked against the study's."""

_open: weakref.WeakSet[ProcessAsker] = weakref.WeakSet()


class ProcessAsker:
    """Asks of a driver's Optuna study, drawn in a child process against its mirror of the study.

    `ask` sends the child what changed in the study since the last ask and returns at once;
    `take` waits for the parameters and makes the driver's trial with them. One ask in flight.
    A mirrored trial's key is its number in the driver's study, or, for one the child drew, the
    negative count of its draw until the driver's trial is made."""

    def __init__(
        self, study: optuna.Study, sampler: optuna.samplers.BaseSampler, space: Mapping[str, BaseDistribution]
    ) -> None:
        self._space = dict(space)
        self._keys: dict[int, int] = {}  # number in the driver's study -> key, every trial mirrored
        self._running: dict[int, int] = {}  # driver's trial id -> key, of mirrored unfinished trials
        self._dropped: list[int] = []  # keys of draws never used: failed in the mirror
        self._walked = 0  # the driver's trials before this one are mirrored, or WAITING
        self._draws = 0
        self._asked: int | None = None
        self.drawn_cpu: list[float] = []  # the CPU seconds of each draw in the child
        self.waited = 0.0  # the seconds the last `take` waited for its draw
        package = str(Path(__file__).resolve().parents[2])  # the folder that holds `study`
        path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH", "")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "study.search.asker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=path),
            # out of the driver's process group: a Ctrl-C or hang-up of the terminal is the
            # driver's to handle, even while the child still imports Optuna (its own handlers
            # are not set yet); the child ends when its input closes
            start_new_session=True,
        )
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        # a large message (the history, first) must not hold the driver while the child reads it
        self._writer = threading.Thread(target=self._write, name="optuna-asker-writer", daemon=True)
        self._writer.start()
        self._send(("start", [int(d) for d in study.directions], sampler, self._space))
        _open.add(self)

    @property
    def asking(self) -> bool:
        """Whether an ask is in flight (`take` will wait for it)."""
        return self._asked is not None

    def ask(self, study: optuna.Study) -> None:
        """Tell the child what changed in ``study`` since the last ask, then draw a trial."""
        if self._asked is not None:
            raise RuntimeError("an ask is in flight: take it first")
        made, ended = self._changes(study)
        self._draws += 1
        self._asked = -self._draws
        self._send(("ask", self._asked, made, ended))

    def take(self, study: optuna.Study) -> optuna.trial.Trial | None:
        """The trial drawn last, made in ``study``; None if the study has a trial waiting (a warm
        start's, which Optuna's ask takes first). Raises if the child failed or ended."""
        key, self._asked = self._asked, None
        if key is None:
            raise RuntimeError("no ask in flight")
        assert self._proc.stdout is not None
        t0 = time.perf_counter()
        reply = pickle.load(self._proc.stdout)  # EOFError if the child ended
        self.waited = time.perf_counter() - t0
        if reply[0] != "params" or reply[1] != key:
            raise RuntimeError(f"the asker process failed: {reply[-1]}")
        self.drawn_cpu.append(reply[3])
        if study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,)):
            self._dropped.append(key)
            return None
        study.enqueue_trial(reply[2])  # drawn there, made here: Optuna's fixed parameters
        trial = study.ask(fixed_distributions=self._space)
        self._keys[trial.number] = key
        self._running[trial._trial_id] = key
        if trial.number == self._walked:  # the next ask need not walk the study to find it
            self._walked += 1
        return trial

    def census(self, study: optuna.Study) -> Census:
        """The mirror's trials, each (state, values, sorted parameters): what the child holds,
        for a check against the driver's study. Not while an ask is in flight."""
        if self._asked is not None:
            raise RuntimeError("an ask is in flight: take it first")
        made, ended = self._changes(study)
        self._send(("census", made, ended))
        assert self._proc.stdout is not None
        reply = pickle.load(self._proc.stdout)
        if reply[0] != "census":
            raise RuntimeError(f"the asker process failed: {reply[-1]}")
        return list(reply[1])

    def close(self) -> None:
        """End the child (its input closed: it exits) and wait for it."""
        _open.discard(self)
        self._out.put(None)
        self._writer.join(timeout=5)
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def _changes(self, study: optuna.Study) -> tuple[list[Made], list[Ended]]:
        """The driver's trials the mirror lacks, and the mirrored ones that ended since."""
        storage = study._storage
        ended: list[Ended] = [(key, int(TrialState.FAIL), None, {}) for key in self._dropped]
        self._dropped = []
        for trial_id, key in list(self._running.items()):
            t = storage.get_trial(trial_id)
            if t.state.is_finished():
                ended.append((key, int(t.state), _values(t), dict(t.intermediate_values)))
                del self._running[trial_id]
        made: list[Made] = []
        walked = None
        if n_trials(study) > self._walked:
            trials = study.get_trials(deepcopy=False)
            for t in trials[self._walked :]:
                if t.number in self._keys:
                    continue
                if t.state == TrialState.WAITING:  # mirrored once it runs: walked again till then
                    walked = t.number if walked is None else walked
                    continue
                self._keys[t.number] = t.number
                if not t.state.is_finished():
                    self._running[t._trial_id] = t.number
                made.append((t.number, int(t.state), _values(t), dict(t.params), dict(t.intermediate_values)))
            self._walked = len(trials) if walked is None else walked
        return made, ended

    def _send(self, message: tuple[Any, ...]) -> None:
        self._out.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def _write(self) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            while (data := self._out.get()) is not None:
                stdin.write(data)
                stdin.flush()
        except OSError:  # the child ended: `take` says so
            pass
        finally:
            with contextlib.suppress(OSError):
                stdin.close()


class AskerPool:
    """TPE's asks in `ProcessAsker` children: one at first, more while the driver waits on them.

    A driver that waits for every draw is paced by TPE's ask (80-100 ms at 10,000 trials on the
    2-core machine): its trials end faster than one process draws. Then another child draws
    beside the first, up to `askers_max`, each an ask ahead over the history it was last told.
    TPE (without its constant liar) reads no running trial, so two draws in flight at once are
    each what a single process would draw over that history. Each child's sampler is built
    from the study's recipe when it starts (`build`), seeded by the trials held then: no two
    children share a seed. Trials are taken in the order their asks were sent."""

    def __init__(
        self,
        study: optuna.Study,
        build: Callable[[int], optuna.samplers.BaseSampler],
        space: Mapping[str, BaseDistribution],
        limit: int,
    ) -> None:
        self._build, self._space, self.limit = build, dict(space), max(1, limit)
        self.askers = [ProcessAsker(study, build(n_trials(study)), self._space)]
        self._order: deque[ProcessAsker] = deque()  # the askers with a draw in flight, oldest first
        self._waits: list[float] = []  # the seconds the last takes waited (`ASKS_JUDGED` of them)
        self._wait_s = ask_wait_s()

    @property
    def asking(self) -> bool:
        """Whether a draw is in flight (`take` returns the oldest)."""
        return bool(self._order)

    def ask(self, study: optuna.Study, room: int) -> None:
        """Draw in every child that is not drawing, while fewer than ``room`` draws are in flight
        (the trials the study has yet to make)."""
        for asker in self.askers:
            if len(self._order) >= room:
                return
            if not asker.asking:
                asker.ask(study)
                self._order.append(asker)

    def take(self, study: optuna.Study) -> optuna.trial.Trial | None:
        """The oldest draw, made in ``study`` (`ProcessAsker.take`); then another child if the last
        `ASKS_JUDGED` takes waited over `ask_wait_s` (their median)."""
        asker = self._order.popleft()
        trial = asker.take(study)
        self._waits = [*self._waits[-(ASKS_JUDGED - 1) :], asker.waited]
        if (
            len(self.askers) < self.limit
            and len(self._waits) == ASKS_JUDGED
            and statistics.median(self._waits) > self._wait_s
        ):
            self.askers.append(ProcessAsker(study, self._build(n_trials(study)), self._space))
            self._waits = []
        return trial

    def close(self) -> None:
        """End every child."""
        for asker in self.askers:
            asker.close()
        self._order.clear()


def _values(trial: FrozenTrial) -> tuple[float, ...] | None:
    return None if trial.values is None else tuple(trial.values)


def close_askers() -> None:
    """End every asker's child: the driver's run is over (`study.run.runner`)."""
    for asker in list(_open):
        asker.close()


ASK_IN_PROCESS = ("tpe",)
"""The samplers whose asks `AsksAhead._ask_ahead` makes in a process: TPE's ask walks the whole
study (about 100 ms a trial at 10,000 trials on the 2-core machine) and depends on nothing but its
trials. The others ask in a thread: cheap (random, QMC, grid), or reading more of the study
than its trials (CMA-ES), or untried (GP)."""

ASK_IN_PROCESS_MS = 8.0
"""The CPU (ms) the median of the last `ASKS_JUDGED` asks in the thread may take before the asks
move to the process. Starting it costs about half a second of CPU, once; a round trip 1-2 ms of
the driver's. TPE's median reaches 8 ms at 50 to 110 trials on the 2-core machine (4 parameters;
3 ms at 6 and 24 trials, whose studies never start it, though single asks there take 6 ms). The
environment's ``PONDER_STUDY_ASK_IN_PROCESS_MS`` replaces it (0: as soon as the asks take any
time; ``off``: never)."""

ASKS_JUDGED = 5
"""The asks in the thread whose median CPU is held against `ASK_IN_PROCESS_MS`."""


def ask_in_process_s() -> float:
    """`ASK_IN_PROCESS_MS`, or the environment's, in seconds (infinite: never)."""
    value = os.environ.get("PONDER_STUDY_ASK_IN_PROCESS_MS", "").strip().lower()
    if value in ("off", "never", "no"):
        return math.inf
    try:
        return float(value) / 1e3 if value else ASK_IN_PROCESS_MS / 1e3
    except ValueError:
        log.warning("PONDER_STUDY_ASK_IN_PROCESS_MS=%r is no number, nor off: %s", value, ASK_IN_PROCESS_MS)
        return ASK_IN_PROCESS_MS / 1e3


ASK_WAIT_MS = 5.0
"""The wait (ms) for a draw, the median of the last `ASKS_JUDGED` takes, past which `AskerPool`
starts another child: the driver is then paced by TPE's asks, not by its trials. The
environment's ``PONDER_STUDY_ASK_WAIT_MS`` replaces it (`ask_wait_s`)."""


def ask_wait_s() -> float:
    """`ASK_WAIT_MS`, or the environment's, in seconds."""
    value = os.environ.get("PONDER_STUDY_ASK_WAIT_MS", "").strip()
    try:
        return float(value) / 1e3 if value else ASK_WAIT_MS / 1e3
    except ValueError:
        log.warning("PONDER_STUDY_ASK_WAIT_MS=%r is no number: %s", value, ASK_WAIT_MS)
        return ASK_WAIT_MS / 1e3


def askers_max() -> int:
    """How many children may draw at once (`AskerPool`): the environment's
    ``PONDER_STUDY_ASKERS``, else one for every two cores, at least two and at most four. Each
    holds a core while it draws, and draws only while the driver waits on the asks."""
    value = os.environ.get("PONDER_STUDY_ASKERS", "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            log.warning("PONDER_STUDY_ASKERS=%r is no whole number: %s", value, ASKERS_DEFAULT)
    return ASKERS_DEFAULT


ASKERS_DEFAULT = min(4, max(2, (os.cpu_count() or 1) // 2))
"""`askers_max` unless the environment says."""


_ASKER: ThreadPoolExecutor | None = None


def _asker() -> ThreadPoolExecutor:
    """The one thread that asks Optuna ahead (`AsksAhead._ask_ahead`)."""
    global _ASKER
    if _ASKER is None:
        _ASKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="optuna-ask-ahead")
    return _ASKER


# -- asking ahead, for the study's searcher ------------------------------------------------------
class AsksAhead:
    """Asking Optuna for the next trial ahead, in a thread or the process: the part of
    `study.search.search.DivergenceAwareOptunaSearch` that does it. It reads the searcher's
    Optuna study (``_ot_study``), the sampler's recipe (``_recipe``: its kind, ``num_samples``
    and ``build``) and the space (``_space``), and keeps what is asked in ``_ahead`` (the
    thread's) and ``_in_process`` (an `AskerPool`), never saved with the searcher."""

    _ot_study: Any  # optuna.Study | None: OptunaSearch's, not typed there
    _space: Any
    _ahead: Future[optuna.trial.Trial] | None
    _in_process: AskerPool | None

    def _ask_ahead(self) -> None:
        """Ask Optuna for the next trial while the driver waits on the trials: in a thread, or,
        once TPE's ask grows past `ASK_IN_PROCESS_MS` (100 ms and more at 10,000 trials), in a
        process (`AskerPool`: two or more while the driver waits on them), where it holds no core
        the driver's thread needs. Only
        while the study has fewer Optuna trials than it will run: an ask the study would not use
        is never made (a kill leaves one made in the thread RUNNING, which the resume hands to
        the next new trial; one made in the process is not in the journal)."""
        study, recipe = self._ot_study, getattr(self, "_recipe", None)
        if self._ahead is not None or study is None or recipe is None or not isinstance(self._space, dict):
            return
        if not getattr(self, "_asks_ahead", True):
            return
        held = n_trials(study)
        pool = getattr(self, "_in_process", None)
        if held >= recipe.num_samples and (pool is None or not pool.asking):
            self._close_process()
            return
        if self._asks_in_process(recipe):
            try:
                if pool is None:
                    self._in_process = pool = AskerPool(
                        study, lambda asked: recipe.build(asked=asked), self._space, askers_max()
                    )
                pool.ask(study, room=recipe.num_samples - held)
                return
            except Exception as e:
                self._process_failed(e)
        self._ahead = _asker().submit(self._timed_ask, study)

    def _timed_ask(self, study: optuna.Study) -> optuna.trial.Trial:
        """Optuna's ask, its CPU time kept (`_asks_in_process`)."""
        t0 = time.thread_time()
        assert isinstance(self._space, dict)  # `_ask_ahead` asks only then
        trial = study.ask(fixed_distributions=self._space)
        cpu = getattr(self, "_asks_cpu", [])
        self._asks_cpu = [*cpu[-(ASKS_JUDGED - 1) :], time.thread_time() - t0]
        return trial

    def _asks_in_process(self, recipe: Any) -> bool:
        """Whether the next ask is made in the process: a sampler of `ASK_IN_PROCESS` whose last
        asks in the thread took more than `ask_in_process_s` of CPU (their median; and ever after
        in this run), unless the process failed in this run."""
        if getattr(self, "_in_process", None) is not None:
            return True
        if getattr(self, "_process_broken", False) or recipe.kind not in ASK_IN_PROCESS:
            return False
        cpu = getattr(self, "_asks_cpu", [])
        threshold = ask_in_process_s()
        judged = 1 if threshold == 0 else ASKS_JUDGED  # 0: the first ask decides
        return len(cpu) >= judged and statistics.median(cpu[-judged:]) > threshold

    def _take_ahead(self) -> optuna.trial.Trial | None:
        """The trial asked ahead (waited for if still being asked); None if there is none, or if
        its ask failed (it is then asked again, in the driver's thread)."""
        pool: AskerPool | None = getattr(self, "_in_process", None)
        if pool is not None and pool.asking and self._ot_study is not None:
            try:
                return pool.take(self._ot_study)
            except Exception as e:
                self._process_failed(e)
                return None
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        try:
            return ahead.result()
        except Exception as e:
            log.warning("asking Optuna ahead failed (%s); asking again", e)
            return None

    def _process_failed(self, e: BaseException) -> None:
        """The process asker failed: the rest of this run asks in the thread, said once."""
        log.warning("asking Optuna in a process failed (%s); asking in the driver from now on", e)
        self._process_broken = True
        self._close_process()

    def _close_process(self) -> None:
        asker, self._in_process = getattr(self, "_in_process", None), None
        if asker is not None:
            asker.close()

    def _settle_ahead(self) -> None:
        """Let an ask in flight end and forget it, before the study or its sampler changes: its
        trial, RUNNING and held by no Tune trial, goes to the next new one (`reconcile`). The
        process asker's mirror is of the study as it was: it is closed (another starts)."""
        ahead, self._ahead = getattr(self, "_ahead", None), None
        if ahead is not None:
            wait([ahead])
        self._close_process()


# -- the child ---------------------------------------------------------------------------------
class _Mirror:
    """The child's in-memory study: the driver's trials by key, and its own draws."""

    def __init__(self, directions: list[int], sampler: optuna.samplers.BaseSampler, space: dict[str, Any]):
        self.study = optuna.create_study(
            directions=[optuna.study.StudyDirection(d) for d in directions], sampler=sampler
        )
        self.storage, self.space = self.study._storage, space
        self.ids: dict[int, int] = {}  # key -> the mirror's trial id, of its unfinished trials

    def make(self, made: list[Made]) -> None:
        for key, state, values, params, reports in made:
            trial = optuna.trial.create_trial(
                state=TrialState.RUNNING, params=params, distributions={k: self.space[k] for k in params}
            )
            self.ids[key] = self.storage.create_new_trial(self.study._study_id, template_trial=trial)
            if state != TrialState.RUNNING:
                self.end([(key, state, values, reports)])

    def end(self, ended: list[Ended]) -> None:
        for key, state, values, reports in ended:
            trial_id = self.ids.pop(key, None)
            if trial_id is None:
                continue
            for step, value in reports.items():
                self.storage.set_trial_intermediate_value(trial_id, step, value)
            values_ = None if values is None else list(values)
            self.storage.set_trial_state_values(trial_id, TrialState(state), values_)

    def census(self) -> Census:
        return [
            (int(t.state), _values(t), tuple(sorted(t.params.items())))
            for t in self.study.get_trials(deepcopy=False)
        ]

    def ask(self, key: int) -> dict[str, Any]:
        trial = self.study.ask(fixed_distributions=self.space)
        self.ids[key] = trial._trial_id
        return trial.params


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    mirror: _Mirror | None = None
    while True:
        try:
            message = pickle.load(stdin)
        except (EOFError, pickle.UnpicklingError):  # the driver closed it, or ended (mid-message)
            return
        try:
            if message[0] == "start":
                mirror = _Mirror(*message[1:])
                continue
            assert mirror is not None, "an ask before the start"
            mirror.make(message[-2])
            mirror.end(message[-1])
            reply: tuple[Any, ...]
            if message[0] == "census":
                reply = ("census", mirror.census())
            else:
                t0 = time.thread_time()
                reply = ("params", message[1], mirror.ask(message[1]), time.thread_time() - t0)
        except Exception as e:  # said to the driver, which asks in its own thread from then on
            reply = ("error", f"{type(e).__name__}: {e}")
        pickle.dump(reply, stdout, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.flush()


def main() -> None:
    """The child, in a session of its own (`ProcessAsker`): a Ctrl-C, SIGTERM or hang-up is the
    driver's to handle; this process ends when the driver closes its input, or dies."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
