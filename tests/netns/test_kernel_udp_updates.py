"""The in-kernel UDP path's named counters (the parser, the names), idle timeouts (`ct timeout` objects) and
incremental updates (the diff against the recording effects: a Hypothesis property), all without privileges."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aether.netns.kernel_udp import (
    KernelArm,
    KernelBackend,
    KernelUdpCounter,
    backend_chain,
    build_kernel_udp,
    counter_of,
    parse_counters,
    service_chain,
)
from aether.netns.kernel_udp_diff import canonical, update_commands
from aether.netns.kernel_udp_install import Verified, apply_kernel_udp, counters, departed
from aether.netns.kernel_udp_text import to_text
from aether.testing.kernel_udp_effects import ARMS, B1, B4, RecordingKernelUdp

# --- counters -------------------------------------------------------------------------------------------------

# `nft -j list counters table ip aether_udp` from a real netns after traffic (tests/netns/test_kernel_udp_datapath.py
# made it; handles kept), with a counter of another table and one this builder does not name
LISTING = {
    "nftables": [
        {"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
        {
            "counter": {
                "family": "ip",
                "name": "svc_10_96_29_10",
                "table": "aether_udp",
                "handle": 7,
                "packets": 61,
                "bytes": 2010,
            }
        },
        {
            "counter": {
                "family": "ip",
                "name": "svc_10_96_29_10__10_29_0_3_5353",
                "table": "aether_udp",
                "handle": 9,
                "packets": 40,
                "bytes": 1320,
            }
        },
        {
            "counter": {
                "family": "ip6",
                "name": "svc_fd000096000000000000000000000010__fd000029000000000000000000000003_7007",
                "table": "aether_udp",
                "handle": 12,
                "packets": 2,
                "bytes": 65555,
            }
        },
        {
            "counter": {
                "family": "inet",
                "name": "svc_10_96_29_10",
                "table": "aether",
                "handle": 3,
                "packets": 9,
                "bytes": 9,
            }
        },
        {"counter": {"family": "ip", "name": "other", "table": "aether_udp", "handle": 4, "packets": 1, "bytes": 1}},
    ]
}


def test_parse_counters() -> None:
    assert parse_counters(LISTING) == [
        KernelUdpCounter("10.96.29.10", None, None, 61, 2010),
        KernelUdpCounter("10.96.29.10", "10.29.0.3", 5353, 40, 1320),
        KernelUdpCounter("fd00:96::10", "fd00:29::3", 7007, 2, 65555),
    ]
    assert parse_counters({"nftables": []}) == []


def test_counter_names_round_trip() -> None:
    for vip, ip, port in (("10.96.0.1", "10.1.2.3", 53), ("fd00:96::a", "fd00::1:2", 65535), ("::1", "::", 1)):
        assert counter_of(service_chain(vip), 1, 2) == KernelUdpCounter(vip, None, None, 1, 2)
        assert counter_of(backend_chain(vip, ip, port), 3, 4) == KernelUdpCounter(vip, ip, port, 3, 4)


def test_every_service_and_valid_backend_has_a_counter() -> None:
    c = canonical(build_kernel_udp(ARMS))
    assert set(c["counters"]) == {
        "svc_10_96_0_10",
        "svc_10_96_0_10__10_29_1_2_5353",
        "svc_10_96_0_10__10_29_1_3_5353",
        "svc_10_96_0_11",
        "svc_10_96_0_12",
        "svc_10_96_0_12__10_29_1_2_53",
    }  # the invalid B3 and the drained B4 (no range, so no chain) have none
    assert {e[1] for e in c["sets"]["vip_counters"]["elem"]} == {"svc_10_96_0_10", "svc_10_96_0_11", "svc_10_96_0_12"}


def test_read_counters_through_the_effects() -> None:
    fx = RecordingKernelUdp()
    apply_kernel_udp(fx, "ns", ARMS)
    fx.counts["svc_10_96_0_10__10_29_1_2_5353"] = (3, 300)
    got = counters(fx)
    assert KernelUdpCounter("10.96.0.10", B1, 5353, 3, 300) in got and len(got) == 6
    assert counters(RecordingKernelUdp()) == []  # no tables: no counters, no error


# --- idle timeout ---------------------------------------------------------------------------------------------


def test_idle_timeout_objects_per_value() -> None:
    """An arm's own idle timeout wins over the node's default; values round up to whole seconds; one object per
    value, set first in the Service's chain; no timeout anywhere: no object and no statement."""
    arms = (ARMS[0]._replace(idle_timeout_s=7.2), ARMS[1]._replace(idle_timeout_s=0.2), ARMS[2])
    c = canonical(build_kernel_udp(arms, default_idle_timeout_s=30))
    assert c["timeouts"] == {
        name: {"protocol": "udp", "l3proto": "ip", "policy": {"unreplied": s, "replied": s}}
        for name, s in (("idle_8", 8), ("idle_1", 1), ("idle_30", 30))
    }
    assert c["rules"]["svc_10_96_0_10"][0][0] == {"ct timeout": "idle_8"}
    assert c["rules"]["svc_10_96_0_12"][0][0] == {"ct timeout": "idle_1"}
    assert c["rules"]["svc_10_96_0_11"] == [[{"ct timeout": "idle_30"}, {"drop": None}]]
    plain = canonical(build_kernel_udp(ARMS))
    assert plain["timeouts"] == {} and "ct timeout" not in str(plain["rules"])


# --- incremental updates --------------------------------------------------------------------------------------

VIPS = ("10.96.1.1", "10.96.1.2", "10.96.1.3", "fd00:96::1", "fd00:96::2")
HOSTS = {4: ("10.29.2.1", "10.29.2.2", "10.29.2.3"), 6: ("fd00:29::1", "fd00:29::2")}


