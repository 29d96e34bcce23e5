"""The operator's override on real members: a 2-member grid loses one member to SIGKILL, the survivor holds half
of the stable topology and cannot tell a crash from a split, so it stays degraded; ``POST /v1/force-available``
on the coordinator (admin token required) brings it back, and every acknowledged key is still there (each
segment had 2 owners)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from groupcluster.grid.client import GridClient

from .grids import Grid, http
from .procs import Members, wait_until

ADMIN = "admin-" + "f" * 24
AUTH = {"Authorization": "Bearer " + ADMIN}


def _grid_status(url: str) -> dict[str, Any] | None:
    try:
        code, body = http("GET", url + "/v1/status", timeout=3)
    except OSError:
        return None
    return json.loads(body) if code == 200 else None


def test_force_available_after_a_crash_in_a_two_member_grid(tmp_path: Path) -> None:
    (tmp_path / "admin").write_text(ADMIN)
    group = Members(tmp_path)
    try:
        grid = Grid(group, 2)
        for i in range(2):
            grid.start(i, "--admin-token-file", str(tmp_path / "admin"))
        wait_until("a balanced 2-member grid", lambda: grid.settled(["m0", "m1"]), 90, group)
        client = GridClient(list(grid.urls.values()))
        try:
            data = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(2000)}
            client.put_many(data)
        finally:
            client.close()

        st = _grid_status(grid.urls["m0"])
        assert st is not None
        coord = "m0" if st["coordinator"] == st["address"] else "m1"
        other = "m1" if coord == "m0" else "m0"
        # Only the coordinator decides; the token is required.
        code, body = http("POST", grid.urls[other] + "/v1/force-available", headers=AUTH)
        assert code == 409 and "only the coordinator" in json.loads(body)["error"], body
        assert http("POST", grid.urls[coord] + "/v1/force-available")[0] == 401

        grid.procs[coord].kill()
        survivor = grid.urls[other]

        def availability() -> str | None:
            s = _grid_status(survivor)
            return None if s is None or s["grid"] is None else s["grid"]["availability"]

        wait_until("the survivor to see the crash", lambda: availability() not in (None, "AVAILABLE"), 60, group)
        code, body = http("POST", survivor + "/v1/force-available", headers=AUTH)
        assert code == 200 and json.loads(body)["forced"] is True, body
        wait_until("the survivor available again", lambda: availability() == "AVAILABLE", 60, group)

        client = GridClient([survivor])
        try:
            assert client.get_many(list(data)) == data
            client.put(b"after", b"yes")
            assert client.get(b"after") == b"yes"
        finally:
            client.close()
    finally:
        group.kill_all()
