"""Compiled single-pass kernels (numba), used where numpy would take several passes.

Imported only when numba is installed (``pip install 'daskstream[fast]'``);
callers fall back to numpy otherwise, with the same results.
"""

from __future__ import annotations

import numba
import numpy as np

# Reassociation lets LLVM split each sum into SIMD lanes: the loop then runs at memory speed.
# NaN and inf are not assumed away ("nnan"/"ninf" stay off): callers check the sums for them.
_FAST_MATH = {"reassoc", "contract"}


@numba.njit(fastmath=_FAST_MATH, nogil=True, cache=True)
def shifted_sums(flat: np.ndarray, shift: float) -> tuple[float, float]:
    """``sum(x - shift)`` and ``sum((x - shift) ** 2)`` in float64, in one pass, without the GIL."""
    total = 0.0
    squares = 0.0
    for i in range(flat.size):
        deviation = np.float64(flat[i]) - shift
        total += deviation
        squares += deviation * deviation
    return total, squares
