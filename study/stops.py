"""The driver's signal handling while Ray starts.

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
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["restore_stop_handlers", "stop_handlers", "stops_held_while_ray_starts"]


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

    - SIGHUP: Ray's local processes (GCS, raylet) start in the driver's process group, and a
      closed terminal's SIGHUP would kill them before the driver could save the study. They must
      inherit an ignored SIGHUP, so the driver ignores it meanwhile, and also blocks it: Linux
      keeps a blocked signal pending even when ignored, so one that came is delivered to the
      driver's own handler once that is back, instead of being lost (the study ran on, the
      terminal gone).
    - SIGTERM: ``ray.init`` first installs a handler that exits 15 at once, nothing saved or
      said. Its ``SystemExit(15)`` becomes a KeyboardInterrupt, as Ctrl-C. That exception can
      also be lost inside ``ray.init``: raised where Python cannot raise it (an at-fork hook while
      Ray forks a process, a finaliser), or caught by Ray. Seen once in CI: a SIGTERM sent as the
      GCS started, and the study ran to its end with exit 0. So the signal itself is recorded
      too, by Python's wakeup fd (every signal with a Python handler writes its number there,
      whatever the handler does), and a SIGTERM found there stops the study once Ray is up."""
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
