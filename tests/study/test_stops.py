"""Issue 19: however a driver stops, one true line the user can paste; whatever the command line
says is checked before Ray starts."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from study.run.stops import stops_held_while_ray_starts
from study.spec.spec import MAX_NAME_LENGTH, load_spec
from study.storage.storage import StorageError, StudyPaths, expand_storage
from tests.study.conftest import CLI, REPO, S3, Driver, cli, driver_env, smoke_source, smoke_spec, trials

ENDED = ["completed", "early_stopped", "diverged"]


def _one_line(done: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


# -- names and storage paths, checked before Ray starts ----------------------------------------
def test_a_name_too_long_for_a_file_name_is_refused_before_anything(tmp_path: Path) -> None:
    long = "n" * (MAX_NAME_LENGTH + 1)
    started = time.monotonic()
    err = _one_line(cli("run", "parity-smoke", "--name", long, "--storage", str(tmp_path)))
    assert time.monotonic() - started < 30  # no Ray start-up
    assert f"at most {MAX_NAME_LENGTH}" in err
    assert list(tmp_path.iterdir()) == []
    assert len(f"study={'n' * MAX_NAME_LENGTH}".encode()) == 255


@pytest.mark.parametrize("name", ["café", "a b", ".x", "x/y"])
def test_a_name_with_other_characters_is_refused_truthfully(tmp_path: Path, name: str) -> None:
    err = _one_line(cli("status", name, "--storage", str(tmp_path)))
    assert "ASCII letters" in err


def test_storage_paths_expand_home_and_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PONDER_TEST_ROOT", str(tmp_path / "v"))
    assert expand_storage("~/tstore") == str(tmp_path / "tstore")
    assert expand_storage("$PONDER_TEST_ROOT/x") == str(tmp_path / "v" / "x")
    assert expand_storage("file://~/nfs") == f"file://{tmp_path}/nfs"
    spec = tmp_path / "s.toml"
    source = (REPO / "study" / "spec" / "specs" / "parity-smoke.toml").read_text()
    spec.write_text(source.replace('storage = "results"', 'storage = "~/specstore"'))
    assert load_spec(str(spec)).run.storage == str(tmp_path / "specstore")


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("s3://", "names no bucket"),
        ("s3:///x", "names no bucket"),
        ("s3:/x", "without '//'"),
        ("ftp://h/x", "unknown scheme"),
    ],
)
def test_a_malformed_storage_uri_is_refused(uri: str, says: str) -> None:
    with pytest.raises(StorageError, match=says):
        expand_storage(uri)
    err = _one_line(cli("status", "x", "--storage", uri))
    assert says in err


@pytest.mark.slow
def test_a_tilde_storage_lands_in_home_not_in_a_folder_named_tilde(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    env = {**os.environ, "HOME": str(home)}
    done = subprocess.run(
        [*CLI, "run", "parity-smoke", "--num-samples", "1", "--storage", "~/tstore", "--quiet"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(trials(home / "tstore", "parity-smoke")) == 1
    assert list(cwd.iterdir()) == []


@pytest.mark.slow
def test_object_storage_errors_are_one_line_within_seconds(s3: S3) -> None:
    started = time.monotonic()
    err = _one_line(cli("status", "x", "--storage", "gs://no-such-bucket/x", timeout=60))
    assert time.monotonic() - started < 15, "gs:// must be refused within 10 s"
    assert "gs://no-such-bucket" in err
    err = _one_line(cli("run", "parity-smoke", "--storage", "s3://no-such-bucket-here/x", timeout=60))
    assert "does not exist" in err


# -- evaluate, report, help --------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cuda", "cuda:7", "gpu", "mps", "", "meta"])
def test_evaluate_checks_the_device_before_the_checkpoint(smoke: tuple[Path, object], device: str) -> None:
    storage, _ = smoke
    err = _one_line(cli("evaluate", "parity-smoke", "--storage", str(storage), "--device", device))
    assert "checkpoint" not in err, err  # a healthy checkpoint is not blamed
    if device.startswith("cuda"):
        assert "CUDA is not available on this machine" in err


def test_evaluate_refused_after_loading_torch_never_aborts(smoke: tuple[Path, object]) -> None:
    """Torch and pyarrow in one process aborted at exit ("terminate called without an active
    exception", exit 134) about 4 runs in 10 under load: 12 runs, three at a time, of a refusal
    made after both are loaded (the trial read from Parquet, then torch asked for CUDA). At that
    rate 12 clean runs happen by chance with probability 0.6^12 = 0.2 %; the mechanism itself,
    an exit past the C-level teardown, is checked exactly by test_cli's
    `test_the_command_exits_past_the_interpreters_c_teardown` (50 runs here took a minute of
    both cores in every suite)."""
    storage, _ = smoke
    args = ("evaluate", "parity-smoke", "--device", "cuda:7", "--storage", str(storage))
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda _: cli(*args), range(12)))
    codes = [r.returncode for r in runs]
    assert codes == [2] * 12, (codes, {r.stderr for r in runs if r.returncode != 2})
    assert all("terminate called" not in r.stderr for r in runs)


def test_report_out_an_existing_file_is_refused_as_such(smoke: tuple[Path, object], tmp_path: Path) -> None:
    storage, _ = smoke
    out = tmp_path / "taken"
    out.write_text("x")
    err = _one_line(cli("report", "parity-smoke", "--storage", str(storage), "--out", str(out)))
    assert "--out" in err and "is a file" in err


def test_a_report_stopped_part_way_says_so_and_the_command_that_finishes_it(
    smoke: tuple[Path, object], driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """Ctrl-C once the first plot is written: exit 130, no traceback, and a last line that says
    the report is incomplete and gives the command that writes it whole (pasted here)."""
    storage, _ = smoke
    out = tmp_path / "my report"
    d = driver("report", "parity-smoke", "--storage", str(storage), "--out", str(out))
    d.wait_until(lambda: any(out.glob("*.png")), poll=0.01)
    assert d.interrupt() == 130
    text = d.output()
    assert "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert "interrupted; the report is incomplete; run it again: " in last, last
    assert not (out / "index.html").exists()  # written last: a stopped report has none
    pasted = _paste(last, "run it again: ", tmp_path)
    assert pasted.returncode == 0, pasted.stderr[-3000:]
    assert (out / "index.html").exists() and len(list(out.glob("*.png"))) >= 6


@pytest.mark.parametrize("verb", ["status", "resume", "export", "report", "evaluate"])
def test_help_says_where_the_storage_falls_back_to(verb: str) -> None:
    done = cli(verb, "--help")
    text = " ".join(done.stdout.split())
    assert "spec's [run] storage" not in text
    assert "results (the spec is not read)" in text


def test_run_help_names_the_specs_storage() -> None:
    assert "spec's [run] storage" in " ".join(cli("run", "--help").stdout.split())


@pytest.mark.parametrize("verb", [["status", "parity-smoke"], ["check", "parity"]])
def test_a_reader_that_has_gone_ends_the_command_in_silence(
    smoke: tuple[Path, object], verb: list[str]
) -> None:
    """``ponder-study status NAME | head -1``: once ``head`` has its line, the rest of the output
    has nowhere to go. The command ends as ``cat`` does: exit 141, nothing on stderr (``status``
    said "could not read or write storage ...: Broken pipe", exit 2, blaming the storage)."""
    storage, _ = smoke
    args = [*verb, "--storage", str(storage)] if verb[0] == "status" else verb
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader gone before the command writes a line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err[-2000:]
    assert err == ""


# -- hints that work when pasted ------------------------------------------------------------------
def _paste(line: str, marker: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the command a line gives after ``marker`` in bash, as a user pasting it would (a user
    whose shell joins the tests' Ray instance, ``RAY_ADDRESS``, as `cli` does)."""
    rest = line.split(marker, 1)[1].strip()
    command = rest.split("`")[1] if rest.startswith("`") else rest  # `quoted`, or the rest of the line
    assert command.startswith("ponder-study "), command
    bin_dir = Path(sys.executable).parent
    env = driver_env(shlex.split(command)[1:], {"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


@pytest.mark.slow
def test_the_hints_paste_into_a_shell_with_a_storage_with_spaces(tmp_path: Path) -> None:
    storage = tmp_path / "my studies"
    first = cli("run", "parity-smoke", "--num-samples", "1", "--storage", str(storage), "--quiet")
    assert first.returncode == 0, first.stderr[-3000:]
    again = cli("run", "parity-smoke", "--num-samples", "1", "--storage", str(storage))
    err = _one_line(again)
    assert shlex.quote(str(storage)) in err
    pasted = _paste(err, "resume it with ", tmp_path)
    assert pasted.returncode == 0, pasted.stderr[-3000:]
    assert len(trials(storage, "parity-smoke")) == 1


@pytest.mark.slow
def test_errored_trials_exit_1_with_the_command_that_retries_them(tmp_path: Path) -> None:
    """Every trial fails once (the fault drill) and the spec allows no retry: the study ends with
    errored trials, exits 1 and names the resume that retries them, which finishes it."""
    spec = tmp_path / "fragile.toml"
    spec.write_text(smoke_source(at_once=1).replace("max_failures = 2", "max_failures = 0"))
    storage = tmp_path / "st"
    env = {**os.environ, "PONDER_STUDY_FAULT": "raise@20"}
    done = subprocess.run(
        [*CLI, "run", str(spec), "--num-samples", "2", "--storage", str(storage), "--quiet"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "errored" in last and "resume it with: " in last, last
    assert (trials(storage, "fragile")["status"] == "errored").any()
    pasted = _paste(last, "resume it with: ", tmp_path)
    assert pasted.returncode == 0, pasted.stdout[-2000:] + pasted.stderr[-2000:]
    t = trials(storage, "fragile")
    assert len(t) == 2 and t["status"].isin(ENDED).all(), t[["trial_id", "status"]]


# -- a full disk -----------------------------------------------------------------------------------
def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    return done.returncode == 0


@pytest.mark.slow
def test_a_full_disk_stops_in_one_line_and_resume_finishes_after_space_is_freed(tmp_path: Path) -> None:
    """A 400 KB storage fills mid-study: one line naming it, exit 1, the resume command last; the
    Optuna journal or Tune's state may be torn. After the disk grows, that command finishes the
    study: every trial final, one Optuna trial each, nothing RUNNING."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "400k"):
        pytest.skip("needs root to mount a size-limited tmpfs")
    try:
        storage = disk / "st"
        spec = smoke_spec(tmp_path, at_once=1)  # one trial at a time: the subject is the disk
        done = cli("run", spec, "--storage", str(storage))  # the progress table on
        assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert "no space left on the device" in last and "resume it with: " in last, last
        assert "Traceback" not in done.stdout + done.stderr
        subprocess.run(["mount", "-o", "remount,size=50m", str(disk)], check=True)
        pasted = _paste(last, "resume it with: ", tmp_path)
        assert pasted.returncode == 0, pasted.stdout[-2000:] + pasted.stderr[-3000:]
        t = trials(storage, "parity-smoke")
        assert len(t) == 6 and t["status"].isin(ENDED).all(), t[["trial_id", "status"]]
        import optuna

        from study.search.journal import optuna_storage
        from study.search.search import TUNE_ID_ATTR
        from study.storage.storage import StudyPaths

        study = optuna.load_study(
            study_name="parity-smoke", storage=optuna_storage(StudyPaths(str(storage), "parity-smoke"))
        )
        finished = [x for x in study.trials if x.state.is_finished()]
        assert not [x for x in study.trials if x.state == optuna.trial.TrialState.RUNNING]
        ran = [x for x in finished if TUNE_ID_ATTR in x.user_attrs]
        assert sorted(x.user_attrs[TUNE_ID_ATTR] for x in ran) == sorted(t["trial_id"])
        # an ask whose journal lines the full disk cut (no Tune id, not all its parameters) never
        # ran: the resume tells it FAIL (`study.search.search`), it is not a second trial of anything
        searched = {d.name for d in load_spec("parity-smoke").space}
        for x in finished:
            if TUNE_ID_ATTR not in x.user_attrs:
                assert x.state == optuna.trial.TrialState.FAIL and not searched <= set(x.params), x
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.slow
def test_a_report_of_an_s3_study_lands_in_the_study_storage(
    smoke: tuple[Path, object], s3: S3, tmp_path: Path
) -> None:
    """`report --help` says <storage>/reports/<name>; on S3 it wrote under the working directory."""
    storage, _ = smoke
    root = s3.bucket()
    for path in storage.rglob("*"):
        rel = path.relative_to(storage)
        if path.is_file() and rel.parts[0] in ("studies", "trials", "history"):
            with s3.fs().open_output_stream(f"{root.removeprefix('s3://')}/{rel}") as f:
                f.write(path.read_bytes())
    done = cli("report", "parity-smoke", "--storage", root, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    written = s3.files(f"{root}/reports/parity-smoke")
    assert any(p.endswith("/index.html") for p in written) and sum(p.endswith(".png") for p in written) == 6
    assert list(tmp_path.iterdir()) == []


def _group_alive(pgid: int) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pgid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split(None, 1)[0] == str(pgid)]


@pytest.mark.slow
@pytest.mark.parametrize("when", ["ray-starting", "trials-starting"])
def test_ctrl_c_early_exits_130_with_the_hint_and_rays_processes_go_with_it(
    driver: Callable[..., Driver], tmp_path: Path, when: str
) -> None:
    if when == "ray-starting":
        d = driver("run", "parity-smoke", "--storage", str(tmp_path), own_ray=True)
        time.sleep(3.0)
    else:
        # once the first trial is about to start (its started record, written to the storage
        # before it can; Tune's own trial folders reach the storage later). A fixed 8 s delay
        # came after the whole smoke study's end on a quiet machine, so these trials train longer
        spec = smoke_spec(tmp_path, times=50, at_once=1)
        d = driver("run", spec, "--storage", str(tmp_path / "st"), own_ray=True)
        started = Path(StudyPaths(str(tmp_path / "st"), "parity-smoke").started_dir)
        d.wait_until(lambda: any(started.glob("*.json")), timeout=120, poll=0.05)
    assert d.interrupt() == 130, d.output()[-3000:]
    text = d.output()
    assert "Traceback" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert "ponder-study" in last and ("resume it with: " in last or "run it again: " in last), last
    deadline = time.monotonic() + 45  # Ray's agents notice their raylet is gone within seconds
    while _group_alive(d.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(d.proc.pid), _group_alive(d.proc.pid)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP"])
def test_a_stop_while_ray_starts_exits_130_with_the_hint(
    driver: Callable[..., Driver], tmp_path: Path, how: str
) -> None:
    """``ray.init`` puts in its own SIGTERM handler (exit 15 at once, nothing said) and the
    driver ignores SIGHUP while Ray's processes start: a `kill` or a closed terminal in those
    seconds must still stop the study as Ctrl-C does. The signal is sent the moment Ray's GCS
    appears in the driver's process group, i.e. inside ``ray.init``."""
    d = driver("run", "parity-smoke", "--num-samples", "2", "--storage", str(tmp_path), own_ray=True)
    d.wait_until(lambda: any("gcs_server" in p for p in _group_alive(d.proc.pid)), timeout=120, poll=0.01)
    if how == "SIGTERM":
        os.kill(d.proc.pid, signal.SIGTERM)  # `kill PID`
    else:
        os.killpg(d.proc.pid, signal.SIGHUP)  # the terminal closed
    rc = d.finish(timeout=120)
    text = d.output()
    assert rc == 130, f"exit {rc}:\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    # nothing was written yet: the command to paste is the same `run` (a resume would find no study)
    run_again = f"ponder-study run parity-smoke --num-samples 2 --storage {shlex.quote(str(tmp_path))}"
    assert last == f"ponder-study: interrupted; run it again: {run_again}", last
    assert not StudyPaths(str(tmp_path), "parity-smoke").exists()
    deadline = time.monotonic() + 45
    while _group_alive(d.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(d.proc.pid), _group_alive(d.proc.pid)


def _links() -> set[str]:
    """What this process's file descriptors point at (``pipe:[inode]`` for a pipe)."""
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # one closed meanwhile (another thread's)
            links.add(os.readlink(f"/proc/self/fd/{fd}"))
    return links


@pytest.mark.slow
@pytest.mark.parametrize("swallowed", [False, True], ids=["raised", "swallowed"])
def test_a_sigterm_while_ray_starts_stops_the_study_even_if_ray_swallows_it(
    swallowed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ray.init`` installs a SIGTERM handler that raises ``SystemExit(15)`` wherever the driver
    is. Raised, it becomes Ctrl-C; swallowed (an at-fork hook, a finaliser, Ray's own code: seen
    once in CI, the study ran to its end with exit 0), the signal's record still stops the study.
    A real signal and the handler Ray installs, without Ray's start-up around them."""

    def drivers_handler(signum: int, frame: object) -> None:
        raise AssertionError("the driver's handler is out while Ray starts")

    pipes: list[str] = []  # the wakeup fd's pipe, by inode: fd numbers are reused
    real_pipe = os.pipe

    def pipe() -> tuple[int, int]:
        read_end, write_end = real_pipe()
        pipes.append(os.readlink(f"/proc/self/fd/{read_end}"))
        return read_end, write_end

    monkeypatch.setattr(os, "pipe", pipe)
    previous = signal.signal(signal.SIGTERM, drivers_handler)
    hup = signal.getsignal(signal.SIGHUP)
    try:
        with pytest.raises(KeyboardInterrupt), stops_held_while_ray_starts():
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as ray.init does
            try:
                signal.raise_signal(signal.SIGTERM)
            except SystemExit:
                if not swallowed:
                    raise
        assert signal.getsignal(signal.SIGTERM) is drivers_handler  # the driver's back
        assert signal.getsignal(signal.SIGHUP) == hup  # no longer ignored
        assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left behind
        assert pipes and not _links() & set(pipes)  # nor its pipe
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
def test_ray_starting_with_no_signal_raises_nothing_and_leaves_the_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    with stops_held_while_ray_starts():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # Ray's processes inherit it
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before
    assert signal.set_wakeup_fd(-1) == -1


def _dispositions(pid: int) -> dict[int, str] | None:
    """SIGTERM's and SIGHUP's disposition in process ``pid`` as the kernel holds it (whatever
    Python believes): 'caught', 'ignored' or 'default'; None once it has gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    masks = {
        k: int(v, 16)
        for k, v in (line.split(":\t") for line in status.splitlines())
        if k in ("SigCgt", "SigIgn")
    }
    return {
        sig: "caught"
        if masks["SigCgt"] >> (sig - 1) & 1
        else "ignored"
        if masks["SigIgn"] >> (sig - 1) & 1
        else "default"
        for sig in (signal.SIGTERM, signal.SIGHUP)
    }


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_the_driver_never_leaves_sigterm_or_sighup_to_kill_it_silently(
    driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """From its first instant to its exit, a `kill` or a closed terminal must meet the driver's
    handler (or be ignored in its last moments), never the default action that ends it at once
    with nothing said. ``ray.shutdown()`` used to set SIGTERM back to the default under
    Python's handler (Ray's C++ crash handler going away) for the ~1 s its processes took to
    stop: a SIGTERM there ended the driver with 143 and no summary. Checked on the kernel's
    view, every millisecond, over a whole study."""
    spec = smoke_spec(tmp_path, at_once=1)
    d = driver("run", spec, "--num-samples", "2", "--storage", str(tmp_path / "st"), own_ray=True)
    start = time.monotonic()
    defaults: list[str] = []
    handled = False
    while (now := _dispositions(d.proc.pid)) is not None and d.proc.poll() is None:
        if all(v != "default" for v in now.values()):
            handled = True  # the launcher's handlers are in: from here on, never the default
        elif handled:
            defaults.append(f"{time.monotonic() - start:.3f} s: {now}")
        time.sleep(0.001)
    assert d.finish() == 0, d.output()[-3000:]
    assert handled
    assert not defaults, f"{len(defaults)} samples at the default, first {defaults[:3]}, last {defaults[-1:]}"
