"""``python -m study``: the ``ponder-study`` command."""

from study.cli.launch import main

main()
