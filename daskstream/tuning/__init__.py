"""The tuner: measure chunk shapes on this machine, choose the fastest, remember it.

:func:`tune` searches (:mod:`~daskstream.tuning.candidates`, pure), measures
(:mod:`~daskstream.tuning.timing`) and remembers
(:mod:`~daskstream.runtime.remembered`); :mod:`~daskstream.tuning.session_feedback` records
what real computations inside a session showed: it watches every session's
computations from the moment the tuner is imported. Adaptive runs, which try settings on the
computation's own first rows instead of ahead of it, are :mod:`~daskstream.tuning.adaptive`.
"""

from daskstream.runtime.remembered import TuneCache
from daskstream.runtime.session import observe_computations
from daskstream.tuning.result import Candidate, TuneResult
from daskstream.tuning.session_feedback import observation
from daskstream.tuning.tuner import tune

observe_computations(observation)

__all__ = ["Candidate", "TuneCache", "TuneResult", "tune"]
