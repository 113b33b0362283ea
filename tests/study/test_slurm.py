"""Issue 36: ``ponder-study slurm`` writes a batch script that runs a study on a Slurm allocation,
stops it cleanly at the time limit's warning and requeues it until the study is finished.

Three layers: the script's writing and the refusals (no Slurm); the script itself run by bash
against stand-ins for srun, scontrol, ray and the driver, to check its signal handling (no
Slurm, no Ray, a second or two each); and one real single-node Slurm (munged, slurmctld and
slurmd started here, in a temporary folder) running a study over two allocations."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from study.launchers import slurm
from study.storage.storage import StudyPaths
from tests.study.conftest import free_port, processes_naming, smoke_source, smoke_spec

ENDED = {"completed", "early_stopped", "diverged"}


def _slurm(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``ponder-study slurm ARGS`` in this process: (exit code, stdout, stderr)."""
    try:
        code = slurm.main(list(args))
    except SystemExit as e:  # argparse's own refusals
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _dry(tmp_path: Path, *extra: str) -> list[str]:
    """The arguments of a dry run of the smoke spec into ``tmp_path``, with ``extra``."""
    return [
        "parity-smoke",
        "--time",
        "01:00:00",
        "--storage",
        str(tmp_path / "store"),
        "--out",
        str(tmp_path / "job"),
        "--dry-run",
        *extra,
    ]


def _refused(code: int, err: str) -> str:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("ponder-study slurm: error: "), err
    return err


# -- the script as written ---------------------------------------------------------------------
def test_the_script_asks_slurm_for_what_the_arguments_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    spec = tmp_path / "gpus.toml"
    spec.write_text(smoke_source().replace("gpu = 0", "gpu = 0.5"))
    args = [
        str(spec),
        "--nodes=3",
        "--gpus-per-node=4",
        "--time=1-12:00:00",
        "--storage=file://" + str(tmp_path / "nfs"),
        "--partition=gpu",
        "--account=lab",
        "--requeue",
        "--stop-before=300",
        "--setup=module load cuda/12.4",
        f"--setup={venv}",
        "--sbatch=--mem=32G",
        "--num-samples=20",
        "--out",
        str(tmp_path / "job"),
        "--dry-run",
    ]
    code, out, err = _slurm(capsys, *args)
    assert code == 0, err
    script = tmp_path / "job" / "gpus.sbatch"
    assert f"wrote {script}" in out and f"sbatch {script}" in out.splitlines()[-1]
    text = script.read_text()
    sbatch = re.findall(r"^#SBATCH (\S+)$", text, re.M)
    for line in (
        "--job-name=ponder-gpus",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",  # 2 trials at once over 3 nodes, one CPU each
        "--gpus-per-node=4",
        "--time=1-12:00:00",
        "--signal=B:USR1@300",
        f"--output={tmp_path}/job/gpus-%j.out",
        "--open-mode=append",
        "--requeue",
        "--partition=gpu",
        "--account=lab",
        "--mem=32G",
    ):
        assert line in sbatch, (line, sbatch)
    assert "module load cuda/12.4\n" in text and f"source {venv}/bin/activate\n" in text
    assert f"storage=file://{tmp_path}/nfs\n" in text and "requeue=1 " in text
    assert f"[ -f {tmp_path}/nfs/studies/gpus/spec.toml ]" in text  # run or resume
    copy = (tmp_path / "job" / "gpus.toml").read_text()
    assert "num_samples = 20" in copy and f'storage = "file://{tmp_path}/nfs"' in copy
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_a_study_on_an_object_store_is_found_by_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "check_reachable", lambda uri: None)  # no S3 here
    args = _dry(tmp_path, "--nodes=2", "--storage=s3://bucket/ponder")
    code, _, err = _slurm(capsys, *args)
    assert code == 0, err
    text = (tmp_path / "job" / "parity-smoke.sbatch").read_text()
    assert "storage=s3://bucket/ponder\n" in text and "--no-requeue" in text
    assert '"$ponder" status "$study" --storage "$storage"' in text
    assert "--gpus-per-node" not in text


