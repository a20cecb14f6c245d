"""Write the NetCDF4 test file with the NetCDF-C library (netCDF4), and the chlorophyll it decodes, as .npy.

Run as ``python netcdf_writer.py OUT.nc DAYS FIRST_DAY ORACLE.npy`` by tests/labelled/test_dataset.py.
"""

from __future__ import annotations

import sys

import numpy as np


def write_netcdf(path, days, first_day):
    """A NetCDF4 file as the NetCDF-C library writes it: time, lat, lon, a packed 81%-fill variable, strings, a group.

    Returns the chlorophyll as netCDF4 itself decodes it (scaled, fill masked), the oracle.
    """
    # Imported here, not at the top: pytest imports this file for doctests, and netCDF4's own HDF5
    # library, once loaded beside h5py's, breaks hdf5plugin's filters in that process.
    import netCDF4

    rng = np.random.default_rng(first_day)
    with netCDF4.Dataset(path, "w") as f:
        f.title = "ocean colour"
        f.createDimension("time", None)
        f.createDimension("lat", 30)
        f.createDimension("lon", 40)
        time = f.createVariable("time", "f8", ("time",))
        time.units, time.calendar = "days since 2000-01-01", "standard"
        time[:] = np.arange(first_day, first_day + days)
        lat = f.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-60, 60, 30)
        f.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 350, 40)
        chl = f.createVariable(
            "chl", "i2", ("time", "lat", "lon"), fill_value=-32767, chunksizes=(5, 30, 40), zlib=True
        )
        chl.scale_factor, chl.add_offset, chl.units = 0.01, 50.0, "mg m-3"
        values = rng.uniform(0, 100, (days, 30, 40))
        chl[:] = np.ma.masked_array(values, values > 19)  # 81% fill, as in the file users met
        f.createVariable("station", str, ("lat",))[:] = np.array([f"st-{i}" for i in range(30)], dtype=object)
        sub = f.createGroup("instrument")
        sub.createDimension("band", 3)
        sub.createVariable("wavelength", "f8", ("band",))[:] = [443.0, 555.0, 670.0]
    with netCDF4.Dataset(path) as f:
        return np.ma.filled(f["chl"][:].astype("f8"), np.nan)


if __name__ == "__main__":
    out, days, first_day, oracle = sys.argv[1:]
    np.save(oracle, write_netcdf(out, int(days), int(first_day)))
