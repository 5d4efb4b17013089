"""A node's processes share one stderr: each log line must reach it in one write.

A line written in two parts (the text, then its newline, as `print` does) lets a
sibling shard's line land between them: two JSON objects on one line, then an empty
one, which a log shipper reading JSON lines cannot parse."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import structlog

from warren.broker.node.logs import configure_logging


class RecordingStream(io.StringIO):
    """A text stream that keeps each `write` call apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_each_line_is_one_write_ending_in_its_newline(monkeypatch):
    stream = RecordingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        configure_logging("info", "json")
        log = structlog.get_logger("test")
        log.info("first.event", n=1)
        log.warning("second.event", text="two\nlines")
    finally:
        structlog.reset_defaults()
    assert len(stream.writes) == 2, f"two records took {len(stream.writes)} writes: {stream.writes!r}"
    for written in stream.writes:
        assert written.endswith("\n") and written.count("\n") == 1, f"not one whole line: {written!r}"
        json.loads(written)


LOGGING_CHILD = """
import sys
from warren.broker.node.logs import configure_logging
import structlog
configure_logging("info", "json")
log = structlog.get_logger("child")
for n in range(int(sys.argv[1])):
    log.info("child.line", child=sys.argv[2], n=n, pad="x" * 40)
"""


def test_processes_sharing_one_stderr_write_whole_lines(tmp_path: Path):
    """Four processes logging at once into one inherited descriptor, as a node's shards do."""
    lines_each, children = 3000, 4
    out = tmp_path / "shared.log"
    with out.open("wb") as shared:
        procs = [subprocess.Popen([sys.executable, "-c", LOGGING_CHILD, str(lines_each), str(k)],
                                  stdout=subprocess.DEVNULL, stderr=shared)
                 for k in range(children)]
        for proc in procs:
            assert proc.wait(timeout=120) == 0, "a logging child failed"
    lines = out.read_text().split("\n")
    assert lines[-1] == ""
    broken = [line for line in lines[:-1] if not _one_json_object(line)]
    assert not broken, f"{len(broken)} of {len(lines) - 1} lines are not one JSON object, e.g. {broken[:3]!r}"
    assert len(lines) - 1 == lines_each * children


def _one_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
