"""Every stop of the ``ponder-study`` driver: Ctrl-C, SIGTERM, SIGHUP, from its first line.

A stop raises KeyboardInterrupt wherever the driver is and is remembered, so a stop swallowed by
code that catches everything is raised again at the driver's next phase
(`raise_a_swallowed_stop`).

``ray.init`` replaces SIGTERM's handler with one that exits 15 at once (nothing saved), and the
local Ray processes it starts share the driver's process group, so a closed terminal's SIGHUP
would kill them. While Ray starts, a SIGTERM or SIGHUP still stops the study as Ctrl-C does
(`stops_held_while_ray_starts`), and the command's own handlers are put back afterwards. Needs
neither Ray nor torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = [
    "RAY_CRASH_HANDLER_OFF",
    "caused_by_ctrl_c",
    "crash_handler_back_for_ray_processes",
    "crash_handler_off_for_the_driver",
    "install_stop_handlers",
    "raise_a_swallowed_stop",
    "restore_stop_handlers",
    "stop_handlers",
    "stops_as_ctrl_c",
    "stops_held_while_ray_starts",
]

RAY_CRASH_HANDLER_OFF = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
"""Turns off Ray's C++ crash handler (absl's) in the driver. It also takes SIGTERM, and
``ray.shutdown()`` removes it by setting SIGTERM back to "die at once" over the driver's own
handler, so a SIGTERM while Ray's processes stop (~1 s) would exit 143 before the summary. Read
when Ray is imported; `study.run.runner` takes it back out before Ray starts its processes, so
trials keep the crash handler."""

_set_here = False


def crash_handler_off_for_the_driver() -> None:
    """Set `RAY_CRASH_HANDLER_OFF` for this process, unless the user set it."""
    global _set_here
    if RAY_CRASH_HANDLER_OFF not in os.environ:  # a user's own setting stands
        os.environ[RAY_CRASH_HANDLER_OFF] = "1"
        _set_here = True


def crash_handler_back_for_ray_processes() -> None:
    """Called once Ray is imported, before it starts processes: they inherit the environment."""
    global _set_here
    if _set_here:
        os.environ.pop(RAY_CRASH_HANDLER_OFF, None)
        _set_here = False


_stop_asked = False


def _as_ctrl_c(signum: int, frame: object) -> None:
    global _stop_asked
    _stop_asked = True
    raise KeyboardInterrupt


def _quiet_when_a_stop_was_swallowed(unraisable: sys.UnraisableHookArgs) -> None:
    """Silence the "Exception ignored in ..." traceback of a stop raised where Python cannot raise
    it (an at-fork hook while Ray forks, a finaliser): `raise_a_swallowed_stop` raises it again at
    the driver's next phase, so the traceback would be noise on a clean exit 130. The
    ``SystemExit(15)`` of ``ray.init``'s SIGTERM handler is remembered as a stop too. Any other
    exception is printed as Python would."""
    global _stop_asked
    if isinstance(unraisable.exc_value, SystemExit) and unraisable.exc_value.code == signal.SIGTERM:
        _stop_asked = True
        return
    if _stop_asked and issubclass(unraisable.exc_type, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


def install_stop_handlers() -> None:
    """Ctrl-C, SIGTERM and SIGHUP raise KeyboardInterrupt and are remembered (see `main`)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _as_ctrl_c)
    sys.unraisablehook = _quiet_when_a_stop_was_swallowed


@contextlib.contextmanager
def stops_as_ctrl_c() -> Iterator[None]:
    """For the block, Ctrl-C and SIGTERM raise KeyboardInterrupt and are remembered, as in the
    command (`install_stop_handlers`): a study driven from Python (a notebook's kernel, whose
    interrupt is a SIGINT) stops as the command does. The caller's handlers, and whether a stop
    had come, are put back afterwards, so a later study is not stopped by this one's stop.
    Outside the main thread, which no signal reaches, nothing changes."""
    global _stop_asked
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved: dict[int, Any] = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    asked = _stop_asked
    for sig in saved:
        signal.signal(sig, _as_ctrl_c)
    try:
        yield
    finally:
        restore_stop_handlers(saved)
        _stop_asked = asked


def caused_by_ctrl_c(error: BaseException) -> bool:
    """Whether ``error`` wraps a Ctrl-C (a stop signal): Python 3.11 turns a KeyboardInterrupt
    raised inside a class body's ``__set_name__`` into a RuntimeError whose cause it is, so a
    Ctrl-C landing while a module defines such a class (``import ray.tune`` does) reads as an
    error unless its causes are looked at."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def raise_a_swallowed_stop() -> None:
    """Raise again a stop (Ctrl-C, SIGTERM, SIGHUP) that came but did not end the command.

    Code that catches every exception around its imports or start-up can swallow the
    KeyboardInterrupt; the driver calls this between its phases (imports, Ray's start, Tune's
    run), so a stop is never lost for long."""
    if _stop_asked:
        raise KeyboardInterrupt


def stop_handlers() -> dict[int, Any]:
    """SIGTERM's and SIGHUP's handlers as they are now, for `restore_stop_handlers`."""
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}


def restore_stop_handlers(handlers: dict[int, Any]) -> None:
    """``ray.init`` replaces SIGTERM's handler with one that exits 15 at once (no state saved):
    put back the command's, which stops the study as Ctrl-C does."""
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


@contextlib.contextmanager
def stops_held_while_ray_starts() -> Iterator[None]:
    """While ``ray.init`` runs, a SIGTERM or SIGHUP still stops the study as Ctrl-C does.

    - SIGHUP: Ray's local processes (GCS, raylet) start in the driver's process group and must
      inherit an ignored SIGHUP, or a closed terminal would kill them before the study is saved.
      The driver ignores it meanwhile and also blocks it: Linux keeps a blocked signal pending
      even when ignored, so one that came reaches the driver's handler once that is back.
    - SIGTERM: ``ray.init`` installs a handler that exits 15 at once; its ``SystemExit(15)``
      becomes a KeyboardInterrupt. That exception can be lost inside ``ray.init`` (raised in an
      at-fork hook or a finaliser, or caught by Ray), so the signal is also recorded through
      Python's wakeup fd, which no handler can swallow, and a SIGTERM found there stops the
      study once Ray is up."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only, and Ray sets no handler from another thread
        return
    handlers = stop_handlers()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    with _signals_recorded() as came:
        try:
            try:
                yield
            finally:
                restore_stop_handlers(handlers)  # Ray's SIGTERM handler out, the driver's back
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # a pending SIGHUP lands now
        except SystemExit as e:
            restore_stop_handlers(handlers)  # in case Ray's handler fired before the line above
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
            if e.code != signal.SIGTERM:
                raise
            raise KeyboardInterrupt from None
    if signal.SIGTERM in came:  # Ray's SystemExit(15) was swallowed on its way out
        raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_recorded() -> Iterator[set[int]]:
    """The numbers of the signals that came in the block (those with a Python handler), filled
    in as the block ends: a record no handler can swallow."""
    came: set[int] = set()
    read_end, write_end = os.pipe()  # both close-on-exec: Ray's processes do not inherit them
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield came
    finally:
        signal.set_wakeup_fd(previous)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_end, 512):
                came.update(chunk)
        os.close(read_end)
        os.close(write_end)
        if previous >= 0 and came:  # whoever had the wakeup fd before hears of them too
            with contextlib.suppress(OSError):
                os.write(previous, bytes(sorted(came)))
