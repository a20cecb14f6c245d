"""Batches for training loops: storage-aligned reads ahead of the loop, shuffled in bounded windows.

:func:`stream` makes a :class:`Stream` (:mod:`~daskstream.streaming.streams`),
which is split and ordered by :mod:`~daskstream.streaming.plan` (its inputs in
:mod:`~daskstream.streaming.inputs`, an elastic epoch in
:mod:`~daskstream.streaming.elastic`), read ahead by
:mod:`~daskstream.streaming.readers` (batches cut by
:mod:`~daskstream.streaming.batches`), resumed by
:mod:`~daskstream.streaming.checkpoints` and shown by
:mod:`~daskstream.streaming.view`.
"""

from daskstream.streaming.streams import Stream, stream

__all__ = ["Stream", "stream"]