def test_cpus_default_to_the_trials_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _slurm(capsys, *_dry(tmp_path))
    assert "#SBATCH --cpus-per-task=2\n" in (tmp_path / "job" / "parity-smoke.sbatch").read_text()
    _slurm(capsys, *_dry(tmp_path, "--cpus-per-node=6"))
    assert "#SBATCH --cpus-per-task=6\n" in (tmp_path / "job" / "parity-smoke.sbatch").read_text()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("30:15", 1815),
        ("02:00:00", 7200),
        ("1-0", 86400),
        ("1-2:30", 95400),
        ("2-00:00:01", 172801),
    ],
)
def test_slurm_time_limits_are_read_as_slurm_reads_them(text: str, seconds: int) -> None:
    assert slurm.parse_time(text) == seconds


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--nodes=2"], "file://"),  # a plain path: one machine's disk
        (["--time=2h"], "HH:MM:SS"),
        (["--time=00:03:00"], "--stop-before"),  # the warning would come at the start
        (["--nodes=0"], "--nodes"),
        (["--setup=./no-such-venv"], "bin/activate"),
        (["--sbatch=mem=1G"], "--sbatch=--mem"),
        (["--cpus-per-node=0"], "--cpus-per-node"),
        (["--num-samples=0"], "--num-samples"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    err = _refused(*_slurm(capsys, *_dry(tmp_path, *extra))[::2])
    assert says in err
    assert not (tmp_path / "job").exists()


def test_a_spec_whose_trials_need_gpus_needs_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "gpu.toml"
    spec.write_text(smoke_source().replace("gpu = 0", "gpu = 1"))
    args = _dry(tmp_path)
    args[0] = str(spec)
    assert "--gpus-per-node" in _refused(*_slurm(capsys, *args)[::2])
    args += ["--gpus-per-node=1", "--cpus-per-node=1"]
    spec.write_text(smoke_source().replace("gpu = 0", "gpu = 1").replace("cpu = 1", "cpu = 2"))
    assert "more than --cpus-per-node 1" in _refused(*_slurm(capsys, *args)[::2])


def test_without_sbatch_it_says_where_to_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on it
    args = [a for a in _dry(tmp_path) if a != "--dry-run"]
    err = _refused(*_slurm(capsys, *args)[::2])
    assert "login node" in err and "--dry-run" in err
    assert not (tmp_path / "job").exists()


def _fake_sbatch(bin_dir: Path, answer: str, code: int = 0) -> Path:
    bin_dir.mkdir(exist_ok=True)
    calls = bin_dir / "sbatch.calls"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        f'#!/bin/bash\necho "$*" >> {calls}\necho {answer!r} >&{1 if code == 0 else 2}\nexit {code}\n'
    )
    sbatch.chmod(0o755)
    return calls


def test_it_submits_with_sbatch_and_says_how_to_follow_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_sbatch(tmp_path / "bin", "4242")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    code, out, err = _slurm(capsys, *[a for a in _dry(tmp_path) if a != "--dry-run"])
    assert code == 0, err
    script = tmp_path / "job" / "parity-smoke.sbatch"
    assert calls.read_text() == f"--parsable {script}\n"
    assert "submitted job 4242" in out
    assert f"{tmp_path}/job/parity-smoke-4242.out" in out
    assert f"status parity-smoke --storage {tmp_path}/store" in out
    assert out.splitlines()[-1].endswith(f"sbatch {script}")


