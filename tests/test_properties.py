"""Every collective, in every variant, equals its numpy reference on every rank, whatever the
world size (1 to 16), length (0 to thousands, uneven splits included), dtype, reduce op,
root, topology and link timing: ``simcomm.testing.check_collective`` draws the cases.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import all_to_all
from algorithms.harness.catalog import COLLECTIVES
from algorithms.reference import all_to_all_reference
from simcomm.testing import Case, buffers, check_case, check_collective, dtypes, topologies

# A case takes a few milliseconds to draw and simulate, so each test affords several times
# the profile's number of examples.
EXAMPLES_PER_PROFILE_EXAMPLE = 8

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("ring_allreduce", {}),
    ("reduce_broadcast_allreduce", {"tree": False}),
    ("reduce_broadcast_allreduce", {"tree": True}),
    ("alltoall_allreduce", {"chunked": False}),
    ("alltoall_allreduce", {"chunked": True}),
    ("reduce_scatter", {}),
    ("all_gather", {}),
    ("broadcast", {"tree": False}),
    ("broadcast", {"tree": True}),
    ("reduce", {"tree": False}),
    ("reduce", {"tree": True}),
    ("all_to_all", {}),
]


def budget() -> settings:
    """The loaded profile, with more examples (so ``dev`` still explores more than ``ci``)."""
    return settings(max_examples=EXAMPLES_PER_PROFILE_EXAMPLE * settings.default.max_examples)


def test_every_collective_has_a_variant_here() -> None:
    assert {name for name, _ in VARIANTS} == set(COLLECTIVES)


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=[
    "-".join([name, *(f"{k}={v}" for k, v in params.items())]) for name, params in VARIANTS])
def test_collective_matches_reference(name: str, params: dict[str, Any]) -> None:
    collective = COLLECTIVES[name]
    check_collective(collective.function, collective.reference, params=params,
                     settings=budget())


@st.composite
def uneven_all_to_all_cases(draw: st.DrawFn) -> Case:
    """Any split matrix: ranks send different amounts to each peer and hold buffers of
    different lengths (row sums), from 0 to a few thousand elements."""
    p = draw(st.integers(1, 16))
    matrix = draw(st.lists(st.lists(st.integers(0, 200), min_size=p, max_size=p),
                           min_size=p, max_size=p))
    dtype = draw(dtypes())
    inputs = [draw(buffers(dtype, sum(row))) for row in matrix]
    return Case(inputs, draw(topologies(p)), params={"split_sizes_matrix": matrix})


@budget()
@given(uneven_all_to_all_cases())
def test_all_to_all_with_uneven_split_sizes(case: Case) -> None:
    check_case(all_to_all, all_to_all_reference, case)
