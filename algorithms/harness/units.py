"""Human units at the edges, SI units inside: bytes, seconds, bytes per second.

Decimal prefixes are powers of 1000 and binary ones (KiB, MiB, GiB) powers of 1024, so
``100GB/s`` is 1e11 B/s as nccl-tests counts it and ``25Gbps`` is 25e9 bits/s = 3.125e9 B/s.
A bare ``K``, ``M`` or ``G`` in a size means 1024-based, as nccl-tests' ``-b 1M`` does. A
size whose unit ends in a small ``b`` (``1Mb``, ``8kb``, ``1Mib``) is refused: a small b means
bits in a rate, so it is not clear whether bits or bytes, 1000 or 1024, are meant.
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
_RATE_PREFIXES = {
    "": 1, "K": 1000, "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4,
}
# A rate is a prefix, B (bytes) or b (bits), then /s or ps: GB/s, GBps, Gb/s, Gbps.
_RATE_UNIT = re.compile(r"([kKMGT]i?)?([Bb])(/s|ps)")


def _split(text: str, what: str) -> tuple[Decimal, str]:
    match = re.fullmatch(_NUMBER + r"\s*([A-Za-zµ/]*)", text.strip())
    if not match:
        raise ValueError(f"cannot read {text!r} as {what}")
    # Decimal keeps "3.4us" at the double nearest 3.4e-6 rather than 3.4 * 1e-6.
    return Decimal(match.group(1)), match.group(2)


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number or a string with a unit, got {value!r}")
    if not (math.isfinite(value) or value == math.inf) or value < 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return float(value)


def parse_bytes(text: str | int) -> int:
    """``"1MiB"`` -> 1048576, ``"1KB"`` -> 1000, ``"4K"`` -> 4096, ``512`` -> 512."""
    if not isinstance(text, str):
        number = _number(text, "a size")
        if number != int(number):
            raise ValueError(f"size {text!r} is not a whole number of bytes")
        return int(number)
    value, unit = _split(text, "a size (e.g. 1MiB, 64KB, 512)")
    if unit.endswith("b"):
        raise ValueError(_ambiguous_size(text, value, unit))
    scale = _SIZE_UNITS.get(unit.upper())
    if scale is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} (use B, KB, KiB, MB, MiB, ...)")
    size = value * Decimal(scale)
    if size != int(size):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(size)


def _ambiguous_size(text: str, value: Decimal, unit: str) -> str:
    """Why a size in ``...b`` is refused, with the spellings that say what was meant."""
    prefix = unit[:-1].upper()
    powers = {"K": 1, "M": 2, "G": 3, "T": 4}
    if not prefix:
        meant = f"write {value}B or {value} for bytes"
    elif prefix in powers:
        power = powers[prefix]
        meant = (f"write {value}{prefix}B for 10^{3 * power} bytes, or {value}{prefix} or "
                 f"{value}{prefix}iB for 2^{10 * power} bytes")
    elif prefix[:1] in powers and prefix[1:] == "I":
        meant = f"write {value}{prefix[0]}iB for 2^{10 * powers[prefix[0]]} bytes"
    else:
        return f"unknown size unit {unit!r} in {text!r} (use B, KB, KiB, MB, MiB, ...)"
    return (f"size {text.strip()!r} is ambiguous: a small b means bits, as in rates "
            f"(Gb/s); {meant}")


def parse_seconds(text: str | float, require_unit: bool = False) -> float:
    """``"5us"`` -> 5e-06, ``"1.5ms"`` -> 0.0015, ``"0"`` -> 0.0. With ``require_unit`` a
    string without a unit (``"1"``) is refused, as a bandwidth without one always is: on a
    command line or in a file, 1 could mean 1 s or 1 us."""
    if not isinstance(text, str):
        seconds = _number(text, "a time")
        if seconds == math.inf:
            raise ValueError(f"a time must be finite, got {text!r}")
        return seconds
    value, unit = _split(text, "a time (e.g. 5us, 1.5ms)")
    if require_unit and not unit:
        bare = text.strip()
        raise ValueError(f"time {bare!r} has no unit: write {bare}s, {bare}ms, {bare}us or "
                         f"{bare}ns")
    scale = _TIME_UNITS.get(unit if unit in _TIME_UNITS else unit.lower())
    if scale is None:
        raise ValueError(f"unknown time unit {unit!r} in {text!r} (use s, ms, us, ns)")
    return float(value * Decimal(scale))


def parse_bandwidth(text: str | float) -> float:
    """``"100GB/s"`` -> 1e11 B/s, ``"25Gbps"`` -> 3.125e9 B/s, ``"inf"`` -> infinity.

    A capital B counts bytes and a small b bits, after the usual convention: ``GB/s`` and
    ``GBps`` are gigabytes per second, ``Gb/s`` and ``Gbps`` gigabits per second.
    """
    if not isinstance(text, str):
        if isinstance(text, bool) or not isinstance(text, (int, float)):
            raise ValueError(f"a bandwidth must be a number or a string with a unit, got {text!r}")
        rate = float(text)
    elif text.strip().lower() in ("inf", "infinity"):
        rate = math.inf
    else:
        value, unit = _split(text, "a bandwidth (e.g. 100GB/s, 25Gbps)")
        match = _RATE_UNIT.fullmatch(unit)
        if match is None:
            raise ValueError(f"unknown bandwidth unit {unit!r} in {text!r} "
                             "(use B/s or b/s with a prefix: GB/s, GiB/s, Gbps, ...)")
        prefix, byte_or_bit, _ = match.groups()
        scale = Decimal(_RATE_PREFIXES[prefix or ""])
        if byte_or_bit == "b":
            scale /= 8
        rate = float(value * scale)
        if rate == math.inf:
            raise ValueError(f"bandwidth {text.strip()!r} is too large: it overflows to "
                             "infinity (write inf for no limit)")
    if not rate > 0:
        raise ValueError(f"bandwidth must be > 0, got {text!r}")
    return rate


def parse_flops(text: str | float) -> float:
    """A compute rate in FLOP/s: ``"125TFLOPS"`` -> 1.25e14, ``"312 TFLOP/s"``, ``9e13`` (a
    number is FLOP/s). A string needs its unit, as a bandwidth does: ``"125"`` could mean
    FLOP/s or TFLOPS."""
    if not isinstance(text, str):
        rate = _number(text, "a compute rate")
    else:
        value, unit = _split(text.replace(" ", ""), "a compute rate (e.g. 125TFLOPS)")
        if not unit:
            bare = text.strip()
            raise ValueError(f"compute rate {bare!r} has no unit: write {bare}TFLOPS, "
                             f"{bare}GFLOPS or {bare}FLOPS")
        match = re.fullmatch(r"([kKMGTP]?)(?:FLOPS|FLOP/s|flops|flop/s)?", unit)
        if match is None:
            raise ValueError(f"unknown compute rate unit {unit!r} in {text!r} "
                             "(use FLOPS with a prefix: GFLOPS, TFLOPS, ...)")
        rate = float(value * Decimal({**_RATE_PREFIXES, "P": 1000**5}[match.group(1)]))
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"a compute rate must be finite and > 0, got {text!r}")
    return rate


def format_bytes(n: int) -> str:
    """Largest binary unit that divides ``n`` exactly: 1048576 -> ``"1MiB"``."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"
