"""aether.netns: the capture contract, the nftables ruleset builder, its installer and the CNI plugin."""