def test_a_job_sbatch_refuses_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_sbatch(tmp_path / "bin", "sbatch: error: invalid partition specified: gpu", code=1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    code, _, err = _slurm(capsys, *[a for a in _dry(tmp_path) if a != "--dry-run"])
    assert code == 1 and err.count("\n") == 1, err
    assert "invalid partition specified" in err and str(tmp_path / "job" / "parity-smoke.sbatch") in err


def test_ponder_study_slurm_is_a_verb_of_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from study import cli

    assert "slurm" in {command.name for command in cli.COMMANDS}
    assert "slurm" in cli.build_parser().format_help()
    assert cli.main(["slurm", *_dry(tmp_path)]) == 0
    assert (tmp_path / "job" / "parity-smoke.sbatch").is_file()
    capsys.readouterr()


# -- the script run by bash, against stand-ins for Slurm, Ray and the driver -------------------
_SRUN = '#!/bin/bash\nwhile [[ "$1" == -* ]]; do [ "$1" = -w ] && shift; shift; done\nexec "$@"\n'
_SCONTROL = """#!/bin/bash
if [ "$1" = show ]; then echo "$SLURMD_NODENAME"; else echo "scontrol $*" >>"$FAKE_CALLS"; fi
"""
_RAY = """#!/bin/bash
for a in "$@"; do case $a in --temp-dir=*) dir=${a#--temp-dir=} ;; esac; done
echo "ray $*" >>"$FAKE_CALLS"
mkdir -p "$dir" && printf 127.0.0.1:6379 >"$dir/ray_current_cluster"
trap 'exit 0' TERM
while :; do sleep 0.05; done
"""
_DRIVER = """#!{python}
import os, signal, sys, time
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write("ponder-study " + " ".join(sys.argv[1:]) + "\\n")
def stop(*_):
    print("driver: interrupted; resume it with: ponder-study resume ...", flush=True)
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)  # the real driver takes SIGTERM as Ctrl-C
print("driver: started", flush=True)
time.sleep(float(os.environ["FAKE_DRIVER_S"]))
print("driver: finished", flush=True)
"""


@dataclass
class Ran:
    code: int
    lines: list[str]
    calls: list[str]


@pytest.fixture
def run_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """Write the smoke study's script, then run it with bash as Slurm would, on stand-ins;
    ``send``: a signal for the script once the driver runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in [("srun", _SRUN), ("scontrol", _SCONTROL), ("ray", _RAY), ("ponder-study", _DRIVER)]:
        (bin_dir / name).write_text(text.replace("{python}", sys.executable))
        (bin_dir / name).chmod(0o755)

    def run(*extra: str, send: signal.Signals | None = None, driver_s: float = 30) -> Ran:
        assert _slurm(capsys, *_dry(tmp_path, *extra))[0] == 0
        calls = tmp_path / "calls"
        calls.write_text("")
        log = tmp_path / "job.out"
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "SLURM_JOB_ID": "7",
            "SLURM_JOB_NODELIST": "node1",
            "SLURMD_NODENAME": "node1",
            "FAKE_CALLS": str(calls),
            "FAKE_DRIVER_S": str(driver_s),
        }
        with log.open("w") as out:
            proc = subprocess.Popen(
                ["bash", str(tmp_path / "job" / "parity-smoke.sbatch")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                # Slurm starts a batch script with SIGINT at its default; a test process started
                # as a background job (`make test &`) has it ignored, and bash can trap no signal
                # it was started ignoring: its INT trap would never run
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                start_new_session=True,  # its stand-ins go with it, even from a failed test
            )
            try:
                if send is not None:
                    deadline = time.monotonic() + 20
                    while "driver: started" not in log.read_text():
                        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                        time.sleep(0.05)
                    proc.send_signal(send)
                try:
                    code = proc.wait(30)
                except subprocess.TimeoutExpired:  # what the script did is the diagnosis
                    pytest.fail(f"the script did not end within 30 s; it wrote:\n{log.read_text()}")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what is left of it: nothing, once it ended
        return Ran(code, log.read_text().splitlines(), calls.read_text().splitlines())

    return run


def test_the_time_limits_warning_stops_the_study_and_requeues_the_job(run_script: Callable[..., Ran]) -> None:
    ran = run_script("--requeue", send=signal.SIGUSR1)
    assert ran.code == 130, ran.lines
    assert any("SIGUSR1" in line and "stopping the study cleanly" in line for line in ran.lines)
    assert "driver: interrupted; resume it with: ponder-study resume ..." in ran.lines
    assert ran.calls[-1] == "scontrol requeue 7", ran.calls
    assert "requeueing job 7: its next allocation resumes the study" in ran.lines[-1]


@pytest.mark.parametrize(("extra", "send"), [((), signal.SIGUSR1), (("--requeue",), signal.SIGINT)])
def test_a_stop_without_requeue_ends_with_the_command_to_continue(
    tmp_path: Path, run_script: Callable[..., Ran], extra: tuple[str, ...], send: signal.Signals
) -> None:
    ran = run_script(*extra, send=send)
    assert ran.code == 130, ran.lines
    assert not any(call.startswith("scontrol requeue") for call in ran.calls)
    assert ran.lines[-1] == f"ponder-study slurm: continue it with: sbatch {tmp_path}/job/parity-smoke.sbatch"


def test_the_script_runs_a_new_study_and_resumes_one_that_exists(
    tmp_path: Path, run_script: Callable[..., Ran]
) -> None:
    store = tmp_path / "store"
    ran = run_script(driver_s=0.2)
    assert ran.code == 0, ran.lines
    head, driver = ran.calls
    assert head.startswith("ray start --head --port=0") and "--num-cpus=2" in head
    spec = tmp_path / "job" / "parity-smoke.toml"
    assert driver == f"ponder-study run {spec} --storage {store} --address 127.0.0.1:6379"
    assert ran.lines[0].startswith("ponder-study slurm: job 7 (allocation 1) on node1: study parity-smoke")
    assert f"follow it from a login node: ponder-study status parity-smoke --storage {store}" in ran.lines[1]
    assert (
        ran.lines[-1]
        == f"ponder-study slurm: see it with: ponder-study status parity-smoke --storage {store}"
    )

    Path(StudyPaths(str(store), "parity-smoke").spec).parent.mkdir(parents=True)
    Path(StudyPaths(str(store), "parity-smoke").spec).write_text("")
    ran = run_script(driver_s=0.2)
    assert ran.calls[-1] == f"ponder-study resume parity-smoke --storage {store} --address 127.0.0.1:6379"


def test_the_script_is_for_sbatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _slurm(capsys, *_dry(tmp_path))[0] == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(
        ["bash", str(tmp_path / "job" / "parity-smoke.sbatch")], capture_output=True, text=True, env=env
    )
    assert done.returncode != 0 and "submit it with sbatch" in done.stderr


# -- a real Slurm ------------------------------------------------------------------------------
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def _find(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None
    )


@dataclass
class Slurm:
    """A one-node Slurm started by the fixture; ``env`` reaches it (``SLURM_CONF``)."""

    env: dict[str, str]
    node: str

    def run(self, *args: str) -> str:
        done = subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=30)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "show", "job", "-o", job_id)))

    def wait(self, job_id: str, until: Callable[[dict[str, str]], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not until(fields := self.job(job_id)):
            assert time.monotonic() < deadline, f"job {job_id} not {what} in {timeout:.0f} s: {fields}"
            time.sleep(0.25)


_CONF = """ClusterName=ponder-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also holds a requeued job back (120 s by default): 5 s here
AuthInfo=socket={dir}/munge.socket,cred_expire=5
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
PlugStackConfig={dir}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
KillWait=10
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)


