"""Doctests of the package's modules: one that needs an optional library is collected only where it is installed."""

import importlib.util

# daskstream/torch.py imports torch when imported; without the torch extra its examples cannot run.
collect_ignore = [] if importlib.util.find_spec("torch") else ["daskstream/torch.py"]
