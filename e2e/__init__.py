"""aether.e2e: the network-namespace lab, the multi-node e2e harness and the local demo."""
