"""Human units at the edges (re-exported from ``algorithms.harness.units``, which realcomm
shares)."""

from algorithms.harness.units import (
    format_bytes, parse_bandwidth, parse_bytes, parse_flops, parse_seconds,
)

__all__ = ["format_bytes", "parse_bandwidth", "parse_bytes", "parse_flops", "parse_seconds"]
