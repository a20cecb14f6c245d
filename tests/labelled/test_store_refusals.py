"""ds.store of a DataArray or Dataset refuses, before it writes anything, a label xarray would not read back.

The oracle is xarray: what ds.store accepts, ``xr.open_zarr`` gives back identical; what it refuses, xarray's
own ``to_zarr`` does not give back identical either (or refuses), and the target is left as it was: absent.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import warnings

import dask.array as da
import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import daskstream as ds
from daskstream.errors import InvalidArgumentError, UnsupportedDtypeError
from daskstream.sources.metadata import hdf5_attrs, json_ready

xr = pytest.importorskip("xarray")

# Each example writes a store or two; a few dozen of them keep the file well under its time budget.
_EXAMPLES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _array(name="v", dims=("x",), **attrs):
    return xr.DataArray(np.arange(3.0), dims=dims, name=name, attrs=attrs)


def _refused(x, target, error=InvalidArgumentError, **options):
    """The message ds.store refuses ``x`` with, having checked that nothing was written."""
    with pytest.raises(error) as info:
        ds.store(x, target, **options)
    assert not os.path.exists(target.partition("::")[0])
    assert "nothing was written" in str(info.value)
    return str(info.value)


def _refusal(x, target, **options):
    """The message ds.store refused ``x`` with, or ``None`` once it has stored it."""
    try:
        ds.store(x, target, **options)
    except InvalidArgumentError as exc:
        return str(exc)
    return None


def _as_dataset(x):
    return x if isinstance(x, xr.Dataset) else x.to_dataset()


def _xarray_round_trips(x, target, zarr_format):
    """Whether xarray's own to_zarr and open_zarr give ``x`` back identical."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _as_dataset(x).to_zarr(target, zarr_format=zarr_format)
            back = xr.open_zarr(target, zarr_format=zarr_format).compute()
        return back.identical(_as_dataset(x))
    # xarray refuses it, stops half-way, or cannot even compare what it read back.
    except (ValueError, TypeError, OverflowError, KeyError, OSError):
        return False


# ------------------------------------------------------------------------------------------- the reported cases


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_the_reported_bytes_attribute_is_refused_with_nothing_written(tmp_path, zarr_format):
    message = _refused(_array(a=b"\x00\xffabc"), str(tmp_path / "out.zarr"), zarr_format=zarr_format)
    assert "attribute 'a' of the DataArray 'v' is bytes" in message
    assert "value.decode()" in message  # what to do instead


def test_bytes_that_are_utf8_text_are_refused_too_as_xarray_reads_none_back(tmp_path):
    # Zarr's attributes are JSON: b"abc" could only come back as "abc", which is not the bytes given.
    x = _array(a=b"abc")
    assert not _xarray_round_trips(x, str(tmp_path / "xarray.zarr"), 3)  # xarray itself refuses bytes
    assert not xr.DataArray(0, attrs={"a": "abc"}).identical(xr.DataArray(0, attrs={"a": b"abc"}))
    _refused(x, str(tmp_path / "out.zarr"))
    # Decoded, as the message says, it is text, and reads back identical.
    ds.store(_array(a=b"abc".decode()), str(tmp_path / "decoded.zarr"))
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "decoded.zarr")["v"].compute(), _array(a="abc"))


@pytest.mark.parametrize(
    ("x", "target", "named"),
    [
        # The reported case: a DataArray named with a '/' was stored in a group xr.open_zarr does not read.
        (_array(name="a/b"), "out.zarr", "the DataArray 'a/b'"),
        (xr.Dataset({"a/b": _array()}), "out.zarr", "data variable 'a/b'"),
        (_array().assign_coords({"c/d": ("x", [1, 2, 3])}), "out.zarr", "coordinate 'c/d'"),
        # A dimension coordinate is a coordinate: its name is a path in the store.
        (_array(dims=("a/b",)).assign_coords({"a/b": [1, 2, 3]}), "out.zarr", "coordinate 'a/b'"),
        # zarr reads '\' as a separator as well.
        (_array(name="a\\b"), "out.zarr", "the DataArray 'a\\\\b'"),
        # A member given after '::' names a group inside the store, which xr.open_zarr of the store does not read.
        (_array(), "out.zarr::grp/t", "the DataArray 'grp/t'"),
    ],
    ids=["dataarray", "dataset-variable", "coordinate", "dimension-coordinate", "backslash", "member-in-a-group"],
)
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_name_zarr_reads_as_a_path_is_refused(tmp_path, x, target, named, zarr_format):
    message = _refused(x, f"{tmp_path}/{target}", zarr_format=zarr_format)
    assert f"the name of {named} holds '/' or '\\'" in message
    assert "rename it" in message


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_dimension_named_with_a_slash_and_no_coordinate_reads_back(tmp_path, zarr_format):
    # Only a dimension's name: metadata, not a path, so it reads back as it is; not refused.
    x = _array(dims=("a/b",))
    ds.store(x, str(tmp_path / "out.zarr"), zarr_format=zarr_format)
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "out.zarr", zarr_format=zarr_format)["v"].compute(), x)


