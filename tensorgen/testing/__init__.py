"""Testing aids shared by the test suite and the benchmarks (the fuzz harness)."""
