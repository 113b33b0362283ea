"""The study report: six real PNGs and a self-contained index, for a real study and for thin ones."""

from __future__ import annotations

import html
import math
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from study.records.ranking import ranked_trials
from study.reports.report import PLOTS, Report, ReportError, pareto_front, write_report
from study.spec.spec import SPECS_DIR
from study.storage.storage import StudyPaths, write_bytes, write_parquet

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIX = ("sensitivity", "pareto", "halting_distribution", "per_step_accuracy", "learning_curves", "asha")


class _Index(HTMLParser):
    """What the tests read from index.html: images, every link, the summary's text, no-data notes."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.alts: list[str] = []
        self.links: list[str] = []
        self.summary = ""
        self.nodata: list[str] = []
        self._section: str | None = None
        self._in_nodata = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src") or "")
            self.alts.append(a.get("alt") or "")
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "section":
            self._section = a.get("id")
        if tag == "p" and a.get("class") == "nodata":
            self._in_nodata = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
        if tag == "p":
            self._in_nodata = False

    def handle_data(self, data: str) -> None:
        if self._section == "summary":
            self.summary += data
        if self._in_nodata:
            self.nodata.append(data)


def _check(report: Report) -> _Index:
    """Six readable PNGs, an index that shows each of them by a relative link and nothing remote."""
    directory = Path(report.directory)
    assert tuple(report.plots) == SIX == PLOTS
    for key, path in report.plots.items():
        png = Path(path)
        assert png == directory / f"{key}.png"
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC, key
        image = matplotlib.image.imread(png)
        height, width = image.shape[:2]
        assert width > 100 and height > 100, (key, image.shape)
        assert image.std() > 0, f"{key} is blank"
    assert Path(report.index) == directory / "index.html"
    text = Path(report.index).read_text(encoding="utf-8")
    index = _Index()
    index.feed(text)
    assert index.images == [f"{key}.png" for key in SIX]
    assert all(alt for alt in index.alts)
    assert all((directory / link).is_file() for link in index.links), index.links  # relative, movable
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text and "<link" not in text
    assert not list(directory.glob(".*.tmp"))
    return index


def _headers(table: str) -> list[str]:
    """A table's column names, without the line-break hints (``<wbr>``) of its headers."""
    return re.findall(r"<th>([^<]*)</th>", table.replace("<wbr>", ""))


def _best_trial(storage: Path, name: str, metric: str = "test/halted_accuracy") -> str:
    """The best trial as the report defines it, computed here with pandas from the Parquet."""
    df = pd.read_parquet(storage / "trials" / f"study={name}")
    ended = df[df["status"].isin(["completed", "early_stopped"]) & df[metric].notna()]
    return str(ended.sort_values([metric, "trial_id"], ascending=[False, True]).iloc[0]["trial_id"])


@pytest.mark.slow
def test_the_smoke_study_gets_six_plots_and_an_index(smoke: tuple[Path, Any], tmp_path: Path) -> None:
    storage, _ = smoke
    report = write_report("parity-smoke", str(storage), out=str(tmp_path / "report"))
    index = _check(report)
    assert index.nodata == []  # parity: easy and hard sets, several trials, history, ASHA's rungs
    assert report.drawn == 6 and report.missing == {}
    best = _best_trial(storage, "parity-smoke")
    assert f"Best trial: {best} " in index.summary
    assert "Trials: 6 (" in index.summary


