"""The ``daskstream`` command: a thin layer over the Python API, a module for each command or two.

:mod:`.app` holds the group and its one-line errors, :mod:`.options` the options commands share,
:mod:`.running` the one path a computing command takes (open in its session, compute, measure) and
:mod:`.output` how results are printed and written; importing each command's module adds it to the group.
"""

from daskstream.cli import clusters, demo_command, info, planning, reductions, stores  # noqa: F401 - registers them
from daskstream.cli.app import main

__all__ = ["main"]
