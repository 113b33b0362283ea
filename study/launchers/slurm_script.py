"""The batch script ``ponder-study slurm`` writes: the job it is written from (`SlurmJob`) and its
text (`render`): #SBATCH lines and the study's settings, then one body for every study that starts
Ray on the allocation, runs or resumes the study, and stops or requeues it at Slurm's warning.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from study.spec.spec import StudySpec
from study.storage.storage import is_remote

__all__ = ["SlurmJob", "render"]


@dataclass(frozen=True)
class SlurmJob:
    """Everything the batch script is written from."""

    spec: StudySpec
    """The spec with the command's overrides (name, trials, storage) in its source."""
    storage: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    time: str
    stop_before_s: int
    out_dir: Path
    workdir: Path
    partition: str | None = None
    account: str | None = None
    requeue: bool = False
    setup: tuple[str, ...] = ()
    sbatch_options: tuple[str, ...] = ()
    fallback_bin: str | None = None
    """The folder of the ``ponder-study`` that wrote the script: used when the job's PATH has none."""

    @property
    def study(self) -> str:
        return self.spec.name

    @property
    def script(self) -> Path:
        return self.out_dir / f"{self.study}.sbatch"

    @property
    def spec_copy(self) -> Path:
        """The spec as submitted (with the overrides), which the first allocation's ``run`` reads."""
        return self.out_dir / f"{self.study}.toml"


def _study_exists(job: SlurmJob) -> str:
    """The script's ``study_exists`` function: the study's spec file, or ``status`` on an object store."""
    if is_remote(job.storage):
        return 'study_exists() { "$ponder" status "$study" --storage "$storage" >/dev/null 2>&1; }'
    spec = os.path.join(job.storage.removeprefix("file://"), "studies", job.study, "spec.toml")
    return f"study_exists() {{ [ -f {shlex.quote(spec)} ]; }}"


