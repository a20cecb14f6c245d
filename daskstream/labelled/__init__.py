"""Labelled data: files as ``xarray`` Datasets whose variables daskstream plans, and xarray's ``engine="daskstream"``.

xarray is optional (``pip install 'daskstream[xarray]'``) and imported only
when these are used.
"""

from daskstream.labelled.dataset import open_dataset

__all__ = ["open_dataset"]
