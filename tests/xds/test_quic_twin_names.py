"""Twin names: one per (source identity, destination); the short `@<sa>` spelling only for a same-namespace source."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aether.api.naming import quic_twin

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
