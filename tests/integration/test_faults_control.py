"""A real member under ``--faults-control``: a bad control file is logged and ignored (the member keeps running),
a good one reaches the faults layer the option added to the stack."""

from __future__ import annotations

from pathlib import Path

from groupcluster.runtime.faults_control import HEAL_DOCUMENT, partition_document, write_control

from .procs import Members, free_port, wait_until


def test_member_applies_good_control_files_and_survives_bad_ones(members: Members, tmp_path: Path) -> None:
    control = tmp_path / "m1.faults.json"
    endpoint = f"127.0.0.1:{free_port(['127.0.0.1'])}"
    m = members.start("m1", endpoint, "--faults-control", str(control), record=False)

    def fc() -> dict:  # type: ignore[type-arg]
        st = m.status() or {}
        return st.get("faults_control") or {}

    wait_until("the member to join and report its faults control", lambda: "applied" in fc(), 30, members, [m])
    assert fc() == {"path": str(control), "applied": 0, "rejected": 0, "last_error": None}

    control.write_text('{"partitions": [{"start": 0, "end": 9, "groups": [["127.0.0.1:x"], ["127.0.0.1:2"]]}]}')
    wait_until("the bad file to be refused", lambda: fc().get("rejected") == 1, 10, members, [m])
    assert "partitions[0].groups[0][0]: '127.0.0.1:x' is not host:port" in fc()["last_error"]
    assert f"faults control {control}.partitions[0].groups[0][0]" in m.log_text()
    assert "(ignored; the faults stay as they were)" in m.log_text()

    write_control(control, partition_document([[endpoint], ["127.0.0.1:2"]], 30))
    wait_until("the partition to be applied", lambda: fc().get("applied") == 1, 10, members, [m])
    write_control(control, HEAL_DOCUMENT)
    wait_until("the heal to be applied", lambda: fc().get("applied") == 2, 10, members, [m])
    assert m.alive()
    st = m.status() or {}
    # Both reached the faults layer (its counters), and the member saw the partition start and heal.
    assert st["metrics"].get("faults.settings_changed") == 2, st["metrics"]
    assert st["metrics"].get("faults.partitions_started") == 1, st["metrics"]
    assert st["metrics"].get("faults.partitions_healed") == 1, st["metrics"]
    assert fc()["last_error"] is None
