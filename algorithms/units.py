"""Human units at the edges, SI units inside: bytes, seconds, bytes per second.

Decimal prefixes are powers of 1000 and binary ones (KiB, MiB, GiB) powers of 1024, so
``100GB/s`` is 1e11 B/s as nccl-tests counts it and ``25Gbps`` is 25e9 bits/s = 3.125e9 B/s.
A bare ``K``, ``M`` or ``G`` in a size means 1024-based, as nccl-tests' ``-b 1M`` does.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_SIZE_UNITS = {
    "": 1, "B": 1,
    "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
    "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
}
_TIME_UNITS = {"": "1", "s": "1", "ms": "1e-3", "us": "1e-6", "µs": "1e-6", "ns": "1e-9"}
_RATE_UNITS = {
    "B/S": 1, "KB/S": 1000, "MB/S": 1000**2, "GB/S": 1000**3, "TB/S": 1000**4,
    "KIB/S": 1024, "MIB/S": 1024**2, "GIB/S": 1024**3, "TIB/S": 1024**4,
    "BPS": "0.125", "KBPS": "125", "MBPS": "125e3", "GBPS": "125e6", "TBPS": "125e9",
}


def _split(text: str, what: str) -> tuple[Decimal, str]:
    match = re.fullmatch(_NUMBER + r"\s*([A-Za-zµ/]*)", text.strip())
    if not match:
        raise ValueError(f"cannot read {text!r} as {what}")
    # Decimal keeps "3.4us" at the double nearest 3.4e-6 rather than 3.4 * 1e-6.
    return Decimal(match.group(1)), match.group(2)


def parse_bytes(text: str | int) -> int:
    """``"1MiB"`` -> 1048576, ``"1KB"`` -> 1000, ``"4K"`` -> 4096, ``512`` -> 512."""
    if isinstance(text, int):
        value, unit = Decimal(text), ""
    else:
        value, unit = _split(text, "a size (e.g. 1MiB, 64KB, 512)")
    scale = _SIZE_UNITS.get(unit.upper())
    if scale is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} (use B, KB, KiB, MB, MiB, ...)")
    size = value * Decimal(scale)
    if size != int(size):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(size)


def parse_seconds(text: str | float) -> float:
    """``"5us"`` -> 5e-06, ``"1.5ms"`` -> 0.0015, ``"0"`` -> 0.0."""
    if isinstance(text, (int, float)):
        return float(text)
    value, unit = _split(text, "a time (e.g. 5us, 1.5ms)")
    scale = _TIME_UNITS.get(unit if unit in _TIME_UNITS else unit.lower())
    if scale is None:
        raise ValueError(f"unknown time unit {unit!r} in {text!r} (use s, ms, us, ns)")
    return float(value * Decimal(scale))


def parse_bandwidth(text: str | float) -> float:
    """``"100GB/s"`` -> 1e11 B/s, ``"25Gbps"`` -> 3.125e9 B/s, ``"inf"`` -> infinity.

    Bits per second are spelled ``bps`` (lower-case b); bytes per second ``B/s``.
    """
    if isinstance(text, (int, float)):
        rate = float(text)
    elif text.strip().lower() in ("inf", "infinity"):
        rate = math.inf
    else:
        value, unit = _split(text, "a bandwidth (e.g. 100GB/s, 25Gbps)")
        if unit.lower().endswith("bps") and not unit.endswith("bps"):
            raise ValueError(f"write bits per second as lower-case 'bps' in {text!r}")
        scale = _RATE_UNITS.get(unit.upper())
        if scale is None:
            raise ValueError(f"unknown bandwidth unit {unit!r} in {text!r} (use GB/s, Gbps, ...)")
        rate = float(value * Decimal(scale))
    if not rate > 0:
        raise ValueError(f"bandwidth must be > 0, got {text!r}")
    return rate


def format_bytes(n: int) -> str:
    """Largest binary unit that divides ``n`` exactly: 1048576 -> ``"1MiB"``."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"
