"""The demo's MCP server: ``research-service``, one read-only tool over stdio.

    python demo/mcp_server.py

The demo worker starts it as a child process and offers its tool as
``demo-tools/research-service/company_profile``, governed by the same hooks as the Python tools.
"""

from __future__ import annotations

import hashlib

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

SECTORS = ["industrials", "technology", "health care", "energy", "consumer goods", "utilities"]

server = MCPServer("research-service", log_level="WARNING")


class CompanyProfile(BaseModel):
    symbol: str
    name: str
    sector: str
    employees: int


@server.tool(
    description="A company's profile (name, sector, employees) by its ticker symbol (read-only)",
    annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False),
)
def company_profile(
    symbol: str = Field(pattern=r"^[A-Z]{1,5}$", description="Ticker symbol, upper case"),
) -> CompanyProfile:
    digest = int(hashlib.sha256(symbol.encode()).hexdigest()[:8], 16)
    return CompanyProfile(
        symbol=symbol,
        name=f"{symbol.title()} Corporation",
        sector=SECTORS[digest % len(SECTORS)],
        employees=100 + digest % 50_000,
    )


if __name__ == "__main__":
    server.run("stdio")
