"""Policy replay: a candidate pipeline's decision stages run in shadow against recorded requests
(:class:`ShadowEvaluator`), the activities the ``PolicyReplay`` workflow fans batches out to
(:class:`PolicyReplayActivities`), and the report they produce (JSON and one HTML page)."""

from .activities import PolicyReplayActivities
from .report import build_report, matched, parse_kinds, summary_lines, to_html, to_json
from .shadow import ShadowEvaluator
from .stages import ShadowStages, calls_out

__all__ = [
    "PolicyReplayActivities",
    "ShadowEvaluator",
    "ShadowStages",
    "build_report",
    "calls_out",
    "matched",
    "parse_kinds",
    "summary_lines",
    "to_html",
    "to_json",
]
