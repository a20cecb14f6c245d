"""Doctests of the package's modules: one that needs an optional library is collected only where it is installed.

Also, for every test: TensorFlow, imported while collecting, leaves no log handler that closes pytest's capture.
"""

import importlib.util
import sys

# daskstream/torch.py and daskstream/tensorflow.py import their framework when imported; without the extra
# their examples cannot run.
collect_ignore = [
    f"daskstream/{module}.py" for module in ("torch", "tensorflow") if importlib.util.find_spec(module) is None
]


def pytest_collection_finish(session):
    # Importing TensorFlow makes absl's log handler, which keeps the sys.stderr of that moment (pytest's
    # capture) and closes it when logging is configured afresh, as import-linter's lint_imports does in
    # tests/test_architecture.py: pytest then loses its stderr and the worker dies. The process's own stderr
    # is one absl never closes (and pytest still captures it, at the file descriptor).
    absl_logging = sys.modules.get("absl.logging")
    if absl_logging is not None:
        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
