"""The docs and benches cite what a reader has: public sources, not this machine's files."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LOCAL = re.compile(r"/work/|\bshared/|(?<![\w-])seeds/|\bNOTES\b|\bseeds? 00\d")
"""Where the reference material and notes lay on the machine the docs were written on: an
absolute path, the shared folder, its seeds/ and NOTES, a seed file by number. A study's
folder named for random seeds (``results/studies/x-seeds/``) is not one."""


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
    """RESULTS.md opens with its summary, then the sources every comparison is with."""
    text = (REPO / "docs" / "RESULTS.md").read_text()
    assert text.index("## Summary") < text.index("## Sources")
    head = text.split("## Sources", 1)[1].split("\n## ", 1)[0]
    for source in (
        "arXiv:2107.05407",
        "nn.labml.ai/adaptive_computation/ponder_net",
        "jankrepl/mildlyoverfitted",
    ):
        assert source in head, source


# -- the docs describe what is: no lab notebook ---------------------------------------------------

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
"""The pages a reader reads: the README and every docs page (not the images of docs/results/)."""

STOP = re.compile(
    r"\bstops? \d+\b(?!\s*(?:%|s\b|ms\b|seconds?\b|trials?\b|iterations?\b|of\b|workers?\b|processes\b))",
    re.I,
)
"""A stop number of the lab notebook: "stop 42", "at stop 33's last commit", "(stop 30)". Not the
verb with a count ("ASHA may stop 2 trials", "stops 10 s later")."""

HASH = re.compile(
    r"(?:\b(?:at|commit|commits|in|since|before|after|from|and|to)\s+|[(`])`?"
    r"(?=[0-9a-f]{7}(?![\w-]))(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7}(?![\w-])"
    r"|\b[0-9a-f]{40}\b"
)
"""A commit hash as the notebook cited one: an abbreviated hash (7 hex digits, letters and
digits both) after "at", "commit", "in", "since", ... or in parentheses or backticks ("at
7c8c9ca", "commit 3337cc5", "(9c440cd)", "`0a597af`"), or a full 40-digit one. A trial id (8 hex
digits, "9ceec66b") is not one: the docs show trial ids as examples."""

ENGINEER = re.compile(r"\banother engineer|\bother engineers\b", re.I)
"""Who measured what is git's to say, not the docs'."""

LAB = {"stop number": STOP, "commit hash": HASH, "another engineer": ENGINEER}


def _lab_lines(name: str, lines: list[tuple[int, str]]) -> list[str]:
    return [
        f"{name}:{number}: {what}: {line.strip()}"
        for number, line in lines
        for what, pattern in LAB.items()
        if pattern.search(line)
    ]


@pytest.mark.parametrize(
    "line",
    [
        "the fresh-clone run at 7c8c9ca, 9 min 41.6 s",
        "docs/tests.md: commit 3337cc5 took 617 s",
        "Optuna's log line that 9c440cd took off stderr (fixed in 4f87206)",
        "the grid ran at commit `0a597af`",
        "built from 3f9e8a1c2b4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f",
    ],
)
def test_the_hash_pattern_finds_a_cited_commit(line: str) -> None:
    assert HASH.search(line), line


@pytest.mark.parametrize(
    "line",
    [
        "9ceec66b     completed    0.5165   0.01398          6         60",
        "| f7014458 | 20,000 (completed) | 0.297 |",
        "two trials (1b604123 and 9ceec66b) at 2026-11-27",
        "in 1234567 rows, at 0.99, since 2026-11-26",
        "the report (results/reports/parity-smoke/index.html)",
    ],
)
def test_the_hash_pattern_leaves_trial_ids_and_numbers(line: str) -> None:
    assert not HASH.search(line), HASH.search(line)


@pytest.mark.parametrize(
    ("line", "lab"),
    [
        ("fresh clone, stop 42: 9 min 41.6 s", True),
        ("at stop 33's last commit", True),
        ("Three costs were cut (Stop 29).", True),
        ("ASHA may stop 2 trials at a rung", False),
        ("Ray SIGKILLs the driver, stops 3 s later", False),
        ("`ponder-study` stop 10 of them", False),
    ],
)
def test_the_stop_pattern_finds_the_notebooks_stops_only(line: str, lab: bool) -> None:
    assert bool(STOP.search(line)) is lab, line


def test_docs_keep_no_lab_notebook() -> None:
    """No stop numbers, commit hashes or "another engineer" in README.md and docs/*.md: the
    history of a figure is git's; a page says what is."""
    found = []
    for path in PAGES:
        lines = list(enumerate(path.read_text().splitlines(), 1))
        found += _lab_lines(str(path.relative_to(REPO)), lines)
    assert not found, "\n".join(found)


def _comments_and_strings(text: str) -> list[tuple[int, str]]:
    """Each line of a module's comments and string literals (its docstrings among them), or of
    the whole text where it does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return list(enumerate(text.splitlines(), 1))
    return [
        (token.start[0] + offset, line)
        for token in tokens
        if token.type in (tokenize.COMMENT, tokenize.STRING)
        for offset, line in enumerate(token.string.splitlines())
    ]


def lab_lines_in_code() -> list[str]:
    """The lab notebook's marks in the comments and docstrings of ponder/, study/, bench/ and
    docs/evidence/ (and bench's shell scripts)."""
    found = []
    for folder in ("ponder", "study", "bench", "docs/evidence"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".sh") or not path.is_file():
                continue
            text = path.read_text(errors="replace")
            lines = (
                _comments_and_strings(text) if path.suffix == ".py" else list(enumerate(text.splitlines(), 1))
            )
            found += _lab_lines(str(path.relative_to(REPO)), lines)
    return found


def test_code_comments_keep_no_lab_notebook() -> None:
    """The same in the comments and docstrings of the code: they say what and why."""
    found = lab_lines_in_code()
    assert not found, "\n".join(found)


def test_pages_stay_short() -> None:
    """A newcomer reads the README and a page in minutes: the README under 150 lines,
    docs/tests.md under 80, every other docs page under 400 (RESULTS.md, the evidence, apart)."""
    limits = {REPO / "README.md": 150, REPO / "docs" / "tests.md": 80}
    over = []
    for path in PAGES:
        if path.name == "RESULTS.md":
            continue
        limit = limits.get(path, 400)
        count = len(path.read_text().splitlines())
        if count >= limit:
            over.append(f"{path.relative_to(REPO)}: {count} lines, the limit {limit}")
    assert not over, "\n".join(over)


# -- links and the bench index ---------------------------------------------------------------------

LINKED = [*PAGES, REPO / "bench" / "README.md", REPO / "docs" / "evidence" / "README.md"]
"""Every Markdown page whose links a reader follows."""

LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but ``-`` and ``_``
    dropped, spaces as ``-`` (a repeated heading gets ``-1``, ``-2``...)."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # no headings in code
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_reaches_its_file_and_heading() -> None:
    broken = []
    for page in LINKED:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}: no such file")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{page.relative_to(REPO)}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def _bench_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (REPO / "bench" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and re.fullmatch(r"`[\w.]+\.(py|sh)`", cells[0]):
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_bench_index_has_one_row_a_script() -> None:
    scripts = sorted(p.name for p in (REPO / "bench").iterdir() if p.suffix in (".py", ".sh"))
    assert sorted(_bench_rows()) == scripts


def _tests_importing(script: str) -> set[str]:
    """The test modules that load ``bench/<script>``: by ``import <stem>`` (bench/ on the path,
    as in a subprocess's code), as ``bench.<stem>``, or by its file name."""
    stem = Path(script).stem
    found = set()
    imports = (
        rf"^\s*import (bench\.)?{stem}\b|^\s*from (bench\.)?{stem} import|^\s*from bench import .*\b{stem}\b"
    )
    for test in (REPO / "tests").rglob("test_*.py"):
        text = test.read_text()
        if re.search(rf"{imports}|\"{re.escape(script)}\"", text, re.M):
            found.add(str(test.relative_to(REPO)))
    return found


def test_the_bench_index_says_which_scripts_tests_import() -> None:
    for script, cells in _bench_rows().items():
        said = set(re.findall(r"`(tests/[\w/]+\.py)`", cells[-1]))
        assert said == _tests_importing(script), script


def test_the_bench_index_gives_each_scripts_own_last_line() -> None:
    """A row's last line, up to its first placeholder (``<...>``), is printed by the script."""
    for script, cells in _bench_rows().items():
        shown = re.match(r"`([^`<]*)", cells[3])
        if shown and shown.group(1).strip():
            words = shown.group(1).strip()
            assert words in (REPO / "bench" / script).read_text(), (script, words)


# -- what the docs state that the code decides --------------------------------------------------


def _tune_save_period_s() -> float:
    """Tune's period between saves of the experiment state when nobody sets it (``auto``)."""
    from ray.tune.execution.experiment_state import _ExperimentCheckpointManager

    return float(_ExperimentCheckpointManager(storage=None, checkpoint_period="auto")._checkpoint_period)


def _stated_values() -> list[tuple[str, str, float]]:
    """(page, pattern whose one group is a number the page states, the code's number)."""
    import inspect

    from ponder import cli as ponder_cli
    from study.records.parquet import SCHEMA_VERSION
    from study.reports.importance import MIN_TRIALS
    from study.reports.live import DEFAULT_INTERVAL_S
    from study.run.lease import LEASE_TTL_S
    from study.spec.spec import MAX_NAME_LENGTH
    from study.storage.filesystems import check_reachable

    reach_s = inspect.signature(check_reachable).parameters["timeout_s"].default
    return [
        ("README.md", r"fANOVA importance of each searched field, once (\d+)", MIN_TRIALS),
        ("docs/specs.md", r"once Optuna holds (\d+) trials complete", MIN_TRIALS),
        ("docs/specs.md", r"importance: needs (\d+) ended trials", MIN_TRIALS),
        ("README.md", r"redrawn every (\d+) s", DEFAULT_INTERVAL_S),
        ("docs/specs.md", r"redrawn every (\d+) s", DEFAULT_INTERVAL_S),
        ("docs/specs.md", r"read every (\d+) s \(or S\)", DEFAULT_INTERVAL_S),
        ("docs/specs.md", r"longer than (\d+) characters", MAX_NAME_LENGTH),
        ("docs/specs.md", r"does not\s+answer within (\d+) s", reach_s),
        ("docs/resume.md", r"renewed every (\d+) s", LEASE_TTL_S / 3),
        ("docs/resume.md", r"(?:not been renewed for|waits at most|went\s+those) (\d+) s", LEASE_TTL_S),
        ("docs/resume.md", r"written in place every (\d+) s or more", _tune_save_period_s()),
        ("docs/parquet.md", r"schema version (\d+)", SCHEMA_VERSION),
        ("docs/parquet.md", r"`schema_version` \((\d+)\)", SCHEMA_VERSION),
        ("docs/parquet.md", r"\| `schema_version` \| (\d+) ", SCHEMA_VERSION),
        ("docs/ponder.md", r"prints one line on stderr and exits with code (\d+)", ponder_cli.EXIT_USAGE),
    ]


def test_numbers_the_docs_state_are_the_codes() -> None:
    """A default or a limit a page states in prose (the generated tables aside) is the code's:
    change one and this names the page to change with it."""
    wrong = []
    for page, pattern, value in _stated_values():
        found = re.findall(pattern, (REPO / page).read_text())
        assert found, f"{page} no longer states /{pattern}/: say it again or drop it from this test"
        wrong += [f"{page}: /{pattern}/ says {n}, the code {value:g}" for n in found if float(n) != value]
    assert not wrong, "\n".join(wrong)


def test_the_parity_defaults_ponder_md_states_are_parity_configs() -> None:
    from ponder.config import ParityConfig

    text = (REPO / "docs" / "ponder.md").read_text()
    stated = re.search(r"\(`ParityConfig`, defaults ([^)]*)\)", text)
    assert stated, "docs/ponder.md no longer lists ParityConfig's defaults"
    names = {"hidden": "n_hidden", "batch": "batch_size"}
    config = ParityConfig()
    for pair in " ".join(stated.group(1).split()).split(", "):
        name, value = pair.rsplit(" ", 1)
        assert float(value) == getattr(config, names.get(name, name)), pair
