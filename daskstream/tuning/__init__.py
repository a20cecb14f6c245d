"""The adaptive tuner: measure chunk shapes on this machine, choose the fastest, remember it.

:func:`tune` searches (:mod:`~daskstream.tuning.search`, pure), measures
(:mod:`~daskstream.tuning.measure`) and remembers
(:mod:`~daskstream.runtime.tune_cache`); :mod:`~daskstream.tuning.feedback` records
what real computations inside a session showed: it watches every session's
computations from the moment the tuner is imported.
"""

from daskstream.runtime.session import observe_computations
from daskstream.runtime.tune_cache import TuneCache
from daskstream.tuning.feedback import observation
from daskstream.tuning.result import Candidate, TuneResult
from daskstream.tuning.tuner import tune

observe_computations(observation)

__all__ = ["Candidate", "TuneCache", "TuneResult", "tune"]