@pytest.mark.slow
def test_the_default_directory_is_under_the_storage(smoke: tuple[Path, Any], tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    for part in ("studies", "trials", "history"):  # not the Tune experiment: the report needs none
        shutil.copytree(smoke[0] / part, storage / part)
    report = write_report("parity-smoke", str(storage))
    assert Path(report.directory) == storage / "reports" / "parity-smoke"
    _check(report)
    again = write_report("parity-smoke", str(storage))  # over an older report: replaced file by file
    assert again == report
    _check(again)


def test_an_unknown_study_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError) as info:
        write_report("no-such-study", str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert "'no-such-study'" in message and "ponder-study list" in message
    assert not (tmp_path / "reports").exists()


def test_a_study_without_parquet_says_how_to_get_it(tmp_path: Path) -> None:
    paths = StudyPaths(str(tmp_path), "early")
    write_bytes(paths.spec, (SPECS_DIR / "parity-smoke.toml").read_bytes())
    with pytest.raises(ReportError, match=r"no trials Parquet yet.*ponder-study export early") as info:
        write_report("early", str(tmp_path))
    assert "\n" not in str(info.value)


def test_ranking_keeps_ended_trials_with_a_value_best_first() -> None:
    trials = pd.DataFrame(
        {
            "trial_id": ["a", "b", "c", "d", "e"],
            "status": ["completed", "early_stopped", "diverged", "completed", "running"],
            "test/loss": [0.3, 0.2, 0.01, 0.2, 0.0],
        }
    )
    assert list(ranked_trials(trials, "test/loss", "min")["trial_id"]) == ["b", "d", "a"]  # tie: by id
    assert list(ranked_trials(trials, "test/loss", "max")["trial_id"]) == ["a", "b", "d"]
    assert ranked_trials(trials, "test/halted_accuracy", "max").empty


def test_the_pareto_plot_marks_the_undominated_ended_trials() -> None:
    acc, steps = "test/halted_accuracy", "test/mean_halting_step"
    trials = pd.DataFrame(
        {
            "trial_id": list("abcdef"),
            "status": ["completed", "early_stopped", "completed", "diverged", "completed", "running"],
            acc: [0.90, 0.80, 0.85, 0.95, math.nan, 0.99],
            steps: [3.0, 2.0, 4.0, 1.0, 1.0, 1.0],
        }
    )
    # c is beaten by a; b (stopped early: a smaller budget), d (diverged), e (no accuracy) and f
    # (running) are not candidates
    assert pareto_front(trials, acc, steps).tolist() == [True, False, False, False, False, False]
    # a parity trial at chance (within 3 standard errors of 0.5 on 200 samples) is never on it,
    # however few its steps; one clearly above chance with fewer steps than a is
    parity = trials.assign(task="parity", eval_samples=200)
    guess = pd.DataFrame(
        {"trial_id": ["g", "h"], "status": "completed", acc: [0.55, 0.70], steps: [1.0, 2.0]}
    ).assign(task="parity", eval_samples=200)
    both = pd.concat([parity, guess], ignore_index=True)
    assert pareto_front(both, acc, steps).tolist() == [True, False, False, False, False, False, False, True]
    # a multi-objective study's table says which trials are on its front: those are marked
    marked = trials.assign(pareto=[False, True, None, True, False, False])
    assert pareto_front(marked, acc, steps).tolist() == [False, True, False, True, False, False]
    # a column with no values says nothing: the front is computed
    unmarked = trials.assign(pareto=pd.Series([None] * 6, dtype=object))
    assert pareto_front(unmarked, acc, steps).tolist() == [True, False, False, False, False, False]
    assert pareto_front(trials.iloc[:0], acc, steps).tolist() == []


def _parity_study(storage: Path, name: str, rows: list[tuple[str, float, float]]) -> None:
    """``parity-smoke`` written by hand, one trial per (status, test halted accuracy, mean
    halting step), its ``pareto`` column as the study would write it: no Ray, no training."""
    from study.records.ranking import pareto_marks

    acc, steps = "test/halted_accuracy", "test/mean_halting_step"
    paths = StudyPaths(str(storage), name)
    write_bytes(paths.spec, (SPECS_DIR / "parity-smoke.toml").read_bytes())
    trials = pd.DataFrame(
        {
            "trial_id": [f"t{i}" for i in range(len(rows))],
            "status": [status for status, _, _ in rows],
            "task": "parity",
            "eval_samples": 200,
            "iterations": 60,
            "lambda_p": [0.2 + 0.1 * i for i in range(len(rows))],
            "beta": 0.01,
            "max_steps": 6,
            "iteration": [60 if status == "completed" else 10 for status, _, _ in rows],
            acc: [a for _, a, _ in rows],
            steps: [n for _, _, n in rows],
            "nan_events": 0,
        }
    )
    trials["pareto"] = pareto_marks(trials.to_dict("records"), [(acc, "max"), (steps, "min")])
    write_parquet(paths.trials_parquet, pa.Table.from_pandas(trials, preserve_index=False))


def _pareto_caption(report: Report) -> str:
    text = Path(report.index).read_text(encoding="utf-8")
    section = text[text.index('<section id="pareto">') : text.index('<section id="halting_distribution">')]
    return html.unescape(re.findall(r"<p>(.*?)</p>", section, flags=re.S)[0])


def test_the_pareto_caption_states_its_rule_and_says_when_nothing_passes_it(tmp_path: Path) -> None:
    # the smoke study's case: the best trial (0.605, completed) is beaten by nothing, but is not
    # above chance by 3 standard errors of 200 samples (0.6061): nothing is ringed, and it says so
    smoke = [("completed", 0.605, 1.9), ("completed", 0.53, 1.955), ("early_stopped", 0.555, 1.5)]
    _parity_study(tmp_path, "chance", smoke)
    report = write_report("chance", str(tmp_path), out=str(tmp_path / "chance"))
    assert "pareto" not in report.missing
    caption = _pareto_caption(report)
    assert "60-iteration budget" in caption and "above chance (0.5)" in caption
    assert "200-sample evaluation set: above 0.6061" in caption
    assert "No trial passes this rule" in caption and "is 0.605" in caption
    assert "nothing is ringed" in caption
    # one completed trial above the bar: it is the front, and the caption counts it
    _parity_study(tmp_path, "front", [*smoke, ("completed", 0.65, 2.5)])
    caption = _pareto_caption(write_report("front", str(tmp_path), out=str(tmp_path / "front")))
    assert "above 0.6061" in caption and "1 of 4 trials pass this rule; 1 ringed." in caption
    assert "No trial passes" not in caption


def test_the_top_trials_table_may_wrap_its_headers_and_scrolls_in_its_own_box(tmp_path: Path) -> None:
    _parity_study(tmp_path, "wide", [("completed", 0.605, 1.9), ("early_stopped", 0.555, 1.5)])
    report = write_report("wide", str(tmp_path), out=str(tmp_path / "report"))
    text = Path(report.index).read_text(encoding="utf-8")
    assert re.search(r"\.wide \{[^}]*overflow-x: auto", text)  # wider than the page: it scrolls alone
    top = text[text.index('<section id="top">') :]
    assert re.search(r'<div class="wide">\s*<table[^>]*class="[^"]*trials', top)
    # a metric's header may break after / and _, a plain name never
    assert "<th>test/<wbr>halted_<wbr>accuracy</th>" in top and "<th>lambda_p</th>" in top
    assert "test/halted_accuracy" in _headers(top)


def _mnist_study(storage: Path, name: str, n_trials: int) -> None:
    """An MNIST-like study written by hand through the Parquet contract: no easy/hard sets, no
    asha.json, ``n_trials`` trials (the first completed, the others stopped after two reports)."""
    from study.records.parquet import TrialRecord, history_table, trials_table  # imports Ray: only here

    spec_text = (SPECS_DIR / "mnist.toml").read_text()
    paths = StudyPaths(str(storage), name)
    write_bytes(paths.spec, spec_text.encode())
    records = []
    for i in range(n_trials):
        max_steps = 4 + i
        lambda_p = [0.2, 0.5, 0.2][i % 3]  # two trials share a lambda_p: a mean and a spread
        reports = 8 if i == 0 else 2
        history = []
        for r in range(1, reports + 1):
            acc = 0.5 + 0.05 * r - 0.03 * i
            p = np.full(max_steps, 1.0 / max_steps)
            history.append(
                {
                    "iteration": 200 * r,
                    "outcome": "completed" if r == 8 else "running",
                    "nan_events": 0,
                    "time_total_s": float(r),
                    "test/halted_accuracy": acc,
                    "test/mean_halting_step": 1.5 + i / 2,
                    "test/per_step_accuracy": [acc - 0.01 * k for k in range(max_steps)],
                    "test/halting_distribution": p.tolist(),
                }
            )
            if i != 2:  # the third trial stands for one without them (written before schema 4)
                history[-1].update({"test/best_step_accuracy": acc, "test/stable_accuracy": acc - 0.2})
        config = {
            "task": "mnist",
            "lambda_p": lambda_p,
            "beta": 0.01,
            "max_steps": max_steps,
            "iterations": 1600,
            "eval_interval": 200,
        }
        records.append(TrialRecord(f"t{i}", "TERMINATED", config, history, stopped_early=i > 0, ended=True))
    write_parquet(paths.trials_parquet, trials_table(records, "test/halted_accuracy", "max"))
    write_parquet(paths.history_parquet, history_table(records))


def test_a_study_without_easy_and_hard_sets_gets_all_six(tmp_path: Path) -> None:
    _mnist_study(tmp_path, "digits", n_trials=3)
    trials = pd.read_parquet(tmp_path / "trials" / "study=digits")
    assert trials["easy/halting_distribution"].isna().all()  # the columns are there, empty
    report = write_report("digits", str(tmp_path), out=str(tmp_path / "report"))
    index = _check(report)
    assert index.nodata == []  # the test set stands in for easy and hard; no asha.json: no rungs
    assert "Best trial: t0 " in index.summary


def test_the_top_trials_show_halted_best_step_and_stable_accuracy_side_by_side(tmp_path: Path) -> None:
    _mnist_study(tmp_path, "digits", n_trials=3)
    report = write_report("digits", str(tmp_path), out=str(tmp_path / "report"))
    _check(report)  # per_step_accuracy.png draws them beside the per-step curves
    text = Path(report.index).read_text(encoding="utf-8")
    table = text[text.index('<section id="top">') :]
    headers = _headers(table)
    at = headers.index("test/halted_accuracy")
    assert headers[at : at + 3] == ["test/halted_accuracy", "test/best_step_accuracy", "test/stable_accuracy"]
    first = re.findall(r"<td>([^<]*)</td>", table)[: len(headers)]  # the best trial, t0: 0.9 after 8 reports
    assert (first[at], first[at + 1], first[at + 2]) == ("0.9", "0.9", "0.7")


def test_a_thin_study_gets_placeholders_not_missing_files(tmp_path: Path) -> None:
    # one trial, no easy/hard/extrapolation/rotation columns at all, no prior_tail, no history
    _mnist_study(tmp_path, "thin", n_trials=1)
    paths = StudyPaths(str(tmp_path), "thin")
    table = pd.read_parquet(paths.trials_parquet)
    keep = [c for c in table.columns if c.split("/")[0] in ("test", "train", "best") or "/" not in c]
    table = table[keep].drop(columns=["prior_tail"])
    write_parquet(paths.trials_parquet, pa.Table.from_pandas(table, preserve_index=False))
    Path(paths.history_parquet).unlink()
    report = write_report("thin", str(tmp_path), out=str(tmp_path / "report"))
    index = _check(report)
    assert len(index.nodata) == 1 and "history" in index.nodata[0]  # the learning curves
    assert report.drawn == 5 and len(report.missing) == 1  # what the CLI says it drew
    assert "Best trial: t0 " in index.summary


def test_a_study_with_no_ended_trial_yet_still_gets_all_six(tmp_path: Path) -> None:
    _mnist_study(tmp_path, "young", n_trials=2)
    paths = StudyPaths(str(tmp_path), "young")
    table = pd.read_parquet(paths.trials_parquet).assign(status="running")
    write_parquet(paths.trials_parquet, pa.Table.from_pandas(table, preserve_index=False))
    report = write_report("young", str(tmp_path), out=str(tmp_path / "report"))
    index = _check(report)
    # nothing ended: no best trial, so no halting distribution or per-step accuracy to show
    assert len(index.nodata) == 2 and all("completed or early-stopped" in n for n in index.nodata)
    assert report.drawn == 4 and len(report.missing) == 2
    assert "Best trial: no completed or early-stopped trial" in index.summary


SEEDED = {  # lambda_p -> (halted accuracy, easy and hard mean halting step) per seed 0, 1, 2
    0.1: ((0.9, 1.0, 0.95), (6.0, 7.0, 8.0), (4.0, 4.0, 5.0)),
    0.3: ((0.7, 0.8, 0.9), (3.0, 3.0, 3.0), (4.0, 5.0, 6.0)),
}


def _seeded_study(storage: Path, name: str) -> None:
    """``ponder-difficulty-paper`` written by hand through the Parquet contract: lambda_p 0.1
    and 0.3, three seeds each, every trial completed after two reports with the numbers above."""
    from study.records.parquet import TrialRecord, history_table, trials_table

    paths = StudyPaths(str(storage), name)
    write_bytes(paths.spec, (SPECS_DIR / "ponder-difficulty-paper.toml").read_bytes())
    records = []
    for lambda_p, (accs, easy, hard) in SEEDED.items():
        for seed in range(3):
            history = []
            for r in (1, 2):
                report: dict[str, Any] = {
                    "iteration": 15000 * r,
                    "outcome": "completed" if r == 2 else "running",
                    "nan_events": 0,
                    "time_total_s": float(r),
                }
                for set_name, steps in (("test", easy[seed]), ("easy", easy[seed]), ("hard", hard[seed])):
                    p = np.full(20, 1 / 20)
                    report |= {
                        f"{set_name}/halted_accuracy": accs[seed],
                        f"{set_name}/best_step_accuracy": accs[seed] - 0.1,
                        f"{set_name}/stable_accuracy": accs[seed] - 0.2,
                        f"{set_name}/mean_halting_step": steps,
                        f"{set_name}/per_step_accuracy": [accs[seed] - 0.01 * k for k in range(20)],
                        f"{set_name}/halting_distribution": p.tolist(),
                    }
                history.append(report)
            config = {"task": "parity", "lambda_p": lambda_p, "seed": seed, "iterations": 30000}
            trial_id = f"l{lambda_p}s{seed}"
            records.append(TrialRecord(trial_id, "TERMINATED", config, history, ended=True))
    write_parquet(paths.trials_parquet, trials_table(records, "test/stable_accuracy", "max"))
    write_parquet(paths.history_parquet, history_table(records))


def test_a_study_that_repeats_configurations_shows_means_and_intervals_over_seeds(tmp_path: Path) -> None:
    from study.reports.plots import _sensitivity
    from study.reports.report import _load

    _seeded_study(tmp_path, "seeded")
    report = write_report("seeded", str(tmp_path), out=str(tmp_path / "report"))
    index = _check(report)
    assert index.nodata == []
    assert "Seeds: 2 configurations run under 3 seeds" in index.summary
    text = Path(report.index).read_text(encoding="utf-8")
    table = text[text.index('<section id="seeds">') : text.index('<section id="top">')]
    headers = _headers(table)
    assert headers[:2] == ["lambda_p", "seeds"]
    assert {"test/halted_accuracy", "test/stable_accuracy", "easy_minus_hard_steps"} <= set(headers)
    cells = re.findall(r"<td>([^<]*)</td>", table)
    rows = [dict(zip(headers, cells[i : i + len(headers)], strict=True)) for i in (0, len(headers))]
    # 0.9, 1.0, 0.95: mean 0.95, sd 0.05, half width t(0.975, 2) = 4.303 times 0.05 / sqrt(3)
    assert rows[0]["lambda_p"] == "0.1" and rows[0]["seeds"] == "3"
    assert rows[0]["test/halted_accuracy"] == "0.95 [0.8258, 1.074]"
    assert rows[1]["easy_minus_hard_steps"] == "-2 [-4.484, 0.4843]"  # -1, -2, -3: sd 1

    # the sensitivity plot: per lambda_p, the mean over seeds with the interval as its bars
    fig = _sensitivity(_load("seeded", str(tmp_path)))
    accuracy = fig.axes[0]
    (bars,) = accuracy.containers
    line, _, (segments,) = bars.lines
    assert line.get_xdata().tolist() == pytest.approx([0.1, 0.3])
    assert line.get_ydata().tolist() == pytest.approx([0.95, 0.8])
    half = 4.303 * 0.05 / math.sqrt(3), 4.303 * 0.1 / math.sqrt(3)
    ends = [(seg[0][1], seg[1][1]) for seg in segments.get_segments()]
    assert ends == [
        pytest.approx((0.95 - half[0], 0.95 + half[0])),
        pytest.approx((0.8 - half[1], 0.8 + half[1])),
    ]
    assert "95 % interval over seeds" in accuracy.get_legend().get_title().get_text()


def test_a_study_without_repeated_seeds_keeps_the_range_per_lambda_p(tmp_path: Path) -> None:
    from study.reports.plots import _sensitivity
    from study.reports.report import _load

    _mnist_study(tmp_path, "digits", n_trials=3)  # two trials share a lambda_p, no seed searched
    report = write_report("digits", str(tmp_path), out=str(tmp_path / "report"))
    text = Path(report.index).read_text(encoding="utf-8")
    assert 'id="seeds"' not in text and "Seeds:" not in text
    fig = _sensitivity(_load("digits", str(tmp_path)))
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any("min to max" in label for label in labels)
