"""The limits of a conversation's saved memory: three exchanges, a summary capped at an eighth of the
model's window, folded on the normal route, kept as it was after a fallback handoff."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.memory import ConversationMemoryStore, capped_summary, fold_heuristically, summary_cap_tokens
from tests.harness import Harness
from workflows.models import MemoryCandidate, RememberInput, estimate_tokens


def exchange(n: int, conversation: str = "c1", size: int = 40) -> MemoryCandidate:
    return MemoryCandidate(conversation_id=conversation, request=f"question {n} " + "q" * size, answer=f"answer {n}")


def test_the_summary_cap_is_an_eighth_of_the_window():
    assert summary_cap_tokens(8000) == 1000
    assert summary_cap_tokens(None) == 1024  # an unknown window: the default one's


def test_a_capped_summary_keeps_its_newest_part_within_the_cap():
    text = " ".join(f"fact{n}" for n in range(2000))
    capped = capped_summary(text, 100)
    assert estimate_tokens(capped) <= 100 and capped.endswith("fact1999") and capped.startswith("… ")
    assert capped_summary("short", 100) == "short"


def test_the_heuristic_fold_is_bounded_whatever_it_folds():
    huge = [exchange(n, size=50_000) for n in range(50)]
    folded = fold_heuristically("earlier: things", huge, 200)
    assert estimate_tokens(folded) <= 200 and "question 49" in folded


class Summarizer:
    def __init__(self, fail: bool = False) -> None:
        self.prompts: list[str] = []
        self.fail = fail

    async def complete(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if self.fail:
            raise RuntimeError("model overloaded")
        return "S" * 100_000  # too long: capped


async def remember_all(activities, count: int, handled_by: str = "primary", start: int = 1):
    env = ActivityEnvironment()
    for n in range(start, start + count):
        await env.run(
            activities.memory_steps.remember,
            RememberInput(request_id=f"r{n}", workflow_id=f"w{n}", candidate=exchange(n), handled_by=handled_by),
        )


def activities_with(tmp_path, memory, summarizer=None, window: int | None = 2048):
    h = Harness(None, tmp_path, memory=memory)  # type: ignore[arg-type]  # only its activities
    h.activities.memory_summarizer = summarizer
    h.activities.memory_context_window = window
    return h.activities


async def test_the_saved_memory_keeps_three_exchanges_and_folds_the_others_into_a_capped_summary(tmp_path):
    memory = ConversationMemoryStore(tmp_path / "m.sqlite3")
    activities = activities_with(tmp_path, memory)
    await remember_all(activities, 6)
    recalled = await memory.recall("c1")
    assert [e.answer for e in recalled.exchanges] == ["answer 4", "answer 5", "answer 6"]
    assert "question 1" in recalled.summary and "question 3" in recalled.summary
    assert "question 4" not in recalled.summary
    assert estimate_tokens(recalled.summary) <= 2048 // 8
    assert len(await memory.recent("c1", 100)) == 3


async def test_a_configured_summarizer_folds_and_its_summary_is_capped(tmp_path):
    memory = ConversationMemoryStore(tmp_path / "m.sqlite3")
    summarizer = Summarizer()
    activities = activities_with(tmp_path, memory, summarizer, window=1024)
    await remember_all(activities, 4)
    assert len(summarizer.prompts) == 1 and "question 1" in summarizer.prompts[0]
    recalled = await memory.recall("c1")
    assert estimate_tokens(recalled.summary) <= 128 and set(recalled.summary) <= {"S", "…", " "}


async def test_after_a_fallback_handoff_the_previous_summary_and_latest_three_are_kept_unsummarized(tmp_path):
    memory = ConversationMemoryStore(tmp_path / "m.sqlite3")
    summarizer = Summarizer()
    activities = activities_with(tmp_path, memory, summarizer)
    await remember_all(activities, 4)  # the summary now covers exchange 1
    before = (await memory.recall("c1")).summary
    summarizer.prompts.clear()
    await remember_all(activities, 2, handled_by="fallback", start=5)
    recalled = await memory.recall("c1")
    assert summarizer.prompts == []  # no model was asked
    assert recalled.summary == before  # exchanges 2 and 3 were dropped, not folded
    assert [e.answer for e in recalled.exchanges] == ["answer 4", "answer 5", "answer 6"]


async def test_a_failing_summarizer_keeps_the_limits_and_is_a_memory_error(tmp_path):
    memory = ConversationMemoryStore(tmp_path / "m.sqlite3")
    activities = activities_with(tmp_path, memory, Summarizer(fail=True))
    await remember_all(activities, 3)
    with pytest.raises(ApplicationError) as failed:
        await remember_all(activities, 1, start=4)
    assert failed.value.type == "MemoryError" and failed.value.non_retryable
    recalled = await memory.recall("c1")
    assert len(recalled.exchanges) == 3 and "question 1" in recalled.summary  # folded by the heuristic
