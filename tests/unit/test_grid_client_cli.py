"""``groupcluster tx`` argument handling and its errors without a member: every mistake is one clear line
(exit 2 for bad arguments, 1 for a member that cannot be reached), never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from groupcluster.cli import main


def dead_member() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nobody listens there


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tx", "resolve", "h:1#2/3", "--member", "127.0.0.1:1"], "one of the arguments --commit --rollback --auto"),
        (["tx", "resolve", "h:1#2/3", "--commit", "--rollback", "--member", "127.0.0.1:1"], "not allowed with"),
        (["tx", "in-doubt", "--member", "ftp://x:1"], "endpoint: expected host:port"),
        (["tx", "in-doubt"], "the following arguments are required: --member"),
        (["tx"], "the following arguments are required: ACTION"),
        (["tx", "in-doubt", "--member", "127.0.0.1:1", "--admin-token-file", "/nonexistent/t"], "cannot read"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_member_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = dead_member()
    assert main(["tx", "in-doubt", "--member", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach http://{url}/v1/tx/in-doubt") and "Traceback" not in err
    assert main(["tx", "resolve", "h:1#2/3", "--auto", "--member", url]) == 1
    err = capsys.readouterr().err
    assert "cannot reach" in err and "Traceback" not in err
