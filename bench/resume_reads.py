"""What a resume reads of a study's records, counted on S3 (moto's server on loopback).

For each N (``--sizes``, default 100 2000), a real study of 8 ``parity-smoke`` trials is run on
moto's S3 server by the CLI (``ponder-study run``), then grown to N ended trials by copying its
records as the driver writes them: for each copy an end record (`write_end_record`), its saved
reports, its started record and its entry in Tune's saved state (Tune's own JSON state of the
trial, under a new id), its bracket, rungs and stop in ASHA's state, and an Optuna trial tagged
with its Tune id in the journal (whose copy on the store is written whole). The study's spec
then says ``num_samples = N``: a finished study.

Then `study.run.runner.resume_study` runs in this process on it, up to the point where Tune would
start trials: Tune's restore done, the records replayed into it, ASHA's state loaded (Tune's
requeue of the restored trials is where it stops; the final export is left out). ``--whole`` runs
the resume to its end instead (nothing trains: every trial has ended), final export included.

Counted: the calls of each function that reads a record (wrapped wherever it was imported), and
the requests the S3 server answered, by record: the reads of an object (a GET of it from its
first byte: a large one is read in ranges, one read), the LISTs of a prefix, the HEADs of a key.
The last line: ``reads per record <reads of a record's objects / its objects, the most of any
record>`` (1.00 when every record is read once; Tune's own state, a cache, is left out).

    .venv/bin/python bench/resume_reads.py [--sizes 100 2000] [--whole]

About 6 minutes at N = 100 and 2,000 on a busy 2-core machine: the two small studies' runs, then
Tune's restore of 2,000 trials, which lists moto's bucket for each. ``--whole`` at N = 2,000
takes ten minutes more (the final export, on moto).

Also a library: tests/study/test_truth.py imports its counters (`counted_readers`) to check that
a resume in the suite reads each record once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NAME = "reads"
BASE_TRIALS = 8

_SERVER = r"""
import json, sys, threading
from collections import Counter
from urllib.parse import parse_qs
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

app = DomainDispatcherApplication(create_backend_app)
counts, lock = Counter(), threading.Lock()

def counting(environ, start_response):
    path, query = environ.get("PATH_INFO", ""), parse_qs(environ.get("QUERY_STRING", ""))
    if path == "/__counts":
        with lock:
            body = json.dumps([[m, k, n] for (m, k), n in counts.items()]).encode()
            if "reset" in query:
                counts.clear()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    method = environ["REQUEST_METHOD"]
    if method == "GET" and not environ.get("HTTP_RANGE", "bytes=0-").startswith("bytes=0-"):
        method = "GET+"  # the rest of an object read in ranges: the same read
    bucket_path = path.strip("/")
    if method == "GET" and "/" not in bucket_path and ("list-type" in query or "prefix" in query):
        key = ("LIST", bucket_path + "/" + query.get("prefix", [""])[0])
    else:
        key = (method, bucket_path)
    with lock:
        counts[key] += 1
    return app(environ, start_response)

server = make_server(
    "127.0.0.1", int(sys.argv[1]), counting, threaded=True, request_handler=MotoRequestHandler
)
print("ready", flush=True)
server.serve_forever()
"""


class CountingS3:
    """moto's S3 server in a process of its own, counting each request it answers by method and
    key (a LIST by its prefix); `take` returns the counts and starts again from zero."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("moto's server did not start")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def take(self) -> Counter[tuple[str, str]]:
        with urllib.request.urlopen(f"{self.endpoint}/__counts?reset=1", timeout=60) as r:
            return Counter({(m, k): n for m, k, n in json.loads(r.read())})

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


RECORDS = (
    ("spec", "studies/{name}/spec.toml"),
    ("end records", "studies/{name}/ended/"),
    ("legacy ended.json", "studies/{name}/ended.json"),
    ("reports", "studies/{name}/reports/"),
    ("started records", "studies/{name}/started/"),
    ("ASHA state", "studies/{name}/asha.json"),
    ("journal copy", "studies/{name}/optuna.journal"),
    ("lease", "studies/{name}/lease."),
    ("Tune's state (cache)", "tune/{name}/"),
    ("Parquet", "trials/"),
    ("Parquet", "history/"),
)
"""Each record's keys, by prefix under the storage root (the first that matches names it)."""


