"""aether.operator: kopf handlers, the MeshNode desired-state model and the pure reconcile functions."""
