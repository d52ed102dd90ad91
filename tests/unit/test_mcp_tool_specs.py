"""What a listed MCP tool becomes, without a server: its spec and governance from annotations and the
configuration, its arguments checked against the listed JSON Schema (step references deferred until
resolved), its result content as a step output, and the configuration file's errors."""

from __future__ import annotations

import json

import mcp_types
import pytest

from activities.mcp import McpConfigError, McpConnection, McpServerConfig, ToolOverride, load_mcp_servers
from activities.mcp.tools import server_tools, step_output
from activities.tools import ToolRegistry
from workflows.models import PlanStep

SCHEMA = {
    "type": "object",
    "properties": {"sku": {"type": "string", "pattern": "^[a-z]+$"}, "units": {"type": "integer", "minimum": 1}},
    "required": ["sku", "units"],
}


def listed(name: str, **annotations: bool) -> mcp_types.Tool:
    return mcp_types.Tool(
        name=name,
        description=f"{name} things",
        input_schema=SCHEMA,
        annotations=mcp_types.ToolAnnotations(**annotations) if annotations else None,
    )


def registry(server: McpServerConfig, *tools: mcp_types.Tool) -> ToolRegistry:
    connection = McpConnection(server, secrets=None, allow_loopback=False)  # never opened here
    return ToolRegistry(server_tools(server, tools, connection))


def flags(reg: ToolRegistry) -> dict[str, tuple[bool, bool]]:
    return {s.capability: (s.read_only, s.approval_required) for s in reg.specs()}


STOCK = McpServerConfig(name="stock", url="https://mcp.example.com/mcp")


def test_annotations_become_read_only_and_approval_unless_the_configuration_says_otherwise():
    tools = (
        listed("look", read_only_hint=True),
        listed("wipe", destructive_hint=True),
        listed("order", destructive_hint=False),
        listed("plain"),
    )
    assert flags(registry(STOCK, *tools)) == {
        "look": (True, False),
        "wipe": (False, True),
        "order": (False, False),
        "plain": (False, False),
    }
    always = STOCK.model_copy(update={"approval": "always", "tools": {"look": ToolOverride(approval_required=False)}})
    assert flags(registry(always, *tools)) == {
        "look": (True, False),
        "wipe": (False, True),
        "order": (False, True),
        "plain": (False, True),
    }
    never = STOCK.model_copy(update={"approval": "never", "tools": {"plain": ToolOverride(read_only=True)}})
    assert flags(registry(never, *tools))["wipe"] == (False, False)
    assert flags(registry(never, *tools))["plain"] == (True, False)


def test_allow_and_deny_lists_choose_the_offered_tools_and_names_that_are_not_capabilities_are_skipped():
    tools = (listed("read_file"), listed("read_dir"), listed("write_file"), listed("bad/name"), listed("has space"))
    allowed = STOCK.model_copy(update={"allow": ["read_*", "write_file"], "deny": ["read_dir"]})
    reg = registry(allowed, *tools)
    assert [s.key for s in reg.specs()] == ["mcp/stock/read_file", "mcp/stock/write_file"]
    spec = reg.specs()[0]
    assert (spec.agent, spec.description, spec.parameters) == ("stock", "read_file things", SCHEMA)


def test_arguments_are_checked_against_the_listed_schema_and_references_wait_until_resolved():
    reg = registry(STOCK, listed("order"))

    def problems(arguments: dict, *, resolved: bool = False) -> list[str]:
        step = PlanStep(step_id="s1", namespace="mcp", agent="stock", capability="order", arguments=arguments)
        return reg.argument_problems(step, resolved=resolved)

    assert problems({"sku": "abc", "units": 2}) == []
    assert problems({"sku": "abc"}) == ["step 's1': argument units: 'units' is a required property"]
    assert problems({"sku": "ABC", "units": 0}) == [
        "step 's1': argument sku: 'ABC' does not match '^[a-z]+$'",
        "step 's1': argument units: 0 is less than the minimum of 1",
    ]
    reference = {"sku": "abc", "units": "{{steps.count.output.units}}"}
    assert problems(reference) == []  # checked once the reference is resolved
    assert problems(reference, resolved=True) == [
        "step 's1': argument units: '{{steps.count.output.units}}' is not of type 'integer'"
    ]


def test_structured_content_text_and_other_blocks_become_step_outputs():
    text = mcp_types.TextContent(type="text", text="12 units")
    assert step_output(mcp_types.CallToolResult(content=[text])) == "12 units"
    structured = mcp_types.CallToolResult(content=[text], structured_content={"units": 12})
    assert step_output(structured) == {"units": 12}
    image = mcp_types.ImageContent(type="image", data="aGVsbG8=", mime_type="image/png")
    blob = mcp_types.EmbeddedResource(
        type="resource",
        resource=mcp_types.BlobResourceContents(uri="file:///chart.png", mime_type="image/png", blob="aGVsbG8="),
    )
    output = step_output(mcp_types.CallToolResult(content=[text, image, blob]))
    assert output == [
        {"type": "text", "text": "12 units"},
        {"type": "image", "mime_type": "image/png"},  # binary data is described, not copied
        {"type": "resource", "resource": {"uri": "file:///chart.png", "mime_type": "image/png"}},
    ]
    assert "aGVsbG8=" not in json.dumps(output)


def test_a_bad_servers_file_names_the_server_and_the_field(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "servers": [
                    {"name": "ok", "command": "python -m ok"},
                    {"name": "leaky", "url": "https://h.example/mcp", "headers": {"Authorization": "Bearer x"}},
                    {"name": "both", "command": ["x"], "url": "https://h.example/mcp"},
                ]
            }
        )
    )
    with pytest.raises(McpConfigError) as caught:
        load_mcp_servers(path)
    message = str(caught.value)
    assert "server 'leaky': headers: Value error, header 'Authorization' carries a credential" in message
    assert "server 'both': Value error, give exactly one of command (stdio) and url (streamable HTTP)" in message
    assert "'ok'" not in message
    path.write_text('{"servers": [{"name": "a", "command": "x"}, {"name": "a", "url": "https://h.example/m"}]}')
    with pytest.raises(McpConfigError, match="server mcp/a is declared twice"):
        load_mcp_servers(path)
    with pytest.raises(McpConfigError, match="cannot read"):
        load_mcp_servers(tmp_path / "missing.json")
