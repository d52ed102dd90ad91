"""One canonical name for a tool wherever a reader meets it: its key ``namespace/agent/capability``. The
record keeps ``agent/capability`` (what hook matchers match, and what committed histories hold); the CLI
shows the key it stands for."""

from __future__ import annotations

from datetime import UTC, datetime

from client.cli import format_checkpoint, format_record, tool_keys
from hooks import allow_list
from workflows.models import (
    AcceptedPlan,
    ApprovalCall,
    ApprovalReason,
    Checkpoint,
    ExecutionRecord,
    Plan,
    PlanStep,
    StepResult,
    StepStatus,
    ToolCall,
    ToolMetrics,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PLAN = Plan(
    steps=[
        PlanStep(step_id="s1", namespace="notes", agent="notes-service", capability="read_note"),
        PlanStep(step_id="s2", namespace="mail", agent="mailer", capability="send", arguments={"to": "a"}),
    ]
)


def test_a_step_is_named_by_its_key_from_the_plan():
    name = tool_keys([PLAN])
    assert name("s1", "notes-service/read_note") == "notes/notes-service/read_note"
    assert name("", "mailer/send") == "mail/mailer/send"  # by the short name, where one key has it
    assert name("s9", "other/tool") == "other/tool"  # nothing to say otherwise: the name as recorded


def test_two_namespaces_with_one_short_name_are_never_guessed_between():
    plan = Plan(
        steps=[
            PlanStep(step_id="a", namespace="n1", agent="svc", capability="do"),
            PlanStep(step_id="b", namespace="n2", agent="svc", capability="do"),
        ]
    )
    name = tool_keys([plan])
    assert (name("a", "svc/do"), name("b", "svc/do"), name("", "svc/do")) == ("n1/svc/do", "n2/svc/do", "svc/do")


def test_the_record_and_the_checkpoint_show_tool_keys():
    record = ExecutionRecord(
        request_id="r1",
        workflow_id="request-r1",
        run_id="run",
        request="send my note",
        started_at=NOW,
        plans=[AcceptedPlan(phase=1, plan=PLAN, accepted_at=NOW)],
        steps=[
            StepResult(step_id="s1", tool="notes-service/read_note", status=StepStatus.SUCCEEDED, result="milk"),
            StepResult(step_id="s2", tool="mailer/send", status=StepStatus.SKIPPED, skip_reason="policy"),
        ],
        tool_metrics={"notes-service/read_note": ToolMetrics(calls=1)},
    )
    text = format_record(record)
    assert "phase 1: s1=notes/notes-service/read_note, s2=mail/mailer/send" in text
    assert "  s1             notes/notes-service/read_note" in text
    assert "  notes/notes-service/read_note            calls 1" in text
    checkpoint = Checkpoint(
        checkpoint_id="c1",
        phase=1,
        plan=PLAN,
        reasons=[ApprovalReason(step_id="s2", tool="mailer/send", reason="approval_required")],
        calls=[ApprovalCall(step_id="s2", tool="mailer/send", arguments={"to": "a"})],
        requested_at=NOW,
        expires_at=NOW,
    )
    shown = format_checkpoint("request-r1", checkpoint)
    assert "s2 (mail/mailer/send): approval_required" in shown
    assert 's2: mail/mailer/send {"to": "a"}' in shown
    assert "s1: notes/notes-service/read_note {}" in shown


def test_the_allow_list_takes_either_name_and_its_denial_names_the_key():
    call = ToolCall(step_id="s2", namespace="mail", agent="mailer", capability="send")
    hook = allow_list(["notes/notes-service/read_note", "other/thing"])
    decision = hook.before_tool(None, call)  # type: ignore[arg-type]
    assert decision is not None and decision.message == "The tool mail/mailer/send is not available in this deployment."
    assert allow_list(["mailer/send"]).before_tool(None, call) is None  # type: ignore[arg-type]
    assert allow_list(["mail/mailer/send"]).before_tool(None, call) is None  # type: ignore[arg-type]
