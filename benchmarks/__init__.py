"""Benchmarks for daskstream: run as modules (``python -m benchmarks.open_sum``), never by the test suite.

See ``benchmarks/README.md`` for what each one measures and the requirement it checks.
"""
