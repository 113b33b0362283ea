"""``submit``: a ``run`` or ``resume`` sent to a Ray cluster's job server (`study.launchers.submit`)."""

from __future__ import annotations

import argparse
import sys
import time

from study.cli.base import EXIT_INTERRUPTED, PROG, Command, fail
from study.launchers.submit import JobServer, SubmitError, job_outcome, job_request, server_address

__all__ = ["Submit"]

_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


class Submit(Command):
    """``submit``: the study runs on the cluster as a Ray job; this command returns at once, or
    with ``--wait`` follows the job's log and exits as the job did."""

    name = "submit"
    help = "run or resume a study as a job on a Ray cluster you started (ray job submit, docs/cluster.md)"
    description = (
        "Send `ponder-study run ...` or `ponder-study resume ...` to a Ray cluster's job server, as "
        "`ray job submit` would, with what the job needs: this venv's Python by its absolute path "
        "(the checkout must sit at the same path on the head), this shell's storage settings "
        "(PONDER_STUDY_STORAGE and the AWS variables, and any --env), and `ray job stop` made a "
        "Ctrl-C with 60 s to save. The storage must be one every node reaches (s3://, or file:// on "
        "a shared file system). Exit code with --wait: 0 done, 130 stopped (resumable), else the "
        "driver's."
    )
    names_a_study = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--address",
            help="the cluster's job server, http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, "
            "then $RAY_ADDRESS, as `ray job submit` reads them)",
        )
        parser.add_argument(
            "--python",
            default=sys.executable,
            metavar="PATH",
            help="the Python on the head that has ponder-study installed (default: this one, %(default)s)",
        )
        parser.add_argument(
            "--env",
            action="append",
            default=[],
            metavar="NAME",
            help="carry this shell's variable NAME to the job too (repeatable); anyone who can read "
            "the job's details on the dashboard can read the carried values",
        )
        parser.add_argument("--wait", action="store_true", help="follow the job's log; exit as the job did")
        parser.add_argument("verb", choices=("run", "resume"), help="what the job runs")
        parser.add_argument(
            "words", nargs=argparse.REMAINDER, help="its arguments, as `ponder-study VERB` takes them"
        )

    def run(self, args: argparse.Namespace) -> int:
        try:
            server = JobServer(server_address(args.address))
            request = job_request(args.verb, args.words, python=args.python, extra_env=args.env)
            job_id = server.submit(request)
        except SubmitError as e:
            fail(str(e))
        address = server.address
        carried = ", ".join(request.carried) or "nothing"
        print(f"{PROG}: job {job_id} submitted to {address}: {request.entrypoint}")
        print(f"  carried from this shell: {carried}; `ray job stop` is a Ctrl-C with 60 s to save")
        print(f"  follow it:  ray job logs {job_id} --address {address} --follow")
        print(f"  stop it:    ray job stop {job_id} --address {address}   (the study stays resumable)")
        if not args.wait:
            print(
                f"  its outcome as an exit code: {PROG} submit --wait ... (`ray job status` exits 0 anyway)"
            )
            return 0
        sys.stdout.flush()
        try:
            return _follow(server, job_id)
        except SubmitError as e:
            fail(str(e))


def _follow(server: JobServer, job_id: str) -> int:
    """Print the job's log as it grows until the job ends; its exit code."""
    shown = 0
    try:
        while True:
            info = server.info(job_id)
            logs = server.logs(job_id)
            sys.stdout.write(logs[shown:])
            sys.stdout.flush()
            shown = len(logs)
            status = str(info.get("status"))
            if status in _ENDED:
                code = job_outcome(status, info.get("driver_exit_code"))
                print(f"{PROG}: job {job_id} {status.lower()} (exit {code})", file=sys.stderr)
                return code
            time.sleep(1.0)
    except KeyboardInterrupt:
        print(
            f"{PROG}: stopped following; the job goes on: "
            f"ray job logs {job_id} --address {server.address} --follow",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
