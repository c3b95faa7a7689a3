"""The east-west builders: inbound h2 + QUIC mTLS per local pod, outbound HTTP routed to h2 or per-source QUIC twins.
The plan (what they read from the MeshNode), the TLS contexts, and the builder that composes them.
"""
