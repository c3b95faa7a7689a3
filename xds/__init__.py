"""aether.xds: the delta-ADS server, translation of desired state into Envoy resources, SDS, QUIC pairs."""
