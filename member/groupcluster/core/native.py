"""What the modules compiled with mypyc (scripts/build_compiled.py) need from ``mypy_extensions``, without
making it a dependency of the interpreted package: mypy and mypyc see the real decorator, Python a no-op."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

T = TypeVar("T")

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:

    def mypyc_attr(*_args: Any, **_kwargs: Any) -> Callable[[T], T]:
        return lambda cls: cls


__all__ = ["mypyc_attr"]
