"""Discovery: rounds, early finish, answers before and after joining, host lists, bad input and configuration."""

from __future__ import annotations

import msgpack
import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError, WireError
from groupcluster.core.events import (
    Disconnect,
    DiscoveryResponse,
    FindMembers,
    GetHosts,
    MembersFound,
    UpdateHosts,
)
from groupcluster.core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Message
from groupcluster.core.view import ViewId
from groupcluster.protocols.discovery import GET_MBRS_REQ, GET_MBRS_RSP, MAX_LEARNED_HOSTS, DiscoveryHeader

from .harness import ME, PEERS, LayerHarness, sent_with

DISC = protocol_ids.DISCOVERY
P1, P2, P3 = PEERS[:3]
HOSTS = [f"{a.host}:{a.port}" for a in (ME, P1, P2, P3)]
FLAGS = NO_RELIABILITY | NO_FLOW_CONTROL


def make(**params) -> LayerHarness:
    return LayerHarness([{"layer": "discovery", "initial_hosts": HOSTS, **params}])


def rsp(coord=None, view_id=None, is_coord=False) -> Message:
    return Message(ME, flags=FLAGS, headers={DISC: DiscoveryHeader(GET_MBRS_RSP, coord, view_id, is_coord)})


def req() -> Message:
    return Message(Address(ME.host, ME.port, 0), flags=FLAGS, headers={DISC: DiscoveryHeader(GET_MBRS_REQ)})


def test_find_members_asks_every_known_endpoint_but_our_own():
    h = make()
    h.control(FindMembers("join"))
    sent = h.take_sent()
    assert sorted(ep for ep, _ in sent) == sorted([P1.endpoint, P2.endpoint, P3.endpoint])
    for ep, msg in sent:
        assert msg.dest == Address(ep[0], ep[1], 0)
        assert msg.flags == FLAGS
        assert msg.headers[DISC].kind == GET_MBRS_REQ


def test_round_collects_answers_until_the_timeout():
    h = make()
    h.control(FindMembers("join"))
    h.receive(P2, [rsp()])
    h.receive(P1, [rsp()])
    h.advance(0.49)
    assert h.take_events(MembersFound) == []
    h.advance(0.02)
    [found] = h.take_events(MembersFound)
    assert found.purpose == "join"
    assert found.responses == (DiscoveryResponse(P1, None, None, False), DiscoveryResponse(P2, None, None, False))


def test_round_finishes_early_when_a_coordinator_answers():
    vid = ViewId(3, P2)
    h = make()
    h.control(FindMembers("join"))
    h.receive(P1, [rsp(P2, vid, False)])
    assert h.take_events(MembersFound) == []
    h.receive(P2, [rsp(P2, vid, True)])
    [found] = h.take_events(MembersFound)
    assert found.responses == (DiscoveryResponse(P1, P2, vid, False), DiscoveryResponse(P2, P2, vid, True))
    # The timer was cancelled: nothing more comes.
    h.advance(2.0)
    assert h.take_events(MembersFound) == []


def test_break_on_coord_rsp_false_waits_for_the_timeout():
    vid = ViewId(3, P2)
    h = make(break_on_coord_rsp=False, timeout="200ms")
    h.control(FindMembers("join"))
    h.receive(P2, [rsp(P2, vid, True)])
    assert h.take_events(MembersFound) == []
    h.advance(0.2)
    assert len(h.take_events(MembersFound)) == 1


def test_round_finishes_once_num_initial_members_answered():
    h = make(num_initial_members=2)
    h.control(FindMembers("join"))
    h.receive(P1, [rsp()])
    h.receive(P1, [rsp()])  # the same member twice counts once
    assert h.take_events(MembersFound) == []
    h.receive(P3, [rsp()])
    [found] = h.take_events(MembersFound)
    assert [r.address for r in found.responses] == [P1, P3]


def test_no_hosts_answers_at_once_with_nobody():
    h = LayerHarness([{"layer": "discovery"}])
    h.control(FindMembers("join"))
    assert h.take_frames() == []
    h.fire()
    assert h.take_events(MembersFound) == [MembersFound("join", ())]