# zarr's notice that fixed-width text has no format 3 specification yet: the advice is followed all the same.
@pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification")
@pytest.mark.parametrize("target", ["out.zarr", "out.h5::/t"])
@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_an_object_dtype_array_is_refused_with_advice_and_the_advice_works(tmp_path, target, lazy):
    values = np.array(["a", "bb", "ccc"], dtype=object)
    x = xr.DataArray(da.from_array(values, chunks=2) if lazy else values, dims="x", name="v")
    message = _refused(x, f"{tmp_path}/{target}", UnsupportedDtypeError)
    assert "has dtype object" in message
    assert ".astype('U16')" in message
    if target == "out.zarr":
        fixed = x.astype("U16")
        ds.store(fixed, f"{tmp_path}/{target}")
        xr.testing.assert_identical(xr.open_zarr(tmp_path / "out.zarr")["v"].compute(), fixed.compute())


def test_an_object_dtype_coordinate_is_written_by_xarray_and_reads_back(tmp_path):
    # Coordinates are written by xarray, which stores variable-length text: not refused.
    x = _array().assign_coords(label=("x", np.array(["a", "bb", "ccc"], dtype=object)))
    ds.store(x, str(tmp_path / "out.zarr"))
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "out.zarr")["v"].compute(), x)


# ---------------------------------------------------------------------------------------- the rest of the class

_TIMES = np.array(["2000-01-01", "2000-01-02", "2000-01-03"], dtype="M8[ns]")


@pytest.mark.parametrize(
    ("x", "zarr_format", "said"),
    [
        # Names that are not text would read back as their str.
        (_array(name=1), 3, "the name of the DataArray 1 is of type int"),
        (_array(dims=(1,)), 3, "the dimension name 1 is of type int"),
        # Names that are no path, or are Zarr's own metadata in that format.
        (_array(name=""), 3, "is empty"),
        (_array(name=".."), 3, "is a path segment"),
        (_array(name="a\x00b"), 3, "holds a NUL character"),
        (_array(name=".zattrs"), 2, "Zarr's own metadata document (format 2)"),
        (_array(name="zarr.json"), 3, "Zarr's own metadata document (format 3)"),
        # Format 2 writes no dimension names unless all have one.
        (_array(dims=("",)), 2, "the dimension name '' is empty"),
        # A non-dimension coordinate is listed in a whitespace-separated "coordinates" attribute.
        (_array().assign_coords({"c d": ("x", [1, 2, 3])}), 3, "coordinate 'c d' holds whitespace"),
        # A DataArray named as one of its coordinates would be written over by it.
        (_array(name="x").assign_coords(x=[1, 2, 3]), 3, "is also the name of one of its coordinates"),
    ],
    ids=["int-name", "int-dimension", "empty", "dotdot", "nul", "zattrs", "zarr-json", "empty-dim-v2", "space", "same"],
)
def test_other_names_that_would_not_read_back_are_refused(tmp_path, x, zarr_format, said):
    assert said in _refused(x, str(tmp_path / "out.zarr"), zarr_format=zarr_format)


