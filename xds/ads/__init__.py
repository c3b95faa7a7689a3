"""The delta-ADS gRPC server: per-node snapshot cache, per-stream and per-type delta state, the servicer.
Type-agnostic: it serves whatever resources the translation put in a snapshot (shaped like go-control-plane's pkg/cache).
"""
