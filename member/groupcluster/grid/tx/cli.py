"""``groupcluster tx``: list and resolve in-doubt grid transactions over a member's HTTP API.

A transaction is *in doubt* when its originator died after every participant voted yes to its prepare and
before they heard the decision: the participants keep its keys locked until an operator (or a resolver)
decides. ::

    groupcluster tx in-doubt --member 127.0.0.1:8080 [--all] [--json] [--admin-token-file F]
    groupcluster tx resolve 127.0.0.1:7800#12/3 --commit|--rollback|--auto --member 127.0.0.1:8080 [--only]
    groupcluster tx resolve 127.0.0.1:7800#12/3 --commit|--rollback|--auto --member 127.0.0.1:8080 --cluster

``in-doubt --all`` asks every member in the routing table of ``--member`` (an in-doubt transaction is listed
by each participant that holds it). ``resolve`` reads every member's report of the transaction
(``GET /v1/tx/{id}/report``) and resolves it (``POST /v1/tx/{id}/resolve``) on each member holding it in
doubt, with the versions the members stamped; ``--auto`` takes the safe decision (commit if some member
committed it, else roll back). With ``--cluster`` the member given does it all itself, in one request
(``POST /v1/tx/{id}/resolve`` ``{"cluster": true}``): it collects every member's report over the group and sends
one decision; ``--auto`` then applies the grid's own rule (the one of automatic resolution), which refuses,
saying why, when a member of the transaction's prepare-time view left. The endpoints need the admin token when
the members run with
``--admin-token-file``. Exit status: 0 done, 1 the member refused or
could not be reached (the message says why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ...runtime.member_cli import _token_file
from ..client import normalize_endpoint


class CliError(Exception):
    """A failure to report on one line (exit status 1)."""


def _endpoint(text: str) -> str:
    try:
        return normalize_endpoint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subs = parser.add_subparsers(dest="tx_command", metavar="ACTION")
    subs.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--member", required=True, type=_endpoint, metavar="URL", help="a member's HTTP endpoint (host:port)"
    )
    common.add_argument(
        "--admin-token-file", type=_token_file, metavar="PATH", help="the members' admin token (if they use one)"
    )
    common.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request (default 10)")
    listing = subs.add_parser("in-doubt", parents=[common], help="list in-doubt transactions")
    listing.add_argument("--all", action="store_true", help="ask every member in the routing table of --member")
    listing.add_argument("--json", action="store_true", help="print JSON (one document) instead of a table")
    resolve = subs.add_parser(
        "resolve",
        parents=[common],
        help="commit or roll back an in-doubt transaction on every member holding it",
        description="Resolve an in-doubt transaction on every member (found through the routing table of "
        "--member) that holds it in doubt; the members' stamped versions go with a commit.",
    )
    resolve.add_argument("tx", metavar="ID", help="the transaction id, as listed (host:port#incarnation/seq)")
    decision = resolve.add_mutually_exclusive_group(required=True)
    decision.add_argument("--commit", action="store_true", help="apply its writes on every owner")
    decision.add_argument("--rollback", action="store_true", help="discard its writes, release its locks")
    decision.add_argument(
        "--auto", action="store_true", help="commit if some member committed it, else roll back (the safe rule)"
    )
    where = resolve.add_mutually_exclusive_group()
    where.add_argument("--only", action="store_true", help="resolve on --member alone (not the other members)")
    where.add_argument(
        "--cluster",
        action="store_true",
        help="let --member collect every member's report and resolve everywhere (with --auto: the grid's rule, "
        "which refuses when a member of the transaction's prepare-time view left)",
    )


def _request(method: str, url: str, token: str | None, timeout: float, body: Any = None) -> tuple[int, Any]:
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CliError(f"cannot reach {url}: {reason}") from None
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = {"error": raw[:200].decode("utf-8", "replace")}
    if status == 401:
        raise CliError(f"{url}: {doc.get('error', 'unauthorized')} (give --admin-token-file)")
    return status, doc


def _members(args: argparse.Namespace) -> list[str]:
    if not getattr(args, "all", True):
        return [args.member]
    status, doc = _request("GET", args.member + "/v1/status", None, args.timeout)
    routing = doc.get("routing") if status == 200 and isinstance(doc, dict) else None
    urls = [u for u in (routing or {}).get("members", []) if isinstance(u, str)]
    if not urls:
        raise CliError(f"{args.member}: no routing table (is it a joined grid member?)")
    return list(dict.fromkeys(normalize_endpoint(u) for u in urls))


def _show_key(b64: str) -> str:
    raw = base64.b64decode(b64)
    try:
        text = raw.decode("utf-8")
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return "b64:" + b64


def in_doubt(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    failures = 0
    for url in _members(args):
        try:
            status, doc = _request("GET", url + "/v1/tx/in-doubt", args.admin_token_file, args.timeout)
        except CliError as exc:
            if not args.all:
                raise
            print(f"warning: {exc}", file=sys.stderr)
            failures += 1
            continue
        if status != 200:
            raise CliError(f"{url}: HTTP {status}: {doc.get('error', doc)}")
        for d in doc.get("in_doubt", []):
            rows.append({"member_url": url, "member": doc.get("member"), **d})
    if args.json:
        print(json.dumps({"in_doubt": rows}, indent=2))
    elif not rows:
        print("no in-doubt transactions" + (" on any member" if args.all else f" on {args.member}"))
    else:
        wt = max(len("TRANSACTION"), *(len(r["tx"]) for r in rows))
        wm = max(len("MEMBER"), *(len(r["member_url"]) for r in rows))
        print(f"{'TRANSACTION':<{wt}}  {'MEMBER':<{wm}}  {'ATTEMPT':>7}  {'WRITES':>6}  KEYS")
        for r in rows:
            keys = ", ".join(_show_key(k) for k in r.get("keys", [])[:6])
            more = len(r.get("keys", [])) - 6
            if more > 0:
                keys += f", ... ({more} more)"
            print(f"{r['tx']:<{wt}}  {r['member_url']:<{wm}}  {r['attempt']:>7}  {len(r.get('writes', [])):>6}  {keys}")
        txs = {r["tx"] for r in rows}
        print(
            f"\n{len(txs)} transaction(s) in doubt on {len({r['member_url'] for r in rows})} member(s); resolve each "
            "on every member with: groupcluster tx resolve ID --auto|--commit|--rollback --member URL"
        )
    return 1 if failures else 0


def _reports(args: argparse.Namespace, urls: list[str]) -> dict[str, dict[str, Any]]:
    """Every reachable member's report of the transaction (``GET /v1/tx/{id}/report``)."""
    path = "/v1/tx/" + urllib.parse.quote(args.tx, safe="") + "/report"
    out = {}
    for url in urls:
        try:
            status, doc = _request("GET", url + path, args.admin_token_file, args.timeout)
        except CliError as exc:
            print(f"warning: {exc}", file=sys.stderr)
            continue
        if status != 200:
            raise CliError(f"{url}: HTTP {status}: {doc.get('error', doc)}")
        out[url] = doc
    return out


