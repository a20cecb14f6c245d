"""Reading YAML settings files: plain data, bounded, and one clear line for every file that is not."""

from __future__ import annotations

import os

import pytest

from daskstream.documents import MAX_BYTES, read_yaml
from daskstream.errors import ConfigFileNotFoundError, DaskstreamError, InvalidArgumentError, SourcePermissionError


def _write(tmp_path, text, name="settings.yaml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_plain_settings_read_as_yaml_safe_load_would(tmp_path):
    path = _write(
        tmp_path,
        "base: &base {target: 0.6, spill: 0.7}\n"
        "worker:\n  <<: *base\n  spill: 0.75\n"
        "walltime: '01:00:00'\nqueue: null\nhosts: [a, b]\nsize: 2GiB\n",
    )
    assert read_yaml(path, what="settings") == {
        "base": {"target": 0.6, "spill": 0.7},
        "worker": {"target": 0.6, "spill": 0.75},
        "walltime": "01:00:00",
        "queue": None,
        "hosts": ["a", "b"],
        "size": "2GiB",
    }


def test_dates_stay_the_text_written(tmp_path):
    assert read_yaml(_write(tmp_path, "until: 2024-01-31\n"), what="settings") == {"until": "2024-01-31"}


def test_an_empty_file_is_none(tmp_path):
    assert read_yaml(_write(tmp_path, "# nothing\n"), what="settings") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [unclosed\n", "is not valid YAML: while parsing a flow sequence"),
        ("a:\n\tb: 1\n", "found character '\\t' that cannot start any token at line 2, column 1"),
        ("a: 1\n---\nb: 2\n", "expected a single document in the stream, but found another document at line 2"),
        ("a: 1\nb: 2\na: 3\n", "sets 'a' twice (at line 1, column 1 and at line 3, column 1); keep one of them"),
        ("a: !!binary aGVsbG8=\n", "holds a value tagged 'tag:yaml.org,2002:binary' at line 1, column 4"),
        ("a: !!set {x, y}\n", "holds a value tagged 'tag:yaml.org,2002:set'"),
        ("a: !custom x\n", "holds a value tagged '!custom'"),
        ("a: !!python/object/apply:os.getpid []\n", "tag:yaml.org,2002:python/object/apply:os.getpid"),
        (b"a: 1\nb: \xff\xfe\n", "is not UTF-8 text (byte 0xff at line 2, column 4); save it as UTF-8"),
        ("a: b\x07\n", "holds a character YAML does not allow (#x0007 at line 1, column 5)"),
    ],
    ids=["unclosed", "tab", "two-documents", "duplicate-key", "binary", "set", "unknown-tag", "python-tag",
         "not-utf8", "control-character"],
)  # fmt: skip
def test_a_file_that_is_not_plain_yaml_settings_is_one_line_naming_it_and_the_place(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(InvalidArgumentError) as info:
        read_yaml(path, what="cluster configuration")
    text = str(info.value)
    assert text.startswith(f"cluster configuration {path} ")
    assert message in text
    assert "\n" not in text


def test_files_that_are_not_regular_files_are_refused_without_reading_them(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    # Reading a FIFO with no writer would block for ever: the refusal comes first.
    with pytest.raises(InvalidArgumentError, match=r"pipe\.yaml is not a regular file"):
        read_yaml(fifo, what="settings")
    with pytest.raises(InvalidArgumentError, match="is a directory, not a YAML file"):
        read_yaml(tmp_path, what="settings")
    with pytest.raises(ConfigFileNotFoundError, match=r"absent\.yaml does not exist"):
        read_yaml(tmp_path / "absent.yaml", what="settings")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_file_is_a_permission_error(tmp_path):
    path = _write(tmp_path, "a: 1\n")
    path.chmod(0)
    with pytest.raises(SourcePermissionError, match="permission denied"):
        read_yaml(path, what="settings")


def test_a_file_larger_than_the_bound_is_refused_before_it_is_parsed(tmp_path):
    path = _write(tmp_path, "a: " + "x" * MAX_BYTES + "\n")
    with pytest.raises(InvalidArgumentError, match=f"is larger than {MAX_BYTES:,} bytes"):
        read_yaml(path, what="settings")


def test_the_bounds_can_be_set_per_read(tmp_path):
    path = _write(tmp_path, "a: {b: {c: {d: 1}}}\nl: [1, 2, 3, 4, 5]\n")
    assert read_yaml(path, what="settings")["a"]["b"]["c"] == {"d": 1}
    with pytest.raises(InvalidArgumentError, match="nests deeper than 3 levels"):
        read_yaml(path, what="settings", max_depth=3)
    with pytest.raises(InvalidArgumentError, match="expands to more than 8 values"):
        read_yaml(path, what="settings", max_nodes=8)


def test_errors_are_daskstream_errors_and_value_errors(tmp_path):
    path = _write(tmp_path, "a: [\n")
    with pytest.raises(DaskstreamError):
        read_yaml(path, what="settings")
    with pytest.raises(ValueError, match="not valid YAML"):
        read_yaml(path, what="settings")
