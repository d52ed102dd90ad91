"""The replay report: every replayed request's findings, counted by kind and grouped by hook, tool and
tenant, as JSON for machines and one self-contained HTML page (no script, no external asset) for people."""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from workflows.models import DECISION_CHANGES, FindingKind, RequestReplay

KINDS = [k.value for k in FindingKind]


def parse_kinds(text: str) -> list[FindingKind]:
    """``"newly_blocked,hook_failed"`` → kinds; an unknown name raises ``ValueError`` naming the known ones."""
    kinds = []
    for name in (part.strip() for part in text.split(",")):
        if not name:
            continue
        try:
            kinds.append(FindingKind(name))
        except ValueError:
            raise ValueError(f"unknown finding {name!r}; one of {', '.join(KINDS)}") from None
    return kinds


def build_report(
    requests: Iterable[RequestReplay], *, replay_id: str, pipeline: str, window: dict[str, Any], total: int
) -> dict[str, Any]:
    """The report as a JSON object: totals, counts by kind and by hook/tool/tenant, and each request that
    has a finding (requests on which the candidate agrees are counted, not listed)."""
    by_kind: Counter[str] = Counter()
    groups: dict[str, dict[str, Counter[str]]] = {"hook": defaultdict(Counter), "tool": defaultdict(Counter)}
    groups["tenant"] = defaultdict(Counter)
    listed, replayed = [], 0
    for request in requests:
        replayed += 1
        if not request.findings:
            continue
        listed.append(request)
        for kind in {f.kind.value for f in request.findings}:
            groups["tenant"][request.tenant or "-"][kind] += 1
        for finding in request.findings:
            by_kind[finding.kind.value] += 1
            if finding.hook:
                groups["hook"][finding.hook][finding.kind.value] += 1
            if finding.tool:
                groups["tool"][finding.tool][finding.kind.value] += 1
    listed.sort(key=lambda r: (r.started_at, r.request_id))
    requests_by_kind: Counter[str] = Counter(k.value for r in listed for k in r.kinds())
    return {
        "replay_id": replay_id,
        "pipeline": pipeline,
        "window": window,
        "generated_at": datetime.now(UTC).isoformat(),
        "totals": {
            "records": total,
            "replayed": replayed,
            "with_findings": len(listed),
            "with_decision_changes": sum(1 for r in listed if r.kinds() & set(DECISION_CHANGES)),
        },
        "findings": {k: by_kind[k] for k in KINDS if by_kind[k]},
        "requests_by_finding": {k: requests_by_kind[k] for k in KINDS if requests_by_kind[k]},
        "by_hook": _plain(groups["hook"]),
        "by_tool": _plain(groups["tool"]),
        "by_tenant": _plain(groups["tenant"]),
        "requests": [r.model_dump(mode="json", exclude_none=True) for r in listed],
    }


def _plain(group: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
    return {name: dict(sorted(counts.items())) for name, counts in sorted(group.items())}


def matched(report: dict[str, Any], kinds: Iterable[FindingKind]) -> list[str]:
    """The kinds of ``kinds`` the report found at least once (what ``--fail-on`` fails on)."""
    return [k.value for k in kinds if report["findings"].get(k.value)]


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False) + "\n"


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The console summary: totals, then each kind with how many requests it touches."""
    totals = report["totals"]
    lines = [
        f"replayed {totals['replayed']} of {totals['records']} records with {report['pipeline']}: "
        f"{totals['with_decision_changes']} would be decided differently, {totals['with_findings']} have findings"
    ]
    for kind, count in report["requests_by_finding"].items():
        lines.append(f"  {kind:<28} {count} request(s)")
    return lines


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem;color:#1d2330}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccd;padding:.25rem .6rem;text-align:left;
vertical-align:top}th{background:#f1f3f8}.k{font-family:monospace;white-space:nowrap}
.newly_blocked,.required_gate_now_rejects,.hook_failed{color:#a3161a;font-weight:600}
.newly_allowed{color:#8a5a00;font-weight:600}.not_replayed,.depends_on_unrecorded{color:#555}
pre{margin:0;white-space:pre-wrap;font-size:12px}details{margin:.4rem 0}
"""


def to_html(report: dict[str, Any]) -> str:
    """One page: totals, the three groupings, then every request with its findings side by side."""
    e = html.escape
    totals = report["totals"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Policy replay {e(report['replay_id'])}</title><style>{_CSS}</style></head><body>",
        f"<h1>Policy replay of <span class='k'>{e(report['pipeline'])}</span></h1>",
        f"<p>Replay <span class='k'>{e(report['replay_id'])}</span>, window "
        f"<span class='k'>{e(json.dumps(report['window']))}</span>: {totals['replayed']} of {totals['records']} "
        f"records replayed; <b>{totals['with_decision_changes']}</b> would be decided differently; "
        f"{totals['with_findings']} have findings.</p>",
        "<h2>Requests by finding</h2><table><tr><th>finding</th><th>requests</th><th>findings</th></tr>",
    ]
    for kind, count in report["requests_by_finding"].items():
        parts.append(f"<tr><td class='k {kind}'>{kind}</td><td>{count}</td><td>{report['findings'][kind]}</td></tr>")
    parts.append("</table>")
    for title, key in (("By hook", "by_hook"), ("By tool", "by_tool"), ("By tenant", "by_tenant")):
        group = report[key]
        if not group:
            continue
        kinds = [k for k in KINDS if any(k in counts for counts in group.values())]
        parts.append(f"<h2>{title}</h2><table><tr><th></th>")
        parts += [f"<th class='k {k}'>{k}</th>" for k in kinds]
        parts.append("</tr>")
        for name, counts in group.items():
            cells = "".join(f"<td>{counts.get(k, '')}</td>" for k in kinds)
            parts.append(f"<tr><td class='k'>{e(name)}</td>{cells}</tr>")
        parts.append("</table>")
    parts.append("<h2>Requests</h2>")
    for request in report["requests"]:
        kinds = sorted({f["kind"] for f in request["findings"]})
        label = ", ".join(f"<span class='{k}'>{k}</span>" for k in kinds)
        parts.append(
            f"<details><summary><span class='k'>{e(request['request_id'])}</span> · tenant "
            f"{e(str(request.get('tenant') or '-'))} · {e(request['started_at'])} · {label}</summary>"
            "<table><tr><th>finding</th><th>stage</th><th>hook</th><th>call</th><th>recorded</th><th>candidate</th>"
            "<th>detail</th></tr>"
        )
        for f in request["findings"]:
            call = f"{f.get('step_id', '')} {f.get('tool', '')}".strip()
            detail = e(f.get("detail", ""))
            for side in ("recorded_arguments", "candidate_arguments"):
                if side in f:
                    detail += f"<pre>{side.split('_')[0]}: {e(json.dumps(f[side], sort_keys=True))}</pre>"
            parts.append(
                f"<tr><td class='k {f['kind']}'>{f['kind']}</td><td class='k'>{e(str(f.get('stage', '')))}</td>"
                f"<td class='k'>{e(str(f.get('hook', '')))}</td><td class='k'>{e(call)}</td>"
                f"<td>{e(f.get('recorded', ''))}</td><td>{e(f.get('candidate', ''))}</td><td>{detail}</td></tr>"
            )
        parts.append("</table></details>")
    parts.append("</body></html>\n")
    return "".join(parts)
