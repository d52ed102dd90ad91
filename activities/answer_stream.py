"""Streaming the answer: its text, delivered to clients while the model writes it.

The channel is the request workflow's own durable stream (``temporalio.contrib.workflow_streams``): the
activity whose model call writes the answer — a planning turn that answers in text, or a synthesis —
publishes the model's text chunks to the ``answer`` topic with signals, batched every
``ANSWER_BATCH_INTERVAL`` so history grows with batches, not tokens; clients read them with long-polling
updates from any offset, and after the request has ended with queries. The workflow itself publishes the
final answer — after the after_synthesis and after_answer hooks — as the topic's last item
(``AnswerChunk.final``).

A planning turn cannot know that it writes the answer until it ends: a model may write a few words and
then call tools. Its text is streamed as it arrives all the same, and a turn that called tools after
writing text is followed by a ``retracted`` chunk: what it wrote was a preamble, not the answer.

What was streamed cannot be taken back: after_synthesis still rewrites the stored and returned answer,
but the chunks a client already read are the model's draft. A pipeline whose protection rewrites the
answer turns streaming off (``StageSettings.answer_streaming``), and a planner or synthesizer that cannot
stream publishes nothing but the final answer.

A retried activity streams again from its start: every chunk carries the activity and the attempt that
wrote it, so a reader starts the text over when a chunk of another activity or attempt arrives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Protocol, cast

from temporalio import activity
from temporalio.contrib.workflow_streams import TopicHandle, WorkflowStreamClient

from workflows.models import ANSWER_TOPIC, AnswerChunk, Plan, SynthesizeInput, SynthesizeOutput

from .planning import AnswerWriter, PlanningRequest

# How often buffered chunks go to the workflow: one signal (one history event) per batch.
ANSWER_BATCH_INTERVAL = timedelta(milliseconds=250)


class StreamedAnswer(Protocol):
    """What a streaming synthesizer returns: text chunks to iterate, then ``output``."""

    output: SynthesizeOutput | None

    def __aiter__(self) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


class AnswerPublisher:
    """An :class:`~activities.planning.AnswerWriter` on the calling workflow's answer topic: each chunk
    names this activity and its attempt."""

    def __init__(self, topic: TopicHandle[AnswerChunk]) -> None:
        info = activity.info()
        self._topic = topic
        self._writer = {"attempt": info.attempt, "activity": f"{info.activity_type}#{info.activity_id}"}
        self.standing = False  # text was written since the last retraction

    def write(self, text: str) -> None:
        self._topic.publish(AnswerChunk(text=text, **self._writer))
        self.standing = True

    def retract(self) -> None:
        if self.standing:
            self._topic.publish(AnswerChunk(text="", retracted=True, **self._writer))
            self.standing = False


@asynccontextmanager
async def answer_topic() -> AsyncIterator[AnswerPublisher]:
    """A publisher on the calling workflow's answer topic; what it published is flushed on exit."""
    async with WorkflowStreamClient.from_within_activity(batch_interval=ANSWER_BATCH_INTERVAL) as channel:
        yield AnswerPublisher(channel.topic(ANSWER_TOPIC, type=AnswerChunk))


def streaming_synthesizer(synthesizer: Any) -> Callable[[SynthesizeInput], StreamedAnswer] | None:
    """The synthesizer's ``synthesize_stream`` method, when it has one."""
    stream = getattr(synthesizer, "synthesize_stream", None)
    return cast("Callable[[SynthesizeInput], StreamedAnswer]", stream) if callable(stream) else None


async def publish_answer(stream: Callable[[SynthesizeInput], StreamedAnswer], input: SynthesizeInput) -> Any:
    """Run a streamed synthesis, publishing each chunk to the calling workflow's ``answer`` topic; the
    synthesizer's output once the model has finished (published chunks are flushed before it returns)."""
    async with answer_topic() as writer:
        answer = stream(input)
        try:
            async for text in answer:
                writer.write(text)
        finally:
            await answer.aclose()
    return answer.output


def streaming_planner(planner: Any) -> Callable[[PlanningRequest, AnswerWriter], Awaitable[Any]] | None:
    """The planner's ``plan`` with an answer writer, when the planner streams (``streams_answer``)."""
    if not getattr(planner, "streams_answer", False):
        return None
    plan = planner.plan
    return lambda request, writer: plan(request, answer=writer)


async def publish_plan(
    plan: Callable[[PlanningRequest, AnswerWriter], Awaitable[Any]], request: PlanningRequest
) -> Any:
    """Run a streamed planning turn, publishing the model's text to the calling workflow's ``answer``
    topic; the plan once the model has finished. Text left standing by a plan that is not a text answer
    (it has steps, or no answer), or by a planner that failed, is retracted before the activity ends."""
    async with answer_topic() as writer:
        try:
            result = await plan(request, writer)
        except Exception:
            writer.retract()
            raise
        if not (isinstance(result, Plan) and result.answer and not result.steps):
            writer.retract()
    return result
