"""The replay report on its own: counts and groupings, --fail-on, the window's parsing, and an HTML page
that shows what hooks wrote as text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from activities.policy_replay.report import build_report, matched, parse_kinds, summary_lines, to_html
from client.replay import parse_since, parse_time, progress_line
from workflows.models import FindingKind, ReplayFinding, ReplayProgress, RequestReplay, Stage

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def _request(request_id: str, tenant: str, *findings: ReplayFinding) -> RequestReplay:
    return RequestReplay(
        request_id=request_id,
        workflow_id=f"request-{request_id}",
        run_id="run",
        tenant=tenant,
        started_at=NOW,
        status="succeeded",
        findings=list(findings),
    )


def _blocked(hook: str = "allow-list", detail: str = "") -> ReplayFinding:
    return ReplayFinding(
        kind=FindingKind.NEWLY_BLOCKED,
        stage=Stage.BEFORE_TOOL,
        hook=hook,
        tool="stock-service/stock_quote",
        detail=detail,
    )


def test_findings_are_counted_by_kind_and_grouped_by_hook_tool_and_tenant() -> None:
    requests = [
        _request("a", "t1", _blocked(), _blocked()),
        _request("b", "t2", _blocked(), ReplayFinding(kind=FindingKind.NOT_REPLAYED, hook="remote")),
        _request("c", "t1"),
    ]
    report = build_report(requests, replay_id="r", pipeline="m:f", window={}, total=3)
    assert report["totals"] == {"records": 3, "replayed": 3, "with_findings": 2, "with_decision_changes": 2}
    assert report["findings"] == {"newly_blocked": 3, "not_replayed": 1}
    assert report["requests_by_finding"] == {"newly_blocked": 2, "not_replayed": 1}
    assert report["by_hook"] == {"allow-list": {"newly_blocked": 3}, "remote": {"not_replayed": 1}}
    assert report["by_tool"] == {"stock-service/stock_quote": {"newly_blocked": 3}}
    assert report["by_tenant"] == {"t1": {"newly_blocked": 1}, "t2": {"newly_blocked": 1, "not_replayed": 1}}
    assert [r["request_id"] for r in report["requests"]] == ["a", "b"]  # agreeing requests are counted only
    assert matched(report, parse_kinds("newly_allowed,newly_blocked")) == ["newly_blocked"]
    assert matched(report, parse_kinds("hook_failed")) == []
    assert summary_lines(report)[0].startswith("replayed 3 of 3 records with m:f: 2 would be decided differently")


def test_an_unknown_finding_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown finding 'newly_blockd'"):
        parse_kinds("newly_blockd")


def test_the_html_page_is_self_contained_and_shows_hook_text_as_text() -> None:
    report = build_report(
        [_request("a", "t1", _blocked(hook="<b>x</b>", detail="<script>alert(1)</script>"))],
        replay_id="r",
        pipeline="m:f",
        window={},
        total=1,
    )
    page = to_html(report)
    assert "<script" not in page and "&lt;script&gt;" in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "http" not in page  # nothing loaded from elsewhere


def test_the_window_and_the_progress_line() -> None:
    assert parse_since("7d", NOW) == NOW - timedelta(days=7)
    assert parse_since("12h", NOW) == NOW - timedelta(hours=12)
    assert parse_time("2026-11-23T00:00:00") == datetime(2026, 11, 23, tzinfo=UTC)
    with pytest.raises(ValueError, match="duration"):
        parse_since("last week")
    line = progress_line(ReplayProgress(replay_id="r", total=200, replayed=50, changed=3), width=8)
    assert line == "[##......] 50/200 records · 3 with findings"
    assert progress_line(ReplayProgress(replay_id="r")) == "listing records…"
