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
from warren.verification.perf.runner import ProcessRun

RUN_TIMEOUT_SECONDS = 90


def perf(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "warren.verification.perf.cli", *args], **popen)


def test_options_round_trip_through_a_child_command_line():
    options = parse(["--url", "amqp://a", "--url", "amqp://b", "-x", "3", "--queue-arg", "x-max-length=10",
                     "--time", "2", "--history", "h", "--queues", "4", "--multi-ack-every", "8"])
    assert parse(to_argv(options)) == options
    assert options.queue_args == {"x-max-length": 10}


def test_the_processes_clients_are_spread_over_the_queues_together():
    """Two processes of one publisher and one consumer each, two queues: one of each per
    queue (before, every process numbered its clients from 0: all four on the first queue,
    and warren-chaos --queues 4 left three queues undeclared for its final drain to wait on)."""
    placed = []
    for index in range(2):
        run = ProcessRun(parse(["--url", "amqp://a", "--queues", "2", "--queue", "q", "-x", "1", "-y", "1",
                                "--time", "1", "--process-index", str(index)]))
        placed.append(([p.queue for p in run.publishers], [c.queue for c in run.consumers]))
    assert placed == [(["q-0"], ["q-0"]), (["q-1"], ["q-1"])], placed


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


def test_many_queue_run_spreads_clients_and_reports_broker_cpu(fresh_server, tmp_path, name):
    """The issue's many-queue case, scaled down: clients spread over every queue, and
    --broker-pid turns the broker's CPU over the run into µs per message."""
    history, summary_path = tmp_path / "history", tmp_path / "summary.json"
    process = perf("--url", fresh_server.url, "--queue", name, "--queues", "3", "-x", "6", "-y", "6",
                   "--pmessages", "50", "--consumer-drain", "1", "--history", str(history),
                   "--broker-pid", str(fresh_server.process.pid), "--json", str(summary_path),
                   stdout=subprocess.PIPE, text=True)
    output, _ = process.communicate(timeout=RUN_TIMEOUT_SECONDS)
    assert process.returncode == 0, output
    assert "broker CPU:" in output
    summary = json.loads(summary_path.read_text())
    assert summary["confirmed"] == 300
    assert summary["broker_cpu_seconds"] > 0
    assert summary["broker_cpu_us_per_confirmed"] == summary["broker_cpu_seconds"] / 300 * 1e6
    rows = read_events(history)
    assert {r["queue"] for r in rows if r["event"] == "confirm"} == {f"{name}-{n}" for n in range(3)}
    assert {r["queue"] for r in rows if r["event"] == "deliver"} == {f"{name}-{n}" for n in range(3)}


def test_multiple_acks_cover_every_delivery(fresh_server, tmp_path, name):
    """--multi-ack-every 16 with 150 messages: nine acks of 16 and the last 6 acked
    once deliveries pause, each delivery's ack in the history."""
    history, summary_path = tmp_path / "history", tmp_path / "summary.json"
    process = perf("--url", fresh_server.url, "--queue", name, "--pmessages", "150", "--multi-ack-every", "16",
                   "--consumer-drain", "1", "--history", str(history), "--json", str(summary_path),
                   stdout=subprocess.PIPE, text=True)
    output, _ = process.communicate(timeout=RUN_TIMEOUT_SECONDS)
    assert process.returncode == 0, output
    summary = json.loads(summary_path.read_text())
    assert summary["delivered"] == summary["acked"] == 150
    rows = read_events(history)
    assert_consistent(rows)
    assert ids(rows, "ack") == ids(rows, "deliver") == ids(rows, "confirm")
