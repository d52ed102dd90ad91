"""The demo's deterministic rule planner and synthesizer, behind the interfaces an LLM would implement."""

from __future__ import annotations

import json
import re

from activities.planning import PlanningRequest
from hooks.builtin.memory import MEMORY_SCOPE_NOTICE_PREFIX
from workflows.models import (
    ENRICHMENT_RAG_CONTEXT,
    Plan,
    PlanStep,
    StepResult,
    StepStatus,
    SynthesizeInput,
    SynthesizeOutput,
)

from .tools import NAMESPACE

_TICKER = re.compile(r"\b[A-Z]{2,5}\b")
_NOT_TICKERS = {"USD", "EUR", "OK", "AM", "PM", "CEO", "API", "FAQ"}
_QUANTITY = re.compile(r"\b(\d{1,6})\b")
_RECIPIENT = re.compile(r"\bto\s+([A-Za-z][\w.@\-]{0,63})", re.IGNORECASE)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def _per_ticker(prefix: str, agent: str, capability: str, tickers: list[str]) -> list[PlanStep]:
    """One step of ``agent/capability`` per ticker, with id ``<prefix>-<ticker>``."""
    return [
        PlanStep(
            step_id=f"{prefix}-{ticker.lower()}",
            namespace=NAMESPACE,
            agent=agent,
            capability=capability,
            arguments={"symbol": ticker},
        )
        for ticker in tickers
    ]


class RulePlanner:
    """Keyword rules: "quote"/"price" → ``stock_quote`` per ticker; "profile" → ``company_profile`` (the
    MCP server's tool) per ticker; "buy"/"sell" → ``execute_trade``;
    "notify"/"send"/"message" → ``send_message``. A message about quoted prices is a second phase: phase 1
    fetches the quotes, phase 2 sends them, referencing each quote's output (``implicit_deps``)."""

    name = "rule-planner/1"

    async def plan(self, request: PlanningRequest) -> Plan:
        text = request.request
        words = _words(text)
        wants_message = bool(words & {"notify", "send", "message"})
        if request.phase > 1:
            return self._message_phase(request, text)
        tickers = list(dict.fromkeys(t for t in _TICKER.findall(text) if t not in _NOT_TICKERS))
        steps: list[PlanStep] = []
        if words & {"quote", "quotes", "price", "prices"}:
            steps += _per_ticker("quote", "stock-service", "stock_quote", tickers)
        if words & {"profile", "profiles"}:
            steps += _per_ticker("profile", "research-service", "company_profile", tickers)
        side = "buy" if "buy" in words else "sell" if "sell" in words else None
        if side and tickers:
            quantity = _QUANTITY.search(text)
            steps.append(
                PlanStep(
                    step_id=f"trade-{tickers[0].lower()}",
                    namespace=NAMESPACE,
                    agent="stock-service",
                    capability="execute_trade",
                    arguments={
                        "symbol": tickers[0],
                        "side": side,
                        "quantity": int(quantity.group(1)) if quantity else 1,
                    },
                )
            )
        if wants_message and steps:
            return Plan(
                phase=1,
                steps=steps,
                rationale="fetch first; the message is planned from the results",
                continue_after=True,
            )
        if wants_message:
            steps.append(self._message(text, text[:2000]))
        return Plan(phase=request.phase, steps=steps, rationale=f"{len(steps)} step(s) from keyword rules")

    def _message_phase(self, request: PlanningRequest, text: str) -> Plan:
        quotes = [
            (r, fields)
            for r in request.prior_results
            if r.tool.endswith("stock_quote")
            and r.status is StepStatus.SUCCEEDED
            and (fields := _fields(r)).get("symbol")
        ]
        if not quotes:
            return Plan(phase=request.phase, steps=[], rationale="nothing to report")
        body = "; ".join(f"{fields['symbol']} {{{{steps.{r.step_id}.output.price}}}} USD" for r, fields in quotes)
        step = self._message(text, f"Prices: {body}")
        step.implicit_deps = [r.step_id for r, _ in quotes]
        return Plan(phase=request.phase, steps=[step], rationale="report the quoted prices")

    @staticmethod
    def _message(text: str, body: str) -> PlanStep:
        recipient = _RECIPIENT.search(text)
        return PlanStep(
            step_id="notify",
            namespace=NAMESPACE,
            agent="notify-service",
            capability="send_message",
            arguments={"to": recipient.group(1) if recipient else "me", "text": body},
        )


def _fields(step: StepResult) -> dict:
    """The step's result as a model reads it: the JSON object a tool returned, unless a hook rewrote the
    text into something else (then no fields)."""
    try:
        value = json.loads(step.result or "")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _describe(step: StepResult) -> str:
    if step.recovered_from is not None:  # an on_tool_error hook gave the model a readable result instead
        return f"{step.tool} ({step.step_id}) failed: {step.result}"
    output = _fields(step)
    if step.status is StepStatus.SUCCEEDED and not output:
        return f"{step.tool} ({step.step_id}): {step.result}"
    if step.status is StepStatus.SUCCEEDED:
        if step.tool.endswith("stock_quote"):
            return f"{output.get('symbol')} is trading at {output.get('price')} {output.get('currency')}."
        if step.tool.endswith("execute_trade"):
            verb = "Bought" if output.get("side") == "buy" else "Sold"
            return f"{verb} {output.get('quantity')} {output.get('symbol')} at {output.get('price')} (order {output.get('order_id')})."
        if step.tool.endswith("send_message"):
            return f"Message sent to {output.get('to')}."
        if step.tool.endswith("company_profile"):
            return f"{output.get('name')} ({output.get('symbol')}) is in {output.get('sector')}, with {output.get('employees')} employees."
        return f"{step.tool} succeeded."
    if step.status is StepStatus.FAILED:
        if step.error_handled_by:  # handled before a handled error made its step succeed
            return f"{step.tool} ({step.step_id}) failed: {step.result}"
        return f"I could not complete {step.tool} ({step.step_id}): {step.result}"
    return f"I skipped {step.tool} ({step.step_id}): {step.result or step.skip_reason}"


def _reference_lines(context: str) -> str:
    """The part of ``rag_context`` an answer may quote: everything before shared memory's section (opened
    by its scope notice). Memory is history for the planner, not results of this request, so a template
    answer does not repeat it."""
    return context.split(MEMORY_SCOPE_NOTICE_PREFIX, 1)[0].strip()


class TemplateSynthesizer:
    """Writes one sentence per step result; confidence is the share of steps that succeeded."""

    name = "template-synthesizer/1"

    async def synthesize(self, input: SynthesizeInput) -> SynthesizeOutput:
        steps = input.execution.steps
        sentences = [_describe(step) for step in steps]
        context = input.enrichments.get(ENRICHMENT_RAG_CONTEXT)
        if not steps:
            sentences.append(
                "I can quote stock prices, place trades and send messages, but found nothing to do for that request."
            )
        knowledge = _reference_lines(context) if isinstance(context, str) else ""
        if knowledge:
            sentences.append("From the knowledge base:\n" + knowledge)
        confidence = (sum(s.status is StepStatus.SUCCEEDED for s in steps) / len(steps)) if steps else 0.5
        return SynthesizeOutput(response="\n".join(sentences), confidence=round(confidence, 3))
