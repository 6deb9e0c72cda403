"""Every collective, in every variant, equals its numpy reference on every rank, whatever the
world size (1 to 16), length (0 to thousands, uneven splits included), dtype, reduce op,
root, topology and link timing: ``simcomm.testing.check_collective`` draws the cases.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import AVG, MAX, MIN, PROD, SUM, all_to_all, alltoall_allreduce
from algorithms.harness.catalog import COLLECTIVES
from algorithms.reference import all_to_all_reference
from simcomm import simulate, switch
from simcomm.testing import Case, buffers, check_case, check_collective, dtypes, topologies

# A case takes a few milliseconds to draw and simulate, so each test affords several times
# the profile's number of examples (4 keeps the suite under ten minutes on two cores; the
# dev profile, 300 examples against ci's 50, explores six times as many).
EXAMPLES_PER_PROFILE_EXAMPLE = 4

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("ring_allreduce", {}),
    ("reduce_broadcast_allreduce", {"tree": False}),
    ("reduce_broadcast_allreduce", {"tree": True}),
    ("alltoall_allreduce", {"chunked": False}),
    ("alltoall_allreduce", {"chunked": True}),
    ("nccl_ring_allreduce", {"channels": 0}),
    ("nccl_ring_allreduce", {"channels": 1}),
    ("nccl_ring_allreduce", {"channels": 3}),
    ("nccl_tree_allreduce", {"channels": 0}),
    ("nccl_tree_allreduce", {"channels": 1, "chunk_bytes": 200}),
    ("nccl_tree_allreduce", {"channels": 3, "chunk_bytes": 500, "protocol": "ll"}),
    ("hierarchical_allreduce", {}),
    ("nvls_allreduce", {"channels": 3, "chunk_bytes": 64}),  # 16 channels cost 3x as much
    ("nvls_tree_allreduce", {"channels": 3, "chunk_bytes": 64, "registered": True}),
    ("nvls_reduce_scatter", {"channels": 3, "chunk_bytes": 32}),
    ("nvls_all_gather", {"channels": 2, "chunk_bytes": 48, "registered": True}),
    ("nccl_allreduce", {}),  # whatever the model's tuner picks at the drawn size
    ("nccl_allreduce", {"algorithm": "tree", "protocol": "ll128", "channels": 2}),
    ("nccl_reduce_scatter", {}),
    ("nccl_all_gather", {"protocol": "ll"}),
    ("nccl_ring_reduce_scatter", {"channels": 0}),
    ("nccl_ring_reduce_scatter", {"channels": 2}),
    ("nccl_ring_all_gather", {"channels": 0}),
    ("nccl_ring_all_gather", {"channels": 3}),
    ("reduce_scatter", {}),
    ("all_gather", {}),
    ("broadcast", {"tree": False}),
    ("broadcast", {"tree": True}),
    ("reduce", {"tree": False}),
    ("reduce", {"tree": True}),
    ("all_to_all", {}),
]


# Variants that cost most per case (a channel per rank: p rings of p ranks) or that only
# dispatch to algorithms tested above get fewer examples, to keep the suite's time.
FEWER_EXAMPLES = {"nccl_ring_allreduce": 1, "nccl_ring_reduce_scatter": 1,
                  "nccl_ring_all_gather": 1, "nccl_allreduce": 1, "nccl_reduce_scatter": 1,
                  "nccl_all_gather": 1, "nvls_allreduce": 1, "nvls_tree_allreduce": 1,
                  "nvls_reduce_scatter": 1, "nvls_all_gather": 1}


def _ids(variants: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return ["-".join([name, *(f"{k}={v}" for k, v in params.items())])
            for name, params in variants]


def budget(name: str = "") -> settings:
    """The loaded profile, with more examples (so ``dev`` still explores more than ``ci``)."""
    per_example = FEWER_EXAMPLES.get(name, EXAMPLES_PER_PROFILE_EXAMPLE)
    return settings(max_examples=per_example * settings.default.max_examples)


def test_every_collective_has_a_variant_here() -> None:
    assert {name for name, _ in VARIANTS} == set(COLLECTIVES)


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=_ids(VARIANTS))
def test_collective_matches_reference(name: str, params: dict[str, Any]) -> None:
    collective = COLLECTIVES[name]
    check_collective(collective.function, collective.reference, params=params,
                     settings=budget(name))


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


ALLREDUCE_VARIANTS = [(name, params) for name, params in VARIANTS if name.endswith("allreduce")]
# The costly ones get fewer examples here too (FEWER_EXAMPLES).
COSTLY_ALLREDUCE_VARIANTS = [v for v in ALLREDUCE_VARIANTS if v[0] in FEWER_EXAMPLES]
CHEAP_ALLREDUCE_VARIANTS = [v for v in ALLREDUCE_VARIANTS if v[0] not in FEWER_EXAMPLES]


def same_bits_on_every_rank(name: str, params: dict[str, Any], data: st.DataObject) -> None:
    """Every rank ends an all-reduce of arbitrary floats with the same bits."""
    # Arbitrary floats, whose sums depend on the order they are added in: ranks that fold
    # in different orders end with different bits, and DDP replicas would drift apart.
    p = data.draw(st.integers(2, 9), label="world size")
    length = data.draw(st.integers(0, 40), label="length")
    floats = st.floats(-1e8, 1e8, allow_nan=False, width=32)
    inputs = [np.array(data.draw(st.lists(floats, min_size=length, max_size=length)),
                       np.float32) for _ in range(p)]
    op = data.draw(st.sampled_from([SUM, AVG, PROD, MAX, MIN]), label="op")
    with np.errstate(over="ignore", invalid="ignore"):  # products may overflow: inf, nan
        result = simulate(COLLECTIVES[name].function, inputs, data.draw(topologies(p)),
                          op=op, record=False, **params)
    first = result.results[0].view(np.uint32)
    for rank, got in enumerate(result.results[1:], 1):
        assert np.array_equal(got.view(np.uint32), first), f"rank {rank} differs from rank 0"


@pytest.mark.parametrize(("name", "params"), CHEAP_ALLREDUCE_VARIANTS,
                         ids=_ids(CHEAP_ALLREDUCE_VARIANTS))
@budget()
@given(data=st.data())
def test_every_allreduce_leaves_the_same_bits_on_every_rank(name, params, data) -> None:
    same_bits_on_every_rank(name, params, data)


@pytest.mark.parametrize(("name", "params"), COSTLY_ALLREDUCE_VARIANTS,
                         ids=_ids(COSTLY_ALLREDUCE_VARIANTS))
@settings(max_examples=settings.default.max_examples)  # as FEWER_EXAMPLES gives them
@given(data=st.data())
def test_every_costly_allreduce_leaves_the_same_bits_on_every_rank(name, params, data) -> None:
    same_bits_on_every_rank(name, params, data)


def test_whole_buffer_alltoall_allreduce_is_the_same_on_every_rank() -> None:
    # The audit's case: adding in arrival order gave [1.0, 0.0, 0.0].
    inputs = [np.array([v], np.float32) for v in (1e8, 1.0, -1e8)]
    result = simulate(alltoall_allreduce, inputs, switch(3, 1e9, 0.0))
    assert [r.tolist() for r in result.results] == [[0.0]] * 3
