"""Zarr arrays, v2 and v3, in folders, zip files and object stores: the source, its chunk reads and checks.

:mod:`.source` is the Source; :mod:`.nodes` says what a folder or prefix holds, :mod:`.chunks` and
:mod:`.shards` read chunks and shards in part, :mod:`.codecs` decodes them within bounds, :mod:`.checks`,
:mod:`.bounds` and :mod:`.digests` check metadata and stamps, :mod:`.files` lists a store's files.
"""