def record_of(key: str, root: str) -> str:
    """The record a key (``bucket/prefix/...``) or a listed prefix belongs to."""
    rel = key.removeprefix(root.removeprefix("s3://").rstrip("/") + "/")
    for record, prefix in RECORDS:
        p = prefix.format(name=NAME)
        if rel.startswith(p) or (p.endswith("/") and rel == p[:-1]):
            return record
    return "other (the bucket, folders)"


READERS = (
    ("spec", "study.records.records", "load_study_spec"),
    ("end records", "study.records.records", "read_end_records"),
    ("end records", "study.records.records", "read_end_record"),
    ("end records", "study.records.records", "has_ended"),
    ("reports", "study.records.records", "_saved_last_report"),
    ("reports", "study.records.records", "read_reports"),
    ("reports", "study.run.export", "_saved_reports"),
    ("reports", "study.search.search", "DivergenceAwareOptunaSearch._report_saved"),
    ("ASHA state", "study.records.asha_state", "read_state"),
    ("journal copy", "study.records.journal_copy", "read_copy"),
    ("journal (local, whole)", "optuna.storages.journal._storage", "JournalStorage.__init__"),
    ("snapshot", "study.records.truth", "read_truth"),
)
"""The functions that read a record: (record, module, name); a name that is not there is skipped."""


@contextlib.contextmanager
def counted_readers() -> Iterator[Counter[str]]:
    """Count the calls of every `READERS` function, wherever it was imported to (each module's
    name bound to it is replaced for the ``with`` block)."""
    import importlib

    calls: Counter[str] = Counter()
    undo: list[tuple[Any, str, Any]] = []
    for record, module_name, name in READERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        original = getattr(owner, attr, None)
        if original is None:
            continue
        label = f"{record}: {name}"

        def wrapper(*args: Any, _f: Any = original, _label: str = label, **kwargs: Any) -> Any:
            calls[_label] += 1
            return _f(*args, **kwargs)

        counting = functools.wraps(original)(wrapper)
        if owner_name:  # a method: the class is the one place it is looked up
            undo.append((owner, attr, original))
            setattr(owner, attr, counting)
            continue
        for m in list(sys.modules.values()):
            if getattr(m, "__name__", "").split(".")[0] in ("study", "bench", "__main__"):
                for key, value in list(vars(m).items()):
                    if value is original:
                        undo.append((m, key, original))
                        setattr(m, key, counting)
    try:
        yield calls
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


