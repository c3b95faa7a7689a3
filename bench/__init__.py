"""Benchmarks: `python -m bench` lists them; each module runs on its own (`python -m bench.<name>`)."""
