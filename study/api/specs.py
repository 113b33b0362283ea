"""What the API takes where the CLI takes words: a spec in any of four forms, a storage given or
read from ``$PONDER_STUDY_STORAGE``, each checked as the CLI checks them (a bad one raises before
Ray starts and before anything is written); and `check`, ``ponder-study check`` as data."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from study.spec.spec import SpecError, StudySpec, load_spec, parse_spec, to_toml
from study.storage.hints import STORAGE_ENV
from study.storage.storage import StorageError, check_reachable, check_writable, expand_storage

if TYPE_CHECKING:
    from study.spec.check import Check

__all__ = ["SpecLike", "StorageLike", "check", "check_storage", "given_storage", "study_spec"]

SpecLike = str | os.PathLike[str] | Mapping[str, Any] | StudySpec
"""A spec as the API takes it: a shipped spec's name (``"parity-smoke"``), the path of a
``.toml`` file, a dict with the TOML's structure, or a `StudySpec`."""
StorageLike = str | os.PathLike[str]
"""A storage: a local folder, or a URI (``s3://bucket/prefix``, ``file:///mnt/nfs/...``)."""


def study_spec(
    spec: SpecLike,
    *,
    name: str | None = None,
    num_samples: int | None = None,
    storage: StorageLike | None = None,
) -> StudySpec:
    """``spec`` validated in full, with ``name``, ``num_samples`` and ``storage`` (else
    ``$PONDER_STUDY_STORAGE``) over its own; `SpecError` naming the key and the fix for a bad one,
    `StorageError` for a storage that cannot be a path or URI."""
    if isinstance(spec, StudySpec):
        base = spec
    elif isinstance(spec, Mapping):
        base = _from_dict(spec, name)
    elif isinstance(spec, os.PathLike):
        path = os.fspath(spec)
        base = load_spec(path if "/" in path or path.endswith(".toml") else f"./{path}")  # a path, not a name
    elif isinstance(spec, str):
        base = load_spec(spec)
    else:
        raise SpecError(
            f"spec: a {type(spec).__name__} is not a spec; give a shipped spec's name, the path of a .toml "
            "file, a dict with the TOML's structure, or a StudySpec",
            "spec",
        )
    if num_samples is not None and (not _is_int(num_samples) or num_samples < 1):
        raise SpecError(f"num_samples must be a positive integer, got {num_samples!r}", "num_samples")
    return base.with_overrides(name=name, num_samples=num_samples, storage=given_storage(storage))


def _from_dict(doc: Mapping[str, Any], name: str | None) -> StudySpec:
    """A spec from a dict shaped as its TOML (``{"task": "parity", "space": {"lambda_p": {...}}}``)."""
    if name is None:
        raise SpecError(
            "name: a spec given as a dict has no file name to take the study's name from; pass name=...",
            "name",
        )
    try:
        text = to_toml(doc)
    except TypeError as e:  # a value TOML cannot hold
        raise SpecError(f"spec: {e}; a spec holds TOML values (str, int, float, bool, list, dict)") from None
    return parse_spec(text, name, origin=f"the dict given for {name!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def given_storage(storage: StorageLike | None) -> str | None:
    """``storage``, else ``$PONDER_STUDY_STORAGE``, with ``~`` and ``$VARS`` expanded as the CLI's
    ``--storage`` is; None when neither says (the spec's, or ``results``, then)."""
    value = os.fspath(storage) if storage is not None else os.environ.get(STORAGE_ENV, "").strip() or None
    if value is None:
        return None
    if not value.strip():
        raise StorageError("storage must not be empty; give a folder or a URI (s3://bucket/prefix)")
    return expand_storage(value)


def check_storage(storage: str, write: bool = False) -> None:
    """`StorageError` for a storage that cannot be reached (or, with ``write``, written)."""
    check_reachable(storage)
    if write:
        check_writable(storage)


def check(
    spec: SpecLike,
    *,
    name: str | None = None,
    num_samples: int | None = None,
    storage: StorageLike | None = None,
    estimate: bool = True,
) -> Check:
    """What `study.run` would do with ``spec`` (and these overrides), without Ray: the trials, the
    budget, the resources, trials at once here, where the results go, a wall-time estimate and a
    fused group's memory (``estimate``: a few training iterations timed here, with torch).

    Returns a `Check`, whose ``str`` is what ``ponder-study check`` prints. Raises `SpecError`
    (naming the key and the fix) or `StorageError` for bad input."""
    from study.spec.check import check as checked

    return checked(study_spec(spec, name=name, num_samples=num_samples, storage=storage), estimate=estimate)
