"""Workload identity: SVIDs and the trust bundle, the certificate sources (built-in CA, PEM directory),
and the SDS Secret resources built from them.
"""
