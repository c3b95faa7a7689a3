"""The fast filler (aether.xds.codec.fastfill) against protobuf's json_format.ParseDict, on every shape the
builders emit (L4 and east-west, SDS secrets), with the coverage checked; random states and knobs (Hypothesis)
must emit no field path the corpus did not compare. The codec's own unit tests are in test_xds_codec.py.

Long because: the corpus, the shape walker and the coverage checks over them are one argument; split, each half
would need the other's internals."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aether.api.authz import compile_bodies
from aether.api.meshnode import Endpoint, MeshNode, MeshPod, parse_meshnode
from aether.netns.records import PodRecord
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node, two_sources_one_destination
from aether.testing.samples import node_with, quic_listener, records_for
from aether.xds.codec import fastfill
from aether.xds.codec import protojson as codec
from aether.xds.identity.ca import BuiltinCA
from aether.xds.resources import (
    CLUSTER,
    KNOWN_TYPES,
    LISTENER,
    ResourceDict,
    Resources,
    Shared,
    TranslateOptions,
    merge,
    short_type,
)
from aether.xds.translate.compose import AREAS, translate
from aether.xds.translate.eastwest.build import EastWestOptions, secrets_for
from aether.xds.translate.eastwest.build import build as eastwest_build

# ---- the fast filler against json_format.ParseDict, on every shape the builders emit ----------------------------
#
# The corpus: translations of states that make every builder emit every resource it has (L4 UDP and TCP, the
# east-west inbound/outbound listeners, h2 clusters and QUIC twins, the route table, SDS secrets), under the knobs
# that change a shape. A resource's *shape* is the set of proto field paths its dict sets (an Any's path names the
# packed type); its *kind* is the coarse class (a listener's protocol and every type it packs, a cluster's type
# and every type it packs). The coverage checks pin the kinds and types compared, and random states and knobs
# (Hypothesis) must emit no field path the corpus did not compare.

ANY: Final = "google.protobuf.Any"
_NOT_MESSAGES: Final = frozenset(
    {"google.protobuf.Duration", "google.protobuf.Timestamp", "google.protobuf.FieldMask"}
    | {f"google.protobuf.{w}Value" for w in ("Bool", "String", "Bytes", "Int32", "UInt32", "Int64", "UInt64")}
    | {"google.protobuf.FloatValue", "google.protobuf.DoubleValue"}
)
L4_AREAS: Final = tuple(a for a in AREAS if a != "eastwest")
OPTS: Final = TranslateOptions(mesh_domain="mesh.example", trust_domain="cluster.local")

# Every listener and cluster kind the corpus compares. A builder change that adds or removes one fails
# test_fast_path_matches_parsedict_on_every_shape_we_render: compare the new kind (add a state or a knob to
# `corpus()` that emits it), then list it here.
LISTENER_KINDS: Final = {
    "TCP listener: TcpProxy",  # the TCP floor's capture
    "TCP listener: TcpProxy TlsInspector",  # the east-west gateway (eastwest/gateway.py): SNI passthrough on 18009
    "UDP listener: DestinationIPInput Route UdpProxyConfig",  # UDP capture
    "UDP listener: DestinationIPInput Route UdpGsoBatchWriterFactory UdpProxyConfig",  # with --udp-gso
    "UDP listener: Route UdpProxyConfig",  # UDP capture, no service: the blackhole only
    # the east-west gateway's QUIC half (eastwest/gateway_quic.py): the SNI module before udp_proxy on UDP 18009
    "UDP listener: DynamicModuleUdpListenerFilter Route StringValue UdpProxyConfig",
    # inbound h2 and h3, with their JSON access log on stdout (and the tests' text file)
    # (each HCM runs the one-SPIFFE-ID check, an RBAC matcher on UriSanInput, then the rule-less RBAC filter: a
    # policy's rules ride on the inbound routes, RBACPerRoute)
    # (the TCP inbound also logs refused handshakes: a CEL ExpressionFilter on its listener access log)
    "TCP listener: Action DownstreamTlsContext ExpressionFilter HttpConnectionManager RBAC Router StdoutAccessLog"
    " TlsInspector UriSanInput",
    "TCP listener: Action DownstreamTlsContext ExpressionFilter FileAccessLog HttpConnectionManager RBAC Router"
    " StdoutAccessLog TlsInspector UriSanInput",
    "UDP listener: Action HttpConnectionManager QuicDownstreamTransport RBAC Router StdoutAccessLog UriSanInput",
    "UDP listener: Action FileAccessLog HttpConnectionManager QuicDownstreamTransport RBAC Router StdoutAccessLog"
    " UriSanInput",
    # HTTP outbound: the pod's own traffic, and a default chain refusing any other source (deny-all RBAC, JSON log)
    "TCP listener: HttpConnectionManager OnDemand RBAC Router StdoutAccessLog set_filter_state.Config",
    "TCP listener: FileAccessLog HttpConnectionManager OnDemand RBAC Router StdoutAccessLog set_filter_state.Config",
    "TCP listener: QuicDownstreamTransport",  # hand-written: enable_resumption true
}
CLUSTER_KINDS: Final = {
    "STATIC cluster: -",  # the blackhole, inbound app clusters
    "EDS cluster: -",  # udp: and tcp: clusters
    "EDS cluster: HttpProtocolOptions UpstreamTlsContext filter_state_override.Config on_demand_secret.Config",  # h2:
    "EDS cluster: HttpProtocolOptions QuicUpstreamTransport",  # QUIC twins
    "EDS cluster: DynamicModulesLoadBalancerConfig",  # the gateway's QUIC cluster, its load balancer our module
}


def _short(type_url: str) -> str:
    return type_url.rsplit("/", 1)[-1]


def _descriptor(full_name: str) -> Any:
    return codec.pool().FindMessageTypeByName(full_name)


def _field_table(desc: Any) -> dict[str, Any]:
    return {**{f.name: f for f in desc.fields}, **{f.json_name: f for f in desc.fields}}


def shape(type_url: str, resource: Mapping[str, Any]) -> frozenset[str]:
    """The proto field paths `resource` sets: `Listener.filter_chains[].filters[].typed_config<TcpProxy>.cluster`;
    a map's values are `{}`, a `Shared` part (fastfill caches those by identity) is marked ` (shared)`."""
    out: set[str] = set()

    def walk(desc: Any, data: Any, at: str) -> None:
        if type(data) is Shared:
            out.add(at + " (shared)")
        if desc.full_name == ANY:
            inner = _descriptor(_short(data["@type"]))
            at = f"{at}<{inner.name}>"
            out.add(at)
            body = data.get("value") if inner.full_name in _NOT_MESSAGES else data
            walk(inner, body, at)
            return
        if desc.full_name in _NOT_MESSAGES or not isinstance(data, dict):
            return
        table = _field_table(desc)
        for key, value in data.items():
            if key == "@type":
                continue
            field = table.get(key)
            if field is None:
                out.add(f"{at}.{key} (not a field)")
                continue
            path = f"{at}.{field.name}"
            out.add(path)
            if field.message_type is None:
                continue
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    for item in value.values():
                        walk(value_field.message_type, item, path + "{}")
            elif isinstance(value, list):
                for item in value:
                    walk(field.message_type, item, path + "[]")
            else:
                walk(field.message_type, value, path)

    desc = _descriptor(codec.full_name(type_url))
    walk(desc, resource, desc.name)
    return frozenset(out)


