"""``python -m study`` is ``ponder-study``."""

import sys

from study.cli import main

sys.exit(main())