@pytest.fixture(scope="module")
def real_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """munged, slurmctld and slurmd for this module, their state in a temporary folder, stopped
    (by pid) at its end; the tests skip, saying why, where they cannot run."""
    found = {name: _find(name) for name in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} missing): `make slurm` installs it as root"
        )
    if os.geteuid() != 0:
        pytest.skip("a test Slurm runs its daemons as root, and this is not root")
    where = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (where / sub).mkdir()
    (where / "plugstack.conf").write_text("")
    key = where / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    conf = where / "slurm.conf"
    conf.write_text(_CONF.format(node=node, dir=where, ctld_port=free_port(), d_port=free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    logs = [where / "munged.out", where / "slurmctld.out", where / "slurmd.out"]
    started: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], log: Path) -> None:
        with log.open("wb") as out:
            started.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env))

    try:
        munge = f"--socket={where}/munge.socket --key-file={key} --pid-file={where}/munged.pid"
        start(
            [str(found["munged"]), "-F", "--force", *munge.split(), f"--seed-file={where}/munged.seed"],
            logs[0],
        )
        start([str(found["slurmctld"]), "-D", "-i", "-f", str(conf)], logs[1])
        start([str(found["slurmd"]), "-D", "-N", node, "-f", str(conf)], logs[2])
        slurm_ = Slurm(env, node)
        deadline = time.monotonic() + 30
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env)
            if state.stdout.strip() == "idle":
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                said = " | ".join(line for log in logs for line in log.read_text().splitlines()[-3:])
                pytest.skip(f"the test Slurm did not start here: {said[-600:]}")
            time.sleep(0.2)
        yield slurm_
    finally:
        with contextlib.suppress(Exception):  # no job outlives the daemons
            subprocess.run(["scancel", "--full", "--user", "root"], env=env, timeout=30, capture_output=True)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                running = subprocess.run(
                    ["squeue", "-h", "-t", "R,CG"], capture_output=True, text=True, env=env
                )
                if not running.stdout.strip():
                    break
                time.sleep(0.5)
        for proc in reversed(started):
            _stop(proc)


