"""Size-only buffers: a length and a dtype, no data, so a cost-only run of gigabytes on
thousands of ranks allocates nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class SizeOnly:
    """A 1-D buffer of ``count`` elements of ``dtype`` that holds no data."""

    count: int
    dtype: np.dtype

    def __init__(self, count: int, dtype: Any = np.float32) -> None:
        if (isinstance(count, bool) or not isinstance(count, (int, np.integer))
                or count < 0):
            raise ValueError(f"SizeOnly count must be an int >= 0, got {count!r}")
        object.__setattr__(self, "count", int(count))
        object.__setattr__(self, "dtype", check_dtype(np.dtype(dtype), "SizeOnly"))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: slice) -> SizeOnly:
        if not isinstance(index, slice):
            raise TypeError("a SizeOnly buffer holds no data: only slices of it can be taken")
        start, stop, step = index.indices(self.count)
        if step != 1:
            raise ValueError("SizeOnly buffers support contiguous slices only")
        # Skip __init__'s checks: the count is a valid int and the dtype already a dtype.
        # Algorithms slice once per message, so this is on the simulator's hot path.
        view = object.__new__(SizeOnly)
        object.__setattr__(view, "count", max(0, stop - start))
        object.__setattr__(view, "dtype", self.dtype)
        return view

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.count * self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize


def check_dtype(dtype: np.dtype, what: str) -> np.dtype:
    """``dtype`` if it holds numbers a collective can reduce and copy: booleans, integers,
    floats, complex numbers and ml_dtypes' floats (bfloat16, float8); else a ValueError
    naming ``what`` (strings, objects, dates and records are not data to all-reduce)."""
    if dtype.kind in "biufc" or (dtype.kind == "V" and dtype.fields is None
                                 and dtype.type.__module__ == "ml_dtypes"):
        return dtype
    raise ValueError(f"{what}: dtype {dtype} holds no numbers to reduce (use an integer, "
                     "float, complex or bool dtype)")
