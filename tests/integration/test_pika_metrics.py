"""The Prometheus endpoint, read while pika clients work against the broker."""
from __future__ import annotations

import re
import urllib.error
import urllib.request

from tests.integration.pika_support import cleanup, connect, connection, sync  # noqa: F401

SCRAPE_TIMEOUT_SECONDS = 5
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(server) -> list[tuple[str, dict, float]]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_SECONDS) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"unparseable metrics line {line!r}"
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        samples.append((match.group("name"), labels, float(match.group("value"))))
    return samples


def value(samples, metric: str, **labels) -> float:
    found = [v for n, tags, v in samples if n == metric and all(tags.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"expected one sample of {metric}{labels}, found {found}"
    return found[0]


def test_connections_gauge_counts_open_connections(server):
    with connect(server), connect(server):
        assert value(scrape(server), "warren_connections") >= 2


def test_queue_messages_ready_after_publishing(server, connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    assert value(scrape(server), "warren_queue_messages_ready", vhost="/", queue=name) == 0
    for i in range(3):
        channel.basic_publish("", name, b"%d" % i)
    sync(channel)
    assert value(scrape(server), "warren_queue_messages_ready", vhost="/", queue=name) == 3
    channel.basic_get(name, auto_ack=False)
    samples = scrape(server)
    assert value(samples, "warren_queue_messages_ready", vhost="/", queue=name) == 2
    assert value(samples, "warren_queue_messages_unacked", vhost="/", queue=name) == 1


def test_published_counter_increases(server, connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    before = value(scrape(server), "warren_messages_published_total")
    for i in range(5):
        channel.basic_publish("", name, b"%d" % i)
    sync(channel)
    after = value(scrape(server), "warren_messages_published_total")
    assert after - before >= 5, f"published_total went from {before} to {after} after 5 publishes"


def test_unknown_path_is_404(server):
    url = f"http://127.0.0.1:{server.metrics_port}/nope"
    try:
        urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_SECONDS)
    except urllib.error.HTTPError as error:
        assert error.code == 404
    else:
        raise AssertionError("GET /nope did not return 404")
