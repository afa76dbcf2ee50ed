"""Writing outputs: every file tensorgen writes appears whole or not at all.

The counterpart of `tensorgen.inputs` (which reads untrusted files); both sit below everything else
so that any layer can write a file without importing the driver."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never half."""
    write_files_atomic([(path, data)])


def _file_mode() -> int:
    # mkstemp creates 0600 files; an output should get the mode any new file gets (0666 less the
    # umask), which can only be read by setting it: set it back at once.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_files_atomic(files: list[tuple[str | Path, bytes]]) -> None:
    """Write all of `files` or none: each goes to a temporary file beside it, and only when all
    are complete are they renamed into place; a failure removes the temporaries (and any file
    already renamed, so that a half-done pair is never left). An OSError names its file."""
    temps: list[tuple[Path, str]] = []
    done: list[Path] = []
    try:
        for path, data in files:
            path = Path(path)
            try:
                fd, tmp = tempfile.mkstemp(
                    dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp"
                )
                temps.append((path, tmp))
                os.fchmod(fd, _file_mode())
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError as err:
                raise OSError(err.errno, err.strerror, str(path)) from None
        for path, tmp in temps:
            try:
                os.replace(tmp, path)
            except OSError as err:
                raise OSError(err.errno, err.strerror, str(path)) from None
            done.append(path)
    except BaseException:
        for _, tmp in temps:
            Path(tmp).unlink(missing_ok=True)
        for path in done:
            path.unlink(missing_ok=True)
        raise
