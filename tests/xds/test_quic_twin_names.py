"""Twin names: one per (source identity, destination); the short `@<sa>` spelling only for a same-namespace source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aether.api.naming import QuicTwinName, parse_quic_twin, quic_twin

# Kubernetes names: DNS-1123 labels (namespaces) and subdomains (ServiceAccounts): never a `/` or `@`
LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
SUBDOMAIN = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,10}[a-z0-9])?", fullmatch=True)


def test_spellings() -> None:
    assert quic_twin("shop", "web", "client") == "quic:shop/web@client"
    assert quic_twin("shop", "web", "client", "shop") == "quic:shop/web@client"
    assert quic_twin("shop", "web", "default", "team-b") == "quic:shop/web@team-b/default"


@given(LABEL, LABEL, st.lists(st.tuples(LABEL, SUBDOMAIN), min_size=2, max_size=6, unique=True))
def test_distinct_sources_never_share_a_twin(dest_ns: str, svc: str, sources: list[tuple[str, str]]) -> None:
    names = [quic_twin(dest_ns, svc, sa, src_ns) for src_ns, sa in sources]
    assert len(set(names)) == len(names)


@given(LABEL, LABEL, LABEL, SUBDOMAIN)
def test_parse_inverts_quic_twin(dest_ns: str, svc: str, src_ns: str, sa: str) -> None:
    name = quic_twin(dest_ns, svc, sa, src_ns)
    assert parse_quic_twin(name) == QuicTwinName(dest_ns, svc, src_ns, sa)
    t = parse_quic_twin(name)
    assert quic_twin(t.namespace, t.service, t.source_sa, t.source_namespace) == name


@given(st.text(max_size=40))
def test_parse_accepts_only_what_quic_twin_makes(name: str) -> None:
    try:
        t = parse_quic_twin(name)
    except ValueError:
        return
    assert quic_twin(t.namespace, t.service, t.source_sa, t.source_namespace) == name


@pytest.mark.parametrize(
    "name",
    [
        "h2:shop/web",
        "quic:shop/web",
        "quic:shop@client",
        "quic:/web@client",
        "quic:shop/@client",
        "quic:shop/web@",
        "quic:shop/web@shop/client",  # the long spelling of a same-namespace source
        "quic:shop/web@a/b/client",
        "quic:shop/web/x@client",
        "quic:Shop/web@client",
        "quic:shop/web@client@x",
    ],
)
def test_parse_refuses(name: str) -> None:
    with pytest.raises(ValueError):
        parse_quic_twin(name)
