"""``groupcluster demo`` (the grid demo) with fewer keys: it scales 3 -> 5 -> 2 under a writer, loses nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_grid_demo_loses_nothing(tmp_path: Path) -> None:
    keys = 5000
    argv = [sys.executable, "-m", "groupcluster.cli", "demo", "--keys", str(keys), "--dir", str(tmp_path / "demo")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = r.stdout
    lines = out.strip().splitlines()
    assert lines, r.stderr
    m = re.fullmatch(r"demo: (\d+) keys, (\d+) lost", lines[-1])
    assert m, f"last line {lines[-1]!r}\n{out}\n{r.stderr}"
    checked, lost = int(m[1]), int(m[2])
    assert lost == 0 and r.returncode == 0, out
    # Every loaded key plus the writer's new ones (it adds 50 new keys per batch while the cluster scales).
    assert checked > keys, out
    assert "scaling 3 -> 5" in out and "scaling 5 -> 2" in out, out
    assert re.search(r"\[[#-]+\] +\d+% (moving segments \d+/\d+|rebalance done)", out), (
        "no rebalance progress shown\n" + out
    )
    assert len(re.findall(r"handed its segments off and left", out)) == 3, out
    assert f"{keys:,} loaded" in out
