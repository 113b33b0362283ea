"""``cluster.yaml``, the Ray cluster-launcher file: the checks ``ray up`` runs, offline.

``ray up`` (``ray.autoscaler._private.commands._bootstrap_config``) loads the file with
``yaml.safe_load``, then:

1. ``prepare_config``: merges Ray's AWS defaults (``ray/autoscaler/aws/defaults.yaml``, a file in
   the package), merges the setup commands, checks the docker block, fills per-type worker counts;
2. ``fillout_available_node_types_resources``: asks EC2 for the instance types' CPUs and GPUs
   (network; ``ray up`` only warns when it fails, and this file declares every type's resources);
3. ``validate_config``: the JSON schema (``ray/autoscaler/ray-schema.json``) and the node-type rules;
4. ``bootstrap_config``: IAM, key pair, subnets, security group (network, AWS).

Steps 1 and 3 are the launcher's own checks and read only local files: they run here exactly as
``ray up`` runs them, with Python's sockets blocked (boto3 would go through them). Step 2 is left
out (network, and only a fallback), step 4 too (it creates things in the AWS account).
``validate_config`` must get the prepared config: on the raw YAML it fails with a misleading
"Missing 'cluster_synced_files'", a field that only the defaults supply. The other tests check
what the project needs from the file.
"""

from __future__ import annotations

import copy
import re
import shlex
import socket
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
STORAGE_VAR = "PONDER_STUDY_STORAGE"

Config = dict[str, Any]


@pytest.fixture(scope="module")
def raw_text() -> str:
    return CLUSTER_YAML.read_text()


@pytest.fixture(scope="module")
def loaded(raw_text: str) -> Config:
    config = yaml.safe_load(raw_text)  # what `ray up` does with the file
    assert isinstance(config, dict)
    return config