@pytest.mark.parametrize(
    ("x", "zarr_format", "said"),
    [
        # CF encoding: xarray decodes the values with these and keeps them in .encoding, not in .attrs.
        (_array(scale_factor=2.0), 3, "the DataArray 'v' has the attribute 'scale_factor'"),
        (_array(units="days since 2000-01-01"), 3, "has the attribute 'units', which xarray reads as CF"),
        (_array(_FillValue=1.0), 3, "has the attribute '_FillValue'"),
        (_array(missing_value=1.0, add_offset=1.0), 2, "has the attributes 'missing_value', 'add_offset'"),
        (xr.DataArray(np.arange(3, dtype="i1"), dims="x", name="v", attrs={"_Unsigned": "true"}), 3, "'_Unsigned'"),
        (_array(dtype="bool"), 3, "has the attribute 'dtype'"),
        # Time units xarray cannot decode: xr.open_zarr would fail.
        (_array(units="days since never"), 3, "unable to decode time units"),
        # A time coordinate's units are xarray's to write: it would stop half-way, the data already written.
        (
            _array(dims=("time",)).assign_coords(time=("time", _TIMES, {"units": "days since 2000-01-01"})),
            3,
            "coordinate 'time' would not be written or read back by xarray",
        ),
        # Attributes xarray reads as its own bookkeeping.
        (_array(coordinates="x"), 3, "the attribute 'coordinates' of the DataArray 'v' is one that xarray reads"),
        (xr.Dataset({"v": _array()}, attrs={"coordinates": "v"}), 3, "the attribute 'coordinates' of the Dataset"),
        (_array(_ARRAY_DIMENSIONS=["y"]), 2, "'_ARRAY_DIMENSIONS' of the DataArray 'v' is one that xarray reads"),
    ],
    ids=[
        "scale_factor",
        "time-units",
        "fill-value",
        "missing-and-offset-v2",
        "unsigned",
        "dtype-bool",
        "bad-time-units",
        "time-coordinate-units",
        "coordinates",
        "dataset-coordinates",
        "array-dimensions-v2",
    ],
)
def test_attributes_xarray_reads_as_encoding_or_bookkeeping_are_refused(tmp_path, x, zarr_format, said):
    assert said in _refused(x, str(tmp_path / "out.zarr"), zarr_format=zarr_format)
    assert not _xarray_round_trips(x, str(tmp_path / "xarray.zarr"), zarr_format)  # xarray agrees


@pytest.mark.parametrize("target", ["out.zarr", "out.h5::/t"])
def test_a_refusal_leaves_an_existing_target_as_it_was(tmp_path, target):
    # Refused before the target is opened: overwrite=True deletes nothing.
    ds.store(_array(), f"{tmp_path}/{target}")
    with pytest.raises(InvalidArgumentError, match="is bytes"):
        ds.store(_array(a=b"K"), f"{tmp_path}/{target}", overwrite=True)
    if target == "out.zarr":
        xr.testing.assert_identical(xr.open_zarr(tmp_path / target)["v"].compute(), _array())
    else:
        with h5py.File(tmp_path / "out.h5", "r") as f:
            np.testing.assert_array_equal(f["t"][...], _array().values)
            assert "a" not in f["t"].attrs


def test_an_attribute_deep_inside_a_coordinate_is_named_by_where_it_is(tmp_path):
    x = _array().assign_coords(x=("x", [1, 2, 3], {"range": {"low": [0, b"\xff"]}}))
    message = _refused(x, str(tmp_path / "out.zarr"))
    assert "the attribute 'range' of coordinate 'x', at ['low'][1], is bytes" in message


def test_a_zarr_3_dimension_may_be_unnamed_text_that_format_2_refuses(tmp_path):
    # Format 3's dimension_names keep an empty name (only format 2 and HDF5 take it for none).
    x = _array(dims=("",))
    ds.store(x, str(tmp_path / "out.zarr"), zarr_format=3)
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "out.zarr")["v"].compute(), x)


# --------------------------------------------------------------------------- any attribute: stored or refused


def _object_array(items):
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


_SCALARS = st.one_of(
    st.text(max_size=4),
    st.binary(max_size=3),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.complex_numbers(max_magnitude=10),
    st.sampled_from(["i1", "u8", "f2", "f4", "f8", "?", "c8", "U2", "S2"]).flatmap(
        lambda dtype: hnp.from_dtype(np.dtype(dtype))
    ),
    st.sampled_from(
        [np.longdouble(1.5), np.datetime64("2000-01-01"), np.timedelta64(3, "s"), datetime.date(2000, 1, 1)]
    ),
    hnp.arrays(
        st.sampled_from(["i4", "u2", "f4", "f8", "?", "U2", "S2", "c16", "M8[s]"]),
        hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
    ),
    st.lists(st.one_of(st.text(max_size=2), st.integers(-3, 3)), min_size=1, max_size=3).map(_object_array),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 3)), inner, max_size=3),
    ),
    max_leaves=6,
)


def _holding(value, where):
    """A DataArray or Dataset whose attribute "a" is ``value``, on the data, a coordinate or the Dataset."""
    x = _array().assign_coords(x=("x", [10, 20, 30]))
    if where == "data":
        return x.assign_attrs(a=value)
    if where == "coordinate":
        return x.assign_coords(x=("x", [10, 20, 30], {"a": value}))
    return x.to_dataset().assign_attrs(a=value)


@_EXAMPLES
@given(value=_VALUES, where=st.sampled_from(["data", "coordinate", "dataset"]), zarr_format=st.sampled_from([2, 3]))
def test_any_attribute_reads_back_identical_or_is_refused_as_xarray_would_not_read_it_back(value, where, zarr_format):
    x = _holding(value, where)
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "out.zarr")
        refused = _refusal(x, target, zarr_format=zarr_format)
        if refused is None:
            back = xr.open_zarr(target, zarr_format=zarr_format).compute()
            xr.testing.assert_identical(back, _as_dataset(x))
        else:
            assert not os.path.exists(target)
            assert "the attribute 'a' of " in refused
            # Refused only what xarray's own writer and reader do not give back identical either.
            assert not _xarray_round_trips(x, os.path.join(tmp, "xarray.zarr"), zarr_format)


