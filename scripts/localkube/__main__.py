"""Command line of the local Kubernetes environment (scripts/local-kube).

Subcommands: build, bin-dir, pin, up, down, status, kubectl, helm.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import build
from .controlplane import ControlPlane


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="local-kube", description=__doc__)
    p.add_argument("--state-dir", help="instance directory (default: $LOCAL_KUBE_STATE_DIR or the cache)")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build missing binaries into the cache (once per machine)")
    b.add_argument("--force", action="store_true", help="rebuild even if present")
    sub.add_parser("bin-dir", help="print the binary directory of the pinned versions")
    sub.add_parser("pin", help="regenerate kube/*/go.mod and go.sum from kube/versions.env")
    u = sub.add_parser("up", help="start the control plane and node agent; last line: kubeconfig path")
    u.add_argument("--timeout", type=float, default=180.0)
    sub.add_parser("down", help="stop everything this instance started")
    sub.add_parser("status", help="show processes and API health as JSON")
    for tool in ("kubectl", "helm"):
        t = sub.add_parser(tool, help=f"run the built {tool} against this instance", add_help=False)
        t.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)

    if args.cmd == "build":
        build.build(force=args.force)
        return 0
    if args.cmd == "bin-dir":
        print(build.bin_dir())
        return 0
    if args.cmd == "pin":
        build.pin()
        return 0
    cp = ControlPlane(args.state_dir)
    if args.cmd == "up":
        try:
            kc = cp.up(timeout=args.timeout)
        except RuntimeError as e:
            print(f"local-kube up: {e}", file=sys.stderr)
            return 1
        print(f"local-kube up: API {cp.state()['server']}, node {cp.state()['node']} Ready; logs in {cp.logs}")
        print(kc)
        return 0
    if args.cmd == "down":
        cp.down()
        return 0
    if args.cmd in ("kubectl", "helm"):
        binary = str(build.bin_dir() / args.cmd)
        os.execv(binary, [binary, f"--kubeconfig={cp.kubeconfig}", *args.rest])
    if args.cmd == "status":
        st = cp.status()
        print(json.dumps(st, indent=2))
        return 0 if st.get("readyz") == 200 else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
