"""warren-perf against a real single-node warren-server: the history it records."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq

from tests.verification.histories import assert_consistent, ids, read_events
from warren.verification.perf.options import parse, to_argv

RUN_TIMEOUT_SECONDS = 90


def perf(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "warren.verification.perf.cli", *args], **popen)


def test_options_round_trip_through_a_child_command_line():
    options = parse(["--url", "amqp://a", "--url", "amqp://b", "-x", "3", "--queue-arg", "x-max-length=10",
                     "--time", "2", "--history", "h", "--queues", "4"])
    assert parse(to_argv(options)) == options
    assert options.queue_args == {"x-max-length": 10}


def test_history_of_a_run_is_consistent(fresh_server, tmp_path, name):
    history, summary_path = tmp_path / "history", tmp_path / "summary.json"
    process = perf("--url", fresh_server.url, "--queue", name, "--producers", "2", "--consumers", "2",
                   "--pmessages", "400", "--consumer-drain", "1", "--history", str(history),
                   "--json", str(summary_path), "--run-id", "r1", stdout=subprocess.PIPE, text=True)
    output, _ = process.communicate(timeout=RUN_TIMEOUT_SECONDS)
    assert process.returncode == 0, output
    assert "summary:" in output
    rows = read_events(history)
    assert_consistent(rows)
    counts = Counter(r["event"] for r in rows)
    summary = json.loads(summary_path.read_text())
    assert counts["publish"] == summary["published"] == 800
    assert counts["confirm"] == summary["confirmed"] == 800
    assert ids(rows, "confirm") <= ids(rows, "deliver")
    assert {r["run_id"] for r in rows} == {"r1"}
    assert {r["queue"] for r in rows} == {name}


def test_kill_9_mid_run_leaves_readable_files(fresh_server, tmp_path, name):
    history = tmp_path / "history"
    process = perf("--url", fresh_server.url, "--queue", name, "--time", "60", "--rate", "200",
                   "--history", str(history), "--quiet")
    try:
        deadline = time.monotonic() + 30
        while len(list(history.glob("*.parquet"))) < 2:
            assert time.monotonic() < deadline, "warren-perf wrote no history files"
            assert process.poll() is None, "warren-perf exited early"
            time.sleep(0.1)  # polling for files, with a deadline
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    for path in history.glob("*.parquet"):
        pq.read_table(path)  # a complete file, never a torn one
    rows = read_events(history)
    assert_consistent(rows)
    assert ids(rows, "publish")
