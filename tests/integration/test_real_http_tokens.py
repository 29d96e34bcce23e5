"""Bearer tokens on a real grid member: ``--admin-token-file`` guards POST /v1/leave, ``--kv-token-file`` the
data endpoints; probes, status and metrics stay open; a bad token file stops the member with a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from groupcluster.grid.client import GridClient, GridRequestError

from .grids import Grid, http
from .procs import Members, wait_until

ADMIN = "admin-" + "a" * 24
KV = "kv-" + "k" * 24
MEMBER = [sys.executable, "-m", "groupcluster.cli", "member", "--cluster", "c", "--bind", "127.0.0.1:0", "--grid"]


def test_tokens_guard_leave_and_data_but_not_probes(tmp_path: Path) -> None:
    (tmp_path / "admin").write_text(ADMIN + "\n")
    (tmp_path / "kv").write_text(KV)
    group = Members(tmp_path)
    try:
        grid = Grid(group, 1)
        grid.start(0, "--admin-token-file", str(tmp_path / "admin"), "--kv-token-file", str(tmp_path / "kv"))
        wait_until("a one-member grid", lambda: grid.settled(["m0"]), 60, group)
        url = grid.urls["m0"]
        for path in ("/healthz", "/readyz", "/v1/status", "/metrics"):
            assert http("GET", url + path)[0] == 200, path

        code, body = http("PUT", url + "/v1/kv/a", b"1")
        assert code == 401 and "missing bearer token" in json.loads(body)["error"], body
        code, body = http("PUT", url + "/v1/kv/a", b"1", headers={"Authorization": "Bearer " + ADMIN})
        assert code == 401 and "wrong bearer token" in json.loads(body)["error"], body
        assert http("PUT", url + "/v1/kv/a", b"1", headers={"Authorization": "Bearer " + KV})[0] == 200
        code, _ = http(
            "POST", url + "/v1/batch", b'{"ops": [["get", "a"]]}', headers={"Content-Type": "application/json"}
        )
        assert code == 401

        client = GridClient([url], token=KV)
        try:
            client.put(b"b", b"2")
            assert client.get(b"b") == b"2"
            client.put_many({b"c": b"3", b"d": b"4"})
            assert client.get_many([b"c", b"d"]) == {b"c": b"3", b"d": b"4"}
        finally:
            client.close()
        anonymous = GridClient([url], route=False)
        try:
            with pytest.raises(GridRequestError) as exc:
                anonymous.get(b"b")
            assert exc.value.status == 401
        finally:
            anonymous.close()

        # The data token does not make a member leave; the admin token does.
        code, body = http("POST", url + "/v1/leave", headers={"Authorization": "Bearer " + KV})
        assert code == 401 and "admin token" in json.loads(body)["error"], body
        assert grid.procs["m0"].alive()
        code, body = http("POST", url + "/v1/leave", headers={"Authorization": "Bearer " + ADMIN})
        assert code == 202, body
        wait_until("the member to leave", lambda: not grid.procs["m0"].alive(), 60, group)
    finally:
        group.kill_all()


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("short", "at least 16 characters")])
def test_bad_token_file_is_a_clear_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    res = subprocess.run(
        [*MEMBER, "--admin-token-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "--admin-token-file" in res.stderr and message in res.stderr, res.stderr
