"""Sub-agents: a sub-agent tool step runs a child ``RequestLifecycle``
(``<workflow id>/subagent/<step id>``), the chain is bounded at depth 3 with ``LoopDepthExceeded``, and
subagent_start / subagent_stop hooks fire on sub-agent steps only, with ``depth`` visible to CEL."""

from __future__ import annotations

from temporalio.service import RPCError

from activities.tools import SubAgentTool
from hooks.declarative import DeclaredHookRuntime, HookStore, declared_hooks, parse_hooks
from workflows.detached import detached_workflow_id
from workflows.models import LOOP_DEPTH_EXCEEDED, ExecutionRecord, PlanStep, RequestResult, StepStatus

from .doubles import FixedPlanner
from .harness import Harness
from .test_declared_hooks import Echo, echo


class Delegate(SubAgentTool):
    namespace = "test-tools"
    agent = "agents"
    capability = "delegate"


def delegate(step_id: str = "d") -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace="test-tools",
        agent="agents",
        capability="delegate",
        arguments={"request": "look deeper"},
    )


async def child_record(h: Harness, workflow_id: str) -> ExecutionRecord | None:
    """The stored record of a child request (every level persists to the same store)."""
    return await h.store.get(workflow_id)


async def exists(client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    return True


async def test_a_sub_agent_chain_stops_at_depth_three(client, tmp_path):
    # Every request plans a sub-agent step: only the depth bound ends the chain.
    planner = FixedPlanner(delegate(), echo("e", "hi"))
    async with Harness(client, tmp_path, tools=[Delegate(), Echo()], planner=planner) as h:
        out = await h.run("recurse")

    assert out.failure is None, out.failure
    root = out.workflow_id
    ids = [f"{root}/subagent/d", f"{root}/subagent/d/subagent/d", f"{root}/subagent/d/subagent/d/subagent/d"]
    records = [await child_record(h, wid) for wid in ids]
    assert all(r is not None for r in records)
    assert [r.metadata["subagent_depth"] for r in records] == [1, 2, 3]
    assert records[0].metadata["parent_workflow_id"] == root
    # Depth 3 refuses a fourth level: its step fails with the typed error and no child starts.
    deepest = {s.step_id: s for s in records[2].steps}["d"]
    assert (deepest.status, deepest.error_type) == (StepStatus.FAILED, LOOP_DEPTH_EXCEEDED)
    assert "depth 4 exceeds the limit of 3" in deepest.error
    assert not await exists(client, f"{ids[2]}/subagent/d")
    # Each level above answered with its child's answer.
    root_step = {s.step_id: s for s in out.record.steps}["d"]
    assert root_step.status is StepStatus.SUCCEEDED and root_step.output["workflow_id"] == ids[0]
    assert root_step.output["depth"] == 1
    assert "execute_tool_step" in out.activity_types()  # the echo step; the sub-agent step ran as a child
    assert [a.summary for a in out.tool_activities] == ["execute · echo/say (e)"]
    child = await client.get_workflow_handle(ids[0], result_type=RequestResult).result()
    assert root_step.output["response"] == child.response and child.response.startswith(root_step.result.rstrip("…"))


async def test_subagent_hooks_fire_on_sub_agent_steps_only_and_see_depth(client, tmp_path):
    store = HookStore(tmp_path / "hooks.sqlite3")
    runtime = DeclaredHookRuntime(store=store)
    deny = tmp_path / "deny.sh"
    deny.write_text('cat >/dev/null\necho "too deep" >&2\nexit 2\n')
    hooks = declared_hooks(
        parse_hooks(
            {
                "hooks": [
                    {
                        "id": "depth-guard",
                        "event": "subagent_start",
                        "handler_type": "command",
                        "config": {"command": f"bash {deny}"},
                        "if_expr": "depth >= 1",
                    },
                    {
                        "id": "child-done",
                        "event": "subagent_stop",
                        "handler_type": "command",
                        "config": {"command": "true"},
                    },
                ]
            }
        ),
        runtime,
    )
    planner = FixedPlanner(delegate(), echo("e", "hi"))
    async with Harness(client, tmp_path, hooks=hooks, tools=[Delegate(), Echo()], planner=planner) as h:
        out = await h.run("recurse")
        # subagent_stop observes in a detached effect, for the root's sub-agent step and for the child's.
        for workflow_id in (out.workflow_id, f"{out.workflow_id}/subagent/d"):
            handle = client.get_workflow_handle(detached_workflow_id(workflow_id, "hook.child-done.subagent_stop.d"))
            await handle.result()
            h.histories.append(await handle.fetch_history())

    assert out.failure is None, out.failure
    level1 = await child_record(h, f"{out.workflow_id}/subagent/d")
    assert level1 is not None
    # The child (depth 1) was refused its own sub-agent by the CEL-guarded hook: no depth-2 workflow.
    refused = {s.step_id: s for s in level1.steps}["d"]
    assert (refused.status, refused.skipped_by, refused.skip_detail) == (StepStatus.SKIPPED, "depth-guard", "too deep")
    assert not await exists(client, f"{out.workflow_id}/subagent/d/subagent/d")
    # Sub-agent hooks never ran for the echo steps: only sub-agent steps are invoked (and audited).
    guard_rows = store.executions(hook_label="depth-guard")
    assert sorted((r.workflow_id, r.decision) for r in guard_rows) == sorted(
        [(out.workflow_id, "skip"), (level1.workflow_id, "block")]
    )
    assert {r.metadata["cel_eval_result"] for r in guard_rows} == {False, True}
    done_rows = store.executions(hook_label="child-done")
    assert sorted((r.workflow_id, r.decision) for r in done_rows) == sorted(
        [(out.workflow_id, "allow"), (level1.workflow_id, "allow")]
    )
    # The workflow applies the sub-agent filter: for the echo step no activity of these hooks is
    # scheduled at all, so no invocation is recorded and no handler runs.
    assert [i.step_id for i in out.record.invocations(hook="depth-guard")] == ["d"]
    assert [i.step_id for i in out.record.invocations(hook="child-done")] == ["d"]
    assert not [a for a in out.scheduled if a.summary and a.summary.endswith(" · e") and "depth-guard" in a.summary]
    assert all(r.workflow_id != out.workflow_id or r.metadata.get("cel_eval_result") is False for r in guard_rows)


async def test_a_request_whose_depth_is_already_at_the_limit_refuses_to_delegate(client, tmp_path):
    planner = FixedPlanner(delegate())
    async with Harness(client, tmp_path, tools=[Delegate(), Echo()], planner=planner) as h:
        out = await h.run("delegate", {"subagent_depth": 3})
    assert out.failure is None, out.failure
    [step] = out.record.steps
    assert (step.status, step.error_type) == (StepStatus.FAILED, LOOP_DEPTH_EXCEEDED)
    assert not await exists(client, f"{out.workflow_id}/subagent/d")
