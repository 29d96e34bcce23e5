"""Transaction endpoints: one-shot (``/v1/tx``), interactive (``/v1/tx/begin``, ``/v1/tx/{id}/...``) and the
in-doubt ones (list, report, resolve)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..driver.grid_runtime import GridRuntime
from ..errors import GridError, GridUnavailable
from ..tx.messages import TxId
from .handler_base import HandlerBase
from .parsers import BadBatch, accepts_msgpack, parse_tx, parse_tx_begin, parse_tx_id, parse_tx_lock, parse_tx_resolve
from .responses import b64, committed_doc, json_error, packed, tx_failure, unavailable


class TxHandlers(HandlerBase):
    """One-shot, interactive and in-doubt transactions."""

    async def tx(self, request: web.Request) -> web.Response:
        """``POST /v1/tx``: a one-shot transaction (begin, lock, commit) on this member."""
        self._count("tx")
        grid = self._runtime(request, tx=True)
        if isinstance(grid, web.Response):
            return grid
        parsed = await self._body(
            request, optional=False, shape='{"reads": {key: version}, "writes": {key: value or null}}'
        )
        if isinstance(parsed, web.Response):
            return parsed
        doc, binary = parsed
        try:
            req = parse_tx(doc, binary)
        except BadBatch as exc:
            return json_error(400, str(exc))
        try:
            tx, res = await grid.transact(req.writes, req.reads, mode=req.mode, lock=req.lock)
        except (ValueError, TypeError) as exc:
            return json_error(400, str(exc))
        except GridError as exc:
            return tx_failure(exc)
        return packed(committed_doc(tx, res), binary)

    async def tx_begin(self, request: web.Request) -> web.Response:
        """``POST /v1/tx/begin``: an interactive transaction, driven by later requests to this member."""
        self._count("tx_begin")
        grid = self._runtime(request, tx=True)
        if isinstance(grid, web.Response):
            return grid
        parsed = await self._body(request, optional=True, shape='{"mode": "optimistic" or "pessimistic"}')
        if isinstance(parsed, web.Response):
            return parsed
        doc, binary = parsed
        try:
            mode = parse_tx_begin(doc)
            tx = await grid.tx_begin(mode, interactive=True)
        except (BadBatch, ValueError) as exc:
            return json_error(400, str(exc))
        except GridError as exc:
            return tx_failure(exc)
        return packed({"tx": str(tx), "mode": grid.interactive[tx].mode, "timeout": grid.tx_timeout}, binary)

    async def tx_action(self, request: web.Request) -> web.Response:
        """``POST /v1/tx/{id}/lock|commit|rollback|resolve``."""
        action = request.match_info["action"]
        self._count(f"tx_{action}")
        grid = self._runtime(request, tx=True)
        if isinstance(grid, web.Response):
            return grid
        shapes = {
            "lock": '{"keys": [key, ...]}',
            "commit": '{"reads": {key: version}, "writes": {key: value or null}}',
            "rollback": "(none)",
            "resolve": '{"commit": true or false}',
        }
        try:
            tx = parse_tx_id(request.match_info["tx"])
        except BadBatch as exc:
            return json_error(400, str(exc))
        parsed = await self._body(request, optional=action in ("commit", "rollback"), shape=shapes[action])
        if isinstance(parsed, web.Response):
            return parsed
        doc, binary = parsed
        try:
            if action == "resolve":
                commit, versions, cluster = parse_tx_resolve(doc, binary)
                if cluster:
                    return await self._tx_resolve_all(grid, tx, commit)
                assert commit is not None
                return self._tx_resolve(grid, tx, commit, versions)
            if action == "rollback":
                return await self._tx_rollback(grid, tx, doc, binary)
            grid.check_interactive(tx)
            if action == "lock":
                keys = parse_tx_lock(doc, binary)
                await grid.tx_lock(tx, keys)
                return packed({"tx": str(tx), "locked": len(keys)}, binary)
            req = parse_tx(doc if doc is not None else {}, binary, interactive=True)
            res = await grid.tx_commit(tx, req.writes, req.reads)
            return packed(committed_doc(tx, res), binary)
        except BadBatch as exc:
            return json_error(400, str(exc))
        except (ValueError, TypeError) as exc:
            return json_error(400, f"transaction {tx}: {exc}")
        except GridError as exc:
            return tx_failure(exc)

    async def _tx_rollback(self, grid: GridRuntime, tx: TxId, doc: Any, binary: bool) -> web.Response:
        if doc is not None:
            return json_error(400, "body: a rollback takes no body")
        if tx not in grid.interactive:
            ended = grid.tx_ended(tx)
            if ended is None:
                grid.check_interactive(tx)  # raises GridTxNotFound with the explanation
            if ended is not None and ended.startswith("commit"):
                return json_error(409, f"transaction {tx} cannot be rolled back: {ended}", tx=str(tx), reason=ended)
            # Rolling back what already rolled back is harmless: answer as if it had been now.
            return packed({"tx": str(tx), "rolled_back": True, "detail": ended}, binary)
        await grid.tx_rollback(tx)
        return packed({"tx": str(tx), "rolled_back": True}, binary)

    def _tx_resolve(self, grid: GridRuntime, tx: TxId, commit: bool, versions: dict[bytes, int]) -> web.Response:
        if not grid.tx_resolve(tx, commit, versions):
            return json_error(
                404,
                f"transaction {tx} is not in doubt on this member (GET /v1/tx/in-doubt lists the ones that are)",
                tx=str(tx),
            )
        return web.json_response({"tx": str(tx), "resolved": "commit" if commit else "rollback"})

    async def _tx_resolve_all(self, grid: GridRuntime, tx: TxId, commit: bool | None) -> web.Response:
        res = await grid.tx_resolve_all(tx, commit)
        if res.ok:
            return web.json_response({"tx": str(tx), "resolved": (res.value or b"").decode(), "cluster": True})
        status = {"not_in_doubt": 404, "undecided": 409, "timeout": 504}.get(res.reason, 503)
        return json_error(status, res.error, tx=str(tx), reason=res.reason)

    async def tx_report(self, request: web.Request) -> web.Response:
        """``GET /v1/tx/{id}/report``: this member's state of a transaction, for a resolver
        (``groupcluster tx resolve --auto`` decides from every member's)."""
        self._count("tx_report")
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        try:
            tx = parse_tx_id(request.match_info["tx"])
            rep = grid.tx_report(tx)
        except BadBatch as exc:
            return json_error(400, str(exc))
        except GridUnavailable as exc:
            return unavailable(exc)
        in_doubt = any(d.tx == tx for d in grid.tx_in_doubt())
        return web.json_response(
            {
                "tx": str(tx),
                "state": rep.state.name if rep.state is not None else None,
                "in_doubt": in_doubt,
                "attempt": rep.attempt,
                "writes": [[b64(k), None if v is None else b64(v)] for k, v in rep.writes],
                "versions": [[b64(k), ver] for k, ver in rep.versions],
                # the members of the view at its prepare here: one gone for good may have committed it
                "views": [str(m) for m in rep.views],
            }
        )

    async def tx_in_doubt(self, request: web.Request) -> web.Response:
        """``GET /v1/tx/in-doubt``: this member's prepared transactions whose originator is gone."""
        self._count("tx_in_doubt")
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        binary = accepts_msgpack(request.headers.get("Accept", ""))
        try:
            found = grid.tx_in_doubt()
        except GridUnavailable as exc:
            return unavailable(exc)
        ch = self.ctx.channel()

        def enc(b: bytes) -> Any:
            return b if binary else b64(b)

        body = {
            "member": str(ch.address) if ch is not None else None,
            "in_doubt": [
                {
                    "tx": str(d.tx),
                    "attempt": d.attempt,
                    "keys": [enc(k) for k in d.keys],
                    "writes": [[enc(k), None if v is None else enc(v)] for k, v in d.writes],
                    "versions": [[enc(k), ver] for k, ver in d.versions],
                }
                for d in found
            ],
        }
        return packed(body, binary)
