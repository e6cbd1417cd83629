"""MCP servers run by the orchestrator on the host and offered to kernels (docs/mcp.md)."""
