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

LOCAL_EDIT = re.compile(r"\ba local edit\b", re.I)
"""A figure's method is what it ran (the command, what it timed), not "a local edit"."""

ACCEPTANCE = re.compile(
    r"\btarget\b[^.\n]*\bis \**(?:missed|met)\b|\b(?:missed|met|reach) the [\d ]+% target\b", re.I
)
"""An issue's acceptance wording ("the target ... is missed"): a page says what was measured."""

LAB = {
    "stop number": STOP,
    "commit hash": HASH,
    "another engineer": ENGINEER,
    "a local edit": LOCAL_EDIT,
    "acceptance wording": ACCEPTANCE,
}


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
    from study.records.asha_state import FLUSH_S, FOLD_EVERY
    from study.records.parquet import SCHEMA_VERSION
    from study.reports.importance import MIN_TRIALS
    from study.reports.live import DEFAULT_INTERVAL_S
    from study.run.lease import LEASE_TTL_S
    from study.run.live_parquet import BUDGET_SHARE, REFRESH_S
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
        ("docs/resume.md", r"every (\d+)th save \(`FOLD_EVERY`\)", FOLD_EVERY),
        ("docs/resume.md", r"made within (\d+) s of one another", FLUSH_S),
        (
            "docs/parquet.md",
            r"at most every `\[run\] parquet_refresh_s`\s+seconds \((\d+) by default",
            REFRESH_S,
        ),
        ("docs/parquet.md", r"within (\d+) % of the driver's time", BUDGET_SHARE * 100),
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


# -- what the pages name, the code holds ----------------------------------------------------------

NAMED_FILE = re.compile(r"`((?:ponder|study|bench|tests|docs/evidence)/[\w/.-]*\.(?:py|sh|toml))`")
NAMED_OBJECT = re.compile(r"`((?:ponder|study)(?:\.\w+)+)`")
DEFINES = r"^(?:\s*(?:class|def) {0}\b|{0}\s*[:=]|\s*{0}\s*[:=]|.*\bimport\b.*\b{0}\b)"


def _module_file(dotted: str) -> Path | None:
    path = REPO / dotted.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolves(dotted: str) -> bool:
    """Whether ``ponder.x.y.NAME`` (or ``...Class.method``) is a module of the repository, or a
    name its longest module prefix defines (or imports: a re-export)."""
    import study

    if dotted in study.MOVED:  # a module's name before the folders: it still imports
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(".".join(parts[:cut]))
        if module is not None:
            rest = parts[cut:]
            text = module.read_text()
            return all(re.search(DEFINES.format(re.escape(name)), text, re.M) for name in rest)
    return False


def test_every_file_and_name_a_page_names_is_the_codes() -> None:
    """A path (`ponder/fused/trainer.py`) or a dotted name (`ponder.fused.key.FUSED_KEY_FIELDS`) a
    page gives in backticks is there: a module moved or a name renamed fails here, naming the page."""
    wrong = []
    for page in LINKED:
        text = page.read_text()
        wrong += [
            f"{page.relative_to(REPO)}: {p}" for p in NAMED_FILE.findall(text) if not (REPO / p).exists()
        ]
        wrong += [f"{page.relative_to(REPO)}: {n}" for n in NAMED_OBJECT.findall(text) if not _resolves(n)]
    assert not wrong, "no such file or name:\n" + "\n".join(wrong)


def test_a_name_placed_in_a_module_is_defined_there() -> None:
    """Where a page says a name lives ("`SPEC_ALIASES` (`study/spec/shipped.py`)"), it lives (a
    symbol of the math, `l_n`, is no name of the code)."""
    wrong = []
    for page in PAGES:
        for name, path in re.findall(r"`(\w+)`\s+\(`((?:ponder|study)/[\w/]+\.py)`", page.read_text()):
            module = REPO / path
            defined = rf"^(?:class|def) {name}\b|^{name}\s*[:=]"  # defined there, not imported
            if len(name) > 3 and module.is_file() and not re.search(defined, module.read_text(), re.M):
                wrong.append(f"{page.relative_to(REPO)}: {name} is not in {path}")
    assert not wrong, "\n".join(wrong)


