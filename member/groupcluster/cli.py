"""The ``groupcluster`` command: a dispatcher over subcommands that live next to what they run.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; modules are imported
only when their subcommand is used, so ``groupcluster sim`` does not import aiohttp.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "member": ("groupcluster.runtime.member_cli", "run one member process"),
    "demo": ("groupcluster.tools.demo", "run a local grid that scales 3 -> 5 -> 2 under writes and loses nothing"),
    "local": ("groupcluster.tools.local", "start, scale, inspect and stop a local cluster of grid members"),
    "chaos": ("groupcluster.tools.chaos.command", "kill, pause and replace real members under load; check the history"),
    "sim": ("groupcluster.sim.cli", "deterministic simulation with fault injection and property checks"),
    "sweep": ("groupcluster.sim.sweep", "run simulation seeds nobody has run, on every stack, for N minutes"),
    "tx": ("groupcluster.grid.tx.cli", "list and resolve in-doubt grid transactions on running members"),
    "check": ("groupcluster.sim.check_cli", "run the property checkers over recorded history files"),
    "bench": ("groupcluster.bench.cli", "benchmarks: our stack side by side with JGroups, PySyncObj and raw TCP"),
    "operator": ("groupcluster_operator.cli", "run the Kubernetes operator for GroupCluster resources (kopf)"),
}


class _VersionAction(argparse.Action):
    """``--version``: the version, and whether the hot modules run compiled (mypyc) or interpreted."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from . import compiled

        try:
            number = version("groupcluster")
        except PackageNotFoundError:
            number = "unknown (not installed)"
        print(f"groupcluster {number}\n{compiled.status().describe()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="groupcluster", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    parser.add_argument(
        "--version", action=_VersionAction, help="print the version and whether the hot modules run compiled"
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    subs.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        if name in sys.argv[1:] or "-h" in sys.argv or "--help" in sys.argv:
            # Only the chosen subcommand's module is imported (and any, for --help).
            try:
                importlib.import_module(module_name).add_arguments(sub)
            except ModuleNotFoundError as exc:
                if exc.name != module_name:
                    raise
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:])
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
