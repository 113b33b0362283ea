"""``python -m study``: the ``ponder-study`` command."""

from study.launch import main

main()
