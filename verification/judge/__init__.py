"""warren-verify: judge a recorded history (verification/history.py) on Spark.

Modules: `javaenv` (which Java Spark gets), `session` (the SparkSession and
the code shipped to executors), `events` (reading a history), `messages`
(loss, phantoms, duplicates), `ordering`, `latency`, `throughput`, `faults`
(unavailability), `verdict` (all of it as one JSON-able dict), `report`
(the HTML), `cli`; `synthetic` (a seeded history generator) and `reference`
(a pure-Python judge for small histories, the tests' oracle).
See docs/verification.md.
"""