def test_only_our_own_endpoint_known_answers_at_once():
    h = LayerHarness([{"layer": "discovery", "initial_hosts": f"{ME.host}:{ME.port}"}])
    h.control(FindMembers("join"))
    assert h.take_frames() == []
    h.fire()
    assert h.take_events(MembersFound) == [MembersFound("join", ())]


def test_concurrent_rounds_of_different_purposes_both_get_answers():
    h = make(timeout="100ms")
    h.control(FindMembers("join"))
    h.control(FindMembers("merge"))
    h.control(FindMembers("merge"))  # joins the running round
    h.receive(P1, [rsp()])
    h.advance(0.1)
    found = h.take_events(MembersFound)
    assert sorted(f.purpose for f in found) == ["join", "merge"]
    assert all(f.responses == (DiscoveryResponse(P1, None, None, False),) for f in found)
    assert h.metric("discovery.rounds_joined") == 1


def test_answers_before_joining_with_no_view():
    h = make()
    h.receive(P1, [req()])
    [(ep, msg)] = h.take_sent()
    assert ep == P1.endpoint and msg.dest == P1 and msg.flags == FLAGS
    hdr = msg.headers[DISC]
    assert (hdr.kind, hdr.coordinator, hdr.view_id, hdr.is_coordinator) == (GET_MBRS_RSP, None, None, False)


def test_answers_with_the_view_coordinator_and_view_id():
    h = make()
    view = h.install_view([P2, ME, P1], seq=7, up=False)
    h.take_sent()
    h.receive(P1, [req()])
    [(_, msg)] = h.take_sent()
    hdr = msg.headers[DISC]
    assert (hdr.coordinator, hdr.view_id, hdr.is_coordinator) == (P2, view.view_id, False)
    h.install_view([ME, P1], seq=8, up=False)
    h.receive(P1, [req()])
    [(_, msg)] = h.take_sent()
    assert msg.headers[DISC].coordinator == ME and msg.headers[DISC].is_coordinator is True


def test_after_disconnect_answers_as_not_joined():
    h = make()
    h.install_view([ME, P1], up=False)
    h.control(Disconnect())
    h.receive(P1, [req()])
    [(_, msg)] = h.take_sent()
    assert msg.headers[DISC].coordinator is None


def test_requesters_are_learned_and_probed_next_time():
    h = LayerHarness([{"layer": "discovery", "initial_hosts": [f"{P1.host}:{P1.port}"]}])
    stranger = Address("127.0.0.2", 9000, 5)
    h.receive(stranger, [req()])
    h.take_sent()
    assert h.control(GetHosts()) == (P1.endpoint, stranger.endpoint)
    h.control(FindMembers("merge"))
    assert sorted(ep for ep, _ in h.take_sent()) == [P1.endpoint, stranger.endpoint]


def test_learned_hosts_are_bounded():
    h = LayerHarness([{"layer": "discovery"}])
    for i in range(MAX_LEARNED_HOSTS + 5):
        h.layer("discovery")._learn(("10.0.0.1", 1000 + i))
    hosts = h.control(GetHosts())
    assert len(hosts) == MAX_LEARNED_HOSTS
    assert ("10.0.0.1", 1000) not in hosts and ("10.0.0.1", 1000 + MAX_LEARNED_HOSTS + 4) in hosts
    assert h.metric("discovery.learned_hosts_evicted") == 5


def test_get_hosts_is_the_sorted_union_and_update_hosts_replaces_the_dynamic_list():
    h = LayerHarness([{"layer": "discovery", "initial_hosts": ["b:2", "a:1"]}])
    assert h.control(GetHosts()) == (("a", 1), ("b", 2))
    h.control(UpdateHosts((("z", 9), ("c", 3))))
    assert h.control(GetHosts()) == (("a", 1), ("b", 2), ("c", 3), ("z", 9))
    h.control(UpdateHosts((("d", 4),)))
    assert h.control(GetHosts()) == (("a", 1), ("b", 2), ("d", 4))
    h.install_view([ME, Address("e", 5, 3)], up=False)
    assert h.control(GetHosts()) == (ME.endpoint, ("a", 1), ("b", 2), ("d", 4), ("e", 5))
    # Deterministic: the same answer every time.
    assert h.control(GetHosts()) == h.control(GetHosts())


