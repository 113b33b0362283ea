"""Where a study's files live: local paths, file:// URIs and S3 (moto's server) alike."""

from __future__ import annotations

import copy
import errno
import os
import pickle
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from study.records import journal_copy
from study.records.records import EndRecord, read_end_records, read_reports, write_end_record
from study.storage.storage import (
    StorageError,
    StudyPaths,
    check_writable,
    create_bytes,
    is_remote,
    is_shared,
    join,
    list_studies,
    read_bytes,
    read_json,
    read_table,
    replaced_folder,
    resolve,
    share_filesystems_when_copied,
    sole_writer,
    to_uri,
    write_bytes,
    write_json,
    write_parquet,
)
from tests.study.conftest import S3


@pytest.mark.parametrize(
    ("uri", "remote", "shared"),
    [
        ("results", False, False),
        ("/abs/results", False, False),
        ("file:///mnt/nfs/results", False, True),
        ("s3://bucket/prefix", True, True),
        ("gs://bucket/prefix", True, True),
    ],
)
def test_which_storage_every_node_can_reach(uri: str, remote: bool, shared: bool) -> None:
    assert is_remote(uri) is remote
    assert is_shared(uri) is shared


def test_a_file_uri_is_its_local_path(tmp_path: Path) -> None:
    by_uri, by_path = StudyPaths(f"file://{tmp_path}", "s"), StudyPaths(str(tmp_path), "s")
    assert by_uri.experiment == by_path.experiment == str(tmp_path / "tune" / "s")
    assert by_uri.optuna_journal == by_path.optuna_journal
    assert by_uri.optuna_journal_copy is None
    write_json(by_uri.ended, {"a": 1})
    assert read_json(by_path.ended) == {"a": 1}


def test_tune_paths_become_uris_again() -> None:
    assert to_uri("s3://b/p", "b/p/tune/x/checkpoint_000001") == "s3://b/p/tune/x/checkpoint_000001"
    assert to_uri("s3://b/p", "s3://b/p/x") == "s3://b/p/x"
    assert to_uri("/local", "/local/tune/x") == "/local/tune/x"


def test_files_round_trip_and_studies_are_listed_on_s3(s3: S3) -> None:
    root = f"{s3.bucket()}/ponder"
    assert list_studies(root) == [] and read_bytes(f"{root}/nothing") is None
    for name in ("b-study", "a-study"):
        write_bytes(StudyPaths(root, name).spec, b"task = 'parity'")
    write_json(f"{root}/studies/not-a-study/asha.json", {})  # no spec: not a study
    assert list_studies(root) == ["a-study", "b-study"]
    paths = StudyPaths(root, "a-study")
    write_parquet(paths.trials_parquet, pa.table({"x": [1, 2]}))
    table = read_table(paths.trials_parquet)
    assert table is not None and table.column("x").to_pylist() == [1, 2]
    assert f"{root[5:]}/trials/study=a-study/trials.parquet" in s3.files(root)


def test_list_studies_on_a_local_root(tmp_path: Path) -> None:
    assert list_studies(str(tmp_path / "missing")) == []
    write_bytes(StudyPaths(str(tmp_path), "one").spec, b"")
    os.makedirs(tmp_path / "studies" / "half-started")
    assert list_studies(str(tmp_path)) == ["one"]


