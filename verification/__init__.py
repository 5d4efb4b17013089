"""Checking Warren's promise from outside: a load generator that records what
it saw (`warren-perf`), a fault injector around a local cluster
(`warren-chaos`), and a Spark job that judges the recorded histories
(`warren-verify`). See docs/verification.md."""
