"""Dask graphs over sources: reading them as arrays, describing a graph's layers, and rewriting it
so that a whole computation keeps its memory budget.

This layer builds and transforms graphs; it never decides where they run. What
a graph is planned for (the budget and threads) is recorded in it where its
arrays are opened (:func:`daskstream.graph.layers.record_plan`).
"""
