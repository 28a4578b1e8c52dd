"""Starting tandem's processes: `tandem serve` (devices, plan, config, supervisor,
probes, screen) and cluster.py, the router + workers of tests and benchmarks."""
