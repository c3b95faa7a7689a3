"""The L4 builders on the mesh port 18082: per-service plaintext UDP and the raw TCP floor, selected by destination IP.
What both share (local pods, EDS clusters, load assignments) and the incremental memo of arms.
"""
