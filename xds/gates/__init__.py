"""Our own validation gates, run on the merged translation before anything is served.
`core`: L4 and CDS/EDS references (every matcher arm names a cluster); `quic`: the east-west mTLS rules (R4, R5, twins).
"""