_NAMES = st.one_of(
    st.text(alphabet="ab/\\. \x00é_", max_size=3),
    st.sampled_from([".", "..", ".zattrs", ".zarray", "zarr.json", "__xarray_dataarray_variable__"]),
)


@_EXAMPLES
@given(
    variable=_NAMES,
    coordinate=_NAMES,
    dimension=_NAMES,
    indexed=st.booleans(),
    zarr_format=st.sampled_from([2, 3]),
)
def test_any_names_read_back_identical_or_are_refused_with_nothing_written(
    variable, coordinate, dimension, indexed, zarr_format
):
    # A data variable, a non-dimension coordinate and a dimension (with its own coordinate, or none).
    if len({variable, coordinate, dimension}) < 3:
        return  # xarray holds one variable per name, and makes a variable named as its dimension a coordinate
    x = xr.Dataset({variable: ((dimension,), np.arange(3.0))}, coords={coordinate: ((dimension,), [1, 2, 3])})
    if indexed:
        x = x.assign_coords({dimension: [10, 20, 30]})
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "out.zarr")
        refused = _refusal(x, target, zarr_format=zarr_format)
        if refused is None:
            xr.testing.assert_identical(xr.open_zarr(target, zarr_format=zarr_format).compute(), x)
        else:
            assert not os.path.exists(target)
            assert "name" in refused


# --------------------------------------------------------------------------------------------------- HDF5 too


@pytest.mark.parametrize(
    ("x", "said"),
    [
        (_array(a=b"\x00\xffabc"), "the attribute 'a' of the DataArray is bytes"),
        (_array(a="a\x00b"), "holds a NUL character, which ends an HDF5 string"),
        (_array(a="a" + chr(0xD800)), "is not valid text"),
        (_array(a=2**70), "an int wider than 64 bits"),
        (_array(a=np.datetime64("2000-01-01")), "is a time"),
        (xr.DataArray(np.arange(3.0), dims="x", attrs={"": 1}), "has an empty name"),
        (xr.DataArray(np.arange(3.0), dims="x", attrs={1: 1}), "has a name of type int"),
        (_array(CLASS="x"), "HDF5 dimension scales or daskstream's store records keep for themselves"),
        (_array(dims=(1,)), "the dimension name 1 is of type int"),
    ],
    ids=["bytes", "nul", "surrogate", "wide-int", "time", "empty-key", "int-key", "bookkeeping", "int-dimension"],
)
def test_an_hdf5_target_refuses_what_it_would_not_read_back_with_nothing_written(tmp_path, x, said):
    assert said in _refused(x, f"{tmp_path / 'out.h5'}::/t")


_HDF5_VALUES = st.recursive(
    st.one_of(st.text(max_size=4), st.integers(), st.floats(), st.booleans(), st.none(), st.binary(max_size=2)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=2)),
    max_leaves=5,
) | st.complex_numbers(max_magnitude=10)


@_EXAMPLES
@given(value=_HDF5_VALUES)
def test_any_hdf5_attribute_reads_back_equal_or_as_its_json_text_or_is_refused(value):
    x = _array(a=value)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.h5")
        refused = _refusal(x, f"{path}::/t")
        if refused is not None:
            assert not os.path.exists(path)
            assert "the attribute 'a' of the DataArray" in refused
            return
        with h5py.File(path, "r") as f:
            back = hdf5_attrs(f["t"])["a"]
            assert [dim.label for dim in f["t"].dims] == ["x"]
    if isinstance(back, str) and not isinstance(value, str):
        # Mappings, None and lists numpy cannot hold item for item are kept as their JSON text.
        assert back == json.dumps(json_ready(value))
    else:
        xr.testing.assert_identical(xr.DataArray(0, attrs={"a": back}), xr.DataArray(0, attrs={"a": value}))


def test_an_hdf5_target_keeps_lists_of_text(tmp_path):
    # A list of str was an array of numpy text, which h5py has no type for: it failed with the file half made.
    ds.store(_array(flags=["low", "high"], mixed=[1, "K"]), f"{tmp_path / 'out.h5'}::/t")
    with h5py.File(tmp_path / "out.h5", "r") as f:
        attrs = hdf5_attrs(f["t"])
    assert attrs["flags"].tolist() == ["low", "high"]
    assert attrs["mixed"] == '[1, "K"]'