def test_a_remote_studys_journal_follows_it_to_another_machine(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's journal is copied to the study directory, each trial end's new lines as one
    part (its cost does not grow with the journal); a driver elsewhere (another cache) takes it
    back before resuming, and never replaces a longer local journal; a fold leaves one file."""
    paths = StudyPaths(f"{s3.bucket()}/ponder", "s")
    copy = paths.optuna_journal_copy
    assert copy is not None and paths.optuna_journal.startswith(os.environ["PONDER_STUDY_CACHE"])
    local = Path(paths.optuna_journal)
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(b"line 1\nline 2\n")
    journal_copy.push(paths)
    with local.open("ab") as f:
        f.write(b"line 3\nline 4 being writ")  # Optuna is writing line 4: it is not copied yet
    journal_copy.push(paths)
    parts = sorted(p.rsplit("/", 1)[1] for p in s3.files(journal_copy.parts_dir(copy)))
    assert parts == [f"{0:016d}", f"{14:016d}"]  # each push uploaded only what was new
    assert read_bytes(f"{journal_copy.parts_dir(copy)}/{14:016d}") == b"line 3\n"
    assert read_bytes(copy) is None and journal_copy.read_copy(copy) == b"line 1\nline 2\nline 3\n"

    monkeypatch.setenv("PONDER_STUDY_CACHE", str(tmp_path / "other-machine"))  # a driver killed
    assert not Path(paths.optuna_journal).exists()  # before its fold; the resume runs elsewhere
    journal_copy.pull(paths)
    assert Path(paths.optuna_journal).read_bytes() == b"line 1\nline 2\nline 3\n"
    Path(paths.optuna_journal).write_bytes(b"line 1\nline 2\nline 3\nline 4\n")  # this driver went on
    journal_copy.pull(paths)
    assert Path(paths.optuna_journal).read_bytes() == b"line 1\nline 2\nline 3\nline 4\n"
    journal_copy.push(paths)  # continues the parts where the first machine's driver left them
    assert journal_copy.read_copy(copy) == b"line 1\nline 2\nline 3\nline 4\n"
    journal_copy.fold(paths)  # the run's end: one file, what optuna-dashboard opens
    assert [p.rsplit("/", 1)[1] for p in s3.files(f"{copy}.parts")] == []
    assert read_bytes(copy) == journal_copy.read_copy(copy) == b"line 1\nline 2\nline 3\nline 4\n"


def test_a_downloaded_studys_journal_parts_are_folded_into_it(tmp_path: Path) -> None:
    """A study copied from a bucket whose driver was killed holds its journal's newest lines in
    parts beside it; on the local disk the resume folds them into the journal."""
    paths = StudyPaths(str(tmp_path), "s")
    journal = Path(paths.optuna_journal)
    journal.parent.mkdir(parents=True)
    journal.write_bytes(b"a\nb\n")
    parts = Path(journal_copy.parts_dir(paths.optuna_journal))
    parts.mkdir()
    (parts / f"{0:016d}").write_bytes(b"a\n")  # written before the last fold: already in the base
    (parts / f"{4:016d}").write_bytes(b"c\n")
    (parts / f"{9:016d}").write_bytes(b"z\n")  # after a gap (a part never uploaded): not taken
    journal_copy.pull(paths)
    assert journal.read_bytes() == b"a\nb\nc\n"
    assert not list(parts.iterdir())


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_trial_s_reports_are_never_replaced_by_fewer(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """A trial's reports are kept in its end record as it ends; when a resume restarts an ended
    trial it returns without reporting, and its second end, with its empty staging copy of
    result.json, must not replace the first."""
    root = str(tmp_path / "results") if where == "local" else f"{request.getfixturevalue('s3').bucket()}/p"
    paths = StudyPaths(root, "study")
    first = EndRecord("abc", "completed", 20, last_result={"iteration": 20})
    assert write_end_record(paths, first, b'{"iteration": 10}\n{"iteration": 20}\n')
    assert not write_end_record(paths, EndRecord("abc", "completed", 0), b"")  # the restarted one
    assert read_reports(paths, "abc") == [{"iteration": 10}, {"iteration": 20}]
    assert read_end_records(paths)["abc"] == first


def test_an_end_record_is_one_line_that_reads_back_as_it_was() -> None:
    record = EndRecord(
        "abc",
        "early_stopped",
        750,
        config={"lambda_p": 0.2, "max_steps": 12},
        last_result={"test/per_step_accuracy": [0.5, 0.75], "nested": {"k": 1}, "stamp": "x"},
        checkpoint="tune/s/abc/checkpoint_000002",
        asha=[["rung", 0, 750, "abc", 0.5], ["stop", "abc"]],
    )
    line = record.to_json()
    assert b"\n" not in line and line.startswith(b'{"asha":')  # keys sorted, compact
    assert EndRecord.from_json(line + b"\n{}") == record


def test_asking_for_a_missing_file_lists_nothing_on_s3(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's start and end ask for files that are not there yet (its started and end records):
    one HEAD each. pyarrow's ``get_file_info`` also lists ``key/`` for a
    missing key, and a listing costs more the more the bucket holds (moto scans it whole)."""
    from moto.s3.models import S3Backend

    listed: list[object] = []
    list_objects = S3Backend.list_objects

    def counted(self: S3Backend, *args: object, **kwargs: object) -> object:
        listed.append(args)
        return list_objects(self, *args, **kwargs)  # type: ignore[arg-type]

    paths = StudyPaths(f"{s3.bucket()}/p", "study")
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "result.json").write_text('{"iteration": 10}\n')
    monkeypatch.setattr(S3Backend, "list_objects", counted)
    assert read_bytes(paths.end_record("abc")) is None
    assert create_bytes(paths.end_record("abc"), b"first")
    assert read_bytes(paths.ended_dir) is None  # a "directory" (a prefix) is no file either
    assert not create_bytes(paths.end_record("abc"), b"second")
    assert read_bytes(paths.end_record("abc")) == b"first"
    ended = EndRecord("abd", "completed", 10)
    assert write_end_record(paths, ended, (staging / "result.json").read_bytes())
    assert read_reports(paths, "abd") == [{"iteration": 10}]
    assert listed == []


