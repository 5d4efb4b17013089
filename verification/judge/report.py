"""One self-contained HTML report of one or two verdicts, side by side.

Plots are plotly figures built from the verdict's small aggregated series
(per second, per histogram bin), never from raw events; plotly.js is inlined
once in the page, so the file opens offline and can be mailed as is.
"""
from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from warren.verification.judge.latency import HISTOGRAM_BINS_PER_DECADE

FAULT_SHADE = dict(fillcolor="rgba(220, 50, 50, 0.15)", line_width=0, layer="below")
COUNTS_SHOWN = ("published", "confirmed", "confirmed_lost", "unconfirmed_delivered", "phantom_messages",
                "duplicates_redelivered", "duplicates_unflagged", "order_violations", "nacked", "returned")
STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.grid{display:grid;grid-template-columns:repeat(var(--n),minmax(0,1fr));gap:2em}
table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}
.ok{color:#1a7f37}.fail{color:#c62828}.bad{background:#fde0e0;font-weight:bold}
h2{font-size:1.2em;word-break:break-all}.wide{overflow-x:auto}"""


def shade_faults(figure: go.Figure, verdict: dict) -> go.Figure:
    for fault in verdict["faults"]:
        figure.add_vrect(x0=fault["start_s"], x1=fault["end_s"], **FAULT_SHADE)
    return figure


def _layout(figure: go.Figure, title: str, y_title: str, log_y: bool = False) -> go.Figure:
    figure.update_layout(title=title, height=340, margin=dict(l=60, r=20, t=50, b=40),
                         legend=dict(orientation="h", y=-0.2), template="plotly_white")
    figure.update_xaxes(title_text="seconds since the first event")
    figure.update_yaxes(title_text=y_title, type="log" if log_y else "linear")
    return figure


def throughput_figure(verdict: dict) -> go.Figure:
    """Confirms/s and deliveries/s over all queues (the per-queue series are in verdict.json)."""
    totals: dict[int, list[int]] = {}
    for point in verdict["series"]["throughput"]:
        total = totals.setdefault(point["second"], [0, 0])
        total[0] += point["confirms"]
        total[1] += point["deliveries"]
    seconds = sorted(totals)
    x = [s + 0.5 for s in seconds]  # a bucket [s, s+1) drawn at its middle, so fault shading lines up
    figure = go.Figure([go.Scatter(x=x, y=[totals[s][0] for s in seconds], name="confirms/s"),
                        go.Scatter(x=x, y=[totals[s][1] for s in seconds], name="deliveries/s",
                                   line=dict(dash="dot"))])
    return shade_faults(_layout(figure, "Throughput (fault windows shaded)", "per second"), verdict)


def latency_figure(verdict: dict) -> go.Figure:
    figure = go.Figure()
    for metric in ("publish_to_confirm", "publish_to_deliver"):
        points = [p for p in verdict["series"]["latency"] if p["metric"] == metric]
        x = [p["second"] + 0.5 for p in points]
        for key, dash in (("p50_ns", "solid"), ("p99_ns", "dot"), ("max_ns", "dash")):
            figure.add_trace(go.Scatter(x=x, y=[p[key] / 1e6 for p in points], line=dict(dash=dash),
                                        name=f"{metric.replace('_', '-')} {key[:-3]}"))
    figure = _layout(figure, "Latency by publish second (fault windows shaded)", "ms", log_y=True)
    return shade_faults(figure, verdict)


def histogram_figure(verdict: dict) -> go.Figure:
    figure = go.Figure()
    for metric in ("publish_to_confirm", "publish_to_deliver"):
        bins = [b for b in verdict["series"]["latency_histogram"] if b["metric"] == metric]
        lower_ms = [10 ** (b["bin"] / HISTOGRAM_BINS_PER_DECADE) / 1e6 for b in bins]
        # A step line, not bars: bars' widths are linear units, which a log axis distorts.
        figure.add_trace(go.Scatter(x=lower_ms, y=[b["count"] for b in bins], name=metric.replace("_", "-"),
                                    mode="lines+markers", line_shape="hv"))
    figure = _layout(figure, "Latency histogram (10 bins per decade)", "messages", log_y=True)
    figure.update_xaxes(type="log", title_text="latency, ms (bin's lower edge)")
    return figure


def _cell(value, bad: bool = False) -> str:
    return f"<td class=bad>{value}</td>" if bad else f"<td>{value}</td>"


def counts_table(verdict: dict) -> str:
    """One column per queue (and "all"), one row per count: stays narrow enough for two histories."""
    failing = {"confirmed_lost", "phantom_messages"}
    columns = [*verdict["queues"].items(), ("all", verdict["totals"])]
    rows = ["<tr><th></th>" + "".join(f"<th>{html.escape(str(queue))}</th>" for queue, _ in columns) + "</tr>"]
    for name in COUNTS_SHOWN:
        cells = "".join(_cell(counts[name], name in failing and counts[name] > 0) for _, counts in columns)
        rows.append(f"<tr><th>{name.replace('_', ' ')}</th>{cells}</tr>")
    return "<div class=wide><table>" + "".join(rows) + "</table></div>"


def latency_table(verdict: dict) -> str:
    columns = ("count", "p50", "p99", "p99.9", "max")
    rows = ["<tr><th>queue</th><th>latency</th>" + "".join(f"<th>{c}{'' if c == 'count' else ' ms'}</th>"
                                                           for c in columns) + "</tr>"]
    for queue, report in verdict["queues"].items():
        for metric, summary in report["latency_ns"].items():
            cells = "".join(_cell(summary.get(c, "") if c == "count" else f"{summary.get(c, 0) / 1e6:.3f}")
                            for c in columns)
            rows.append(f"<tr><th>{html.escape(str(queue))}</th><td>{metric.replace('_', '-')}</td>{cells}</tr>")
    return "<div class=wide><table>" + "".join(rows) + "</table></div>"


def faults_table(verdict: dict) -> str:
    if not verdict["faults"]:
        return "<p>No faults recorded.</p>"
    rows = ["<tr><th>fault</th><th>node</th><th>start s</th><th>end s</th><th>longest gap without a confirm, s"
            " (all queues; worst queue)</th></tr>"]
    for fault in verdict["faults"]:
        gaps = fault["unavailability_s"]
        worst = max(((g, q) for q, g in gaps.items() if g is not None and q != "*"), default=None)
        overall = "-" if gaps.get("*") is None else f"{gaps['*']:.3f}"
        worst_text = "" if worst is None else f"; {worst[0]:.3f} ({html.escape(str(worst[1]))})"
        rows.append(f"<tr><th>{html.escape(str(fault['detail']))}</th><td>{html.escape(str(fault['node']))}</td>"
                    f"<td>{fault['start_s']:.3f}</td><td>{fault['end_s']:.3f}</td><td>{overall}{worst_text}</td></tr>")
    return (f"<div class=wide><table>{''.join(rows)}</table></div>"
            f"<p>Gaps measured up to {verdict['grace_s']} s after each fault's end.</p>")


def history_column(verdict: dict) -> str:
    status = ("<span class=ok>OK</span>" if verdict["ok"]
              else "<span class=fail>FAIL: confirmed messages lost or phantoms</span>")
    drained = "" if verdict["drained"] else " <b>No drain_end recorded: messages left in queues count as lost.</b>"
    if verdict.get("drain_timed_out"):
        drained += (" <b>The final drain timed out: a queue was not emptied, or could not be consumed from;"
                    " messages left in it count as lost.</b>")
    figures = "".join(f.to_html(full_html=False, include_plotlyjs=False)
                      for f in (throughput_figure(verdict), latency_figure(verdict), histogram_figure(verdict)))
    lost = "".join(f"<li>{html.escape(str(q))}: {html.escape(', '.join(ids))}</li>"
                   for q, ids in verdict["lost_examples"].items())
    return (f"<section><h2>{html.escape(verdict['history'])}</h2><p>{status}, "
            f"{verdict['duration_s']:.1f} s of history.{drained}</p>{counts_table(verdict)}"
            + (f"<p>Confirmed and lost (first ones):</p><ul>{lost}</ul>" if lost else "")
            + f"{latency_table(verdict)}{faults_table(verdict)}{figures}</section>")


def render(verdicts: list[dict]) -> str:
    title = " vs ".join(html.escape(v["history"]) for v in verdicts)
    columns = "".join(history_column(v) for v in verdicts)
    return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>warren-verify: {title}</title>"
            f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h1>warren-verify</h1><div class=grid style='--n:{len(verdicts)}'>{columns}</div></body></html>")


def write_report(verdicts: list[dict], path: Path) -> None:
    path.write_text(render(verdicts), encoding="utf-8")
