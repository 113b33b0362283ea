"""When to ``torch.compile`` the training step, and the compile cache every trial on a machine shares.

Compiled: the forward pass and the loss together (`ponder.trainer.forward_loss`), the parity GRU
in plain ops (`ponder.gru.gru_unroll_plain`), so Inductor fuses every step's elementwise work,
forward and backward; the optimiser, the gradient clip and evaluation stay eager. On CUDA the step
is also captured in CUDA graphs (``reduce-overhead``: the training batch has one shape for a whole
run); `CUDA_GRAPHS` turns that off for `bench/iteration_speed.py`'s comparison.

``auto`` compiles on CUDA only (`bench/iteration_speed.py`, parity n_elems 15, max_steps 20,
batch 128, hidden 64; docs/ponder.md):

- CPU: faster than eager an iteration once compiled, for a minute or more of cold compile (a
  few seconds warm), and a whole study gains under 10 % with a warm cache (docs/ponder.md): when
  a cold compile pays for itself is not measured (a guess: after tens of thousands of
  iterations), so ``compile = "on"`` is for a long CPU run.
- CUDA (H200): 2.34 ms an iteration with CUDA graphs against 5.51 ms eager (4.95 ms compiled
  without graphs), for 12.4 s of cold compile (1.6 s warm): it pays after about 4,000 iterations.

``auto`` never depends on the run's length: a run and its resume to another budget must compute
the same numbers (compiled and eager agree only to float rounding).

The cache: Inductor's FX graph and AOTAutograd caches (on by default in torch 2.13) live under
``TORCHINDUCTOR_CACHE_DIR``; `share_compile_cache` points it at one directory per machine, so a
trial with another lambda_p or beta (tensor inputs, not constants) loads the kernels an earlier
trial compiled. Shapes (batch size, max_steps, n_hidden) and torch's thread count are in the key.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ponder.config import CompileMode, compiles_on

__all__ = [
    "CACHE_ENV",
    "CUDA_GRAPHS",
    "CompileMode",
    "compile_cache_dir",
    "compile_mode",
    "forget_compiled",
    "share_compile_cache",
    "should_compile",
    "uses_cuda_graphs",
]

CACHE_ENV = "PONDER_STUDY_CACHE"
"""Environment variable naming ponder-study's cache root; default ``~/.cache/ponder-study``."""


def should_compile(mode: CompileMode, device: torch.device) -> bool:
    """Whether a run compiles its training step: ``on``, ``off``, or ``auto`` (CUDA only, 2.4x eager
    on an H200; see the module)."""
    return compiles_on(mode, device.type)


CUDA_GRAPHS = True
"""Whether a compiled step on CUDA is captured in CUDA graphs (set False to compare without)."""


def uses_cuda_graphs(device: torch.device) -> bool:
    """Whether a compiled step on ``device`` replays CUDA graphs."""
    return CUDA_GRAPHS and device.type == "cuda"


def compile_mode(device: torch.device) -> str | None:
    """``torch.compile``'s ``mode`` for the training step on ``device`` (None: Inductor's default)."""
    return "reduce-overhead" if uses_cuda_graphs(device) else None


def forget_compiled() -> None:
    """Drop the compiled code and CUDA graphs this process holds, but not the on-disk cache.

    For a process that trains one run after another (a Tune actor reused for the next trial):
    torch.compile keeps at most ``recompile_limit`` (8) versions of the step per process and runs
    every further shape eagerly without a word, and each CUDA-graphed version holds its own GPU
    memory pool. After this, the next run compiles as in a fresh process, loading its kernels
    from the shared Inductor cache (about 1.6 s on an H200). Never call it while another run's
    compiled step is still in use in the process.
    """
    import sys

    if "torch._dynamo" in sys.modules:  # nothing was ever compiled otherwise
        import torch._dynamo

        torch._dynamo.reset()


def compile_cache_dir() -> Path:
    """``$PONDER_STUDY_CACHE/inductor``, or ``~/.cache/ponder-study/inductor``."""
    root = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "ponder-study")
    return Path(root).expanduser() / "inductor"


def share_compile_cache() -> Path:
    """Point Inductor's on-disk caches at the machine-wide directory, before the first compile.

    A ``TORCHINDUCTOR_CACHE_DIR`` already in the environment wins, whoever set it chose it,
    unless it is Inductor's own per-user default under /tmp: torch writes that one into the
    environment itself (creating a fused Adam does). Returns the directory in use.
    """
    # imported here: torch._inductor's package costs a second to import, and only a compile needs it
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current and Path(current).resolve() != Path(default_cache_dir()).resolve():
        return Path(current)
    path = compile_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path
