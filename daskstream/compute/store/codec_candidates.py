"""The codecs ``store(..., codec="auto")`` chooses among, as Zarr (v2 and v3) and HDF5 name them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from daskstream import dependencies


@dataclass(frozen=True)
class Candidate:
    """One codec and its settings, as Zarr and HDF5 name it."""

    name: str
    family: str
    level: int = 0
    cname: str = ""
    shuffle: str = "noshuffle"

    @property
    def variant(self) -> str:
        """What else makes it another codec than its family and level say (blosc's compressor and shuffle)."""
        return f"{self.cname} {self.shuffle}" if self.family == "blosc" else ""

    @property
    def label(self) -> str:
        if self.family == "none":
            return "no compression"
        if self.family == "blosc":
            return f"blosc {self.cname} {self.level} + {self.shuffle.replace('shuffle', ' shuffle').strip()}"
        if self.family == "gzip+shuffle":
            return f"gzip {self.level} + shuffle"
        return f"{self.family} {self.level}"

    def zarr_compressor(self, zarr_format: int) -> Any:
        """The compressor ``store`` takes for a Zarr array of ``zarr_format``."""
        if self.family == "none":
            return None
        if zarr_format == 2:
            import numcodecs

            shuffles = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
            return {
                "zstd": lambda: numcodecs.Zstd(level=self.level),
                "gzip": lambda: numcodecs.GZip(level=self.level),
                "blosc": lambda: numcodecs.Blosc(cname=self.cname, clevel=self.level, shuffle=shuffles[self.shuffle]),
            }[self.family]()
        from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

        return {
            "zstd": lambda: ZstdCodec(level=self.level),
            "gzip": lambda: GzipCodec(level=self.level),
            "blosc": lambda: BloscCodec(cname=self.cname, clevel=self.level, shuffle=self.shuffle),  # type: ignore[arg-type]
        }[self.family]()

    def hdf5_compressor(self) -> Any:
        """The compressor ``store`` takes for an HDF5 dataset (an ``hdf5plugin`` filter for zstd and blosc)."""
        if self.family == "none":
            return None
        if self.family == "gzip+shuffle":
            return {"compression": "gzip", "compression_opts": self.level, "shuffle": True}
        hdf5plugin = dependencies.optional_import(
            "hdf5plugin", package="hdf5plugin", extra="hdf5plugin", needed_for=f"{self.label} in an HDF5 target"
        )
        if self.family == "zstd":
            return hdf5plugin.Zstd(clevel=self.level)
        shuffles = {"noshuffle": hdf5plugin.Blosc.NOSHUFFLE, "shuffle": hdf5plugin.Blosc.SHUFFLE,
                    "bitshuffle": hdf5plugin.Blosc.BITSHUFFLE}  # fmt: skip
        return hdf5plugin.Blosc(cname=self.cname, clevel=self.level, shuffle=shuffles[self.shuffle])


_ZARR_CANDIDATES = (
    Candidate("none", "none"),
    Candidate("blosc-lz4-shuffle", "blosc", 5, "lz4", "shuffle"),
    Candidate("blosc-lz4-bitshuffle", "blosc", 5, "lz4", "bitshuffle"),
    Candidate("blosc-zstd-bitshuffle", "blosc", 1, "zstd", "bitshuffle"),
    Candidate("zstd-1", "zstd", 1),
    Candidate("zstd-3", "zstd", 3),
    Candidate("zstd-9", "zstd", 9),
    Candidate("gzip-1", "gzip", 1),
)

_HDF5_CANDIDATES = (
    Candidate("none", "none"),
    Candidate("gzip-1", "gzip+shuffle", 1),
    Candidate("gzip-4", "gzip+shuffle", 4),
)

# With hdf5plugin installed; h5py encodes these in the writing process only (not in the tasks).
_HDF5_PLUGIN_CANDIDATES = (
    Candidate("blosc-lz4-bitshuffle", "blosc", 5, "lz4", "bitshuffle"),
    Candidate("zstd-1", "zstd", 1),
    Candidate("zstd-3", "zstd", 3),
)


def _candidates(target_format: str) -> tuple[Candidate, ...]:
    if target_format == "zarr":
        return _ZARR_CANDIDATES
    try:
        import hdf5plugin  # noqa: F401 - only whether it is there
    except ImportError:
        return _HDF5_CANDIDATES
    return _HDF5_CANDIDATES + _HDF5_PLUGIN_CANDIDATES


__all__ = ["Candidate"]
