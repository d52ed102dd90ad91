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
