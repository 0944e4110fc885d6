"""Starting the real servers hubshift is tested and benchmarked against (one way to do it, used by
tests, benchmarks and the demo)."""
