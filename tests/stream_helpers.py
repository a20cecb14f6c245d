"""Data the training-loop tests (streams, PyTorch, tf.data, resuming) share; their files: conftest's ``arrays``."""

from __future__ import annotations

import numpy as np

N, WIDTH = 3001, 8


def indexed(n: int = N, width: int = WIDTH) -> np.ndarray:
    """Rows whose first column is their index, so every item can be told apart."""
    data = np.random.default_rng(0).standard_normal((n, width)).astype("f4")
    data[:, 0] = np.arange(n)
    return data
