"""Frame authentication: the envelope (forgery, replay, truncation, wrong key or cluster, key rotation,
encryption), its bounded replay state, the transport's drop-and-count path, the configuration errors, and a
simulated group that runs every fault kind with authentication and encryption on."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError
from groupcluster.core.events import ViewChange
from groupcluster.core.message import Message
from groupcluster.core.stack import Stack, Transmit, resolve_config
from groupcluster.core.view import View, ViewId
from groupcluster.core.wire import decode_frame, encode_messages
from groupcluster.protocols import auth
from groupcluster.protocols.auth import (
    FORGED,
    OVERHEAD,
    REPLAYED,
    TRUNCATED,
    UNAUTHENTICATED,
    UNKNOWN_KEY,
    WRONG_MODE,
    AuthError,
    FrameAuth,
)
from groupcluster.sim.runner import run_many
from groupcluster.sim.scenario import Scenario

K1 = b"k1-0123456789abcdef-secret"
K2 = b"k2-fedcba9876543210-secret"
A = Address("10.0.0.1", 7800, 11)
B = Address("10.0.0.2", 7800, 22)
FRAME = encode_messages("test", A, [Message(None, b"hello world " * 4)])


def pair(*, encrypt: bool = False, sender_keys=(K1,), receiver_keys=(K1,), **kw) -> tuple[FrameAuth, FrameAuth]:
    sender = FrameAuth(sender_keys, "test", session=os.urandom(16), encrypt=encrypt)
    receiver = FrameAuth(receiver_keys, "test", session=os.urandom(16), encrypt=encrypt, **kw)
    return sender, receiver


def rejected(receiver: FrameAuth, data: bytes, now: float = 0.0) -> AuthError:
    with pytest.raises(AuthError) as err:
        receiver.open(data, now)
    return err.value


@pytest.mark.parametrize("encrypt", [False, True])
def test_round_trip_and_every_byte_is_protected(encrypt: bool) -> None:
    sender, receiver = pair(encrypt=encrypt)
    sealed = sender.seal(FRAME)
    assert len(sealed) == len(FRAME) + OVERHEAD
    plain, _ = receiver.open(sealed, 0.0)
    assert bytes(plain) == FRAME
    assert decode_frame(plain, "test")[0] == A  # type: ignore[arg-type]
    # Flipping any single byte (header, body or tag) makes the frame forged, never accepted.
    for pos in range(len(sealed)):
        fresh = sender.seal(FRAME)
        mutated = bytearray(fresh)
        mutated[pos] ^= 0x01
        err = rejected(receiver, bytes(mutated))
        if pos == 0:
            assert err.reason == UNAUTHENTICATED
        elif pos == 1:
            assert err.reason == WRONG_MODE
        elif 2 <= pos < 6:
            assert err.reason == UNKNOWN_KEY
        else:
            assert err.reason == FORGED, (pos, err)
    # Forged frames did not move the replay window: the untouched frames still open.
    receiver.open(sender.seal(FRAME), 0.0)


def test_encryption_hides_the_frame_and_never_reuses_a_nonce() -> None:
    sender, receiver = pair(encrypt=True)
    frames = [sender.seal(FRAME) for _ in range(50)]
    assert all(b"hello world" not in f for f in frames)
    nonces = {f[22:30] for f in frames}  # the counter is the nonce of the session's key
    assert len(nonces) == 50
    assert len({f[OVERHEAD - 16 :] for f in frames}) == 50  # same plaintext, different ciphertext every time
    for f in frames:
        assert bytes(receiver.open(f, 0.0)[0]) == FRAME
    # Another sender session with the same key and counters encrypts differently (its own derived key).
    other = FrameAuth((K1,), "test", session=os.urandom(16), encrypt=True)
    assert other.seal(FRAME)[30:] != frames[0][30:]


def test_mac_frames_carry_the_plain_frame() -> None:
    sender, _ = pair()
    assert FRAME in sender.seal(FRAME)


@pytest.mark.parametrize("encrypt", [False, True])
def test_replays_are_dropped_and_reordering_within_the_window_is_not(encrypt: bool) -> None:
    sender, receiver = pair(encrypt=encrypt, window=64)
    frames = [sender.seal(FRAME) for _ in range(200)]
    receiver.open(frames[0], 0.0)
    assert rejected(receiver, frames[0]).reason == REPLAYED
    # Reordered within the window: all accepted once, none twice.
    order = list(range(1, 60))
    random.Random(3).shuffle(order)
    for i in order:
        receiver.open(frames[i], 0.0)
    for i in order:
        assert rejected(receiver, frames[i]).reason == REPLAYED
    receiver.open(frames[199], 0.0)
    # Older than the window below the highest counter: refused even if never seen.
    err = rejected(receiver, frames[100])
    assert err.reason == REPLAYED and "older than the replay window" in str(err)
    receiver.open(frames[150], 0.0)  # within the window, never seen: fine
    assert rejected(receiver, frames[150]).reason == REPLAYED


def test_gaps_are_normal_frames_for_other_members_never_arrive() -> None:
    sender, receiver = pair()
    frames = [sender.seal(FRAME) for _ in range(30)]
    for f in frames[::7]:
        receiver.open(f, 0.0)
    assert receiver.sessions[(sender.send_key.key_id, sender.session)].highest == 29


def test_truncated_and_unsealed_frames() -> None:
    sender, receiver = pair()
    sealed = sender.seal(FRAME)
    assert rejected(receiver, sealed[:10]).reason == TRUNCATED
    assert rejected(receiver, sealed[: OVERHEAD - 1]).reason == TRUNCATED
    assert rejected(receiver, sealed[:-1]).reason == FORGED
    assert rejected(receiver, sealed[: len(sealed) // 2]).reason == FORGED
    assert rejected(receiver, FRAME).reason == UNAUTHENTICATED
    assert rejected(receiver, b"").reason == UNAUTHENTICATED


def test_wrong_key_other_cluster_and_wrong_mode() -> None:
    sender, receiver = pair(sender_keys=(K2,))
    assert rejected(receiver, sender.seal(FRAME)).reason == UNKNOWN_KEY
    # Same secret, another cluster: keys are derived per cluster, so the frame is foreign.
    foreign = FrameAuth((K1,), "other-cluster", session=os.urandom(16))
    assert rejected(receiver, foreign.seal(FRAME)).reason == UNKNOWN_KEY
    encrypting = FrameAuth((K1,), "test", session=os.urandom(16), encrypt=True)
    assert rejected(receiver, encrypting.seal(FRAME)).reason == WRONG_MODE
    # A forged tag under a known key id (an attacker can copy a key id from any captured frame).
    sealed = bytearray(FrameAuth((K1,), "test", session=os.urandom(16)).seal(FRAME))
    sealed[-16:] = os.urandom(16)
    assert rejected(receiver, bytes(sealed)).reason == FORGED


def test_key_rotation_first_key_seals_every_key_opens() -> None:
    old = FrameAuth((K1,), "test", session=os.urandom(16))
    rotating = FrameAuth((K2, K1), "test", session=os.urandom(16))  # new key first, old still accepted
    new = FrameAuth((K2,), "test", session=os.urandom(16))
    rotating.open(old.seal(FRAME), 0.0)
    rotating.open(new.seal(FRAME), 0.0)
    new.open(rotating.seal(FRAME), 0.0)
    assert rejected(old, rotating.seal(FRAME)).reason == UNKNOWN_KEY


def test_replay_state_is_bounded_and_prefers_keeping_members() -> None:
    receiver = FrameAuth((K1,), "test", session=os.urandom(16), max_senders=4, sender_ttl=60.0)
    member = FrameAuth((K1,), "test", session=os.urandom(16))
    _, sess = receiver.open(member.seal(FRAME), 0.0)
    receiver.bind(sess, A)
    receiver.set_members([A])
    for t in range(1, 50):
        receiver.open(FrameAuth((K1,), "test", session=os.urandom(16)).seal(FRAME), float(t))
        assert len(receiver.sessions) <= 4
    # The view member survived 49 strangers, though it was the least recently seen.
    assert (member.send_key.key_id, member.session) in receiver.sessions
    receiver.open(member.seal(FRAME), 50.0)


def test_silent_non_members_are_pruned_members_are_not() -> None:
    receiver = FrameAuth((K1,), "test", session=os.urandom(16), sender_ttl=60.0)
    a, b = (FrameAuth((K1,), "test", session=os.urandom(16)) for _ in range(2))
    for sender, address in ((a, A), (b, B)):
        _, sess = receiver.open(sender.seal(FRAME), 0.0)
        receiver.bind(sess, address)
    receiver.set_members([A])
    assert receiver.prune(30.0) == 0
    assert receiver.prune(61.0) == 1
    assert [s.sender for s in receiver.sessions.values()] == [A]
    # Pruning also happens while receiving, without a timer.
    receiver.set_members([])
    receiver.open(FrameAuth((K1,), "test", session=os.urandom(16)).seal(FRAME), 200.0)
    assert A not in [s.sender for s in receiver.sessions.values()]


# -- configuration ------------------------------------------------------------------------------------------
def transport_config(**params):
    [(_, cfg)] = resolve_config([{"layer": "transport", **params}])
    return cfg


def test_secret_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret"
    path.write_text("# rotated 2024-05\n" + K2.decode() + "\n\n" + K1.decode() + "\n")
    cfg = transport_config(auth_secret_file=str(path))
    assert cfg.secret.keys == (K2, K1)
    assert K1.decode() not in repr(cfg)  # a config dump never shows the key
    monkeypatch.setenv("GC_TEST_SECRET", K1.decode())
    assert transport_config(auth_secret_env="GC_TEST_SECRET", encrypt=True).secret.keys == (K1,)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"auth_secret_file": "/nonexistent/secret"}, "auth_secret_file: cannot read the secret file /nonexistent"),
        ({"auth_secret_file": 5}, "auth_secret_file: expected the path of a file"),
        ({"auth_secret_env": "GC_TEST_UNSET_VARIABLE"}, "the environment variable GC_TEST_UNSET_VARIABLE is not set"),
        ({"encrypt": True}, "transport.encrypt: encryption needs a cluster secret"),
        ({"auth_replay_window": 8}, "auth_replay_window"),
    ],
)
def test_bad_auth_configuration_names_the_key(params, expected) -> None:
    with pytest.raises(ConfigError) as err:
        transport_config(**params)
    assert expected in str(err.value), str(err.value)


def test_short_empty_binary_and_double_secrets_are_rejected(tmp_path: Path, monkeypatch) -> None:
    short = tmp_path / "short"
    short.write_text("tooshort\n")
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe" * 20)
    for path, expected in ((short, "at least 16 are required"), (empty, "holds no key"), (binary, "is not text")):
        with pytest.raises(ConfigError) as err:
            transport_config(auth_secret_file=str(path))
        assert "auth_secret_file" in str(err.value) and expected in str(err.value), str(err.value)
    monkeypatch.setenv("GC_TEST_SECRET", K1.decode())
    good = tmp_path / "good"
    good.write_text(K1.decode())
    with pytest.raises(ConfigError, match="not both"):
        transport_config(auth_secret_file=str(good), auth_secret_env="GC_TEST_SECRET")


# -- the transport in a stack ------------------------------------------------------------------------------
def stack(me: Address, secret_file: Path | None, **params) -> Stack:
    entry: dict = {"layer": "transport", **params}
    if secret_file is not None:
        entry["auth_secret_file"] = str(secret_file)
    return Stack([entry], local_address=me, cluster="test", seed=1)


def frames_between(src: Stack, to: Address = B) -> list[bytes]:
    return [o.data for o in src.drain() if isinstance(o, Transmit) and o.endpoint == to.endpoint]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text(K1.decode() + "\n")
    return path


def test_stacks_with_the_key_talk_and_others_are_counted(tmp_path: Path, secret: Path) -> None:
    a, b = stack(A, secret), stack(B, secret)
    other_key = tmp_path / "other"
    other_key.write_text(K2.decode())
    stranger, plain = stack(Address("10.0.0.3", 7800, 3), other_key), stack(Address("10.0.0.4", 7800, 4), None)
    for s in (a, b, stranger, plain):
        s.start(0.0)
        s.control(0.0, ViewChange(View(ViewId(1, A), (A, B, s.local_address))))
        s.drain()
    a.send_many(1.0, [Message(None, f"m{i}".encode()) for i in range(3)])
    sealed = frames_between(a)
    assert sealed and all(f[0] == 0xC1 for f in sealed)
    b.receive_many(1.0, sealed)
    assert [m.payload for ev in b.drain() if hasattr(ev, "messages") for m in ev.messages] == [b"m0", b"m1", b"m2"]
    # The same frames again (a replay by anyone on the network): dropped and counted.
    b.receive_many(2.0, sealed)
    assert b.metrics["transport.auth_replayed"] == len(sealed)
    # Another key, no key, a forged and a truncated frame.
    stranger.send(1.0, b"evil")
    plain.send(1.0, b"plain")
    bad = [*frames_between(stranger), *frames_between(plain), sealed[0][:-1], sealed[0][:20]]
    b.receive_many(3.0, bad)
    m = b.metrics
    assert (m["transport.auth_unknown_key"], m["transport.auth_unauthenticated"]) == (1, 1)
    assert (m["transport.auth_forged"], m["transport.auth_truncated"]) == (1, 1)
    assert m["transport.auth_rejected"] == len(sealed) + 4
    assert not [ev for ev in b.drain() if hasattr(ev, "messages")]
    assert b.describe()["transport"]["auth"]["rejected"] == len(sealed) + 4
    # A member without a secret drops sealed frames and says why.
    plain.receive(4.0, sealed[0])
    assert plain.metrics["transport.bad_frames"] == 1


def test_sealed_frames_fit_max_frame_size(secret: Path) -> None:
    a = stack(A, secret, max_frame_size="4KiB")
    a.start(0.0)
    a.control(0.0, ViewChange(View(ViewId(1, A), (A, B))))
    a.drain()
    a.send_many(1.0, [Message(None, b"x" * 200) for _ in range(300)])
    sizes = [len(f) for f in frames_between(a)]
    assert len(sizes) > 10 and max(sizes) <= 4096, sizes


def test_reseed_session_only_before_the_first_frame(secret: Path) -> None:
    a = stack(A, secret)
    transport = a.layers[0]
    transport.reseed_session(b"\x01" * 16)
    assert transport.auth.session == b"\x01" * 16
    transport.auth.seal(b"x")
    with pytest.raises(RuntimeError):
        transport.reseed_session(b"\x02" * 16)


def test_simulated_group_with_auth_and_encryption_keeps_every_property(secret: Path) -> None:
    # Every fault kind of the simulator (loss, duplication - replays at the transport -, reordering, partitions,
    # crashes) with sealed, encrypted frames: the checkers must find no violation and the group must converge.
    scenario = Scenario(overrides={"transport": {"auth_secret_file": str(secret), "encrypt": True}})
    results = list(run_many(range(6), scenario))
    for r in results:
        assert not r.violations, (r.seed, r.violations[:3])
        assert r.converged_at is not None, r.seed
    assert sum(r.stats["delivered"] for r in results) > 500


def test_module_constants_describe_the_envelope() -> None:
    assert auth.HEADER_SIZE == 30 and auth.OVERHEAD == 46
    assert auth.MARKER == 0xC1  # msgpack never uses 0xC1: a sealed frame is never a plain one