def test_no_page_links_to_itself_by_its_own_name() -> None:
    wrong = []
    for page in LINKED:
        for target in LINK.findall(page.read_text()):
            if target.partition("#")[0] == page.name:
                wrong.append(f"{page.relative_to(REPO)}: ({target}): link within the page as (#heading)")
    assert not wrong, "\n".join(wrong)


def test_no_page_runs_a_script_that_lives_only_in_a_page() -> None:
    """A script a page runs is shipped (bench/, docs/evidence/), not saved by hand under /tmp."""
    found = [
        f"{page.relative_to(REPO)}: {m}"
        for page in PAGES
        for m in re.findall(r"/tmp/[\w./-]+\.py", page.read_text())
    ]
    assert not found, "\n".join(found)


def _layout_block() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Layout", 1)[1].split("```")[1]


def test_the_readme_layout_names_every_module_of_ponder_and_folder_of_study() -> None:
    block = _layout_block()
    ponder = block.split("study/", 1)[0]
    names = [
        p.name + ("/" if p.is_dir() else "")
        for p in (REPO / "ponder").iterdir()
        if p.name not in ("__init__.py", "__pycache__")
        and (p.suffix == ".py" or (p / "__init__.py").exists())
    ]
    assert [n for n in names if not re.search(rf"(?<![\w/]){re.escape(n)}", ponder)] == []
    folders = [p.name + "/" for p in (REPO / "study").iterdir() if (p / "__init__.py").exists()]
    assert [f for f in folders if not re.search(rf"^\s+{re.escape(f)}", block, re.M)] == []


def test_the_fused_page_says_which_tasks_fuse_on_which_streams() -> None:
    from ponder.tasks import registered

    text = " ".join((REPO / "docs" / "fused.md").read_text().split())
    said = re.search(r"The tasks that fuse, each on its data streams: (.*?)\. With", text)
    assert said, "docs/fused.md no longer says which tasks fuse"
    stated = {
        task: set(re.split(r",\s*", streams))
        for task, streams in re.findall(r"`(\w+)` \((\w+(?:, \w+)*)", said.group(1))
    }
    assert stated == {
        name: set(task.fused_streams) for name, task in registered().items() if task.fused_streams
    }


def test_the_specs_page_names_every_shipped_spec() -> None:
    from study.spec.shipped import list_specs

    text = (REPO / "docs" / "specs.md").read_text()
    listing = text.split("### Specs", 1)[1].split("```", 1)[0]
    assert [s for s in list_specs() if f"`{s}`" not in listing] == []


