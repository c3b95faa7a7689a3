"""Desired state (MeshNode + pod records) -> Envoy resources for one node, pure.
`l4/` builds plaintext UDP and raw TCP on 18082; `eastwest/` builds inbound h2/QUIC mTLS, outbound HTTP and twins; `compose` merges them.
"""
