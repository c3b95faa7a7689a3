"""The node sidecar, the thin shell: state sources (file, MeshNode through the API), the control loop, the secret keeper,
the Envoy bootstrap and the `aether xds` command line.
"""
