"""``python -m ponder.train``: train one PonderNet from the command line (see `ponder.cli`)."""

from __future__ import annotations

from ponder.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
