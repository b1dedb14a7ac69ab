"""Output files: checked before any work starts, written so that a failure or a reader never sees
half of one, with the permissions the user's umask gives (as ``open`` would)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from liveput.errors import LiveputError

MAX_INPUT_BYTES = 256 * 2**20
"""Largest input file read (traces, catalogs, profiles, speedups), bytes: a larger one is
refused before it is read (the largest measured spot trace we know of is a few MB)."""


def read_text_file(path: str | Path, role: str = "input") -> str:
    """The text of an input file, or a one-line error naming ``role`` and the path: a missing
    file, a folder, a file over :data:`MAX_INPUT_BYTES`, or a file that is not UTF-8 text."""
    path = Path(path)
    if not path.exists():
        raise LiveputError(f"{role} {path}: no such file")
    if not path.is_file():
        raise LiveputError(f"{role} {path}: not a file")
    size = path.stat().st_size
    if size > MAX_INPUT_BYTES:
        raise LiveputError(
            f"{role} {path}: {size / 2**20:.0f} MiB is more than the "
            f"{MAX_INPUT_BYTES / 2**20:.0f} MiB an input may have"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise LiveputError(f"{role} {path}: not a text file") from None
    except OSError as error:
        raise LiveputError(f"{role} {path}: {(error.strerror or str(error)).lower()}") from None
    if "\x00" in text:
        raise LiveputError(f"{role} {path}: not a text file (it holds NUL bytes)")
    return text


def _writable_folder(path: Path, folder: Path) -> None:
    if not folder.exists():
        raise LiveputError(f"{path}: folder {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise LiveputError(f"{path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LiveputError(f"{path}: folder {folder} is not writable")


def check_output_file(path: str | Path, suffix: str | None = None) -> Path:
    """Refuse, in one line, an output file that cannot be written: a folder, a missing or
    unwritable parent folder, a read-only file, or a name without ``suffix`` (``".png"``)."""
    path = Path(path)
    if path.is_dir():
        raise LiveputError(f"{path}: is a folder; name a file to write")
    if suffix is not None and path.suffix.lower() != suffix:
        raise LiveputError(
            f"{path}: the file is written as {suffix[1:].upper()}; name it *{suffix}"
        )
    _writable_folder(path, path.parent if str(path.parent) else Path("."))
    if path.exists() and not os.access(path, os.W_OK):
        raise LiveputError(f"{path}: file is not writable")
    return path


def check_output_folder(path: str | Path) -> Path:
    """Refuse an output folder that cannot be made or written: a file of that name, or a missing
    or unwritable parent folder. The folder itself is made by the writer."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise LiveputError(f"{path}: is a file; name a folder to write the report in")
        if not os.access(path, os.W_OK | os.X_OK):
            raise LiveputError(f"{path}: folder is not writable")
        return path
    _writable_folder(path, path.parent if str(path.parent) else Path("."))
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename: an
    interrupted write leaves the old file (or none), never a partial one. The parent folder
    must exist (:func:`check_output_file`)."""
    path = Path(path)
    check_output_file(path)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        # mkstemp makes the file 0600; a file the user writes gets their umask's permissions.
        os.chmod(temp_name, 0o666 & ~_umask())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def check_writable_url(url: str, role: str) -> None:
    """Write and remove a probe file in ``url`` (a folder or any fsspec URL), created for the
    probe if need be: a one-line LiveputError, naming ``role``, if it cannot (checked before
    work starts, so that no run trains on while each of its writes there fails). Local folders
    made for the probe are removed after it: a command refused later for another argument
    leaves nothing behind, and the first write makes them again."""
    import uuid

    from liveput.objectstore import local_folder, url_to_fs

    made: list[Path] = []
    try:
        fs, root = url_to_fs(url.rstrip("/"))
        folder = local_folder(url)
        while folder is not None and not folder.exists() and folder != folder.parent:
            made.append(folder)
            folder = folder.parent
        fs.makedirs(root, exist_ok=True)
        probe = f"{root}/.liveput-probe-{uuid.uuid4().hex}"
        with fs.open(probe, "wb") as handle:
            handle.write(b"probe")
        fs.rm(probe)
    except Exception as error:  # noqa: BLE001 - any backend's failure says the same thing
        lines = str(error).splitlines()
        reason = getattr(error, "strerror", None) or (lines[0] if lines else type(error).__name__)
        raise LiveputError(f"{role} {url} cannot be written: {reason}") from None
    finally:
        for folder in made:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break  # something was written there meanwhile: it stays