def resolve(args: argparse.Namespace) -> int:
    """Resolve on every member that holds the transaction in doubt (the decision must be the same on all),
    passing the versions the members stamped (a commit needs one per written key)."""
    if args.cluster:
        return _resolve_cluster(args)
    urls = _members(args) if not args.only else [args.member]
    reports = _reports(args, urls)
    holding = [u for u, r in reports.items() if r.get("in_doubt")]
    if not holding:
        where = "the member" if args.only else "any member"
        raise CliError(f"transaction {args.tx} is not in doubt on {where} (list them with: groupcluster tx in-doubt)")
    if args.auto:
        # termination_decision (docs/grid-transactions.md): commit iff some participant committed it.
        commit = any(r.get("state") == "COMMITTED" for r in reports.values())
        why = "a participant committed it" if commit else "no participant committed it"
        print(f"decision: {'commit' if commit else 'roll back'} ({why})")
    else:
        commit = bool(args.commit)
    versions: dict[str, int] = {}
    for r in reports.values():
        for key, version in r.get("versions", []):
            versions[key] = max(version, versions.get(key, 0))
    path = "/v1/tx/" + urllib.parse.quote(args.tx, safe="") + "/resolve"
    resolved: list[str] = []
    pending = holding
    for _ in range(3):
        later = []
        for url in pending:
            body = {"commit": commit, "versions": versions} if commit else {"commit": False}
            status, doc = _request("POST", url + path, args.admin_token_file, args.timeout, body)
            error = str(doc.get("error", ""))
            if status == 200:
                resolved.append(url)
            elif status == 404 and "not in doubt" in error:
                continue  # resolved meanwhile by the decision another member sent it
            elif status == 400 and "no version for written keys" in error:
                # The primary that stamped them died: once the current primary is resolved (it stamps them
                # anew), its report carries them.
                later.append(url)
            else:
                raise CliError(f"{url}: HTTP {status}: {error or doc}")
        if not later:
            break
        for r in _reports(args, urls).values():
            for key, version in r.get("versions", []):
                versions[key] = max(version, versions.get(key, 0))
        pending = later
    else:
        raise CliError(f"transaction {args.tx}: no version known for some written keys on {', '.join(pending)}")
    verb = "committed" if commit else "rolled back"
    print(f"transaction {args.tx} {verb} (resolved on {', '.join(resolved) or 'the members, by each other'})")
    return 0


def _resolve_cluster(args: argparse.Namespace) -> int:
    commit = None if args.auto else bool(args.commit)
    path = "/v1/tx/" + urllib.parse.quote(args.tx, safe="") + "/resolve"
    timeout = max(args.timeout, 35.0)  # the member waits up to its op_timeout (30 s) for every report
    body = {"cluster": True, "commit": commit}
    status, doc = _request("POST", args.member + path, args.admin_token_file, timeout, body)
    if status != 200:
        raise CliError(f"{args.member}: HTTP {status}: {doc.get('error', doc)}")
    verb = "committed" if doc.get("resolved") == "commit" else "rolled back"
    print(f"transaction {args.tx} {verb} (resolved on every member by {args.member})")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return in_doubt(args) if args.tx_command == "in-doubt" else resolve(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
