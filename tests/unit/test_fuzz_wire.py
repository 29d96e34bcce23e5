"""Fuzzing the decoders of peer input: the frame decoder (every header type through it), the grid payload
decoder, and a whole stack receiving frames that decode but carry nonsense.

Inputs: arbitrary bytes; real frames captured from simulated groups (fifo, vsync and total-order stacks, so
every header type of every layer appears), mutated byte-wise (flips, inserts, deletes, splices, msgpack type
bytes); and structurally valid msgpack with wrong types and sizes in each position. A decoder must either
return or raise WireError with a message naming the field (prefix ``frame``/``grid``); anything else is a
bug. The stack test feeds decodable-but-hostile frames into a member whose view holds their sender and
checks that no layer raises. Hangs are caught by the timeout marker (no timed assertions).

This module runs a small share with hypothesis in the default test command; ``scripts/fuzz_decoders.py``
runs the same generators (tests/unit/fuzzwire.py) for millions of inputs
(``python scripts/fuzz_decoders.py --inputs 1000000``).
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from groupcluster import protocols as _protocols  # noqa: F401  # registers every layer and header
from groupcluster.core.message import HEADER_TYPES
from groupcluster.core.wire import decode_frame
from groupcluster.grid import payload as grid_payload
from groupcluster.protocols import sequencer as _sequencer  # noqa: F401  # registers the sequencer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzzwire import (
    SIM_CLUSTER,
    StackTarget,
    check_frame_decoder,
    check_grid_decoder,
    check_header_decoder,
    corpus_frames,
    grid_corpus,
    mutate_bytes,
    mutate_header_ints,
    mutate_structure,
)

# -- the default share ---------------------------------------------------------------------------------------
# Derandomized: the same inputs every run, so the test command is not a lottery; new inputs come from the
# million-input target (scripts/fuzz_decoders.py), and whatever it finds is pinned as a test here.
FUZZ = settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None, derandomize=True
)
# Recursive msgpack structures cost hypothesis far more to generate than the decoders take to reject them.
FUZZ_STRUCTURED = settings(FUZZ, max_examples=100)


@pytest.mark.timeout(120)
@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_are_rejected_cleanly(data: bytes) -> None:
    check_frame_decoder(data)
    check_grid_decoder(data)


@pytest.mark.timeout(120)
@FUZZ
@given(st.data())
def test_mutated_real_frames_are_rejected_cleanly(data: st.DataObject) -> None:
    frames = corpus_frames()
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    base = rng.choice(frames)
    mutated = mutate_bytes(base, rng, rng.choice(frames)) if rng.random() < 0.5 else mutate_structure(base, rng)
    check_frame_decoder(mutated)


@pytest.mark.timeout(120)
@FUZZ
@given(st.data())
def test_mutated_grid_payloads_are_rejected_cleanly(data: st.DataObject) -> None:
    payloads = grid_corpus()
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    base = rng.choice(payloads)
    mutated = mutate_bytes(base, rng, rng.choice(payloads)) if rng.random() < 0.5 else mutate_structure(base, rng)
    check_grid_decoder(mutated)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=40)
    | st.binary(max_size=64),
    lambda children: st.lists(children, max_size=8),
    max_leaves=40,
)


@pytest.mark.timeout(120)
@FUZZ_STRUCTURED
@given(st.sampled_from(sorted(HEADER_TYPES)), msgpack_values)
def test_every_header_decoder_rejects_wrong_types_cleanly(pid: int, value: Any) -> None:
    check_header_decoder(pid, value)


@pytest.mark.timeout(120)
@FUZZ_STRUCTURED
@given(
    st.one_of(st.just(1), msgpack_values),
    st.one_of(st.just(SIM_CLUSTER), msgpack_values),
    st.one_of(st.just(["10.0.0.1", 7800, 1]), msgpack_values),
    st.lists(
        st.lists(st.one_of(st.none(), msgpack_values), min_size=4, max_size=4)
        | st.tuples(st.none(), st.integers(0, 7), st.lists(msgpack_values, max_size=6), st.binary(max_size=32)).map(
            list
        ),
        max_size=4,
    ),
)
def test_structurally_valid_frames_with_wrong_fields(version: Any, cluster: Any, sender: Any, msgs: Any) -> None:
    data = msgpack.packb([version, cluster, sender, msgs], use_bin_type=True)
    check_frame_decoder(data)


@pytest.mark.timeout(120)
@FUZZ_STRUCTURED
@given(st.integers(0, 30), msgpack_values)
def test_structurally_valid_grid_payloads_with_wrong_fields(kind: int, body: Any) -> None:
    fields = body if isinstance(body, list) else [body]
    data = msgpack.packb([grid_payload.GRID_FORMAT_VERSION, [[kind, *fields]]], use_bin_type=True)
    check_grid_decoder(data)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("preset", ["fifo", "vsync", "total-order"])
def test_a_member_survives_decodable_hostile_frames(preset: str) -> None:
    # Frames that pass the decoder but carry hostile values (huge seqnos, ranges, counts, wrong kinds) go
    # through every layer of a member that has their senders in its view; nothing may raise (or hang).
    target = StackTarget(preset)
    frames = corpus_frames()
    rng = random.Random(f"stack-{preset}")
    fed = 0
    for _ in range(2500):
        base = rng.choice(frames)
        r = rng.random()
        data = mutate_header_ints(base, rng) if r < 0.8 else mutate_structure(base, rng) if r < 0.9 else base
        if check_frame_decoder(data) == "ok":
            target.feed(data)
            fed += 1
    target.stack.fire_timers(target.now + 60.0)
    assert fed > 600, f"only {fed} of the mutated frames decoded: the test is not reaching the layers"


def test_the_corpus_covers_every_header_type() -> None:
    seen: set[int] = set()
    for data in corpus_frames():
        for msg in decode_frame(data, SIM_CLUSTER)[1]:
            seen.update(msg.headers)
    missing = {HEADER_TYPES[p].__name__ for p in set(HEADER_TYPES) - seen}
    # Headers of layers that are in no preset (fault injection, test probes) cannot appear.
    assert missing <= {"FaultsHeader", "ProbeHeader"}, f"no frame in the corpus carries {sorted(missing)}"
