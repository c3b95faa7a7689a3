"""The QUIC pair lifecycle (pure): which (source ServiceAccount, destination) twins exist, go dormant or are pruned.
Typed events in (fetches, fresh streams, environment, clock, sidecar start), decisions out; no I/O: docs/pairs.md.
"""
