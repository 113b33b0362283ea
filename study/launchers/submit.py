"""A study sent to a Ray cluster's job server (``ray job submit``), from a checkout on any cluster.

A job's entrypoint runs in a shell on the head node, which neither has this shell's environment
nor the venv on its PATH. `job_request` builds what the job needs:

- the command by the interpreter's absolute path (``<python> -m study run ...``), so it is found
  wherever the checkout sits at the same path on the head (a shared file system, or the head itself);
- the storage settings of this shell carried in the job's ``env_vars`` (``PONDER_STUDY_STORAGE``,
  the standard AWS variables, any ``--env NAME``): they reach the driver and every trial;
- ``RAY_JOB_STOP_SIGNAL=SIGINT`` and ``RAY_JOB_STOP_WAIT_TIME_S=60``: ``ray job stop`` becomes a
  Ctrl-C with time to save, and the study's summary and resume line reach the job's log.

`JobServer` speaks the job server's REST API (the one ``ray job`` and Ray's SDK use) with the
standard library, so submitting needs no ``ray[default]`` here, only on the head that serves jobs.
`job_outcome` turns a finished job into an exit code, which ``ray job status`` does not give.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study.storage.filesystems import has_scheme

__all__ = [
    "CARRIED_ENV",
    "STOP_ENV",
    "JobRequest",
    "JobServer",
    "SubmitError",
    "job_outcome",
    "job_request",
    "server_address",
]

CARRIED_ENV = (
    "PONDER_STUDY_STORAGE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_EC2_METADATA_DISABLED",
)
"""What a study's storage may need from this shell, carried to the job when set here."""

STOP_ENV = {"RAY_JOB_STOP_SIGNAL": "SIGINT", "RAY_JOB_STOP_WAIT_TIME_S": "60"}
"""``ray job stop`` as a Ctrl-C with 60 s to finish, as cluster.yaml sets it for its head."""

SERVER_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
"""Where Ray's own ``ray job`` commands look for the job server, in this order."""


class SubmitError(ValueError):
    """A submission refused before it reached the cluster: the message says how to fix it."""


@dataclass(frozen=True)
class JobRequest:
    """What `JobSubmissionClient.submit_job` is given, and what the user is told about it."""

    entrypoint: str
    env_vars: dict[str, str] = field(default_factory=dict)
    carried: tuple[str, ...] = ()
    """The names (not the values) of this shell's variables the job carries."""

    @property
    def runtime_env(self) -> dict[str, Any]:
        return {"env_vars": dict(self.env_vars)}


