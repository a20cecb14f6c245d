"""Tasks that stream: many blocks or storage chunks computed one after another inside one task.

:mod:`~daskstream.compute.streaming.chains` runs groups of a block's chains
of tasks inside one task; :mod:`~daskstream.compute.streaming.folds` has a
reduction's combines compute their blocks themselves, before dask builds
them; :mod:`~daskstream.compute.streaming.spans`,
:mod:`~daskstream.compute.streaming.span_steps` and
:mod:`~daskstream.compute.streaming.span_graphs` stream the storage chunks
of a span; :mod:`~daskstream.compute.streaming.optimizer` puts them together
as dask's array optimizer.
"""