# -- the study ---------------------------------------------------------------------------------
def run_base(storage: str, env: dict[str, str]) -> None:
    """The real study this bench grows: ``parity-smoke``, 8 trials, run by the CLI."""
    cmd = [sys.executable, "-m", "study", "run", "parity-smoke", "--name", NAME]
    cmd += ["--num-samples", str(BASE_TRIALS), "--storage", storage, "--quiet"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the base study did not run: {done.stderr[-3000:]}")


def _clone_trial(state: str, base_id: str, new_id: str) -> str:
    """Tune's JSON state of a trial, as Tune writes it, for a copy of it named ``new_id``."""
    from ray.tune.experiment import Trial

    trial = Trial.from_json_state(state, stub=True)
    trial.trial_id = new_id
    assert trial.storage is not None
    trial.storage.trial_dir_name = trial.storage.trial_dir_name.replace(base_id, new_id)
    json_state, _ = trial.get_json_state()
    return str(json_state)


def grow(storage: str, n: int) -> None:
    """Copy the base study's 8 trials' records to make it a finished study of ``n`` trials."""
    import optuna
    import pyarrow.fs as pafs

    from study.records import journal_copy
    from study.records.asha_state import fold_log, read_state
    from study.records.records import read_end_records, write_end_record
    from study.search.journal import optuna_storage
    from study.search.trial_map import TUNE_ID_ATTR
    from study.storage.storage import StudyPaths, read_bytes, resolve, trial_reports, write_bytes

    paths = StudyPaths(storage, NAME)
    ends = read_end_records(paths)
    base = sorted(ends)
    assert len(base) == BASE_TRIALS, base
    new_ids = [f"{k:08x}" for k in range(n - BASE_TRIALS)]
    assert not set(new_ids) & set(base)
    of = {new: base[k % BASE_TRIALS] for k, new in enumerate(new_ids)}
    reports = {b: read_bytes(trial_reports(paths.reports_dir, b)) or b"" for b in base}
    started = {b: json.loads(read_bytes(paths.started_record(b)) or b"{}") for b in base}
    fs, tune_dir = resolve(paths.experiment)
    states = sorted(
        i.path
        for i in fs.get_file_info(pafs.FileSelector(tune_dir))
        if i.base_name.startswith("experiment_state-")
    )
    with fs.open_input_stream(states[-1]) as f:
        experiment = json.loads(f.readall())
    saved = {json.loads(t)["trial_id"]: (t, m) for t, m in experiment["trial_data"]}

    def one(new: str) -> tuple[str, str]:
        b = of[new]
        write_end_record(paths, dataclasses.replace(ends[b], trial_id=new))
        write_bytes(trial_reports(paths.reports_dir, new), reports[b].replace(b.encode(), new.encode()))
        state = _clone_trial(saved[b][0], b, new)
        record = {"trial_id": new, "trial_data": [state, started[b]["trial_data"][1]]}
        write_bytes(paths.started_record(new), json.dumps(record).encode())
        return state, saved[b][1]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        experiment["trial_data"] += list(pool.map(one, new_ids))
    write_bytes(f"{paths.experiment}/{states[-1].rsplit('/', 1)[-1]}", json.dumps(experiment).encode())
    asha = read_state(paths.asha)
    assert asha is not None
    for new, b in of.items():
        asha["assigned"][new] = asha["assigned"][b]
        for bracket in asha["brackets"]:
            for _, rung in bracket:
                if b in rung:
                    rung[new] = rung[b]
        if b in asha["stopped"]:
            asha["stopped"].append(new)
    fold_log(paths.asha, asha)
    study = optuna.load_study(study_name=NAME, storage=optuna_storage(paths))
    frozen = {t.user_attrs[TUNE_ID_ATTR]: t for t in study.get_trials(deepcopy=False)}
    study.add_trials(
        [
            optuna.trial.create_trial(
                state=frozen[b].state,
                values=frozen[b].values,
                params=frozen[b].params,
                distributions=frozen[b].distributions,
                user_attrs={**frozen[b].user_attrs, TUNE_ID_ATTR: new},
                intermediate_values=frozen[b].intermediate_values,
            )
            for new, b in of.items()
        ]
    )
    journal_copy.fold(paths)
    spec = (read_bytes(paths.spec) or b"").decode()
    write_bytes(paths.spec, re.sub(r"num_samples = \d+", f"num_samples = {n}", spec).encode())


# -- the resume --------------------------------------------------------------------------------
class AtStart(BaseException):
    """Raised where Tune would start the restored study's trials: the bench stops there."""


@dataclasses.dataclass
class Counts:
    """What one resume read: reader calls, S3 requests (by method and record), objects per record."""

    calls: Counter[str]
    requests: Counter[tuple[str, str]]
    objects: Counter[str]


def objects(server: CountingS3, storage: str) -> Counter[str]:
    """How many objects of each record the study holds."""
    import pyarrow.fs as pafs

    from study.storage.storage import resolve

    fs, root = resolve(storage)
    found: Counter[str] = Counter()
    for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if i.type == pafs.FileType.File:
            found[record_of(i.path, storage)] += 1
    server.take()  # the listing above is not the resume's
    return found


def resume(server: CountingS3, storage: str, whole: bool) -> tuple[Counts, Counts | None]:
    """Resume the study in this process, counting; (up to where Tune would start trials, the
    whole resume with ``whole``)."""
    from ray.tune.execution.tune_controller import TuneController

    import study.run.runner as runner

    requeue = TuneController._requeue_restored_trials
    at_start: list[Counts] = []

    def then_stop(controller: Any, trials: Any, resume_config: Any) -> None:
        requeue(controller, trials, resume_config)
        at_start.append(Counts(Counter(calls), _by_record(server.take(), storage), Counter()))
        if not whole:
            raise AtStart

    export = runner.export_experiment
    TuneController._requeue_restored_trials = then_stop  # type: ignore[method-assign]
    if not whole:
        runner.export_experiment = lambda spec, paths: []  # type: ignore[assignment]
    try:
        with counted_readers() as calls:
            server.take()
            with contextlib.suppress(AtStart):
                runner.resume_study(NAME, storage, verbose=0)
            end = Counts(Counter(calls), _by_record(server.take(), storage), Counter())
    finally:
        TuneController._requeue_restored_trials = requeue  # type: ignore[method-assign]
        runner.export_experiment = export  # type: ignore[assignment]
    if not at_start:
        raise RuntimeError("the resume did not restore Tune's experiment")
    start = at_start[0]
    if not whole:
        return start, None
    return start, Counts(end.calls, start.requests + end.requests, Counter())


def _by_record(requests: Counter[tuple[str, str]], storage: str) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for (method, key), n in requests.items():
        out[(method, record_of(key, storage))] += n
    return out


# -- the table ---------------------------------------------------------------------------------
ORDER = [r for r, _ in RECORDS if r != "Parquet"] + [
    "Parquet",
    "journal (local, whole)",
    "other (the bucket, folders)",
]


def table(rows: dict[int, Counts], title: str) -> float:
    """Print the reader calls and the S3 requests of each record at each N; returns the most
    GETs per object of a record."""
    sizes = sorted(rows)
    print(f"\n{title}")
    readers = sorted(
        {label for c in rows.values() for label in c.calls},
        key=lambda x: ORDER.index(x.split(":")[0]) if x.split(":")[0] in ORDER else 99,
    )
    head = "".join(f"{'N = ' + format(n, ','):>24}" for n in sizes)
    print(f"  {'reader: calls':<50}{head}")
    for label in readers:
        print(f"  {label:<50}" + "".join(f"{rows[n].calls[label]:>24}" for n in sizes))
    print(f"  {'record: reads / LISTs / HEADs, objects':<50}" + head)
    worst = 0.0
    for record in ORDER:
        if not any(rows[n].requests[(m, record)] for n in sizes for m in ("GET", "LIST", "HEAD")):
            continue
        cells = []
        for n in sizes:
            c = rows[n]
            get, lst, head_ = (c.requests[(m, record)] for m in ("GET", "LIST", "HEAD"))
            cells.append(f"{get}/{lst}/{head_}, {c.objects[record]}")
            if (
                record not in ("Tune's state (cache)", "lease", "Parquet", "other (the bucket, folders)")
                and c.objects[record]
            ):
                worst = max(worst, get / c.objects[record])
        print(f"  {record:<50}" + "".join(f"{cell:>24}" for cell in cells))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 2000], help="study sizes N")
    parser.add_argument(
        "--whole", action="store_true", help="run each resume to its end (the final export too)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (printed)")
    args = parser.parse_args()
    if min(args.sizes) < BASE_TRIALS:
        parser.error(f"each size must be at least {BASE_TRIALS}")
    tmp = tempfile.mkdtemp(prefix="resume_reads.")
    server = CountingS3()
    env = {
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "PONDER_STUDY_CACHE": os.path.join(tmp, "cache"),
    }
    os.environ.update(env)
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    import optuna
    import pyarrow.fs as pafs
    import ray

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pafs.S3FileSystem(endpoint_override=server.endpoint, allow_bucket_creation=True).create_dir("bench")
    starts: dict[int, Counts] = {}
    wholes: dict[int, Counts] = {}
    try:
        t0 = time.perf_counter()
        for n in args.sizes:
            storage = f"s3://bench/n{n}"
            run_base(storage, {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
            grow(storage, n)
        built = time.perf_counter() - t0
        ray.init(
            address="local",
            num_cpus=1,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        t0 = time.perf_counter()
        for n in args.sizes:
            storage = f"s3://bench/n{n}"
            found = objects(server, storage)
            start, whole = resume(server, storage, args.whole)
            starts[n] = dataclasses.replace(start, objects=found)
            if whole is not None:
                wholes[n] = dataclasses.replace(whole, objects=found)
        resumed = time.perf_counter() - t0
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        server.stop()
        if args.keep:
            print(f"the studies' journals are in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"a resume of a finished study on S3 (moto, loopback): {len(args.sizes)} studies built in "
        f"{built:.0f} s, resumed in {resumed:.0f} s"
    )
    worst = table(starts, "read up to where Tune would start trials")
    if wholes:
        table(wholes, "read by the whole resume (the final export included)")
    print(f"reads per record {worst:.2f}")


if __name__ == "__main__":
    main()
