"""Buffer helpers. Algorithms touch data only through ``len``, 1-D slicing and these helpers,
so one algorithm runs on numpy arrays, size-only buffers and torch tensors alike."""

from __future__ import annotations

import operator
from typing import Any


def chunk_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(length)`` into ``parts`` contiguous ranges; the first ``length % parts``
    ranges are one element longer (numpy's ``array_split`` rule)."""
    for name, value, least in (("length", length, 0), ("parts", parts, 1)):
        if isinstance(value, bool) or not hasattr(value, "__index__") or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    length, parts = operator.index(length), operator.index(parts)
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def split_even(buf: Any, parts: int) -> list[Any]:
    """Views of ``buf`` in ``parts`` near-equal contiguous chunks (see ``chunk_bounds``)."""
    return [buf[start:stop] for start, stop in chunk_bounds(len(buf), parts)]


def split_sizes(buf: Any, sizes: list[int]) -> list[Any]:
    """Views of ``buf`` in consecutive chunks of the given sizes, which must add up to its
    length."""
    if any(isinstance(s, bool) or not hasattr(s, "__index__") for s in sizes):
        raise ValueError(f"chunk sizes must be ints, got {sizes}")
    if sum(sizes) != len(buf) or any(s < 0 for s in sizes):
        raise ValueError(f"chunk sizes {sizes} do not partition a buffer of length {len(buf)}")
    views, start = [], 0
    for size in sizes:
        views.append(buf[start:start + size])
        start += size
    return views
