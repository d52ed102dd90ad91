"""The README's first agent: an expense desk whose one tool a reviewer approves, planned by a model.

``AGENT_PIPELINE=examples.expenses.agent:build`` with ``AGENT_MODEL`` set runs it; ``tests/test_testing_kit.py``
tests it with the testing kit.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from agent_lifecycle import (
    HookRejection,
    PipelineHook,
    Plan,
    RequiredAfterPlanningHook,
    Settings,
    Tool,
    ToolContext,
    build_pipeline,
)


class ExpenseArguments(BaseModel):
    amount: float = Field(gt=0, le=5000)
    what: str = Field(min_length=1, max_length=200)


class FileExpense(Tool):
    namespace, agent, capability = "expenses", "expense-desk", "file_expense"
    description = "File an expense report: the amount in euros and what it was for."
    approval_required = True  # a reviewer approves each call, exactly as it will run
    Arguments = ExpenseArguments

    async def run(self, arguments: ExpenseArguments, ctx: ToolContext) -> dict:
        # file it here; ctx.idempotency_key is the same on every retry of this call
        return {"filed": True, "amount": arguments.amount, "what": arguments.what}


class OnlyExpenses(RequiredAfterPlanningHook, PipelineHook):  # the required gate: fails closed
    name = "only-expenses"

    def after_planning(self, ctx, plan: Plan) -> Plan:
        if any(step.namespace != "expenses" for step in plan.steps):
            raise HookRejection("only the expense tools")  # no tool runs
        return plan


def build(settings: Settings):
    return build_pipeline(settings, name="expenses", hooks=[OnlyExpenses()], tools=[FileExpense()])
