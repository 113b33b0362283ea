"""``python -m study``: the ``ponder-study`` command."""

from study.cli import entry

entry()
