"""Studies over the simulator: static-best, the oracle, comparisons, sweeps, benchmarks, plots."""
