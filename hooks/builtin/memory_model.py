"""What the memory hooks share: entity extraction, how they report a provider call, the prompt format they
send a :class:`MemoryModel`, and a deterministic rule-based model so a pipeline runs (and the demo shows
memory) without an LLM.

Every memory prompt has the same shape — a ``<task>`` line, instructions, and the data as JSON inside
``<input>…</input>`` — and every answer is JSON. A real model reads the instructions; the heuristic model
reads the task and the JSON. Hooks parse the answer themselves and fall back to heuristics when it is
unusable, so a model can never break a request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from workflows.models import EffectStatus

from ..contracts import PipelineContext
from ..memory import ReadResult, WriteResult

_SYMBOL = re.compile(r"\b[A-Z][A-Z0-9]{1,5}\b")
_NOT_ENTITIES = {"USD", "EUR", "GBP", "OK", "AM", "PM", "CEO", "API", "FAQ", "JSON", "ID", "I", "A"}
_TASK = re.compile(r"<task>(.*?)</task>", re.DOTALL)
_INPUT = re.compile(r"<input>\s*(.*?)\s*</input>", re.DOTALL)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def extract_entities(text: str, *, limit: int = 8) -> list[str]:
    """The default entity extractor: ticker-like symbols (``ACME``, ``MSFT``), in order of appearance."""
    found = [m for m in _SYMBOL.findall(text or "") if m not in _NOT_ENTITIES]
    return list(dict.fromkeys(found))[:limit]


def report_call(
    ctx: PipelineContext,
    effect_id: str,
    result: ReadResult[Any] | WriteResult,
    *,
    name: str,
    data: dict[str, Any],
    summary: str = "",
) -> None:
    """Report a memory provider's call as the effect ``effect_id``: succeeded or failed as the provider said,
    with its error."""
    ctx.report_effect(
        effect_id,
        name=name,
        status=EffectStatus.SUCCEEDED if result.ok else EffectStatus.FAILED,
        data=data,
        error=result.error,
        summary=summary,
    )


def model_prompt(task: str, instructions: str, data: dict[str, Any]) -> str:
    """A memory prompt: the task, what to do, and the data as JSON."""
    payload = json.dumps(data, ensure_ascii=False, sort_keys=True)
    return f"<task>{task}</task>\n{instructions.strip()}\n<input>\n{payload}\n</input>\nAnswer with JSON only."


def parse_json_answer(text: str) -> Any:
    """The JSON a model answered (the first ``{...}`` block if it wrapped it in prose); raises ValueError."""
    text = (text or "").strip()
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise ValueError("the model's answer holds no JSON object") from None
        return json.loads(text[start : end + 1])


def readable_result(result: str | None, *, limit: int = 200) -> str:
    """A tool result as a short line: a JSON object becomes ``key=value`` pairs."""
    text = result or ""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in sorted(value.items()) if not isinstance(v, (dict, list)))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class HeuristicMemoryModel:
    """A deterministic :class:`~hooks.memory.MemoryModel`: rules instead of a language model.

    ``summarize_events``: one line per event from its tool, outcome and result. ``extract_knowledge``: the
    answer's sentences that name an entity, at most ``max_fragments``. ``extract_user_facts``: first-person
    statements (``my name is …``, ``I live in …``, ``I prefer …``).
    """

    name = "heuristic-memory-model/1"

    _FACTS = (
        ("name", re.compile(r"\bmy name is ([A-Z][\w'\-]{0,40})", re.IGNORECASE)),
        ("name", re.compile(r"\bcall me ([A-Z][\w'\-]{0,40})", re.IGNORECASE)),
        ("home_city", re.compile(r"\bI live in ([A-Z][\w'\- ]{0,40}?)(?:[.,!?]|$)", re.IGNORECASE)),
        ("preference", re.compile(r"\bI (?:prefer|like) ([^.!?]{1,80})", re.IGNORECASE)),
    )

    async def complete(self, prompt: str) -> str:
        task = _TASK.search(prompt)
        data = _INPUT.search(prompt)
        if task is None or data is None:
            return "{}"
        payload = json.loads(data.group(1))
        handler = getattr(self, f"_{task.group(1).strip()}", None)
        return json.dumps(handler(payload) if handler else {}, ensure_ascii=False)

    @staticmethod
    def _summarize_events(data: dict[str, Any]) -> dict[str, Any]:
        summaries = []
        for event in data.get("events", []):
            detail = readable_result(event.get("result"), limit=160) or f"{event.get('tool')} {event.get('outcome')}"
            summaries.append({"step_id": event.get("step_id"), "summary": detail})
        return {"summaries": summaries}

    @staticmethod
    def _extract_knowledge(data: dict[str, Any]) -> dict[str, Any]:
        fragments = []
        lines = [line.strip().lstrip("-* ").strip() for line in data.get("response", "").splitlines()]
        for sentence in (s for line in lines for s in _SENTENCE.split(line)):
            sentence = " ".join(sentence.split())
            entities = extract_entities(sentence)
            if entities and len(sentence) > 12:
                fragments.append({"title": f"{entities[0]}: {sentence[:60]}", "text": sentence, "entities": entities})
        return {"fragments": fragments[: int(data.get("max_fragments", 3))]}

    def _extract_user_facts(self, data: dict[str, Any]) -> dict[str, Any]:
        facts = {}
        for key, pattern in self._FACTS:
            match = pattern.search(data.get("request", ""))
            if match and key not in facts:
                facts[key] = match.group(1).strip()
        return {"facts": [{"key": k, "value": v} for k, v in facts.items()]}


def strings_in(value: Any) -> Sequence[str]:
    """Every string inside a JSON value (to extract entities from tool arguments)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []
