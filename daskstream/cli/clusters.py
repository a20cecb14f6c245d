"""``daskstream cluster check``: a cluster file checked before anything starts."""

from __future__ import annotations

import json
from typing import Any

import click
import yaml

from daskstream.cli.app import main
from daskstream.cli.options import consent_options
from daskstream.runtime.clusters import check_cluster


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases, for people to read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@main.group()
def cluster() -> None:
    """Cluster configuration files (see cluster-configs/)."""


@cluster.command("check")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@consent_options
def cluster_check(file: str, as_json: bool) -> None:
    """Validate a cluster YAML without starting anything, and compare versions with its running cluster.

    Prints the job script or cluster spec the file makes, then the versions of
    daskstream, dask, distributed and numpy on this client, the scheduler and
    the workers where its cluster runs. FILE may also be the address of a running
    scheduler (tcp://host:8786). Where the scheduler or a worker differs from this
    client, the command fails with one line naming them.
    """

    check = check_cluster(file)
    if as_json:
        versions = check.versions.as_dict() if check.versions is not None else None
        click.echo(
            json.dumps(
                {"kind": check.kind, "lines": check.lines, "job_script": check.job_script, "spec": check.spec,
                 "versions": versions},
                default=str,
            )
        )  # fmt: skip
    else:
        for line in check.lines:
            click.echo(line)
        if check.job_script:
            click.echo("\n" + check.job_script)
        if check.spec:
            # Written out in full: a value the spec shares (the scheduler's and workers' resources) is
            # repeated rather than shown as a YAML anchor and alias (&id001, *id001).
            click.echo("\n" + yaml.dump(check.spec, Dumper=_PlainDumper, sort_keys=False).rstrip("\n"))
    if check.versions is not None:
        check.versions.check()  # after the listing, which shows what differs
