"""Computations on daskstream arrays: reductions, one-pass statistics, kernels and store."""
