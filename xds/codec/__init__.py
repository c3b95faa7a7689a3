"""Proto3-JSON resource dicts -> protobuf messages and bytes for ADS.
A fast filler for the hot path, the xds-protos modules it needs, and the Envoy 1.40 messages xds-protos lacks.
"""
