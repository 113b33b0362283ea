"""The verbs about a spec rather than a study: ``check`` (what running it would do), ``schema``
(its JSON Schema) and ``slurm`` (a batch script that runs it), none of which starts Ray."""

from __future__ import annotations

import argparse

from study.cli.base import Command, WordsCommand, add_storage, refusing
from study.spec.spec import SpecError

__all__ = ["Check", "Schema", "Slurm"]


class Check(Command):
    """``check``: a spec validated and what `run` would do with it, without Ray."""

    name = "check"
    help = "validate a spec and say what running it would do (no Ray)"
    description = (
        "Validate a spec without starting Ray and print what `run` would do: the search "
        "space, the trial count, the budget in trial-iterations, resources, trials at once, where the "
        "results go, and a wall-time estimate from a few iterations timed on this machine."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("spec", help="a shipped spec or a path to a .toml file")
        add_storage(parser, from_spec=True)
        parser.add_argument(
            "--no-estimate", action="store_true", help="skip timing a few training iterations (no torch)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from study.spec.check import check_spec

        with refusing(SpecError):
            print(check_spec(args.spec, args.storage, estimate=not args.no_estimate))
        return 0


class Slurm(WordsCommand):
    """``slurm``: its own parser and checks (`study.launchers.slurm`), on a login node: no Ray, no torch."""

    name = "slurm"
    help = "write a Slurm batch script for a study and submit it with sbatch (docs/slurm.md)"
    description = (
        "Write a Slurm batch script that runs a study on the allocation's nodes (a Ray "
        "head on the first, a worker on each other) and submit it with sbatch; with --requeue the "
        "study goes on over as many allocations as it needs (docs/slurm.md)."
    )
    add_help = False  # `slurm --help` is study.launchers.slurm's own

    def run_words(self, words: list[str]) -> int:
        from study.launchers.slurm import main as slurm_main

        return slurm_main(words)


class Schema(Command):
    """``schema``: the JSON Schema of a spec's TOML, for editors."""

    name = "schema"
    help = "print the JSON Schema of a spec (for editors: taplo, Even Better TOML)"
    description = (
        "Print the JSON Schema of a spec's TOML, generated from the spec's models; the "
        "shipped copy is study/spec/specs/spec.schema.json, which every shipped spec names on its first "
        "line (#:schema ./spec.schema.json)."
    )

    def run(self, args: argparse.Namespace) -> int:
        from study.spec.spec import schema_text

        print(schema_text(), end="")
        return 0
