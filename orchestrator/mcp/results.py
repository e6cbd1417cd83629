"""MCP SDK results as the plain JSON the kernel receives (the wire shapes of docs/mcp.md).

The kernel may not import the SDK, so every answer is turned into dicts here: a tool's
result keeps its structured content and its content blocks; a resource its contents; a
prompt its messages. Binary data stays base64 text, as the protocol sends it.
"""

from __future__ import annotations

from typing import Any

from mcp import types

__all__ = ["block_json", "catalog_json", "prompt_json", "resource_json", "tool_json"]


def block_json(block: Any) -> dict[str, Any]:
    """One content block: text, image/audio (base64 ``data``), an embedded resource or a
    resource link; anything newer keeps the SDK's own dump."""
    if isinstance(block, types.TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, types.ImageContent | types.AudioContent):
        return {"type": block.type, "mime_type": block.mimeType, "data": block.data}
    if isinstance(block, types.EmbeddedResource):
        return {"type": "resource", **_contents_json(block.resource)}
    if isinstance(block, types.ResourceLink):
        return {"type": "resource_link", "uri": str(block.uri), "name": block.name}
    dumped: dict[str, Any] = block.model_dump(mode="json", exclude_none=True)
    return dumped


def _contents_json(contents: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"uri": str(contents.uri), "mime_type": contents.mimeType}
    if isinstance(contents, types.TextResourceContents):
        out["text"] = contents.text
    elif isinstance(contents, types.BlobResourceContents):
        out["blob"] = contents.blob
    return out


def tool_json(result: types.CallToolResult) -> dict[str, Any]:
    return {
        "is_error": bool(result.isError),
        "structured": result.structuredContent,
        "content": [block_json(block) for block in result.content],
    }


def resource_json(result: types.ReadResourceResult) -> dict[str, Any]:
    return {"contents": [_contents_json(item) for item in result.contents]}


def prompt_json(result: types.GetPromptResult) -> dict[str, Any]:
    return {
        "description": result.description,
        "messages": [
            {"role": message.role, "content": block_json(message.content)}
            for message in result.messages
        ],
    }


def catalog_json(
    tools: list[types.Tool], resources: list[types.Resource], prompts: list[types.Prompt]
) -> dict[str, Any]:
    """What a server offers: each tool with its input schema, each resource, each prompt."""
    return {
        "tools": [
            {
                "name": tool.name,
                "description": tool.description or "",
                "input_schema": tool.inputSchema,
                "output_schema": tool.outputSchema,
            }
            for tool in tools
        ],
        "resources": [
            {
                "uri": str(resource.uri),
                "name": resource.name,
                "description": resource.description or "",
                "mime_type": resource.mimeType,
            }
            for resource in resources
        ],
        "prompts": [
            {
                "name": prompt.name,
                "description": prompt.description or "",
                "arguments": [
                    {
                        "name": argument.name,
                        "description": argument.description or "",
                        "required": bool(argument.required),
                    }
                    for argument in prompt.arguments or []
                ],
            }
            for prompt in prompts
        ],
    }
