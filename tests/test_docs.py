"""The docs and benches cite what a reader has: public sources, not this machine's files."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOCAL = re.compile(r"/work/|\bshared/|(?<![\w-])seeds/|\bNOTES\b|\bseeds? 00\d")
"""Where the reference material and notes lay on the machine the docs were written on: an
absolute path, the shared folder, its seeds/ and NOTES, a seed file by number. A study's
folder (``docs/results/ponder-difficulty-seeds/``) is not one."""


def test_docs_and_benches_cite_no_machine_local_path() -> None:
    found = []
    for folder in ("docs", "bench", "README.md"):
        for path in sorted([REPO / folder, *(REPO / folder).rglob("*")]):
            if not path.is_file() or path.suffix == ".png":
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if LOCAL.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_results_cite_the_public_sources() -> None:
    head = (REPO / "docs" / "RESULTS.md").read_text().split("## Summary", 1)[0]
    for source in (
        "arXiv:2107.05407",
        "nn.labml.ai/adaptive_computation/ponder_net",
        "jankrepl/mildlyoverfitted",
    ):
        assert source in head, source
