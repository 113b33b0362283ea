"""The notebook of examples/, executed by a real Jupyter kernel (ipykernel, the venv's own python,
driven by nbclient) in a copy of its folder: every cell must run, and its outputs must be of the
kinds committed (the plots drawn, the tables filled), so the notebook a reader opens on a code
host is the one that runs."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "tour.ipynb"


def kinds(cell: Any) -> set[str]:
    """What a code cell showed: each rich output's MIME type (a plot's ``image/png``, a table's
    ``text/html``), and ``stream:<name>`` for printed text."""
    found = set()
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            found.add(f"stream:{out['name']}")
        elif out["output_type"] in ("display_data", "execute_result"):
            found.update(out["data"])
        elif out["output_type"] == "error":
            found.add(f"error:{out['ename']}")
    return found


def text_of(cell: Any) -> str:
    """Everything a code cell showed as text, its results' ``text/plain`` and its streams."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


def execute(notebook: Path, folder: Path, env: dict[str, str]) -> Any:
    """``notebook`` run in ``folder`` (where its study goes) by a new kernel with ``env``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(folder)}},
        record_timing=False,  # no timestamps in a notebook written back (`python -m tests.test_notebook`)
    )
    km = client.create_kernel_manager()
    assert km.kernel_spec is not None
    # ipykernel's own spec in the venv, whose bare "python" jupyter_client launches as this
    # interpreter: the venv's python, with nothing registered in a user's or the system's folders
    assert Path(km.kernel_spec.resource_dir).is_relative_to(sys.prefix), km.kernel_spec.resource_dir
    assert km.format_kernel_cmd()[0] == sys.executable, km.format_kernel_cmd()
    client.execute(env=env)
    return nb


@pytest.mark.slow
def test_the_notebook_runs_in_a_kernel_and_shows_what_it_committed(tmp_path: Path) -> None:
    import nbformat

    from tests.study.conftest import driver_env

    folder = tmp_path / "examples"
    folder.mkdir()
    shutil.copy(NOTEBOOK, folder / NOTEBOOK.name)
    jupyter = tmp_path / "jupyter"  # the kernel's and IPython's files here: none in $HOME
    jupyter.mkdir()
    env = {
        **driver_env(["run"]),  # the suite's Ray instance, as the CLI's drivers join it
        "OMP_NUM_THREADS": "1",
        "IPYTHONDIR": str(jupyter / "ipython"),
        "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
        "MPLCONFIGDIR": str(jupyter / "matplotlib"),
    }
    saved = {k: os.environ.get(k) for k in ("JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR", "JUPYTER_PATH")}
    os.environ.update(JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"), JUPYTER_DATA_DIR=str(jupyter / "data"))
    os.environ.pop("JUPYTER_PATH", None)  # kernels from the venv only, not a user's
    try:
        ran = execute(folder / NOTEBOOK.name, folder, env)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    committed = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in ran.cells if c.cell_type == "code"]
    for mine, theirs in zip(code, [c for c in committed.cells if c.cell_type == "code"], strict=True):
        assert mine.source == theirs.source
        rich = {"image/png", "text/html"} & kinds(theirs)
        assert rich <= kinds(mine), (mine.source, kinds(mine))
        assert not {k for k in kinds(mine) if k.startswith("error:")}, text_of(mine)
    assert (folder / "results" / "studies" / "notebook-tour" / "spec.toml").is_file()

    check, run, trials, history, scatter, sensitivity, best, evaluation, model, more, importance = code
    assert text_of(check).strip() == "(4, 160, 80, 2)"  # trials, budget, ASHA's least, at once here
    assert "Number of trials: 4/4 (4 TERMINATED)" in text_of(run)  # Tune's table, redrawn in place
    assert re.search(r"^study notebook-tour: 4 trials: .*completed", text_of(run), flags=re.M)
    assert "no driver is running it" in text_of(run)  # the Study's summary and freshness
    for plot in (scatter, sensitivity):
        assert "image/png" in kinds(plot), kinds(plot)
    for table in (trials, history, importance):  # DataFrames with rows
        assert table.outputs[-1]["data"]["text/html"].count("<tr") > 2, table.source
    assert re.search(r"^status\s+completed$", text_of(best), flags=re.M), text_of(best)
    assert "best by test/halted_accuracy (max)" in text_of(evaluation)
    assert re.search(r"halting steps: \[(\d+, ){7}\d+\]", text_of(model)), text_of(model)
    counts = re.findall(r"^(completed|early_stopped|diverged)\s+(\d+)$", text_of(more), flags=re.M)
    assert sum(int(n) for _, n in counts) == 6, text_of(more)  # 4, then 2 more
    assert "importance (fANOVA" in text_of(importance), text_of(importance)


def main() -> None:
    """``python -m tests.test_notebook``: the notebook run as a reader runs it (its own Ray
    instance), in a copy of examples/ under a temporary folder, and written back with its outputs."""
    import tempfile

    import nbformat

    folder = Path(tempfile.mkdtemp(prefix="ponder-study-")) / "examples"
    folder.mkdir()
    shutil.copy(NOTEBOOK, folder / NOTEBOOK.name)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    nbformat.write(execute(folder / NOTEBOOK.name, folder, {**env, "OMP_NUM_THREADS": "1"}), NOTEBOOK)
    print(f"wrote {NOTEBOOK.relative_to(REPO)} (its study: {folder / 'results'})")


if __name__ == "__main__":
    main()
