"""What the workflow and the client show operators: bounded, one line, secrets masked, and unable to
form a link, an image or an HTML tag in the UI's markdown."""

from __future__ import annotations

from workflows import story

SECRET = "ghp_" + "a" * 36


def test_a_summary_is_one_masked_line_of_bounded_length():
    summary = story.request_summary(f"look up\n\nthe token {SECRET}\tplease " + "x" * 500)
    assert summary.startswith("request: look up the token [REDACTED] please x")
    assert SECRET not in summary and "\n" not in summary and "\t" not in summary
    assert summary.endswith("…") and len(summary) <= len("request: ") + story.SUMMARY_CHARS + 1


def test_a_summary_stays_within_what_the_server_accepts_in_bytes():
    summary = story.request_summary("€" * 1000)
    assert len(summary.encode()) <= story.MAX_SUMMARY_BYTES


def test_an_excerpt_cannot_form_a_link_an_image_or_a_tag():
    shown = story.excerpt('see ![pixel](http://tracker.example/p.png) and [here](http://x.example) <img src="y">')
    assert "](" not in shown and "<" not in shown and ">" not in shown
    assert "![pixel] (http://tracker.example/p.png)" in shown


def test_current_details_say_what_was_asked_the_stage_and_the_outcome():
    running = story.current_details("Buy 10 ACME", stage="after_planning")
    assert running == "**asked:** Buy 10 ACME\n\n**stage:** after_planning"
    ended = story.current_details(
        "Buy 10 ACME",
        stage="failed",
        outcome=story.failure_headline("RequiredAfterPlanningError", "the plan was refused"),
    )
    assert ended.endswith("**outcome:** RequiredAfterPlanningError: the plan was refused")


def test_request_details_name_the_request_id_and_a_longer_excerpt():
    details = story.request_details("What is the price of ACME? " * 30, "r-1")
    assert details.startswith("**request id:** r-1\n\n**asked:** What is the price of ACME?")
    assert len(details) < 500


CARD = "4111 1111 1111 1111"


def _checkpoint():
    from datetime import UTC, datetime

    from workflows.models import ApprovalCall, ApprovalReason, Checkpoint, Plan

    now = datetime(2027, 1, 1, tzinfo=UTC)
    return Checkpoint(
        checkpoint_id="cp-1",
        phase=1,
        plan=Plan(steps=[]),
        reasons=[ApprovalReason(step_id="pay", tool="bank/pay", reason=f"charges card {CARD}")],
        calls=[ApprovalCall(step_id="pay", tool="bank/pay", arguments={"card": CARD, "note": "zqmarker"})],
        requested_at=now,
        expires_at=now,
        status="approved",
        reviewer="alice",
        comment=f"ok for {CARD}",
    )


def test_without_text_what_the_ui_shows_names_tools_steps_hooks_and_reviewers_and_nothing_asked():
    checkpoint = _checkpoint()
    fields = [
        story.request_summary(f"pay {CARD}", "r-1", with_text=False),
        story.request_details(f"pay {CARD}", "r-1", with_text=False),
        story.subagent_summary("bank/pay", "pay", 1, f"pay {CARD}", with_text=False),
        story.subagent_details("request-r-1", "r-1", f"pay {CARD}", with_text=False),
        story.checkpoint_timer_summary(checkpoint, ["alice"], {"pay": "payment-guard"}, with_text=False),
        *story.checkpoint_lines(checkpoint, "request-r-1", ["alice"], {"pay": "payment-guard"}, with_text=False),
        *story.reviewed_lines([checkpoint], with_text=False),
        story.decision_mark("denied", "before_tool", "payment-guard", f"card {CARD} blocked", "pay", with_text=False),
        story.current_details(
            f"pay {CARD}",
            stage="completed",
            outcome=story.failure_outcome("Refused", CARD, with_text=False),
            with_text=False,
        ),
    ]
    for field in fields:
        assert "zqmarker" not in field and "4111" not in field, field
    timer = fields[4]
    assert timer == (
        "awaiting review · cp-1 until expiry: approve bank/pay (pay) — required by hook payment-guard · reviewers: alice"
    )
    assert fields[0] == "request · r-1" and "by alice" in fields[-3] and fields[-2].endswith("payment-guard · pay")
    assert "**outcome:** Refused" in fields[-1]
    # With text (a deployment without encryption, or one that allows it): masked excerpts, as before.
    with_text = story.checkpoint_timer_summary(checkpoint, ["alice"], {"pay": "payment-guard"})
    assert "zqmarker" in with_text and CARD not in with_text and "[REDACTED]" in with_text


def test_what_the_ui_shows_is_built_shown_so_the_encrypting_codec_leaves_it_readable():
    from workflows.converter import Shown

    assert isinstance(story.request_summary("x", "r"), Shown)
    assert isinstance(story.checkpoint_timer_summary(_checkpoint(), [], {}), Shown)
    assert isinstance(story.current_details("x", stage="planning"), Shown)
    assert isinstance(story.decision_mark("denied", "before_tool", "h", "why"), Shown)