def _type_name(type_url: str) -> str:
    """`TcpProxy`; a message named only `Config` keeps its package: `set_filter_state.Config`."""
    parts = _short(type_url).split(".")
    return parts[-1] if parts[-1] != "Config" else f"{parts[-3]}.{parts[-1]}"


def _packed_types(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        here = {_type_name(obj["@type"])} if isinstance(obj.get("@type"), str) else set()
        return here.union(*(_packed_types(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_packed_types(v) for v in obj))
    return set()


def kind(type_url: str, resource: Mapping[str, Any]) -> str:
    """A listener's protocol and a cluster's discovery type, then every type either packs (sorted, `-`: none)."""
    packed = " ".join(sorted(_packed_types(resource))) or "-"
    if type_url == LISTENER:
        protocol = resource.get("address", {}).get("socketAddress", {}).get("protocol", "TCP")
        return f"{protocol} listener: {packed}"
    if type_url == CLUSTER:
        return f"{resource.get('type', 'EDS')} cluster: {packed}"
    return short_type(type_url)


@functools.cache
def _ca(trust_domain: str) -> BuiltinCA:
    return BuiltinCA(trust_domain)


def _secrets(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> Resources:
    return secrets_for(node, records, options, _ca(options.trust_domain))


def _l4_node() -> tuple[MeshNode, dict[str, PodRecord]]:
    """40 UDP services (one blackholed, one with two endpoints, two VIPs on one cluster), 7 TCP services, 3 pods
    with records and no IP (the east-west builder skips them)."""
    node = node_with(40, 3, name="codec-l4")
    udp = node.status.udp.services
    udp[3] = udp[3].model_copy(update={"cluster": "blackhole", "endpoints": []})
    udp[4] = udp[4].model_copy(update={"endpoints": [*udp[4].endpoints, Endpoint(ip="10.200.9.9", port=53)]})
    udp[5] = udp[5].model_copy(update={"cluster": udp[6].cluster})
    node.status.tcp.services = [a.model_copy(update={"cluster": a.cluster.replace("udp:", "tcp:")}) for a in udp[:7]]
    return node, records_for(node)


def _eastwest_node() -> tuple[MeshNode, dict[str, PodRecord]]:
    """Sources in two namespaces (a twin named `@<ns>/<sa>`), a local pod that is also a destination's endpoint
    (its app ports come from the destination), a destination with two ports and two endpoints, one without a VIP
    and one without ports, a pod without a record and one without an IP (both skipped)."""
    pods = [
        SamplePod("u-api", "api-0", "10.200.1.2", "api", "/run/netns/codec-api"),
        SamplePod("u-job", "job-0", "10.200.1.3", "batch", "/run/netns/codec-job", namespace="jobs"),
    ]
    dests = [
        SampleDestination("default/api", "api", (8080, 9090), ("10.200.1.2", "10.200.2.7"), vip="10.96.0.30"),
        SampleDestination("jobs/queue", "queue", (7000,), ("10.200.2.8",)),
        SampleDestination("default/bare", "bare", (), ("10.200.2.9",), vip="10.96.0.31"),
    ]
    node, records = sample_node("codec-ew", pods, dests)
    node.status.pods.append(MeshPod(uid="u-norecord", namespace="default", name="gone-0", ip="10.200.1.9"))
    node.status.pods.append(MeshPod(uid="u-noip", namespace="default", name="pending-0"))
    records["u-noip"] = PodRecord(uid="u-noip", namespace="default", name="pending-0", netns="/run/netns/codec-p")
    return node, records


def _by_area(
    label: str, node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions
) -> list[tuple[str, Resources]]:
    return [(f"{label}/{area}", translate(node, records, replace(options, areas=(area,)))) for area in AREAS]


@functools.cache
def corpus() -> tuple[tuple[str, Resources], ...]:
    """(`<state>[/<area>]`, resources): each builder's output on its own, then the east-west knobs and the secrets."""
    cases: list[tuple[str, Resources]] = []
    l4, l4_records = _l4_node()
    cases += _by_area("l4", l4, l4_records, OPTS)
    udp_knobs = replace(
        OPTS,
        udp_gso_writer=True,
        udp_prefer_gro=False,
        udp_upstream_prefer_gro=True,
        udp_session_idle_s=0.25,
        udp_preserve_source=True,
    )
    cases += _by_area("l4-knobs", l4, l4_records, udp_knobs)
    cases += _by_area("l4-upstream-gro-off", l4, l4_records, replace(OPTS, udp_upstream_prefer_gro=False))
    empty = node_with(0, 1, name="codec-empty")  # a pod and no service: the matcher is its blackhole alone
    cases += _by_area("no-services", empty, records_for(empty), OPTS)
    for label, (node, records) in (
        ("eastwest-sample", two_sources_one_destination()),
        ("eastwest-mixed", _eastwest_node()),
    ):
        cases += _by_area(label, node, records, OPTS)
        cases.append((f"{label}/secrets", _secrets(node, records, OPTS)))
        for knobs, ew in (
            ("h2-only", EastWestOptions(quic=False, prefer_gro=False)),
            ("access-logs", EastWestOptions(access_log_path="/dev/stdout", app_ports={"u-client": (80, 81)})),
            ("path-config-source", EastWestOptions(config_source={"path_config_source": {"path": "/etc/sds.yaml"}})),
            ("remote", EastWestOptions(remote_gateways={"default/web": ("10.199.0.2",), "default/api": ("10.1.0.1",)})),
        ):
            cases.append((f"{label}/eastwest-{knobs}", eastwest_build(node, records, OPTS, ew)))
        guarded = replace(OPTS, authorization=compile_bodies(_POLICIES, "cluster.local"))
        cases.append((f"{label}/eastwest-authz", eastwest_build(node, records, guarded)))
        cases += _by_area(f"{label}/gateway", node, records, replace(OPTS, east_west_gateway="10.199.0.2"))
        with_quic = replace(OPTS, east_west_gateway="10.199.0.2", east_west_gateway_quic=True)
        cases += _by_area(f"{label}/gateway-quic", node, records, with_quic)
    quic = {"q": quic_listener(enableEarlyData=False, enableResumption=True)}
    cases.append(("hand-written/resumption-on", {LISTENER: quic}))
    return tuple(cases)


def _normalised(msg: Message) -> Message:
    """`msg` with every Any re-packed from deterministic bytes, in place: ParseDict packs an Any's maps in
    insertion order, fastfill sorted, so the same message can have two byte forms."""
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            if fd.message_type.fields_by_name["value"].message_type is not None:
                for item in value.values():
                    _normalised(item)
        elif fd.is_repeated:
            for item in value:
                _normalised(item)
        else:
            _normalised(value)
    if msg.DESCRIPTOR.full_name == ANY:
        inner = codec.message_class(_short(msg.type_url))()
        inner.ParseFromString(msg.value)
        msg.value = _normalised(inner).SerializeToString(deterministic=True)
    return msg


def assert_fast_equals_parsedict(type_url: str, name: str, resource: ResourceDict) -> None:
    """fastfill handles the resource (no fallback to ParseDict) and gives the message ParseDict gives: same
    fields, same values, same unknown fields, down through every Any."""
    fast = codec.message_class(codec.full_name(type_url))()
    try:
        fastfill.fill(fast, resource, codec.message_class)
    except (fastfill.Unsupported, TypeError, ValueError, KeyError, AttributeError) as exc:  # what the codec catches
        pytest.fail(f"{short_type(type_url)} {name!r}: the fast path fell back to ParseDict: {exc}")
    slow = codec.to_message(type_url, resource, name, fast=False)
    fast_bytes = _normalised(fast).SerializeToString(deterministic=True)
    slow_bytes = _normalised(slow).SerializeToString(deterministic=True)
    if fast_bytes != slow_bytes:
        fast_json, slow_json = (
            json.dumps(codec.decode_json(type_url, b), indent=1, sort_keys=True).splitlines()
            for b in (fast_bytes, slow_bytes)
        )
        diff = "\n".join(difflib.unified_diff(slow_json, fast_json, "ParseDict", "fastfill", lineterm=""))
        pytest.fail(f"{short_type(type_url)} {name!r}: fastfill differs from ParseDict\n{diff or '(unknown fields)'}")


@dataclass
class Compared:
    types: set[str] = field(default_factory=set)
    areas: set[str] = field(default_factory=set)
    kinds: dict[str, set[str]] = field(default_factory=dict)
    paths: dict[str, set[str]] = field(default_factory=dict)
    count: int = 0


@functools.cache
def compared() -> Compared:
    """Compare every corpus resource; what was compared, for the coverage checks."""
    seen = Compared()
    for label, resources in corpus():
        for type_url, named in resources.items():
            for name, resource in named.items():
                assert_fast_equals_parsedict(type_url, name, resource)
                seen.types.add(type_url)
                seen.areas.add(label.rpartition("/")[2])
                seen.kinds.setdefault(type_url, set()).add(kind(type_url, resource))
                seen.paths.setdefault(type_url, set()).update(shape(type_url, resource))
                seen.count += 1
    return seen


def test_fast_path_matches_parsedict_on_every_shape_we_render() -> None:
    """The fast filler (aether.xds.codec.fastfill) must give the same messages as json_format.ParseDict, on
    every resource type, builder and listener/cluster kind (the coverage is checked, not assumed)."""
    seen = compared()
    assert seen.types == set(KNOWN_TYPES), "a resource type the translation emits was never compared"
    assert set(AREAS) <= seen.areas, "a builder whose output was never compared"
    assert "secrets" in seen.areas
    assert seen.kinds[LISTENER] == LISTENER_KINDS, "listener kinds compared: " + repr(sorted(seen.kinds[LISTENER]))
    assert seen.kinds[CLUSTER] == CLUSTER_KINDS, "cluster kinds compared: " + repr(sorted(seen.kinds[CLUSTER]))
    assert seen.count > 150


# ---- random states and knobs emit nothing the corpus did not compare --------------------------------------------

_NAMESPACES: Final = ("default", "jobs")
# MeshAuthorizationPolicies for the corpus and the random states: exact and namespace-wide sources, a port-scoped
# rule, an invalid policy (fails closed: no rules), on the sample Services and the random states' d0/d1
_POLICIES: Final = tuple(
    {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"targetRefs": [{"name": t} for t in ("web", "api", "d0", "d1")], "rules": rules},
    }
    for name, ns, rules in (
        ("callers", "default", [{"from": ["spiffe://cluster.local/ns/default/sa/client"], "ports": [8080]}]),
        ("team", "default", [{"from": ["spiffe://cluster.local/ns/jobs/sa/*"]}]),
        ("broken", "jobs", [{"from": ["*"]}]),
    )
)
_DOMAINS: Final = st.sampled_from(["cluster.local", "mesh.example", "corp.internal"])
# Knobs by type; a knob of a type not listed here fails the test: say how to draw it, so the shapes it makes are
# explored (and compared) too.
_BY_TYPE: Final[dict[Any, st.SearchStrategy[Any]]] = {
    bool: st.booleans(),
    bool | None: st.none() | st.booleans(),
    int: st.integers(1, 2**31 - 1),
    # milliseconds: what the flags take (a float of 10+ decimals is no valid proto3-JSON Duration as the east-west
    # builders write it, f"{x}s", for either path)
    float: st.integers(1, 86_400_000).map(lambda ms: ms / 1000),
    float | None: st.none() | st.integers(1, 86_400_000).map(lambda ms: ms / 1000),
    str: _DOMAINS,
}
_BY_NAME: Final[dict[tuple[type, str], st.SearchStrategy[Any]]] = {
    (TranslateOptions, "areas"): st.just(L4_AREAS),  # the east-west builder runs with its own knobs below
    (EastWestOptions, "default_app_ports"): st.lists(st.sampled_from([80, 8080, 9090]), min_size=1, max_size=2).map(
        lambda ports: tuple(dict.fromkeys(ports))
    ),
    (EastWestOptions, "app_ports"): st.dictionaries(st.sampled_from(["u0", "u1", "u2"]), st.just((81, 82)), max_size=2),
    (EastWestOptions, "access_log_path"): st.none() | st.just("/dev/stdout"),
    (EastWestOptions, "config_source"): st.sampled_from(
        [None, {"ads": {}, "resource_api_version": "V3"}, {"path_config_source": {"path": "/etc/sds.yaml"}}]
    ),
    (EastWestOptions, "identity_factory"): st.sampled_from(["envoy.hashable_string", "envoy.string"]),
    (TranslateOptions, "authorization"): st.sampled_from([(), compile_bodies(_POLICIES, "cluster.local")]),
    (TranslateOptions, "east_west_gateway"): st.none() | st.just("10.199.0.2"),  # the gateway area's knobs
    (TranslateOptions, "east_west_gateway_quic"): st.booleans(),
    (EastWestOptions, "remote_gateways"): st.dictionaries(
        st.sampled_from(["default/web", "default/api", *(f"{ns}/d{i}" for ns in _NAMESPACES for i in (0, 1))]),
        st.just(("10.199.0.2", "10.199.0.3")),
        max_size=2,
    ),
}


def knobs(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Every field of the options dataclass `cls`, drawn by name (`_BY_NAME`) or by type (`_BY_TYPE`)."""
    hints = typing.get_type_hints(cls)
    drawn: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        strategy = _BY_NAME.get((cls, f.name), _BY_TYPE.get(hints[f.name]))
        if strategy is None:
            pytest.fail(f"{cls.__name__}.{f.name}: {hints[f.name]}: a knob this test cannot draw; add it to _BY_NAME")
        drawn[f.name] = strategy
    return st.builds(cls, **drawn)


@st.composite
def states(draw: st.DrawFn) -> tuple[MeshNode, dict[str, PodRecord]]:
    """A MeshNode with pods (with or without an IP and a record), UDP and TCP arms (blackholed, shared clusters,
    0-2 endpoints) and east-west destinations (0-2 ports; local pods among their endpoints, or not)."""
    pods, records = [], {}
    for i in range(draw(st.integers(0, 3))):
        ns = draw(st.sampled_from(_NAMESPACES))
        ip = draw(st.none() | st.just(f"10.200.1.{i + 2}"))
        pods.append({"uid": f"u{i}", "namespace": ns, "name": f"p{i}", "ip": ip, "serviceAccount": f"sa{i % 2}"})
        if draw(st.booleans()) or i == 0:
            records[f"u{i}"] = PodRecord(uid=f"u{i}", namespace=ns, name=f"p{i}", netns=f"/run/netns/hyp-{i}")
    endpoint_ips = st.sampled_from([*(p["ip"] for p in pods if p["ip"]), "10.200.2.7", "10.200.2.8"])
    endpoints = st.lists(st.tuples(endpoint_ips, st.sampled_from([53, 5353])), max_size=2, unique=True)

    def arms(protocol: str, subnet: int) -> list[dict[str, Any]]:
        out = []
        for i in range(draw(st.integers(0, 3))):
            service = f"{draw(st.sampled_from(_NAMESPACES))}/{protocol}{i}"
            cluster = draw(st.sampled_from([f"{protocol}:{service}", f"{protocol}:default/{protocol}0", "blackhole"]))
            eps = [] if cluster == "blackhole" else draw(endpoints)
            out.append(
                {
                    "service": service,
                    "vip": f"10.96.{subnet}.{i + 1}",
                    "cluster": cluster,
                    "endpoints": [{"ip": ip, "port": port} for ip, port in eps],
                }
            )
        return out

    destinations = [
        {
            "service": f"{draw(st.sampled_from(_NAMESPACES))}/d{i}",
            "serviceAccount": f"dsa{i}",
            "ports": draw(st.lists(st.sampled_from([80, 8080, 9090]), max_size=2, unique=True)),
            "endpoints": [{"ip": ip, "port": 18008} for ip, _ in draw(endpoints)],
        }
        for i in range(draw(st.integers(0, 2)))
    ]
    status = {"pods": pods, "udp": {"services": arms("udp", 0)}, "tcp": {"services": arms("tcp", 1)}}
    status["quic"] = {"destinations": destinations}
    return parse_meshnode({"metadata": {"name": "codec-hyp"}, "status": status}), records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=states(), options=knobs(TranslateOptions), ew=knobs(EastWestOptions))
def test_every_shape_random_states_emit_was_compared(
    state: tuple[MeshNode, dict[str, PodRecord]], options: TranslateOptions, ew: EastWestOptions
) -> None:
    """Random states and knobs (every field of TranslateOptions and EastWestOptions) emit no resource type or field
    path the corpus did not compare, and fast and ParseDict agree on them too."""
    node, records = state
    resources = merge(
        translate(node, records, options),
        eastwest_build(node, records, options, ew),
        _secrets(node, records, options),
    )
    seen = compared()
    for type_url, named in resources.items():
        for name, resource in named.items():
            assert_fast_equals_parsedict(type_url, name, resource)
            assert type_url in seen.types, f"{short_type(type_url)}: a resource type the corpus never compared"
            new = shape(type_url, resource) - seen.paths[type_url]
            assert not new, f"{short_type(type_url)} {name!r} sets fields the corpus never compared: {sorted(new)}"
