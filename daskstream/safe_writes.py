"""Where daskstream writes: never onto what it reads, never over what it did not make, and only whole.

Every path that writes or deletes a user's files goes through here: the
command's ``--out``, ``store``/``convert`` targets, rechunk's intermediate
folders and the tuning cache. Three rules, each one function:

- :func:`refuse_onto_reads` — a place written is never a place read, nor
  inside one, nor around one, however either is spelled: paths are compared
  by device and inode after links are followed, so ``./a.npy``, a symbolic
  link to it and a hard link of it are one file.
- :func:`check_replaceable` — what is already at a place written is replaced
  only when it is a file and a file is written (as a shell's ``>`` does), or
  when it is a folder this same kind of writer made before (``is_own``); a
  folder of the user's is never deleted.
- :func:`written_whole` — the new content is written under a temporary name
  beside the place and renamed into it only after it was written whole, so a
  failed or interrupted write leaves the old content as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator

from daskstream.advice import said
from daskstream.errors import InvalidArgumentError, TargetExistsError, TargetWriteError

__all__ = [
    "check_replaceable",
    "lies_within",
    "os_place",
    "refuse_onto_reads",
    "same_path",
    "written_whole",
]


def os_place(path: str, *, follow_last: bool = True) -> str:
    """The absolute path the system reaches by ``path``: each link followed before a ``..`` after it applies.

    ``os.path.abspath`` applies ``..`` to the text, so ``other/link/../a.zarr``
    reads as ``other/a.zarr`` where the system reaches the folder above where
    the link leads. With ``follow_last=False`` a link at the end is kept as
    the place itself (a file written replaces the link, not what it leads to).
    """
    path = os.fspath(path)
    head, name = os.path.split(path.rstrip(os.sep) or path)
    if follow_last or name in ("", ".", ".."):
        return os.path.realpath(path)
    return os.path.join(os.path.realpath(head or "."), name)


def lies_within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it, whatever links or mounts lead to either.

    Each folder on the way up from ``path`` (links resolved) is compared with
    ``folder`` by device and inode, so two spellings of one place match.
    """
    try:
        wanted = os.stat(folder)
    except OSError:
        return False  # nothing there yet: nothing to lose
    current = os.path.realpath(path)
    while True:
        with contextlib.suppress(OSError):
            st = os.stat(current)
            if (st.st_dev, st.st_ino) == (wanted.st_dev, wanted.st_ino):
                return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def same_path(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are one file or folder (links followed, hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_onto_reads(target: str, reads: Iterable[tuple[str, str]], *, option: str) -> None:
    """Refuse to write ``target`` when it is, lies inside or holds a place the computation reads.

    Parameters
    ----------
    target
        The local file or folder about to be written.
    reads
        ``(place, name)`` pairs: each local file or folder read, and the name
        of the source that reads it (for the message).
    option
        How the user named the target (``"--out out.npy"``), for the message.
    """
    for place, name in reads:
        inside, around = lies_within(place, target), lies_within(target, place)
        if inside and around:
            how = "which is this very file" if os.path.isfile(place) else "which is this very folder"
        elif inside:
            how = f"which lies inside it, at {place}"
        elif around:
            how = f"and it lies inside that source, at {place}"
        else:
            continue
        raise InvalidArgumentError(
            said(
                option,
                f": the computation reads {name}, {how}; writing there would destroy the data it reads. Write to "
                "another place, then replace the old one if you want to",
            )
        )


def check_replaceable(target: str, *, folder: bool, is_own: Callable[[str], bool], option: str) -> None:
    """Refuse, before anything is computed, a ``target`` whose present content may not be replaced.

    A file (not a folder) is written over a file, or over a symbolic link
    (the link is replaced; what it points to is not touched). A folder is
    written over nothing or over a folder ``is_own`` recognises as this
    writer's earlier result. The folder the target goes in must exist.
    """
    parent = os.path.dirname(os_place(target, follow_last=False))
    if not os.path.isdir(parent):
        raise InvalidArgumentError(f"{option}: the folder {parent} does not exist; make it first, or write elsewhere")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TargetWriteError(exc.errno, f"{option}: cannot look at what is there ({exc.strerror})") from None
    if folder:
        if stat.S_ISDIR(mode) and is_own(target):
            return
        what = "a folder that is not (only) a result daskstream wrote" if stat.S_ISDIR(mode) else "a file"
        raise TargetExistsError(
            f"{option}: {what} is already there, and daskstream replaces a folder only when it holds nothing "
            "but such a result written before; choose another name, or move it away yourself"
        )
    if stat.S_ISDIR(mode):
        raise TargetExistsError(
            f"{option}: a folder is there, and a file is written over a file only (daskstream never deletes a "
            "folder it did not make); choose another name"
        )
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise TargetExistsError(
            f"{option}: something that is not a file (a pipe, socket or device) is there; choose another name"
        )


@contextlib.contextmanager
def written_whole(target: str, *, folder: bool, is_own: Callable[[str], bool], option: str) -> Iterator[str]:
    """A temporary path beside ``target`` to write into; put in ``target``'s place when the block ends well.

    What is at ``target`` is checked again (:func:`check_replaceable`) just
    before it is replaced. If the block raises (an error, Ctrl-C), the
    temporary file or folder is removed and ``target`` is left as it was.
    A folder replaced is moved aside first and removed only once the new one
    is in place.
    """
    target = os_place(target, follow_last=False)
    check_replaceable(target, folder=folder, is_own=is_own, option=option)
    parent, name = os.path.split(target)
    try:
        if folder:
            temporary = tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=parent)
        else:
            fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=parent)
            os.close(fd)
        # tempfile makes them private to the user; the result gets the permissions a new file would
        # have, or those of the file it replaces (as a shell's > keeps them).
        os.chmod(temporary, _permissions(target, folder=folder))
    except OSError as exc:
        raise TargetWriteError(
            exc.errno, f"{option}: cannot write in {parent} ({exc.strerror}); check its permissions and free space"
        ) from None
    try:
        yield temporary
        check_replaceable(target, folder=folder, is_own=is_own, option=option)
        try:
            if folder and os.path.lexists(target):
                # A folder cannot be renamed over a folder that holds anything: the old one goes aside first,
                # and comes back if the new one cannot take its place.
                aside = tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=parent)
                os.replace(target, os.path.join(aside, name))
                try:
                    os.replace(temporary, target)
                except BaseException:
                    os.replace(os.path.join(aside, name), target)
                    os.rmdir(aside)
                    raise
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.replace(temporary, target)
        except OSError as exc:
            raise TargetWriteError(
                exc.errno, f"{option}: could not put the result in place ({exc.strerror}); what was there is kept"
            ) from None
    except BaseException:
        _remove(temporary)
        raise


def _permissions(target: str, *, folder: bool) -> int:
    try:
        st = os.stat(target)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) == folder:
        return stat.S_IMODE(st.st_mode)
    return (0o777 if folder else 0o666) & ~_umask()


def _umask() -> int:
    """The process's umask, read without setting it where the system tells it (setting it races other threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _remove(path: str) -> None:
    """Remove a temporary file or folder this module made."""
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