JOB_ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
"""The job states Slurm does not leave (its ``JOB_STATE_BASE`` values past ``PENDING``/``RUNNING``)."""


@pytest.mark.slow
def test_a_study_runs_over_two_allocations_of_a_real_slurm(
    real_slurm: Slurm, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script through sbatch: the first allocation runs the study and is warned as its time
    limit would warn it (`scancel --batch --signal=USR1`) once a trial has started; the study
    stops cleanly, the job requeues itself, and the second allocation resumes the study to its
    end: every trial once, the job's output saying what happened and how to follow it."""
    monkeypatch.setenv("SLURM_CONF", real_slurm.env["SLURM_CONF"])
    store, out = tmp_path / "store", tmp_path / "job"
    spec = smoke_spec(tmp_path, at_once=1)  # one trial at a time: one Ray worker, less CPU
    args = [spec, "--num-samples=2", "--time=00:05:00", "--stop-before=60", "--cpus-per-node=2", "--requeue"]
    code, said, err = _slurm(capsys, *args, "--storage", str(store), "--out", str(out))
    assert code == 0, err
    job = re.search(r"submitted job (\d+)", said)
    assert job is not None, said
    job_id, began, requeued = job.group(1), time.monotonic(), -1.0
    log = out / f"parity-smoke-{job_id}.out"
    started = Path(StudyPaths(str(store), "parity-smoke").study_dir) / "started"
    try:
        while not any(started.glob("*.json")):  # a trial is about to start: the study is under way
            fields = real_slurm.job(job_id)
            assert fields["JobState"] in ("PENDING", "RUNNING"), (fields, log.read_text()[-3000:])
            assert time.monotonic() - began < 90, log.read_text()[-3000:] if log.exists() else fields
            time.sleep(0.2)
        real_slurm.run("scancel", "--batch", "--signal=USR1", job_id)
        real_slurm.wait(job_id, lambda f: f["Restarts"] == "1", 60, "requeued")
        requeued = time.monotonic() - began
        real_slurm.wait(
            job_id, lambda f: f["JobState"] in JOB_ENDED, 120, "ended"
        )  # not merely out of RUNNING: a requeued job passes through REQUEUED and COMPLETING
        fields = real_slurm.job(job_id)
    finally:
        text = log.read_text() if log.exists() else "(no output)"
        print(f"job {job_id}: requeued at {requeued:.1f} s, ended at {time.monotonic() - began:.1f} s")
        print(text[-4000:])
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, text[-3000:])

    lines = [line for line in text.splitlines() if line.startswith(("ponder-study", "study "))]
    assert lines[0].startswith(f"ponder-study slurm: job {job_id} (allocation 1) on {real_slurm.node}")
    assert any(f"status parity-smoke --storage {store}" in line for line in lines[:2])
    assert any("SIGUSR1" in line for line in lines)
    assert any(line.startswith("ponder-study: ") and "resume parity-smoke" in line for line in lines)
    assert any(f"requeueing job {job_id}" in line for line in lines)
    assert any(f"job {job_id} (allocation 2)" in line for line in lines)
    assert any(
        re.search(r"ponder-study resume parity-smoke --storage \S+ --address \S+:\d+$", x) for x in lines
    )
    assert lines[-1] == f"ponder-study slurm: see it with: {_status_command(lines)}"

    trials = pd.read_parquet(store / "trials" / "study=parity-smoke")
    assert len(trials) == 2 and trials["trial_id"].is_unique and set(trials["status"]) <= ENDED, trials
    history = pd.read_parquet(store / "history" / "study=parity-smoke")
    assert not history.duplicated(["trial_id", "iteration"]).any()  # no report twice
    left = processes_naming(f"/tmp/ponder-slurm-{job_id}.")
    for pid in left:  # the job's Ray, started by this test: not left running, whatever the assert says
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert left == []  # the job's Ray went with it


def _status_command(lines: list[str]) -> str:
    """The status command the job's second line gave (``follow it from a login node: ...``)."""
    return lines[1].split("follow it from a login node: ", 1)[1]
