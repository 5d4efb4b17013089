"""The Spark judge against the injected anomalies and the pure-Python reference."""
from __future__ import annotations

import json
import re

import pytest

from tests.verification.historyrows import delivered, event, published_confirmed, write_history
from warren.verification.judge import cli, reference
from warren.verification.judge.synthetic import generate
from warren.verification.judge.verdict import judge_history

INJECTED_AS_COUNTED = ("confirmed_lost", "unconfirmed_delivered", "duplicates_redelivered", "duplicates_unflagged",
                       "phantom_messages", "order_violations", "nacked", "returned")


@pytest.fixture(scope="module", params=[1, 7])
def synthetic(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"synthetic-{request.param}")
    injected = generate(24_000, directory, seed=request.param, anomalies_each=3)
    return directory, injected


def test_spark_equals_reference_and_injected(spark, synthetic):
    directory, injected = synthetic
    verdict = judge_history(spark, str(directory))
    expected = reference.judge(directory)
    assert verdict["queues"] == expected["queues"]
    for queue, counts in injected.items():
        for name in INJECTED_AS_COUNTED:
            assert verdict["queues"][queue][name] == counts[name], (queue, name)
    gaps = {f["id"]: {q: None if g is None else round(g * 1e9) for q, g in f["unavailability_s"].items()}
            for f in verdict["faults"]}
    assert gaps == expected["unavailability_ns"]
    assert len(verdict["faults"]) == 2 and all(g["*"] > 0 for g in gaps.values())
    assert verdict["drained"] and not verdict["ok"]


def test_latency_percentiles_are_nearest_rank(spark, tmp_path):
    rows = []
    for seq in range(1000):  # publish-to-confirm latency of message seq: (seq + 1) * 10 ns
        rows += [event("publish", seq * 10_000, seq=seq), event("confirm", seq * 10_000 + (seq + 1) * 10, seq=seq)]
        rows += delivered(seq, seq * 10_000 + 5_000)
    verdict = judge_history(spark, str(write_history(tmp_path / "h", rows)))
    confirm = verdict["queues"]["q"]["latency_ns"]["publish_to_confirm"]
    assert confirm == {"count": 1000, "p50": 5000, "p99": 9900, "p99.9": 9990, "max": 10000}


def test_order_violation_is_counted_once_and_not_for_redeliveries(spark, tmp_path):
    rows = [r for seq in range(4) for r in published_confirmed(seq, seq * 100)]
    rows += delivered(2, 1000) + delivered(3, 1100) + delivered(0, 1200)     # 0 after 3: one violation
    rows += delivered(1, 1300, redelivered=True)                              # after 3, but redelivered
    rows += delivered(2, 1400, consumer="other") + delivered(1, 1500, consumer="other")  # 1 after 2: one more
    verdict = judge_history(spark, str(write_history(tmp_path / "h", rows)))
    assert verdict["queues"]["q"]["order_violations"] == 2
    assert verdict["queues"]["q"]["duplicates_unflagged"] == 2  # the second deliveries of 2 and 1
    assert reference.judge(tmp_path / "h")["queues"]["q"]["order_violations"] == 2


@pytest.mark.parametrize("anomaly, code", [
    ("lost", 1),       # confirmed, never delivered
    ("phantom", 1),    # delivered, never published
    ("tolerated", 0),  # duplicates, an unconfirmed delivery, a confirmed return: reported, not failures
])
def test_exit_status(spark, tmp_path, anomaly, code):
    rows = published_confirmed(0, 0) + delivered(0, 100) + [event("drain_end", 1000, queue=None, publisher=None)]
    rows += {"lost": published_confirmed(1, 10),
             "phantom": [event("deliver", 200, publisher="ghost", seq=5, consumer="c")],
             "tolerated": (delivered(0, 300) + [event("publish", 20, seq=2)] + delivered(2, 400)
                           + published_confirmed(3, 30) + [event("return", 35, seq=3)])}[anomaly]
    history = write_history(tmp_path / "h", rows)
    assert cli.main([str(history), "--out", str(tmp_path / "out"), "--no-html"]) == code
    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert verdict["ok"] is (code == 0)
    if anomaly == "tolerated":
        tolerated = ("duplicates_unflagged", "unconfirmed_delivered", "returned")
        assert {k: verdict["histories"][0]["totals"][k] for k in tolerated} == \
            {"duplicates_unflagged": 1, "unconfirmed_delivered": 1, "returned": 1}


def test_a_drain_that_timed_out_is_said(spark, tmp_path, capsys):
    rows = published_confirmed(0, 0) + delivered(0, 100)
    rows += [event("drain_end", 1000, queue=None, publisher=None, detail="drained=1 timed_out=True")]
    history = write_history(tmp_path / "h", rows)
    assert cli.main([str(history), "--out", str(tmp_path / "out"), "--no-html"]) == 0   # nothing lost
    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text())["histories"][0]
    assert verdict["drained"] and verdict["drain_timed_out"]
    assert "the final drain timed out" in capsys.readouterr().out


def test_report_is_self_contained_with_both_histories(spark, tmp_path):
    directory, clean = tmp_path / "anomalies", tmp_path / "clean"
    generate(8_000, directory, seed=5, anomalies_each=1)
    generate(8_000, clean, seed=3, anomalies_each=0)
    assert cli.main([str(clean), "--out", str(tmp_path / "single")]) == 0
    assert cli.main([str(directory), str(clean), "--out", str(tmp_path / "pair")]) == 1
    page = (tmp_path / "pair" / "report.html").read_text()
    assert not re.search(r"<script[^>]*\ssrc\s*=", page, re.IGNORECASE)  # plotly.js is inlined
    assert not re.search(r"<link[^>]*\shref\s*=", page, re.IGNORECASE)
    assert "Plotly.newPlot" in page
    assert page.count("class=\"plotly-graph-div\"") == 6  # three figures per history
    for title in ("Throughput", "Latency by publish second", "Latency histogram"):
        assert page.count(title) >= 2
    assert str(directory) in page and str(clean) in page
    verdicts = json.loads((tmp_path / "pair" / "verdict.json").read_text())["histories"]
    assert [v["ok"] for v in verdicts] == [False, True]


def test_a_directory_without_events_is_a_usage_error(spark, tmp_path):
    (tmp_path / "h").mkdir()
    assert cli.main([str(tmp_path / "h"), "--out", str(tmp_path / "out")]) == cli.EXIT_USAGE
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(tmp_path / "missing")])
    assert exit_.value.code == cli.EXIT_USAGE
