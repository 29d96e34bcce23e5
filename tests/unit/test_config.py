"""Readable units and layer/stack configuration parsing: values, defaults, and errors that name the key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from groupcluster.core.address import Address
from groupcluster.core.config import describe, param, parse_hosts, parse_params
from groupcluster.core.errors import ConfigError
from groupcluster.core.stack import Stack, resolve_config
from groupcluster.core.units import parse_duration, parse_size
from groupcluster.protocols import discovery, faults, fd, flow, frag, transport  # noqa: F401  (register layers)

ME = Address("127.0.0.1", 7800, 1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("3s", 3.0),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("10us", 1e-5),
        (" 4 s ", 4.0),
        ("7", 7.0),
        (5, 5.0),
        (0.5, 0.5),
        ("3S", 3.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["-1s", "3 parsecs", "s", "", "1e3s", True, None, [1], -2])
def test_parse_duration_rejects(bad):
    with pytest.raises(ConfigError) as err:
        parse_duration(bad, where="x.timeout")
    assert str(err.value).startswith("x.timeout:")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64KiB", 65536),
        ("1MB", 1_000_000),
        ("1MiB", 1 << 20),
        ("1.5KiB", 1536),
        ("2GiB", 2 << 30),
        ("100", 100),
        ("100B", 100),
        (100, 100),
        ("4kb", 4000),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["1XB", "KiB", "-1KiB", True, 1.5, None, -1, "1 2"])
def test_parse_size_rejects(bad):
    with pytest.raises(ConfigError) as err:
        parse_size(bad, where="x.size")
    assert "x.size" in str(err.value)


def test_parse_hosts_forms():
    assert parse_hosts("a:1, b:2", "k") == (("a", 1), ("b", 2))
    assert parse_hosts(["a:1", ("b", 2)], "k") == (("a", 1), ("b", 2))
    assert parse_hosts([], "k") == ()


@pytest.mark.parametrize("bad", ["a", "a:", ":1", "a:x", "a:0", "a:65536", 5, [5], [("a", "1")]])
def test_parse_hosts_rejects(bad):
    with pytest.raises(ConfigError) as err:
        parse_hosts(bad, "stack[1] (discovery).initial_hosts")
    assert "stack[1] (discovery).initial_hosts" in str(err.value)


@dataclass(frozen=True)
class Sample:
    wait: float = param("250ms", "duration", doc="a duration")
    size: int = param("1KiB", "size", doc="a size", minimum=16)
    n: int = param(3, "int", minimum=1)
    ratio: float = param(0.5, "float")
    on: bool = param(True, "bool")
    name: str = param("x", "str")
    mode: str = param("a", "choice", choices=("a", "b"))
    hosts: tuple = param((), "hosts")
    names: tuple = param(("p", "q"), "strs")


def test_defaults_are_stored_in_units():
    cfg = Sample()
    assert (cfg.wait, cfg.size, cfg.hosts, cfg.names) == (0.25, 1024, (), ("p", "q"))
    assert parse_params(Sample, {}, "w") == cfg


def test_parse_params_converts_values():
    cfg = parse_params(
        Sample,
        {"wait": "2s", "size": "2KiB", "n": 5, "ratio": 1, "on": False, "mode": "b", "hosts": "h:1", "names": "a,b"},
        "w",
    )
    assert cfg == Sample(2.0, 2048, 5, 1.0, False, "x", "b", (("h", 1),), ("a", "b"))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"nope": 1}, "w: unknown key 'nope'; allowed keys: hosts, mode, n, name, names, on, ratio, size, wait"),
        ({"wait": "soon"}, "w.wait: expected a duration"),
        ({"size": "8B"}, "w.size: '8B' is below the minimum 16"),
        ({"n": 0}, "w.n: 0 is below the minimum 1"),
        ({"n": True}, "w.n: expected an integer"),
        ({"n": 1.0}, "w.n: expected an integer"),
        ({"ratio": "half"}, "w.ratio: expected a number"),
        ({"on": "yes"}, "w.on: expected true or false"),
        ({"name": 5}, "w.name: expected a string"),
        ({"mode": "c"}, "w.mode: 'c' is not allowed; allowed values: a, b"),
        ({"names": [1]}, "w.names: expected a list of strings"),
        ({"hosts": "h"}, "w.hosts: 'h' is not host:port"),
    ],
)
def test_parse_params_errors_name_the_key(params, message):
    with pytest.raises(ConfigError) as err:
        parse_params(Sample, params, "w")
    assert message in str(err.value)


def test_describe_lists_parameters_with_docs():
    rows = {name: (kind, default, doc) for name, kind, default, doc in describe(fd.FdConfig)}
    assert rows["interval"] == ("duration", 1.0, "how often heartbeats are sent and silence is checked")
    assert set(rows) == {"interval", "timeout", "verify_timeout"}


def test_layer_defaults_are_in_units():
    assert (fd.FdConfig().interval, fd.FdConfig().timeout, fd.FdConfig().verify_timeout) == (1.0, 4.0, 1.0)
    assert discovery.DiscoveryConfig().timeout == 0.5
    assert discovery.DiscoveryConfig().initial_hosts == ()
    assert frag.FragConfig().frag_size == 56 * 1024 and frag.FragConfig().max_pending == 64 << 20
    f = flow.FlowConfig()
    assert (f.max_credits, f.min_threshold, f.max_queued, f.block_timeout) == (4 << 20, 0.4, 16 << 20, 0.5)
    assert faults.FaultsConfig().partitions == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "stack: expected a non-empty list"),
        ("transport", "stack: expected a non-empty list"),
        ([{"layer": "transport"}, "fd"], "stack[1]: expected a mapping"),
        ([{"layer": "transport"}, {"name": "fd"}], "stack[1].layer: unknown layer None; allowed values:"),
        ([{"layer": "transport"}, {"layer": "fdd"}], "stack[1].layer: unknown layer 'fdd'; allowed values:"),
        ([{"layer": "fd"}, {"layer": "transport"}], "stack[0].layer: the bottom layer must be a transport"),
        ([{"layer": "transport"}, {"layer": "fd"}, {"layer": "fd"}], "stack: layer(s) listed twice: fd"),
        ([{"layer": "transport"}, {"layer": "fd", "interval": "x"}], "stack[1] (fd).interval"),
        ([{"layer": "transport", "max_frame_size": 10}], "stack[0] (transport).max_frame_size"),
    ],
)
def test_stack_configuration_errors_name_the_entry(spec, message):
    with pytest.raises(ConfigError) as err:
        resolve_config(spec)
    assert message in str(err.value)


def test_unknown_layer_error_lists_the_allowed_names():
    with pytest.raises(ConfigError) as err:
        resolve_config([{"layer": "transport"}, {"layer": "nope"}])
    for name in ("discovery", "faults", "fd", "flow", "frag", "transport"):
        assert name in str(err.value)


def test_layer_level_checks_fail_when_the_stack_is_built():
    spec = [{"layer": "transport"}, {"layer": "discovery"}, {"layer": "flow", "min_threshold": 2.0}]
    with pytest.raises(ConfigError, match=r"stack\[2\] \(flow\)\.min_threshold"):
        Stack(spec, local_address=ME, cluster="c")


def test_placeholder_local_address_is_refused():
    with pytest.raises(ConfigError, match="incarnation"):
        Stack([{"layer": "transport"}], local_address=Address("127.0.0.1", 7800, 0), cluster="c")


def test_build_spec_refuses_a_layer_that_is_not_a_mapping():
    from groupcluster.runtime.channel import build_spec

    with pytest.raises(ConfigError, match=r"stack\[1\]: expected a mapping with a 'layer' key, got 'fd'"):
        build_spec([{"layer": "transport"}, "fd"])  # a caller without type checking
    assert build_spec([{"layer": "transport"}, {"layer": "fd"}], {"fd": {"interval": "1s"}})[1] == {
        "layer": "fd",
        "interval": "1s",
    }


def test_only_the_transport_receives_bytes():
    stack = Stack([{"layer": "transport"}, {"layer": "fd"}], local_address=Address("10.0.0.1", 7800, 1), cluster="c")
    fd_layer = stack.layer("fd")
    assert fd_layer is not None
    with pytest.raises(NotImplementedError, match="fd is not a transport"):
        fd_layer.receive(b"")