@st.composite
def arm_sets(draw: st.DrawFn) -> list[KernelArm]:
    out = []
    for vip in draw(st.lists(st.sampled_from(VIPS), unique=True, max_size=len(VIPS))):
        hosts = HOSTS[6 if ":" in vip else 4]
        backend = st.builds(
            KernelBackend, st.sampled_from(hosts), st.sampled_from((53, 5353)), st.integers(0, 3), st.booleans()
        )
        timeout = st.sampled_from((None, 1.0, 7.5, 30.0))
        out.append(KernelArm(vip, tuple(draw(st.lists(backend, max_size=4))), draw(timeout)))
    return out


@settings(max_examples=400, deadline=None)
@given(arm_sets(), arm_sets(), st.sampled_from((None, 30.0)))
def test_update_turns_previous_tables_into_new_ones(
    previous: list[KernelArm], arms: list[KernelArm], default: float | None
) -> None:
    """Applied to the tables `previous` built (on the recording effects, which check every reference as nft does),
    the incremental transaction leaves exactly what `arms` build; counters of Services and backends in both are
    never deleted (their counts stay); no change: no transaction at all."""
    fx = RecordingKernelUdp()
    apply_kernel_udp(fx, "ns", previous, default_idle_timeout_s=default)
    fx.calls.clear()
    apply_kernel_udp(fx, "ns", arms, previous=previous, default_idle_timeout_s=default)
    wanted = build_kernel_udp(arms, default_idle_timeout_s=default)
    for family in ("ip", "ip6"):
        assert fx.tables[family] == canonical(wanted, family)
    writes = [c for c in fx.calls if c[0] == "nft" and c[1] != "list"]
    update = update_commands(previous, arms, default_idle_timeout_s=default)["nftables"]
    assert writes == ([("nft", "update")] if update else [])
    old = build_kernel_udp(previous, default_idle_timeout_s=default)
    kept = {f: set(canonical(old, f)["counters"]) & set(canonical(wanted, f)["counters"]) for f in ("ip", "ip6")}
    for cmd in update:
        ((_, obj),) = cmd.items()
        ((kind, body),) = obj.items()
        assert not (kind == "counter" and body["name"] in kept[body["family"]]), cmd


def test_an_endpoint_change_touches_only_its_service() -> None:
    """One endpoint of one Service moves: the transaction names only that Service's objects (its chain's rule,
    the two backends' chains and counters, its `backend_counters` elements), nothing of the others."""
    moved = (
        ARMS[0]._replace(backends=(ARMS[0].backends[0], KernelBackend(B4, 5353, 25), ARMS[0].backends[2])),
        *ARMS[1:],
    )
    cmds = update_commands(ARMS, moved)["nftables"]
    text = to_text({"nftables": cmds})
    assert "10_96_0_12" not in text and "10_96_0_11" not in text and "10.96.0.12" not in text
    assert [next(iter(c)) + " " + next(iter(next(iter(c.values())))) for c in cmds] == [
        "add counter",
        "add chain",
        "add rule",  # the new backend's dnat
        "flush chain",
        "add rule",  # svc_10_96_0_10: its new pick
        "delete element",
        "add element",
        "flush chain",
        "delete chain",
        "delete counter",
    ]
    assert update_commands(ARMS, ARMS) == {"nftables": []}


def test_a_table_not_what_previous_builds_is_replaced_whole() -> None:
    fx = RecordingKernelUdp()
    apply_kernel_udp(fx, "ns", ARMS[:1])
    fx.calls.clear()
    apply_kernel_udp(fx, "ns", ARMS, previous=ARMS[1:])  # the netns holds ARMS[:1], not ARMS[1:]
    assert ("nft", "replace") in fx.calls and ("nft", "update") not in fx.calls
    assert fx.tables["ip"] == canonical(build_kernel_udp(ARMS))


def test_departed_ipv6_backends() -> None:
    before = (KernelArm("fd00:96::1", (KernelBackend("fd00:29::1", 53, 1), KernelBackend("fd00:29:0::2", 53, 1))),)
    after = (KernelArm("fd00:96:0::1", (KernelBackend("fd00:29::1", 53, 1),)),)
    assert departed(before, after) == [("fd00:96::1", "fd00:29::2", 53)]  # compared in nft's (RFC 5952) form


def test_an_unmoved_generation_skips_the_read_back() -> None:
    """With a `Verified` record, a netns whose nft generation moved only by our own transactions is not listed
    again before the next update; another commit in between (the generation moved once more) makes the next
    apply read back, and a table changed by it is then replaced whole."""
    fx, seen = RecordingKernelUdp(), Verified()
    apply_kernel_udp(fx, "ns", ARMS[:1], verified=seen)  # first: listed, replaced, read back
    fx.calls.clear()
    apply_kernel_udp(fx, "ns", ARMS, previous=ARMS[:1], verified=seen)
    assert [c[1] for c in fx.calls if c[0] == "nft"] == ["update"]
    fx.tables["ip"]["sets"]["vips"]["elem"].pop()  # another writer changes the table: one more commit
    fx.gen += 1
    fx.calls.clear()
    apply_kernel_udp(fx, "ns", ARMS[1:], previous=ARMS, verified=seen)
    assert [c[1] for c in fx.calls if c[0] == "nft"] == ["list", "replace", "list", "list"]
    assert fx.tables["ip"] == canonical(build_kernel_udp(ARMS[1:]))
    fx.calls.clear()
    apply_kernel_udp(fx, "ns", ARMS[1:], previous=ARMS[1:], verified=seen)  # nothing to do: nothing sent or listed
    assert [c for c in fx.calls if c[0] == "nft"] == []