def server_address(given: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The job server's address: ``--address``, else what ``ray job`` reads from the environment."""
    for address in (given, *(environ.get(name) for name in SERVER_ENV)):
        if address:
            return address if "://" in address else f"http://{address}"
    raise SubmitError(
        "submit needs the cluster's job server: give --address http://HEAD:8265 "
        "(or set $RAY_API_SERVER_ADDRESS as for `ray job submit`)"
    )


def _option(words: Sequence[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``words``; None if absent."""
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
    return None


def _absolute_spec(verb: str, words: list[str]) -> list[str]:
    """``run SPEC``: a spec file given by a relative path is named by its absolute one, since the
    job does not start in this directory (a shipped spec's name is left as it is)."""
    if verb != "run" or not words or words[0].startswith("-"):
        return words
    spec = Path(words[0])
    if spec.suffix == ".toml" or spec.exists():
        if not spec.is_file():
            raise SubmitError(f"spec {words[0]} is not a file here; give the path of a .toml file")
        return [str(spec.resolve()), *words[1:]]
    return words


def job_request(
    verb: str,
    words: Sequence[str],
    *,
    python: str = sys.executable,
    extra_env: Sequence[str] = (),
    environ: Mapping[str, str] = os.environ,
) -> JobRequest:
    """The job that runs ``ponder-study VERB WORDS`` on the cluster, joining it (``--address
    auto``) with storage every node reaches; `SubmitError` for a storage the head cannot use."""
    args = _absolute_spec(verb, list(words))
    storage = _option(args, "--storage") or environ.get("PONDER_STUDY_STORAGE")
    if storage is None:
        raise SubmitError(
            "a submitted study needs storage every node reaches: give --storage s3://BUCKET/PATH "
            "(or file:///SHARED/PATH on a file system all nodes mount), or set $PONDER_STUDY_STORAGE"
        )
    if not has_scheme(storage):
        raise SubmitError(
            f"--storage {storage} is a path on this machine, which the job on the head node and the "
            "trials on other nodes do not see: give s3://BUCKET/PATH, or file:///SHARED/PATH on a "
            "file system every node mounts"
        )
    if _option(args, "--address") is None:
        args += ["--address", "auto"]  # the cluster the job runs on, not a Ray of its own
    carried = [name for name in (*CARRIED_ENV, *extra_env) if name in environ]
    missing = [name for name in extra_env if name not in environ]
    if missing:
        raise SubmitError(f"--env {missing[0]}: it is not set in this shell; set it, or leave it out")
    env_vars = {**STOP_ENV, **{name: environ[name] for name in carried}}
    entrypoint = shlex.join([python, "-m", "study", verb, *args])
    return JobRequest(entrypoint, env_vars, tuple(dict.fromkeys(carried)))


def job_outcome(status: str, driver_exit_code: int | None) -> int:
    """A finished job's exit code, as the command's own would be: 0 succeeded, 130 stopped
    (resumable), the driver's code where it failed (1 if it never started)."""
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 130
    return driver_exit_code if driver_exit_code else 1


def _token(environ: Mapping[str, str]) -> str | None:
    """The cluster's token where token authentication is asked for (``RAY_AUTH_MODE=token``), read
    where Ray reads it: ``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``."""
    if environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    if environ.get("RAY_AUTH_TOKEN"):
        return environ["RAY_AUTH_TOKEN"].strip()
    path = Path(environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()
    return path.read_text().strip() if path.is_file() else None


class JobServer:
    """The job server of a Ray cluster (``http://HEAD:8265``), through its REST API."""

    def __init__(
        self, address: str, environ: Mapping[str, str] = os.environ, timeout_s: float = 30.0
    ) -> None:
        self.address = address.rstrip("/")
        self.timeout_s = timeout_s
        token = _token(environ)
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.address}{path}", data, self._headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code == 401:
                raise SubmitError(
                    f"the job server at {self.address} asks for the cluster's token: export "
                    "RAY_AUTH_MODE=token, with the head's token in ~/.ray/auth_token (or $RAY_AUTH_TOKEN)"
                ) from None
            if e.code == 403 and "Authorization" in self._headers:
                raise SubmitError(
                    f"the job server at {self.address} refused the token sent: put the head's token in "
                    "$RAY_AUTH_TOKEN (or ~/.ray/auth_token, $RAY_AUTH_TOKEN_PATH)"
                ) from None
            text = " ".join(e.read().decode(errors="replace").split())[:200]
            raise SubmitError(f"the job server at {self.address} answered {e.code}: {text}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise SubmitError(
                f"no Ray job server at {self.address} ({reason}); check --address, and that the head "
                "runs Ray's dashboard (`ray start --head` with ray[default] installed)"
            ) from None

    def submit(self, request: JobRequest, wait_s: float = 60.0) -> str:
        """Submit the job; its id. A head whose job agent is still starting (just after ``ray
        start``) answers "try again later": it is asked again for up to ``wait_s``."""
        body = {"entrypoint": request.entrypoint, "runtime_env": request.runtime_env}
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return str(self._call("POST", "/api/jobs/", body)["job_id"])
            except SubmitError as e:
                if "try again later" not in str(e) or time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def info(self, job_id: str) -> dict[str, Any]:
        """The job's details: ``status``, ``driver_exit_code``, ``runtime_env``, ..."""
        return dict(self._call("GET", f"/api/jobs/{job_id}"))

    def logs(self, job_id: str) -> str:
        """The job's log so far."""
        return str(self._call("GET", f"/api/jobs/{job_id}/logs")["logs"])

    def stop(self, job_id: str) -> bool:
        """Ask the job to stop (its stop signal, then SIGKILL after the wait it was given)."""
        return bool(self._call("POST", f"/api/jobs/{job_id}/stop")["stopped"])
