"""warren-perf: a PerfTest-like AMQP 0-9-1 load generator that can record a history."""
