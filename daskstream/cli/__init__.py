"""The ``daskstream`` command: a thin layer over the Python API, a module for each command or two.

:mod:`.app` holds the group and its one-line errors, :mod:`.options` the options commands share; importing
each command's module adds it to the group.
"""

from daskstream.cli import clusters, demo_command, info, planning, reductions, stores  # noqa: F401 - registers them
from daskstream.cli.app import main

__all__ = ["main"]
