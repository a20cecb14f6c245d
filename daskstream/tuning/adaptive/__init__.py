"""Adaptive runs: a reduction, ``describe`` or store that tries settings on its own first rows, then runs the rest
with the winner.

:mod:`~daskstream.tuning.adaptive.trials` says which settings to try, where each runs and which wins (pure);
:mod:`~daskstream.tuning.adaptive.engine` runs the waves, :mod:`~daskstream.tuning.adaptive.reads` reads and
times each; :mod:`~daskstream.tuning.adaptive.reductions` and :mod:`~daskstream.tuning.adaptive.stores` are the
runs ``ds.reduce``, ``ds.describe`` and ``ds.store`` hand ``adaptive=True`` to, and
:mod:`~daskstream.tuning.adaptive.record` is the :class:`Adaptation` each returns.
"""

from daskstream.tuning.adaptive.record import Adaptation
from daskstream.tuning.adaptive.reductions import AdaptiveRun, adaptive_description, adaptive_reduction
from daskstream.tuning.adaptive.stores import adaptive_store

__all__ = ["Adaptation", "AdaptiveRun", "adaptive_description", "adaptive_reduction", "adaptive_store"]
