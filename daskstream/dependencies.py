"""daskstream's dependencies: the versions it declares, the versions installed, and the one way it
imports a package that may be missing or too old.

The declared ranges are read from the installed package's metadata (written
from ``pyproject.toml``), so there is one list of floors. A feature that needs
an optional package, or an API that only some versions have, imports it through
:func:`optional_import`, which fails with a
:class:`~daskstream.errors.MissingDependencyError` naming the package, the
version found and the version needed, never with a bare ``ImportError``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import platform
from dataclasses import dataclass
from types import ModuleType

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from daskstream.errors import MissingDependencyError

# Extras that only develop or measure daskstream: not reported as features a user may lack.
_DEVELOPMENT_EXTRAS = ("test", "bench")
# Distributions that install another's import package under their own name: a requirement on the key is met
# by whichever is installed. TensorFlow's CPU-only build (what CI installs) and nightlies are such.
_SAME_PACKAGE = {"tensorflow": ("tensorflow-cpu", "tf-nightly", "tf-nightly-cpu")}


@dataclass(frozen=True)
class Dependency:
    """One declared requirement and what is installed for it.

    Attributes
    ----------
    name
        The distribution's name (``"dask"``, ``"numcodecs"``).
    specifier
        The declared range (``">=2025.1"``), ``""`` when unbounded.
    extra
        The extra that declares it, ``None`` for a core dependency.
    installed
        The version installed, ``None`` when it is not.
    """

    name: str
    specifier: str
    extra: str | None
    installed: str | None

    @property
    def satisfied(self) -> bool:
        """Whether an installed version is within the declared range."""
        if self.installed is None:
            return False
        try:
            return Requirement(f"{self.name}{self.specifier}").specifier.contains(
                Version(self.installed), prereleases=True
            )
        except (InvalidRequirement, InvalidVersion):
            return False


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, ``None`` when it is not installed.

    >>> installed_version("numpy") is not None, installed_version("no-such-distribution-here")
    (True, None)
    """
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _provided_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or of one installing its package in its place."""
    for candidate in (name, *_SAME_PACKAGE.get(name.lower(), ())):
        version = installed_version(candidate)
        if version is not None:
            return version
    return None


@functools.cache
def declared() -> tuple[Dependency, ...]:
    """Every requirement daskstream declares (core, then each extra's), with what is installed for it."""
    try:
        lines = importlib.metadata.requires("daskstream") or []
    except importlib.metadata.PackageNotFoundError:
        lines = []  # run from a source tree that was never installed: nothing to report
    found = []
    for line in lines:
        requirement = Requirement(line)
        extra = None
        if requirement.marker is not None:
            extra = next(
                (e for e in _extras() if requirement.marker.evaluate({"extra": e})),
                None,
            )
            if extra is None:
                continue  # a marker for another platform or Python
        found.append(
            Dependency(requirement.name, str(requirement.specifier), extra, _provided_version(requirement.name))
        )
    return tuple(found)


def _extras() -> list[str]:
    try:
        return importlib.metadata.metadata("daskstream").get_all("Provides-Extra") or []
    except importlib.metadata.PackageNotFoundError:
        return []


def floor(name: str) -> str:
    """The range daskstream declares for distribution ``name`` (``""`` when it declares none)."""
    return next((d.specifier for d in declared() if d.name.lower() == name.lower()), "")


def usable_extras() -> dict[str, bool]:
    """For each feature extra, whether all it installs is present in a declared version."""
    extras: dict[str, bool] = {}
    for dependency in declared():
        if dependency.extra is None or dependency.extra in _DEVELOPMENT_EXTRAS:
            continue
        extras[dependency.extra] = extras.get(dependency.extra, True) and dependency.satisfied
    return extras


def optional_import(module: str, *, package: str, needed_for: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` (of distribution ``package``) for ``needed_for``, or say what to install.

    Raises
    ------
    MissingDependencyError
        When ``package`` is not installed, is outside the range daskstream
        declares for it, or has no ``module`` (an API of other versions):
        naming the package, the version found, the version needed and the
        command that installs it.

    Examples
    --------
    >>> optional_import("numpy.linalg", package="numpy", needed_for="an example").__name__
    'numpy.linalg'
    >>> optional_import("no_such_module", package="no-such-package", needed_for="an example")
    Traceback (most recent call last):
    ...
    daskstream.errors.MissingDependencyError: an example needs no-such-package, which is not installed; pip install 'no-such-package'

    """
    version = _provided_version(package)
    wanted = floor(package)
    install = f"pip install 'daskstream[{extra}]'" if extra else f"pip install '{package}{wanted}'"
    if version is None:
        raise MissingDependencyError(f"{needed_for} needs {package}{wanted}, which is not installed; {install}")
    dependency = Dependency(package, wanted, extra, version)
    if wanted and not dependency.satisfied:
        raise MissingDependencyError(
            f"{needed_for} needs {package}{wanted}, and {package} {version} is installed; "
            f"pip install '{package}{wanted}'"
        )
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        wanted_module = f"{package}{wanted}" if module == package else f"{module} from {package}{wanted}"
        raise MissingDependencyError(
            f"{needed_for} needs {wanted_module}, which the installed {package} {version} cannot import ({exc}); "
            f"{install}"
        ) from exc


def report() -> str:
    """The versions of daskstream's dependencies and which optional features are usable, for bug reports."""
    lines = [
        f"daskstream {installed_version('daskstream')} (Python {platform.python_version()}, {platform.system()} {platform.machine()})"
    ]
    width = max((len(d.name) for d in declared()), default=10)
    lines.append("dependencies:")
    for dependency in declared():
        if dependency.extra is not None:
            continue
        lines.append(f"  {dependency.name:<{width}}  {_shown(dependency)}")
    extras = usable_extras()
    if extras:
        lines.append("optional features (pip install 'daskstream[NAME]'):")
        for extra, usable in extras.items():
            members = [d for d in declared() if d.extra == extra]
            state = "usable" if usable else "not usable"
            shown = ", ".join(f"{d.name} {_shown(d)}" for d in members)
            lines.append(f"  {extra:<{width}}  {state}: {shown}")
    return "\n".join(lines)


def _shown(dependency: Dependency) -> str:
    if dependency.installed is None:
        return f"not installed (needs {dependency.specifier or 'any version'})"
    if not dependency.satisfied:
        return f"{dependency.installed} (needs {dependency.specifier}: outside the declared range)"
    return dependency.installed


__all__ = ["Dependency", "declared", "floor", "installed_version", "optional_import", "report", "usable_extras"]
