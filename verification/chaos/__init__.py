"""warren-chaos: a local Warren cluster under warren-perf load, with seeded faults."""