def render(job: SlurmJob, written: datetime | None = None) -> str:
    """The batch script's text: its #SBATCH lines and settings from ``job``, then `_BODY`."""
    q = shlex.quote
    when = (written or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    sbatch = [
        f"--job-name=ponder-{job.study}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus_per_node}",
        *([f"--gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []),
        f"--time={job.time}",
        f"--signal=B:USR1@{job.stop_before_s}",
        f"--chdir={job.workdir}",
        f"--output={job.out_dir}/{job.study}-%j.out",
        "--open-mode=append",
        "--requeue" if job.requeue else "--no-requeue",
        *([f"--partition={job.partition}"] if job.partition else []),
        *([f"--account={job.account}"] if job.account else []),
        *job.sbatch_options,
    ]
    lines = [
        "#!/bin/bash",
        f"# Written by `ponder-study slurm` ({when}): study {job.study} on {job.nodes} node(s).",
        "# `sbatch` this file to run the study, or to continue it: it resumes a study that exists.",
        *(f"#SBATCH {option}" for option in sbatch),
        "",
        "# -- the study (written by ponder-study slurm; change them here, or write the script again) --",
        f"study={q(job.study)}",
        f"storage={q(job.storage)}",
        f"spec={q(str(job.spec_copy))}   # the spec as submitted: what the first allocation runs",
        f"script={q(str(job.script))}",
        f"out_dir={q(str(job.out_dir))}",
        f"cpus={job.cpus_per_node}   # per node, for trials (the driver shares the first node's)",
        f"gpus={job.gpus_per_node}   # per node",
        f"requeue={int(job.requeue)}   # 1: at the time limit's warning, requeue the job to resume the study",
        f"fallback_bin={q(job.fallback_bin or '')}   # ponder-study and ray, if the PATH has none",
        _study_exists(job),
        "",
        "# -- your site's set-up (--setup): modules, a venv on the shared disk --",
        *(job.setup or ("# (none)",)),
        "",
    ]
    return "\n".join(lines) + _BODY


_BODY = r"""
# -- from here on the same for every study --
set -u
export PYTHONUNBUFFERED=1                      # the driver's lines reach this output as they come
say() { printf 'ponder-study slurm: %s\n' "$*"; }
words() { local w out=""; for w in "$@"; do out+="${out:+ }$(printf '%q' "$w")"; done; printf '%s' "$out"; }

job=${SLURM_JOB_ID:?this is a Slurm batch script: submit it with sbatch}
allocation=$((${SLURM_RESTART_COUNT:-0} + 1))
if ponder=$(command -v ponder-study); then shown=ponder-study
else ponder=$fallback_bin/ponder-study; shown=$ponder; fi
if [ ! -x "$ponder" ]; then
    say "no ponder-study on this node's PATH, nor at $ponder: give the job a shared venv (--setup)"
    exit 2
fi
export PATH="$(dirname "$ponder"):$PATH"       # ray from the same install as ponder-study
follow=$(words "$shown" status "$study" --storage "$storage")
continue_line="continue it with: $(words sbatch "$script")"

# USR1: the time limit is near (--signal), or `scancel --batch --signal=USR1`: stop, then requeue.
# INT: `scancel --batch --signal=INT`: stop, no requeue. The driver takes SIGTERM as Ctrl-C: Tune
# saves, the driver exits 130. TERM (`scancel`, the limit itself) reaches every process of the job
# from Slurm, the driver included: it is only noted here.
stopping="" signalled="" work=""
on_signal() {
    [ -n "$stopping" ] && return
    stopping=$1
    case $1 in
        USR1) say "SIGUSR1 at $(date +%T): the time limit is near; stopping the study cleanly" ;;
        INT) say "SIGINT at $(date +%T): stopping the study cleanly" ;;
        TERM) say "SIGTERM at $(date +%T): Slurm is ending the job; the driver stops as on Ctrl-C"; return ;;
    esac
    stop_driver
}
stop_driver() {
    if [ -z "$signalled" ] && [ -s "$work/driver.pid" ]; then
        signalled=1
        kill -TERM "$(cat "$work/driver.pid")" 2>/dev/null
    fi
}
trap 'on_signal USR1' USR1
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${SLURMD_NODENAME:-${nodes[0]}}      # this node: the driver runs beside the head
workers=()
for node in "${nodes[@]}"; do [ "$node" != "$head_node" ] && workers+=("$node"); done
say "job $job (allocation $allocation) on ${SLURM_JOB_NODELIST}: study $study, storage $storage"
say "follow it from a login node: $follow"

# this job's own Ray: its files under /tmp (short: Ray's socket paths are limited), a token of its own
work=$(mktemp -d "/tmp/ponder-slurm-$job.XXXXXX")
ray_log="$out_dir/ray-$job.log"
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export RAY_AUTH_TOKEN
unset RAY_ADDRESS
ray_args=(--block --temp-dir="$work/ray" --num-cpus="$cpus" --num-gpus="$gpus" --disable-usage-stats)
steps=()
stop_ray() {
    local step alive
    [ ${#steps[@]} -eq 0 ] && return
    kill -TERM "${steps[@]}" 2>/dev/null
    for _ in $(seq 60); do
        alive=""
        for step in "${steps[@]}"; do kill -0 "$step" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break
        sleep 0.5
    done
}

address=""
srun --nodes=1 --ntasks=1 --cpus-per-task="$cpus" -w "$head_node" \
    ray start --head --port=0 --include-dashboard=false "${ray_args[@]}" \
    ${PONDER_STUDY_HEAD_IP:+--node-ip-address="$PONDER_STUDY_HEAD_IP"} >>"$ray_log" 2>&1 &
steps+=($!)
for _ in $(seq 900); do                        # up to 3 minutes
    [ -n "$stopping" ] && break
    kill -0 "${steps[0]}" 2>/dev/null || break
    if [ -s "$work/ray/ray_current_cluster" ]; then
        address=$(cat "$work/ray/ray_current_cluster")
        [[ $address =~ ^[^:]+:[0-9]+$ ]] && break
        address=""
    fi
    sleep 0.2
done

rc=""
if [ -z "$address" ] && [ -z "$stopping" ]; then
    say "the Ray head did not start on $head_node; its log, $ray_log, ends:"
    tail -n 5 "$ray_log" | sed 's/^/    /'
    rc=1
elif [ -n "$address" ]; then
    say "Ray head at $address on $head_node, ${#workers[@]} worker node(s); Ray's log: $ray_log"
    for node in "${workers[@]}"; do
        srun --nodes=1 --ntasks=1 --cpus-per-task="$cpus" -w "$node" \
            ray start --address="$address" "${ray_args[@]}" >>"$ray_log" 2>&1 &
        steps+=($!)
    done
fi

if [ -z "$rc" ] && [ -z "$stopping" ]; then
    if study_exists; then verb=(resume "$study"); else verb=(run "$spec"); fi
    say "$(words "$shown" "${verb[@]}" --storage "$storage" --address "$address")"
    (
        trap '' USR1 INT TERM                  # this shell only records the driver's exit code
        "$ponder" "${verb[@]}" --storage "$storage" --address "$address" &
        echo $! >"$work/driver.pid"
        wait $!
        echo $? >"$work/driver.rc"
    ) &
    driver_shell=$!
    while [ ! -s "$work/driver.pid" ] && kill -0 "$driver_shell" 2>/dev/null; do sleep 0.05; done
    [ -n "$stopping" ] && [ "$stopping" != TERM ] && stop_driver   # a signal that came as it started
    while kill -0 "$driver_shell" 2>/dev/null; do wait "$driver_shell" 2>/dev/null; done
    rc=$(cat "$work/driver.rc" 2>/dev/null)
    [ -n "$rc" ] || rc=1
fi
[ -n "$rc" ] || rc=130                         # stopped before the driver started: nothing ran
stop_ray
case $rc in 0 | 130) rm -rf "$work" ;; *) say "Ray's own logs stay in $work/ray on $head_node" ;; esac

case $rc in
    0)
        say "study $study is finished"
        say "see it with: $follow"
        exit 0
        ;;
    130) say "the study stopped; finished trials stay finished, the others resume from their checkpoints" ;;
    *) say "the driver exited $rc (the lines above say why); the study can be resumed once that is fixed" ;;
esac
if [ "$rc" = 130 ] && [ "$stopping" = USR1 ] && [ "$requeue" = 1 ]; then
    say "requeueing job $job: its next allocation resumes the study (\`scancel $job\` ends it)"
    if out=$(scontrol requeue "$job" 2>&1); then
        exit "$rc"                             # Slurm ends this allocation now
    fi
    say "could not requeue job $job: $out"
fi
say "$continue_line"
exit "$rc"
"""