def test_update_hosts_feeds_the_next_round():
    h = LayerHarness([{"layer": "discovery"}])
    h.control(UpdateHosts(((P1.host, P1.port),)))
    h.control(FindMembers("join"))
    assert [ep for ep, _ in h.take_sent()] == [P1.endpoint]


def test_discovery_messages_are_consumed_and_others_pass_in_order():
    h = make()
    h.control(FindMembers("join"))
    h.receive(P1, [Message(None, b"a"), rsp(), Message(None, b"b"), req()])
    assert [m.payload for m in h.take_delivered()] == [b"a", b"b"]


def test_responses_outside_a_round_are_counted_not_delivered():
    h = make()
    h.receive(P1, [rsp()])
    assert h.take_events(MembersFound) == [] and h.take_delivered() == []
    assert h.metric("discovery.late_responses") == 1


def test_response_from_a_placeholder_sender_is_counted_as_malformed():
    h = make()
    h.control(FindMembers("join"))
    h.receive(Address(P1.host, P1.port, 0), [rsp()])
    assert h.metric("discovery.malformed_responses") == 1
    h.advance(1.0)
    assert h.take_events(MembersFound) == [MembersFound("join", ())]


def test_header_round_trip():
    for hdr in (
        DiscoveryHeader(GET_MBRS_REQ),
        DiscoveryHeader(GET_MBRS_RSP),
        DiscoveryHeader(GET_MBRS_RSP, P1, ViewId(4, P2), False),
        DiscoveryHeader(GET_MBRS_RSP, P1, ViewId(4, P1), True),
    ):
        back = DiscoveryHeader.from_wire(msgpack.unpackb(msgpack.packb(hdr.to_wire())))
        assert (back.kind, back.coordinator, back.view_id, back.is_coordinator) == (
            hdr.kind,
            hdr.coordinator,
            hdr.view_id,
            hdr.is_coordinator,
        )


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        [2],
        [0, 1],
        [1],
        [1, None, None],
        [1, None, None, "no"],
        [1, None, None, True],  # coordinator claim without a coordinator
        [1, ["h", 1, 1], None, False],  # coordinator without a view id
        [1, ["h", 1, 1], [1], False],
        [1, ["h", 70000, 1], [1, ["h", 1, 1]], False],
        [1, ["h", 1, 1], [-1, ["h", 1, 1]], False],
    ],
)
def test_header_from_wire_rejects_malformed(bad):
    with pytest.raises(WireError):
        DiscoveryHeader.from_wire(bad)


def test_malformed_header_drops_the_frame_and_is_counted():
    h = make()
    h.control(FindMembers("join"))
    frame = msgpack.packb([1, "test", P1.to_wire(), [[ME.to_wire(), 3, [DISC, [1, None, None, 1]], b""]]])
    h.receive_raw(frame)
    assert h.metric("transport.bad_frames") == 1
    h.advance(1.0)
    assert h.take_events(MembersFound) == [MembersFound("join", ())]


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"initial_hosts": "nohost"}, "stack[1] (discovery).initial_hosts"),
        ({"initial_hosts": ["h:99999"]}, "stack[1] (discovery).initial_hosts"),
        ({"timeout": "later"}, "stack[1] (discovery).timeout"),
        ({"break_on_coord_rsp": "yes"}, "stack[1] (discovery).break_on_coord_rsp"),
        ({"num_initial_members": 0}, "stack[1] (discovery).num_initial_members"),
        ({"num_initial_members": 2.5}, "stack[1] (discovery).num_initial_members"),
        ({"hosts": "a:1"}, "unknown key 'hosts'"),
    ],
)
def test_bad_configuration_names_the_key(params, key):
    with pytest.raises(ConfigError) as err:
        LayerHarness([{"layer": "discovery", **params}])
    assert key in str(err.value)


def test_sent_requests_carry_the_discovery_header():
    h = make()
    h.control(FindMembers("join"))
    assert len(sent_with(h.take_sent(), DISC)) == 3
