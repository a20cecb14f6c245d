"""Configuration: defaults in one YAML file, documented in the schema, overridable the dask way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import yaml

import daskstream as ds
from daskstream import config
from daskstream.errors import InvalidArgumentError
from daskstream.runtime.resources import resources_for

PACKAGE = Path(ds.__file__).parent


def _keys(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _schema_keys(node, prefix=""):
    for key, value in node.get("properties", {}).items():
        if value.get("type") == "object":
            yield from _schema_keys(value, f"{prefix}{key}.")
        else:
            assert value.get("description"), f"{prefix}{key} has no description"
            yield f"{prefix}{key}"


def test_every_default_is_documented_in_the_schema():
    defaults = yaml.safe_load((PACKAGE / "daskstream.yaml").read_text())
    schema = yaml.safe_load((PACKAGE / "daskstream-schema.yaml").read_text())
    assert set(_keys(defaults)) == set(_schema_keys(schema))


def test_defaults_are_registered_with_dask():
    assert dask.config.get("daskstream.memory-budget") == "auto"
    assert dask.config.get("daskstream.planning.working-set-factor") == "auto"
    assert dask.config.get("daskstream.planning.float64-copies") == 3


def test_config_budget_is_used_and_an_argument_wins():
    with dask.config.set({"daskstream.memory-budget": "48MiB"}):
        assert ds.plan_chunks((1000,), "f4", threads=1, workers=1).memory_budget == 48 * 2**20
        assert ds.plan_chunks((1000,), "f4", threads=1, workers=1, memory_budget="1GiB").memory_budget == 2**30


def test_an_array_is_computed_for_the_budget_it_was_opened_with_over_the_setting_and_an_argument_wins(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((100, 10)))
    x = ds.open(tmp_path / "a.npy", memory_budget="64MiB")
    with dask.config.set({"daskstream.memory-budget": "48MiB"}):
        assert resources_for(x.sum()).memory_budget == 64 * 2**20
        assert ds.plan_compute(x.sum()).budget == 64 * 2**20
        assert ds.plan_compute(x.sum(), memory_budget="1GiB").budget == 2**30
        # What daskstream did not open follows the setting.
        assert resources_for(da.ones(10), np.ones(3), "a path").memory_budget == 48 * 2**20
        # Of several arrays, the smallest budget any was opened with.
        y = ds.open(tmp_path / "a.npy", memory_budget="32MiB")
        assert resources_for(x, y).memory_budget == 32 * 2**20


def test_environment_variable_sets_the_budget():
    env = {**os.environ, "DASK_DASKSTREAM__MEMORY_BUDGET": "96MiB"}
    code = "import daskstream as ds; print(ds.plan_chunks((10,), 'f4', threads=1, workers=1).memory_budget)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(96 * 2**20)


def test_machine_default_budget_is_a_share_of_total_memory_not_of_what_is_free():
    import psutil

    from daskstream.runtime.resources import total_memory

    plan = ds.plan_chunks((10,), "f4", threads=1, workers=1)
    assert plan.memory_budget == int(total_memory() * 0.5)
    assert total_memory() <= psutil.virtual_memory().total


def test_cluster_config_file_sets_the_budget(repo_root):
    env = {**os.environ, "DASK_CONFIG": str(repo_root / "cluster-configs" / "local.yaml")}
    code = "import daskstream as ds; print(ds.plan_chunks((10,), 'f4', threads=1, workers=1).memory_budget)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(2 * 2**30)


def test_the_defaults_file_validates_against_the_schema():
    # With jsonschema, as dask checks its own dask.yaml against dask-schema.yaml.
    import jsonschema

    schema = yaml.safe_load((PACKAGE / "daskstream-schema.yaml").read_text())
    defaults = yaml.safe_load((PACKAGE / "daskstream.yaml").read_text())
    jsonschema.validate(defaults, schema)
    config.check_section(defaults["daskstream"], where="daskstream.yaml")


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"planning": {"max-tasks": 0}}, "daskstream.planning.max-tasks is 0, which is less than the minimum of 1"),
        ({"memory-budget": 3.5}, "daskstream.memory-budget is 3.5"),
        ({"planning": {"machine-memory-fraction": "half"}}, "daskstream.planning.machine-memory-fraction"),
    ],
)
def test_a_cluster_files_daskstream_settings_are_checked_against_the_same_schema(tmp_path, section, named):
    from daskstream.runtime.clusters import load_cluster_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"daskstream": {"cluster": "local", **section}}))
    with pytest.raises(InvalidArgumentError) as caught:
        load_cluster_config(path)
    assert str(caught.value).startswith(f"cluster configuration {path}: {named}")


def test_every_default_is_of_the_type_its_schema_names():
    from daskstream import config

    defaults = yaml.safe_load((PACKAGE / "daskstream.yaml").read_text())
    for key in _keys(defaults["daskstream"]):
        config.setting(key)  # raises for a default outside its own schema


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tune.batches", "many", "must be a whole number"),
        ("tune.batches", 0, "must be at least 1"),
        ("planning.machine-memory-fraction", 1.5, "must be more than 0, at most 1"),
        ("planning.max-tasks", True, "must be 'auto' or a whole number"),
        ("planning.max-tasks", "many", "must be 'auto' or a whole number"),
        ("sources.max-open-files", "inf", "must be a whole number"),
        ("tune.feedback", "sometimes", "must be true or false"),
    ],
)
def test_a_setting_of_the_wrong_type_is_one_clear_error_naming_it(key, value, message):
    from daskstream import config
    from daskstream.errors import InvalidArgumentError

    variable = "DASK_DASKSTREAM__" + key.upper().replace(".", "__").replace("-", "_")
    with dask.config.set({f"daskstream.{key}": value}), pytest.raises(InvalidArgumentError) as info:
        config.setting(key)
    assert f"daskstream.{key} is {value!r}, which {message}" in str(info.value)
    assert variable in str(info.value)


def test_numbers_written_as_text_are_read_as_numbers():
    from daskstream import config

    with dask.config.set({"daskstream.tune.batches": "7", "daskstream.tune.min-gain": "0.25"}):
        assert config.setting("tune.batches") == 7
        assert config.setting("tune.min-gain") == 0.25
