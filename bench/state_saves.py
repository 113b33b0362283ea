"""What saving Tune's experiment state before each new trial starts costs a study.

The study's scheduler (`study.search.scheduler.SnapshotBeforeStart`) has Tune save its state, and wait
for the copy to reach the storage, once per driver before its first trial starts; before each
later new trial it writes that trial's own started record instead (a whole save per trial
would grow with the study), so that a resume after a SIGKILL knows every trial that ever trained.
This runs one real study through
`study.run.runner.run_study` (the shipped spec ``--spec``, default ``parity-smoke``) and times every
call of Tune's own save (`TuneController.checkpoint`), forced and periodic, wrapped here for the
measurement only. It prints the forced saves' count, median, max and total, and the total as a
share of the study's wall time measured in the same run.

``--s3`` puts the study on an S3 API instead of a local directory: moto's server on loopback
(the ``dev`` extra), reached as AWS would be, so each save is an upload.

    .venv/bin/python bench/state_saves.py [--spec parity-smoke] [--s3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", default="parity-smoke", help="shipped spec to run (default parity-smoke)")
    parser.add_argument("--s3", action="store_true", help="store the study on moto's S3 server")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="state-saves-")
    storage = root
    server = None
    if args.s3:
        import pyarrow.fs as pafs
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_EC2_METADATA_DISABLED="true",
            PONDER_STUDY_CACHE=os.path.join(root, "cache"),
        )
        pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True).create_dir("bench")
        storage = "s3://bench/studies"

    from ray.tune.execution.tune_controller import TuneController

    from study.run.runner import run_study
    from study.spec.spec import load_spec

    saves: dict[bool, list[float]] = {True: [], False: []}
    save = TuneController.checkpoint

    def timed(self: TuneController, force: bool = False, wait: bool = False) -> Any:
        start = time.perf_counter()
        save(self, force=force, wait=wait)
        saves[force].append(time.perf_counter() - start)

    TuneController.checkpoint = timed  # type: ignore[method-assign]
    spec = load_spec(args.spec).with_overrides(name=args.spec, storage=storage)
    start = time.perf_counter()
    outcome = run_study(spec, verbose=0)
    wall = time.perf_counter() - start
    if server is not None:
        server.stop()

    forced = saves[True]
    print(f"study {args.spec} on {'S3 (moto)' if args.s3 else 'a local directory'}: {outcome.statuses}")
    print(f"study wall time: {wall:.1f} s")
    print(
        f"forced saves: {len(forced)} ({spec.search.num_samples} trials), "
        f"median {statistics.median(forced) * 1e3:.0f} ms, max {max(forced) * 1e3:.0f} ms, "
        f"total {sum(forced):.2f} s = {100 * sum(forced) / wall:.1f} % of the wall time"
    )
    print(f"Tune's other save calls (periodic, mostly throttled): {len(saves[False])}")


if __name__ == "__main__":
    main()
