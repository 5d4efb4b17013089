"""A stand-in for the prom/prometheus service of docker-compose.yml, for machines
that cannot pull images from Docker Hub (tests/test_container.py). It is NOT
Prometheus: it takes the same flags, reads the same configuration file, scrapes
every static target of every job at start and then every scrape_interval (a
target that is down again after a second), and
answers a minimal ``/api/v1/targets`` in Prometheus's shape (health, lastError)
and ``/-/ready``, so a test can see that the compose file's Prometheus wiring
(the mounted config, the target names on the compose network, the metrics
endpoints) works. The standard library only; the simple YAML of
deploy/prometheus.yml is read line by line.
"""
from __future__ import annotations

import argparse
import json
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def read_config(path: str) -> tuple[float, list[dict]]:
    """(scrape interval in seconds, [{job, metrics_path, scheme, targets}])."""
    interval = 15.0
    jobs: list[dict] = []
    in_targets = False
    for raw in open(path, encoding="utf-8"):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if match := re.match(r"^\s*scrape_interval:\s*(\d+)s\s*$", line):
            if not jobs:
                interval = float(match.group(1))
        elif match := re.match(r"^\s*- job_name:\s*['\"]?([\w-]+)['\"]?\s*$", line):
            jobs.append({"job": match.group(1), "metrics_path": "/metrics", "scheme": "http", "targets": []})
            in_targets = False
        elif jobs and (match := re.match(r"^\s*(metrics_path|scheme):\s*(\S+)\s*$", line)):
            jobs[-1][match.group(1)] = match.group(2)
        elif jobs and re.match(r"^\s*(- )?targets:\s*$", line):
            in_targets = True
        elif jobs and in_targets and (match := re.match(r"^\s*- ['\"]?([\w.-]+:\d+)['\"]?\s*$", line)):
            jobs[-1]["targets"].append(match.group(1))
        else:
            in_targets = False
    return interval, jobs


class Scraper:
    def __init__(self, jobs: list[dict]):
        self.jobs = jobs
        self.lock = threading.Lock()
        self.results: dict[tuple[str, str], dict] = {}
        self.scrapes = 0

    def scrape_all(self) -> None:
        for job in self.jobs:
            for target in job["targets"]:
                url = f"{job['scheme']}://{target}{job['metrics_path']}"
                started = time.time()
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        body = response.read().decode("utf-8", "replace")
                    samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
                    health, error = ("up", "") if response.status == 200 and samples else ("down", "no samples")
                except Exception as exc:  # noqa: BLE001 -- reported as the target's lastError
                    health, error, samples = "down", str(exc), 0
                with self.lock:
                    self.results[(job["job"], target)] = {
                        "labels": {"job": job["job"], "instance": target},
                        "scrapeUrl": url, "health": health, "lastError": error,
                        "lastScrape": started, "samples": samples,
                    }
        with self.lock:
            self.scrapes += 1

    def targets(self) -> dict:
        with self.lock:
            return {"status": "success", "data": {"activeTargets": list(self.results.values())}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config.file", dest="config", default="/etc/prometheus/prometheus.yml")
    parser.add_argument("--web.listen-address", dest="listen", default="0.0.0.0:9090")
    args, _ = parser.parse_known_args()  # storage flags and the like mean nothing here
    interval, jobs = read_config(args.config)
    scraper = Scraper(jobs)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            if self.path.startswith("/api/v1/targets"):
                body, kind = json.dumps(scraper.targets()).encode(), "application/json"
            elif self.path.startswith("/-/ready") or self.path.startswith("/-/healthy"):
                body, kind = b"Prometheus stand-in is Ready.\n", "text/plain"
            elif self.path.startswith("/metrics"):
                body, kind = f"standin_scrapes_total {scraper.scrapes}\n".encode(), "text/plain; version=0.0.4"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:
            pass

    host, port = args.listen.rsplit(":", 1)
    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"event": "standin.started", "interval_s": interval,
                      "targets": {j["job"]: j["targets"] for j in jobs}}), flush=True)
    while True:
        scraper.scrape_all()
        # unlike Prometheus, a target that is down is tried again after a second
        # (the nodes start alongside), so that a test need not wait a whole interval
        down = any(t["health"] != "up" for t in scraper.targets()["data"]["activeTargets"])
        time.sleep(min(interval, 1.0) if down else interval)


if __name__ == "__main__":
    main()
