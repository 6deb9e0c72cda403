"""Output files written whole or not at all: a write that fails midway (a full disk, an
error, Ctrl-C) leaves the file that was there before, and no part of the new one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write the new file to: renamed over ``path``
    (``os.replace``) when the block ends, removed if it raises. An ``OSError`` names
    ``path``. The temporary name ends in ``.partial``, so give savefig its format."""
    target = Path(path)
    scratch = target.with_name(f"{target.name}.partial")
    try:
        yield scratch
        os.replace(scratch, target)
    except OSError as error:
        raise OSError(f"cannot write {target}: {error.strerror or error}") from None
    finally:
        scratch.unlink(missing_ok=True)
