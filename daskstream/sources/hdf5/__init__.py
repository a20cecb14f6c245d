"""HDF5 datasets (and NetCDF-4 variables): the source, its chunk index, filters, types and linked files.

:mod:`.source` is the Source; :mod:`.chunks` reads the chunk index (checked against the file), :mod:`.filters`
the filters, :mod:`.types` the dtypes, :mod:`.layout` and :mod:`.headers` the storage, :mod:`.datasets` and
:mod:`.objects` what a file holds, :mod:`.linked` the external files, links and virtual datasets it reads.
"""
