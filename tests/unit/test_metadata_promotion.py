"""Guards metadata auto-promotion: request metadata ``rag_context``, ``conversation_history`` and
``conversation_turns`` become planning enrichments before any hook runs.

A ``conversation_history`` text wins over ``conversation_turns``; turns become ``role: content`` lines,
the most recent ones only, and malformed turns are left out.
"""

from __future__ import annotations

import pytest

from workflows.support import MAX_CONVERSATION_TURNS, promote_metadata


@pytest.mark.parametrize(
    "metadata,promoted",
    [
        pytest.param({}, {}, id="no metadata promotes nothing"),
        pytest.param({"desk": "a", "locale": "fr"}, {}, id="other keys are not promoted"),
        pytest.param(
            {"rag_context": "ACME reports Thursday."}, {"rag_context": "ACME reports Thursday."}, id="rag_context text"
        ),
        pytest.param({"rag_context": "   "}, {}, id="blank rag_context is dropped"),
        pytest.param({"rag_context": ["a", "b"]}, {}, id="rag_context that is not text is dropped"),
        pytest.param(
            {"conversation_history": "user: hi\nassistant: hello"},
            {"conversation_history": "user: hi\nassistant: hello"},
            id="conversation_history text",
        ),
        pytest.param({"conversation_history": "\n "}, {}, id="blank conversation_history is dropped"),
        pytest.param(
            {"conversation_turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"conversation_history": "user: hi\nassistant: hello"},
            id="turns become role-prefixed lines",
        ),
        pytest.param(
            {"conversation_turns": [{"content": "hi"}]},
            {"conversation_history": "user: hi"},
            id="a turn without a role is the user's",
        ),
        pytest.param({"conversation_turns": []}, {}, id="no turns promote nothing"),
        pytest.param({"conversation_turns": "user: hi"}, {}, id="turns that are not a list are ignored"),
        pytest.param(
            {"rag_context": "facts", "conversation_turns": [{"role": "user", "content": "hi"}]},
            {"rag_context": "facts", "conversation_history": "user: hi"},
            id="rag_context and turns together",
        ),
    ],
)
def test_metadata_is_promoted_into_enrichments(metadata, promoted):
    assert promote_metadata(metadata) == promoted


@pytest.mark.parametrize(
    "malformed",
    [
        pytest.param("user: hi", id="a string"),
        pytest.param(["user", "hi"], id="a list"),
        pytest.param(None, id="null"),
        pytest.param({"role": "user"}, id="a turn without content"),
        pytest.param({"role": "user", "content": 42}, id="content that is not text"),
        pytest.param({"role": "user", "content": {"text": "hi"}}, id="content that is an object"),
    ],
)
def test_malformed_turns_are_left_out_and_the_others_kept(malformed):
    turns = [{"role": "user", "content": "hi"}, malformed, {"role": "assistant", "content": "hello"}]

    assert promote_metadata({"conversation_turns": turns}) == {"conversation_history": "user: hi\nassistant: hello"}


def test_a_turn_with_a_null_role_never_reaches_the_prompt_as_python_none():
    """A client that serialises a missing role as ``null`` must not put ``None: hi`` before the planner."""
    promoted = promote_metadata({"conversation_turns": [{"role": None, "content": "hi"}]})

    assert "None" not in promoted.get("conversation_history", "")


def test_turns_that_are_all_malformed_promote_nothing():
    assert promote_metadata({"conversation_turns": [None, "hi", {"role": "user"}]}) == {}


def test_only_the_most_recent_turns_are_promoted():
    turns = [{"role": "user", "content": f"message {n}"} for n in range(1, MAX_CONVERSATION_TURNS + 6)]

    lines = promote_metadata({"conversation_turns": turns})["conversation_history"].splitlines()

    assert len(lines) == MAX_CONVERSATION_TURNS
    assert lines[0] == "user: message 6"
    assert lines[-1] == f"user: message {MAX_CONVERSATION_TURNS + 5}"


def test_conversation_history_text_wins_over_conversation_turns():
    metadata = {"conversation_history": "the summary", "conversation_turns": [{"role": "user", "content": "raw turn"}]}

    assert promote_metadata(metadata) == {"conversation_history": "the summary"}


@pytest.mark.parametrize("history", ["", "   ", 7, None], ids=["empty", "blank", "a number", "null"])
def test_turns_are_used_when_conversation_history_is_not_usable_text(history):
    metadata = {"conversation_history": history, "conversation_turns": [{"role": "user", "content": "raw turn"}]}

    assert promote_metadata(metadata) == {"conversation_history": "user: raw turn"}


def test_promotion_leaves_the_request_metadata_unchanged():
    metadata = {"rag_context": "facts", "conversation_turns": [{"role": "user", "content": "hi"}]}
    before = {**metadata, "conversation_turns": [dict(t) for t in metadata["conversation_turns"]]}

    promote_metadata(metadata)

    assert metadata == before
