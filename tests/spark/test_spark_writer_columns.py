"""The writer's column conversion: string and binary Arrow columns come out as bytes, UTF-8 for text,
whatever Arrow layout Spark hands over (no Spark session needed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from groupcluster.spark.source import _as_bytes

TEXT = ["k1", "héllo", ""]
UTF8 = [t.encode("utf-8") for t in TEXT]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.string_view()])
def test_text_columns_become_their_utf8_bytes(kind: pa.DataType) -> None:
    assert _as_bytes(pa.array(TEXT, kind)) == UTF8
    assert _as_bytes(pa.chunked_array([pa.array(TEXT[:1], kind), pa.array(TEXT[1:], kind)])) == UTF8


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.binary_view()])
def test_binary_columns_stay_bytes(kind: pa.DataType) -> None:
    assert _as_bytes(pa.array(UTF8, kind)) == UTF8