@pytest.fixture
def config(loaded: Config) -> Config:
    """A fresh copy per test, free to break."""
    return copy.deepcopy(loaded)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to resolve a name or open a connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError(f"the launcher checks tried to use the network: {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def launcher_checks(config: Config) -> Config:
    """``ray up``'s offline checks, in its order; returns the prepared config."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def pyproject_pin(package: str) -> str:
    """The exact version pyproject.toml pins ``package`` to (``name==X`` or ``name[extra]==X``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dependency in project["dependencies"]:
        match = re.fullmatch(rf"{re.escape(package)}(\[[^\]]*\])?==(\S+)", dependency.replace(" ", ""))
        if match:
            return match.group(2)
    raise AssertionError(f"pyproject.toml pins no exact {package} version")


def strings(node: object) -> Iterator[str]:
    """Every string in the parsed YAML, keys included (comments are not in it)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def worker_types(config: Config) -> dict[str, Config]:
    types: dict[str, Config] = config["available_node_types"]
    return {name: spec for name, spec in types.items() if name != config["head_node_type"]}


def storage_uri(config: Config) -> str:
    """The value of ``-e PONDER_STUDY_STORAGE=...`` in the docker options every node gets."""
    values = [
        token.split("=", 1)[1]
        for option in config["docker"].get("run_options", [])
        for token in shlex.split(option)
        if token.startswith(f"{STORAGE_VAR}=")
    ]
    assert len(values) == 1, f"{STORAGE_VAR} must be set once in docker.run_options, found {values}"
    return values[0]


# --- Ray's own launcher checks -------------------------------------------------------------


@pytest.mark.usefixtures("no_network")
def test_the_cluster_file_passes_the_launcher_checks(config: Config) -> None:
    prepared = launcher_checks(config)
    # the defaults filled in what the file leaves out, and overrode nothing it sets
    assert prepared["max_workers"] == config["max_workers"]
    assert prepared["available_node_types"][config["head_node_type"]]["max_workers"] == 0
    assert prepared["head_setup_commands"][: len(config["setup_commands"])] == config["setup_commands"]


@pytest.mark.usefixtures("no_network")
def test_validate_config_needs_the_prepared_config(config: Config) -> None:
    with pytest.raises(RuntimeError, match="Missing 'cluster_synced_files'"):
        validate_config(copy.deepcopy(config))


def _rename_top_level(config: Config) -> None:
    config["max_worker"] = config.pop("max_workers")


def _rename_in_node_type(config: Config) -> None:
    worker = next(iter(worker_types(config).values()))
    worker["min_worker"] = worker.pop("min_workers")


def _undefined_head_type(config: Config) -> None:
    config["head_node_type"] = "cpu-head"


def _fractional_node_resources(config: Config) -> None:
    next(iter(worker_types(config).values()))["resources"]["GPU"] = 0.5


def _min_workers_above_max(config: Config) -> None:
    next(iter(worker_types(config).values()))["min_workers"] = config["max_workers"] + 1


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize(
    ("breakage", "error", "message"),
    [
        # the defaults supply max_workers (2): the misspelt key is the only sign of the mistake
        pytest.param(
            _rename_top_level,
            jsonschema.ValidationError,
            r"'max_worker' was unexpected",
            id="misspelt-top-level-key",
        ),
        pytest.param(
            _rename_in_node_type,
            jsonschema.ValidationError,
            r"'min_worker' was unexpected",
            id="misspelt-node-type-key",
        ),
        pytest.param(
            _undefined_head_type,
            ValueError,
            r"`head_node_type` must be one of `available_node_types`",
            id="undefined-head-type",
        ),
        # a node offers whole GPUs; fractions belong to a trial's [resources] in the spec
        pytest.param(
            _fractional_node_resources,
            jsonschema.ValidationError,
            r"0\.5 is not of type 'integer'",
            id="fractional-node-gpu",
        ),
        pytest.param(
            _min_workers_above_max,
            ValueError,
            r"smaller than the sum of `min_workers`",
            id="min-workers-above-max",
        ),
    ],
)
def test_a_broken_copy_fails_the_launcher_checks(
    config: Config, breakage: Callable[[Config], None], error: type[Exception], message: str
) -> None:
    breakage(config)
    with pytest.raises(error, match=message):
        launcher_checks(config)


# --- what the project needs from the file ---------------------------------------------------


def test_the_image_is_the_ray_version_of_the_project(config: Config) -> None:
    docker = config["docker"]
    repository, tag = docker["image"].rsplit(":", 1)
    assert repository == "rayproject/ray"
    assert tag == f"{ray.__version__}-py311-gpu"
    assert ray.__version__ == pyproject_pin("ray")
    assert not {"head_image", "worker_image"} & set(docker), "one image for every node"
    assert docker["container_name"]
    assert docker["pull_before_run"] is True


def test_the_head_has_no_gpu_and_runs_no_trial(config: Config) -> None:
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert head["resources"].get("CPU") == 0


def test_one_worker_type_has_one_gpu_and_one_has_several(config: Config) -> None:
    workers = worker_types(config)
    gpus = {name: spec["resources"].get("GPU", 0) for name, spec in workers.items()}
    assert 1 in gpus.values(), gpus
    assert any(n > 1 for n in gpus.values()), gpus


def test_worker_types_declare_their_resources_and_scale_from_zero(config: Config) -> None:
    for name, spec in worker_types(config).items():
        assert {"CPU", "GPU"} <= set(spec["resources"]), name
        assert spec["min_workers"] == 0, name
        assert 0 < spec["max_workers"] <= config["max_workers"], name
    assert config["idle_timeout_minutes"] > 0


def test_every_node_has_an_image_an_instance_type_and_an_instance_profile(config: Config) -> None:
    # node_config goes to EC2 unchecked (a misspelt key there passes the launcher checks):
    # the keys the cluster relies on are checked here
    for name, spec in config["available_node_types"].items():
        node = spec["node_config"]
        assert node["InstanceType"], name
        assert node["ImageId"], name
        assert set(node["IamInstanceProfile"]) & {"Name", "Arn"}, name


def test_setup_installs_pinned_torch_then_the_mounted_project(config: Config) -> None:
    commands: list[str] = config["setup_commands"]
    torch_install = f"pip install torch=={pyproject_pin('torch')}"
    assert torch_install in commands
    project_installs = [c for c in commands if c.startswith("pip install -e ")]
    assert len(project_installs) == 1
    assert commands.index(torch_install) < commands.index(project_installs[0])
    # the editable install points at the directory file_mounts copies the repository to
    (target,) = shlex.split(project_installs[0].removeprefix("pip install -e "))
    target = re.sub(r"\[[^\]]*\]$", "", target).replace("$HOME/", "~/")
    assert config["file_mounts"].get(target) == "."
    assert ".venv" in config["rsync_exclude"]


def test_the_storage_is_an_s3_uri_set_in_exactly_one_place(config: Config, raw_text: str) -> None:
    uri = storage_uri(config)
    parsed = urlparse(uri)
    assert parsed.scheme == "s3"
    assert parsed.netloc and parsed.path.strip("/"), uri
    assert raw_text.count(uri) == 1, "the bucket must appear once in cluster.yaml, where the user edits it"
    assert raw_text.count("s3://") == 1


def test_ray_job_stop_is_a_ctrl_c_for_the_driver(config: Config) -> None:
    # the job supervisor runs on the head and reads these from its environment
    options = [token for option in config["docker"]["head_run_options"] for token in shlex.split(option)]
    assert "RAY_JOB_STOP_SIGNAL=SIGINT" in options
    (wait,) = [o for o in options if o.startswith("RAY_JOB_STOP_WAIT_TIME_S=")]
    assert int(wait.split("=", 1)[1]) >= 30


def test_nothing_opens_ingress_to_the_world(config: Config) -> None:
    for text in strings(config):
        assert "0.0.0.0" not in text, text
        assert "::/0" not in text, text
    rules = config["provider"].get("security_group", {}).get("IpPermissions", [])
    for rule in rules:
        assert all(r.get("CidrIp") != "0.0.0.0/0" for r in rule.get("IpRanges", [])), rule
        assert all(r.get("CidrIpv6") != "::/0" for r in rule.get("Ipv6Ranges", [])), rule
    # the dashboard listens on the head's loopback only: `ray dashboard` tunnels to it over SSH
    (start,) = [c for c in config["head_start_ray_commands"] if "ray start --head" in c]
    assert "--dashboard-host=127.0.0.1" in start