def test_the_parquet_page_lists_every_file_of_a_studys_folder() -> None:
    """`results/studies/<name>/` as the page draws it holds what the code writes there: every
    `StudyPaths` file or folder of the study (but ``ended.json``, the ledger of studies started
    before end records) and the log folder."""
    from study.run.tune_logs import log_dir
    from study.storage.paths import StudyPaths

    paths = StudyPaths("results", "name")
    written = {"logs"}
    for attr, value in vars(StudyPaths).items():
        if isinstance(value, property) and attr not in ("ended", "root_fs_path"):
            where = getattr(paths, attr)
            if isinstance(where, str) and where.startswith(paths.study_dir + "/"):
                written.add(where.removeprefix(paths.study_dir + "/").split("/")[0])
    assert log_dir(paths).name == "logs"
    text = (REPO / "docs" / "parquet.md").read_text()
    block = text.split("```", 2)[1].split("results/studies/<name>/", 1)[1]
    assert sorted(n for n in written if not re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", block)) == []


def test_the_verb_recipe_names_every_module_of_a_verb_and_every_base() -> None:
    """docs/change.md's "Add a CLI verb" names each module of study/cli/ that holds a verb, and
    each class the verbs are built on."""
    import ast

    bases: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for module in sorted((REPO / "study" / "cli").glob("*.py")):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
                where[node.name] = module.name

    def is_verb(name: str) -> bool:
        return name == "Command" or any(is_verb(b) for b in bases.get(name, []))

    verbs = {name for name in bases if is_verb(name)}
    built_on = {b for name in verbs for b in bases[name] if b in verbs}
    text = (REPO / "docs" / "change.md").read_text()
    recipe = text.split("## Add a CLI verb", 1)[1].split("\n## ", 1)[0]
    modules = {where[v] for v in verbs - built_on}
    assert sorted(m for m in modules if m not in recipe) == []
    assert sorted(b for b in built_on | {"WordsCommand"} if f"`{b}`" not in recipe) == []


def test_every_spec_key_row_says_the_bounds_and_rules_the_code_enforces() -> None:
    """The spec table says what the models refuse: a key's bounds (``reduction_factor`` above 1),
    a whole number of GPUs above 1 and at most one with ``fuse``, at least one ``[space]`` field;
    and a field that means something else in each task says which meaning is whose."""
    from study.spec.models import ResourcesSpec, SchedulerSpec, SearchSpec, spec_model

    rows = {
        cells[0]: cells[-1]
        for line in (REPO / "docs" / "specs.md").read_text().splitlines()
        if (cells := [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    }
    for section, model in (
        ("search", SearchSpec),
        ("scheduler", SchedulerSpec),
        ("resources", ResourcesSpec),
    ):
        for name, info in model.model_fields.items():
            for bound in info.metadata:
                value = next((getattr(bound, k) for k in ("gt", "ge", "lt", "le") if hasattr(bound, k)), None)
                if value is not None and value < 2**16:
                    assert re.search(rf"\b{value:g}(\.0)?\b", rows[f"`[{section}] {name}`"]), (
                        section,
                        name,
                        bound,
                    )
    assert "above 1" in rows["`[scheduler] reduction_factor`"]
    assert "whole" in rows["`[resources] gpu`"] and "at most 1" in rows["`[resources] gpu`"]
    assert "at least one" in rows["`[space.<field>]`"]
    configs = {
        task: spec_model(task).model_fields["config"].annotation.model_fields for task in ("parity", "mnist")
    }
    for name in set(configs["parity"]) & set(configs["mnist"]):
        if configs["parity"][name].description != configs["mnist"][name].description:
            assert "parity: " in rows[f"`{name}`"] and "mnist: " in rows[f"`{name}`"], name


def test_a_torch_version_a_page_gives_is_the_pinned_one_or_says_it_is_not() -> None:
    pin = re.search(r"torch==([\d.]+)", (REPO / "pyproject.toml").read_text())
    assert pin
    wrong = []
    for page in PAGES:
        for sentence in re.split(r"(?<=[.;])\s", " ".join(page.read_text().split())):
            for version in re.findall(r"\btorch (\d+\.\d+(?:\.\d+)?)(?![\d.-])", sentence):
                if not pin.group(1).startswith(version) and "not the pinned" not in sentence:
                    wrong.append(f"{page.relative_to(REPO)}: torch {version}: {sentence[:120]}")
    assert not wrong, "\n".join(wrong)


def test_the_schema_is_written_by_make_generate_and_printed_by_the_verb() -> None:
    """``ponder-study schema`` prints the JSON Schema; ``make generate`` writes the shipped one."""
    from study.cli.specs import Schema

    assert Schema.help.startswith("print ")
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^generate:.*\n\t.*study\.cli\.reference", makefile, re.M)
    wrong = re.compile(r"ponder-study schema`?\s+(?:re)?(?:generates|writes|rewrites)", re.I)
    found = [
        str(page.relative_to(REPO)) for page in PAGES if wrong.search(" ".join(page.read_text().split()))
    ]
    assert not found, f"these say `ponder-study schema` writes the schema file: {found}"
