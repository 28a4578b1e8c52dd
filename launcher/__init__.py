"""Starting a whole cluster (router + workers) as real processes, for tests and benchmarks."""
