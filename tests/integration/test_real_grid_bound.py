"""The ``max_entries`` bound on real members over HTTP (docs/grid.md, "A bound on entries"): two members with
``--grid-set max_entries=N`` and two owners take keys until a primary holds N entries; then a PUT of a new key
is a 507 with reason ``full`` (the sync client raises GridRequestError at once, a batch names each refused key),
nothing of it is written, overwrites and deletes go on, and /metrics counts the refusals. The same for the
``max_bytes`` bound on key and value bytes."""

from __future__ import annotations

import pytest
from groupcluster.grid.client import GridBatchError, GridClient, GridRequestError, GridTxAborted

from .grids import Grid, http, http_json
from .procs import Members, wait_until

BOUND = 50


def test_members_at_their_bound_refuse_new_keys_with_507_and_write_nothing(members: Members) -> None:
    grid = Grid(members, 2)
    for i in range(2):
        grid.start(i, "--grid-set", f"max_entries={BOUND}", "--grid-set", "num_owners=2")
    wait_until("two members settled", lambda: grid.settled(["m0", "m1"]), 90, members)
    url = grid.urls["m0"]
    with GridClient(list(grid.urls.values())) as client:
        # Two owners of every segment: each member holds every key, so the grid takes exactly BOUND keys.
        client.put_many({f"k{i}".encode(): b"v" for i in range(BOUND)})
        with pytest.raises(GridRequestError) as refused:
            client.put(b"one-more", b"v")
        assert refused.value.status == 507 and "max_entries is 50" in str(refused.value)
        code, body = http_json("PUT", f"{url}/v1/kv/one-more", b"v")
        assert code == 507 and body["reason"] == "full" and body["error"].startswith("full: member "), body
        with pytest.raises(GridBatchError) as batch:
            client.put_many({b"k0": b"again", b"b1": b"v", b"b2": b"v"})
        assert set(batch.value.failed) == {b"b1", b"b2"} and batch.value.completed == 1
        assert all("HTTP 507" in why for why in batch.value.failed.values()), batch.value.failed
        assert client.get_many([b"one-more", b"b1", b"b2", b"k0"]) == {
            b"one-more": None,
            b"b1": None,
            b"b2": None,
            b"k0": b"again",
        }
        # A transaction adding a key is refused the same way (rolled back at prepare), and not re-run.
        with pytest.raises(GridTxAborted) as aborted:
            client.run_transaction(lambda tx: tx.put(b"tx-new", b"v"))
        assert aborted.value.reason == "full" and aborted.value.status == 409, aborted.value
        assert client.stats.get("tx_reruns", 0) == 0 and client.get(b"tx-new") is None
        client.delete(b"k1")  # room for one
        client.put(b"one-more", b"v")
        assert client.get(b"one-more") == b"v"
        for name in ("m0", "m1"):
            st = grid.status(name)
            assert st is not None and st["grid"]["store"]["entries"] == BOUND, st["grid"]["store"]
            assert st["grid"]["store"]["max_entries"] == BOUND
    refusals = 0
    for u in grid.urls.values():
        text = http("GET", f"{u}/metrics")[1].decode()
        refusals += sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("groupcluster_grid_writes_refused_full")
        )
    assert refusals == 4  # the client's PUT, the curl-style PUT and the batch's two keys (not the transaction)


def test_members_refuse_what_would_grow_them_past_max_bytes(members: Members) -> None:
    """``--grid-set max_bytes=2KiB`` on two real members with two owners: 20 entries of a 4-byte key and a
    96-byte value fill 2,000 of the 2,048 bytes; a 60-byte value more is a 507 naming max_bytes, an overwrite
    that grows is refused too, one that shrinks goes on and makes room; status and metrics show the bytes."""
    grid = Grid(members, 2)
    for i in range(2):
        grid.start(i, "--grid-set", "max_bytes=2KiB", "--grid-set", "num_owners=2")
    wait_until("two members settled", lambda: grid.settled(["m0", "m1"]), 90, members)
    with GridClient(list(grid.urls.values())) as client:
        client.put_many({b"k%03d" % i: b"v" * 96 for i in range(20)})
        with pytest.raises(GridRequestError) as refused:
            client.put(b"k999", b"w" * 60)
        assert refused.value.status == 507 and "holds 2000 bytes of keys and values, its max_bytes is 2048" in str(
            refused.value
        )
        with pytest.raises(GridRequestError):
            client.put(b"k000", b"v" * 150)  # grows an entry by 54 bytes
        client.put(b"k000", b"v" * 30)  # shrinks it by 66
        client.put(b"k999", b"w" * 60)  # 64 bytes: fits now
        assert client.get_many([b"k000", b"k999"]) == {b"k000": b"v" * 30, b"k999": b"w" * 60}
    for name, url in grid.urls.items():
        st = grid.status(name)
        assert st is not None and st["grid"]["store"]["bytes"] == 1998 and st["grid"]["store"]["max_bytes"] == 2048
        text = http("GET", f"{url}/metrics")[1].decode()
        assert "groupcluster_grid_store_bytes 1998" in text and "groupcluster_grid_max_bytes 2048" in text, name
