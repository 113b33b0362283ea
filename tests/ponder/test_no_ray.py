"""``ponder/`` is plain PyTorch: it never imports Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ponder

PACKAGE = Path(ponder.__file__).parent


def test_no_module_of_ponder_names_ray() -> None:
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n == "ray" or n.startswith("ray.") for n in names), path


def test_importing_and_training_loads_no_ray() -> None:
    code = (
        "import sys, ponder, ponder.train, ponder.cli\n"
        "from ponder import ParityConfig, Trainer\n"
        "config = ParityConfig(n_elems=3, max_steps=2, iterations=2, eval_interval=1, eval_samples=8)\n"
        "list(Trainer(config).run())\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_package_names_load_lazily_and_all_of_them_resolve() -> None:
    """``import ponder.config`` (what a spec check needs) loads no torch; every public name of
    the package still resolves to its module's object."""
    code = (
        "import sys, ponder.config, ponder.metrics\n"
        "print('torch' in sys.modules)\n"
        "import ponder\n"
        "assert all(getattr(ponder, n) is not None for n in ponder.__all__)\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
