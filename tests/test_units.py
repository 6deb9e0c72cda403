"""Human units at the edges: sizes, times and bandwidths, and the errors for bad text."""

from __future__ import annotations

import math
import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simcomm import parse_bandwidth, parse_bytes, parse_seconds
from simcomm.units import format_bytes, parse_flops


@pytest.mark.parametrize("text, expected", [
    ("100GB/s", 1e11),
    ("25Gbps", 3.125e9),  # bits: 25e9 / 8
    ("400 Gbps", 5e10),
    ("100Gb/s", 1.25e10),  # a small b is bits, written either way
    ("100GBps", 1e11),  # a capital B is bytes, written either way
    ("1GiB/s", 2.0**30),
    ("900 MB/s", 9e8),
    ("8bps", 1.0),
    ("inf", math.inf),
    ("Infinity", math.inf),
    (5e9, 5e9),
])
def test_parse_bandwidth(text, expected) -> None:
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("1MiB", 1_048_576),
    ("1KB", 1000),
    ("4K", 4096),  # a bare K is 1024-based, as in nccl-tests' -b 4K
    ("64KB", 64_000),
    ("1.5KiB", 1536),
    ("2G", 2**31),
    ("1GB", 10**9),
    ("512", 512),
    ("512B", 512),
    (" 8 MiB ", 8 * 2**20),
    ("1e3", 1000),
    (512, 512),
])
def test_parse_bytes(text, expected) -> None:
    assert parse_bytes(text) == expected
    assert isinstance(parse_bytes(text), int)


@pytest.mark.parametrize("text, expected", [
    ("5us", 5e-6),
    ("3.4us", 3.4e-6),  # the double nearest the decimal figure, not 3.4 * 1e-6
    ("5µs", 5e-6),
    ("1.5ms", 1.5e-3),
    ("10ns", 1e-8),
    ("2s", 2.0),
    ("2", 2.0),
    ("0", 0.0),
    (1e-6, 1e-6),
])
def test_parse_seconds(text, expected) -> None:
    assert parse_seconds(text) == expected


@pytest.mark.parametrize("parse, text", [
    (parse_bandwidth, "fast"),
    (parse_bandwidth, "100gBps"),  # no such prefix
    (parse_bandwidth, "100 furlongs/s"),
    (parse_bandwidth, "-1GB/s"),
    (parse_bandwidth, "0GB/s"),
    (parse_bandwidth, ""),
    (parse_bytes, "lots"),
    (parse_bytes, "1.5B"),  # not a whole number of bytes
    (parse_bytes, "3 parsecs"),
    (parse_bytes, "-1MiB"),
    (parse_bytes, ""),
    (parse_seconds, "soon"),
    (parse_seconds, "5 fortnights"),
    (parse_seconds, "-5us"),
    (parse_seconds, "5 us 3"),
])
def test_bad_text_raises_value_error_naming_the_text(parse, text) -> None:
    with pytest.raises(ValueError) as caught:
        parse(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("rate", [0, -5.0, math.nan])
def test_a_bandwidth_must_be_positive(rate) -> None:
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        parse_bandwidth(rate)


@pytest.mark.parametrize("n, text", [
    (0, "0B"), (1000, "1000B"), (1024, "1KiB"), (3072, "3KiB"), (1_048_576, "1MiB"),
    (1_048_577, "1048577B"), (2**30, "1GiB"), (5 * 2**40, "5TiB"),
])
def test_format_bytes_picks_the_largest_exact_binary_unit(n, text) -> None:
    assert format_bytes(n) == text


@given(n=st.integers(0, 2**50))
def test_format_bytes_round_trips(n) -> None:
    assert parse_bytes(format_bytes(n)) == n


@given(value=st.integers(1, 10**6), unit=st.sampled_from(["KB", "MB", "GB", "TB"]))
def test_decimal_rates_are_powers_of_1000_exactly(value, unit) -> None:
    scale = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
    assert parse_bandwidth(f"{value}{unit}/s") == value * scale
    assert parse_bandwidth(f"{value}{unit[0]}bps") == value * scale / 8


@given(mantissa=st.integers(0, 10**9), places=st.integers(0, 6),
       unit=st.sampled_from(["s", "ms", "us", "ns"]))
def test_times_are_the_double_nearest_the_decimal_figure(mantissa, places, unit) -> None:
    figure = Decimal(mantissa).scaleb(-places)
    exponent = {"s": 0, "ms": -3, "us": -6, "ns": -9}[unit]
    assert parse_seconds(f"{figure}{unit}") == float(figure.scaleb(exponent))


@pytest.mark.parametrize("text, suggestions", [
    ("1Mb", ["1MB for 10^6 bytes", "1M or 1MiB for 2^20 bytes"]),
    ("1Kb", ["1KB for 10^3 bytes", "1K or 1KiB for 2^10 bytes"]),
    ("1Gb", ["1GB for 10^9 bytes", "1G or 1GiB for 2^30 bytes"]),
    ("4kb", ["4KB for 10^3 bytes", "4K or 4KiB for 2^10 bytes"]),
    ("2Mib", ["2MiB for 2^20 bytes"]),
    ("8b", ["8B or 8 for bytes"]),
])
def test_a_size_in_bits_is_ambiguous_and_refused(text, suggestions) -> None:
    # A small b means bits in a rate (Gb/s), so 1Mb could be 125 KB, 1 MB or 1 MiB.
    with pytest.raises(ValueError) as caught:
        parse_bytes(text)
    message = str(caught.value)
    assert message.startswith(f"size {text!r} is ambiguous: a small b means bits")
    assert all(suggestion in message for suggestion in suggestions)
    assert "\n" not in message


@pytest.mark.parametrize("text", ["1", "0", "1e-6", " 2.5 "])
def test_a_time_without_a_unit_is_refused_where_one_is_required(text) -> None:
    # A command line's --latency 1 used to be read as one second.
    bare = text.strip()
    with pytest.raises(ValueError, match=re.escape(f"time {bare!r} has no unit: write {bare}s")):
        parse_seconds(text, require_unit=True)
    assert parse_seconds(f"{bare}us", require_unit=True) == parse_seconds(f"{bare}us")


@pytest.mark.parametrize("text", ["1e400GB/s", "1e309B/s", "1e400Gbps"])
def test_a_bandwidth_that_overflows_is_refused_naming_it(text) -> None:
    # It used to come out as inf: a run at infinite bandwidth, unasked.
    with pytest.raises(ValueError, match=re.escape(f"bandwidth {text!r} is too large")):
        parse_bandwidth(text)


@pytest.mark.parametrize("text", ["125", "9e13", " 2.5 "])
def test_a_compute_rate_without_a_unit_is_refused(text) -> None:
    # --throughput 125 used to be read as 125 FLOP/s.
    bare = text.strip()
    with pytest.raises(ValueError, match=re.escape(f"compute rate {bare!r} has no unit: "
                                                   f"write {bare}TFLOPS")):
        parse_flops(text)
    assert parse_flops(f"{bare}TFLOPS") == float(bare) * 1e12
    assert parse_flops(9e13) == 9e13  # a number is FLOP/s, as the Python API takes it