def test_a_sole_writer_creates_in_one_put_and_reads_back_what_it_created(
    s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver under its lease (`sole_writer`) creates a record on S3 with one PUT, the names in
    its folder listed once, and reads back the records it created without a request (the
    searcher and the Parquet read each trial's end record as it ends); a record that was there
    before is still never replaced, and outside the driver's run the store is asked again."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    calls: Counter[str] = Counter()  # the requests moto's server answers: LIST, HEAD, GET, PUT
    answer = DomainDispatcherApplication.__call__

    def counted(self: DomainDispatcherApplication, environ: dict[str, Any], start: Any) -> Any:
        listing = "list-type" in environ.get("QUERY_STRING", "") or "prefix=" in environ.get(
            "QUERY_STRING", ""
        )
        calls["LIST" if listing else environ["REQUEST_METHOD"]] += 1
        return answer(self, environ, start)

    monkeypatch.setattr(DomainDispatcherApplication, "__call__", counted)
    paths = StudyPaths(f"{s3.bucket()}/p", "study")
    assert create_bytes(paths.end_record("before"), b"first")
    calls.clear()
    with sole_writer():
        assert not create_bytes(paths.end_record("before"), b"replaced")
        assert create_bytes(paths.end_record("new1"), b"one")
        assert create_bytes(paths.end_record("new2"), b"two")
        assert not create_bytes(paths.end_record("new1"), b"again")
        assert read_bytes(paths.end_record("new1")) == b"one"
        assert read_bytes(paths.end_record("new2")) == b"two"
        assert dict(calls) == {"LIST": 1, "PUT": 2}
        assert read_bytes(paths.end_record("before")) == b"first"  # not created here: read
        assert create_bytes(paths.started_record("s"), b"started", durable=False)  # not waited for
        assert read_bytes(paths.started_record("s")) == b"started"
    assert calls["PUT"] == 3  # put by the time the run ends
    assert read_bytes(paths.started_record("s")) == b"started"
    assert read_bytes(paths.end_record("new1")) == b"one"
    assert calls["GET"] >= 2
    assert not create_bytes(paths.end_record("new2"), b"outside")  # asked: a HEAD
    assert read_bytes(paths.end_record("new2")) == b"two"


def test_a_copied_s3_filesystem_is_the_same_one(s3: S3) -> None:
    """Tune deep-copies its experiment's spec, and the storage's filesystem in it, for every trial
    it creates; a copied S3 filesystem built a new S3 client, which waits for a moment when no
    request of any client is in flight (pyarrow's S3 lock). The driver shares the filesystem."""
    fs = s3.fs()
    share_filesystems_when_copied()
    spec = {"storage": SimpleNamespace(storage_filesystem=fs), "config": {"x": [1]}}
    copied = copy.deepcopy(spec)
    assert copied["storage"].storage_filesystem is fs
    assert copied["config"] == spec["config"] and copied["config"] is not spec["config"]
    unpickled = pickle.loads(pickle.dumps(fs))  # sent to a worker: a filesystem of its own, as before
    assert unpickled is not fs and unpickled.equals(fs)


# -- a study's folder compacted whole ---------------------------------------------------------------
def _rows(table_dir: str) -> list[int]:
    return sorted(pd.read_parquet(table_dir.rsplit("/", 1)[0])["x"].tolist())


def _compact(folder: str, new: dict[str, list[int]], check_inside: Callable[[], None] | None = None) -> None:
    with replaced_folder(folder) as staging:
        for name, xs in new.items():
            write_parquet(join(staging, name), pa.table({"x": xs}))
        if check_inside is not None:
            check_inside()


@pytest.mark.parametrize("swap", [True, False], ids=["swapped", "one-by-one"])
def test_a_folder_replaced_whole_never_shows_a_row_twice(
    tmp_path: Path, swap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction: the fragments' rows go into one file and the fragments go. Until the block
    ends, pandas reads the old files only (the new ones are staged where readers do not look);
    after, the new ones only. Without the swap (a filesystem without renameat2's exchange) the
    result is the same, put in place file by file."""
    if not swap:
        monkeypatch.setattr("study.storage.storage._exchange", lambda a, b: False)
    folder = str(tmp_path / "history" / "study=s")
    _compact(folder, {"history.parquet": [1, 2], "trial-c.parquet": [3], "trial-d.parquet": [4]})
    assert _rows(folder) == [1, 2, 3, 4]

    def still_old() -> None:
        assert _rows(folder) == [1, 2, 3, 4]

    _compact(folder, {"history.parquet": [1, 2, 3], "trial-d.parquet": [4]}, check_inside=still_old)
    assert _rows(folder) == [1, 2, 3, 4]
    assert sorted(os.listdir(folder)) == ["history.parquet", "trial-d.parquet"]  # trial-c went
    assert sorted(os.listdir(tmp_path / "history")) == ["study=s"]  # no staging left behind


def test_a_compaction_that_fails_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    folder = str(tmp_path / "history" / "study=s")
    _compact(folder, {"history.parquet": [1], "trial-b.parquet": [2]})
    with pytest.raises(OSError, match="disk full"):

        def fail() -> None:
            raise OSError("disk full")

        _compact(folder, {"history.parquet": [1, 2]}, check_inside=fail)
    assert sorted(os.listdir(folder)) == ["history.parquet", "trial-b.parquet"]
    assert _rows(folder) == [1, 2]
    assert sorted(os.listdir(tmp_path / "history")) == ["study=s"]


def test_a_folder_is_replaced_whole_on_s3(s3: S3) -> None:
    bucket = s3.bucket()
    folder = f"{bucket}/history/study=s"
    _compact(folder, {"history.parquet": [1], "trial-b.parquet": [2], "trial-c.parquet": [3]})
    _compact(folder, {"history.parquet": [1, 2], "trial-c.parquet": [3]})
    assert sorted(f.rsplit("/", 1)[1] for f in s3.files(bucket)) == ["history.parquet", "trial-c.parquet"]
    table = pa.concat_tables(read_table(f"s3://{f}") for f in s3.files(bucket))  # type: ignore[misc]
    assert sorted(table.column("x").to_pylist()) == [1, 2, 3]


def test_a_buckets_filesystem_is_built_once_and_paths_resolve_as_pyarrow_does(s3: S3) -> None:
    bucket = s3.bucket()
    uris = [bucket, f"{bucket}/", f"{bucket}/a", f"{bucket}/a/b.json", f"{bucket}/a/dir/"]
    for uri in uris:
        assert resolve(uri)[1] == pafs.FileSystem.from_uri(uri)[1], uri
    assert len({id(resolve(uri)[0]) for uri in uris}) == 1
    write_bytes(f"{bucket}/a/b.json", b"{}")
    assert read_bytes(f"{bucket}/a/b.json") == b"{}"


def test_local_files_get_the_mode_a_plain_open_gives(tmp_path: Path) -> None:
    """Written to a temporary file first (never seen torn), yet not left 0600 as mkstemp makes
    it: a study on a shared disk stays readable by those its owner's umask lets read it."""
    old = os.umask(0o027)
    try:
        write_bytes(str(tmp_path / "replaced.parquet"), b"1")
        write_bytes(str(tmp_path / "replaced.parquet"), b"2")
        assert create_bytes(str(tmp_path / "created.json"), b"{}")
    finally:
        os.umask(old)
    for name in ("replaced.parquet", "created.json"):
        assert oct(os.stat(tmp_path / name).st_mode & 0o777) == oct(0o640), name


def test_a_storage_that_cannot_be_written_is_refused_and_the_check_leaves_nothing(tmp_path: Path) -> None:
    check_writable(str(tmp_path / "new" / "deeper"))  # made later by the study, not by the check
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="file is a file, not a folder"):
        check_writable(str(tmp_path / "file" / "below"))
    with pytest.raises(StorageError, match="cannot be written"):
        check_writable("/proc/ponder-study")
    check_writable("s3://a-bucket/x")  # object stores: check_reachable's part


def test_a_storage_under_a_folder_we_may_not_enter_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's folder (mode 0700): stat of a path inside it fails with EACCES, which
    Path.exists raises (seen as a non-root user: exit 1 and a traceback log). The tests run as
    root, who may enter any folder, so the refusals are those a non-root user meets."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_stat, real_mkdtemp = Path.stat, tempfile.mkdtemp

    def stat(self: Path, **kwargs: Any) -> os.stat_result:
        if locked in self.parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_stat(self, **kwargs)

    def mkdtemp(*args: Any, dir: str | None = None, **kwargs: Any) -> str:
        if dir is not None and Path(dir) == locked:
            raise PermissionError(errno.EACCES, "Permission denied", dir)
        return real_mkdtemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(StorageError, match=f"cannot be written \\(Permission denied in {locked}\\)"):
        check_writable(str(locked / "x" / "y"))
