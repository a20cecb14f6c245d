"""The adaptive tuner: measure chunk shapes on this machine, choose the fastest, remember it.

:func:`tune` searches (:mod:`~daskstream.tuning.search`, pure), measures
(:mod:`~daskstream.tuning.measure`) and remembers
(:mod:`~daskstream.tuning.cache`); :mod:`~daskstream.tuning.feedback` records
what real computations inside a session showed.
"""

from daskstream.tuning.cache import TuneCache
from daskstream.tuning.result import Candidate, TuneResult
from daskstream.tuning.tuner import tune

__all__ = ["Candidate", "TuneCache", "TuneResult", "tune"]
