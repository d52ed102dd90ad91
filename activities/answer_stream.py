"""Streaming synthesis: the answer's text, delivered to clients while the model writes it.

The channel is the request workflow's own durable stream (``temporalio.contrib.workflow_streams``): the
``synthesize`` activity publishes the model's text chunks to the ``answer`` topic with signals, batched
every ``ANSWER_BATCH_INTERVAL`` so history grows with batches, not tokens; clients read them with
long-polling updates from any offset, and after the request has ended with queries. The workflow itself
publishes the final answer — after the after_synthesis hooks — as the topic's last item
(``AnswerChunk.final``).

What was streamed cannot be taken back: after_synthesis still rewrites the stored and returned answer,
but the chunks a client already read are the model's draft. A pipeline whose protection rewrites the
answer turns streaming off (``StageSettings.answer_streaming``), and a synthesizer that cannot stream
publishes nothing but the final answer.

A retried synthesis streams again from its start: every chunk carries the activity attempt that wrote it,
so a reader drops what an earlier attempt sent when a later attempt's first chunk arrives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any, Protocol, cast

from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from workflows.models import ANSWER_TOPIC, AnswerChunk, SynthesizeInput, SynthesizeOutput

# How often buffered chunks go to the workflow: one signal (one history event) per batch.
ANSWER_BATCH_INTERVAL = timedelta(milliseconds=250)


class StreamedAnswer(Protocol):
    """What a streaming synthesizer returns: text chunks to iterate, then ``output``."""

    output: SynthesizeOutput | None

    def __aiter__(self) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


def streaming_synthesizer(synthesizer: Any) -> Callable[[SynthesizeInput], StreamedAnswer] | None:
    """The synthesizer's ``synthesize_stream`` method, when it has one."""
    stream = getattr(synthesizer, "synthesize_stream", None)
    return cast("Callable[[SynthesizeInput], StreamedAnswer]", stream) if callable(stream) else None


async def publish_answer(stream: Callable[[SynthesizeInput], StreamedAnswer], input: SynthesizeInput) -> Any:
    """Run a streamed synthesis, publishing each chunk to the calling workflow's ``answer`` topic; the
    synthesizer's output once the model has finished (published chunks are flushed before it returns)."""
    attempt = activity.info().attempt
    async with WorkflowStreamClient.from_within_activity(batch_interval=ANSWER_BATCH_INTERVAL) as channel:
        topic = channel.topic(ANSWER_TOPIC, type=AnswerChunk)
        answer = stream(input)
        try:
            async for text in answer:
                topic.publish(AnswerChunk(attempt=attempt, text=text))
        finally:
            await answer.aclose()
    return answer.output
