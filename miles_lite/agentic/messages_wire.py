"""Anthropic Messages (``POST /v1/messages``, version 2023-06-01) in OpenAI chat terms, and
back. Pure: no I/O.

The session server speaks Messages to agents by translating each request into the chat
request of the same exchange (:func:`chat_body`: the system prompt, ``text`` /
``tool_use`` / ``tool_result`` / ``image`` blocks, tools, ``tool_choice``, ``max_tokens``,
``stop_sequences``), so a Messages session gets exactly the token-in trajectory, masks,
log-probs and versions of the same exchange in chat form; the engine's chat answer comes
back as a Messages answer (:func:`messages_answer`) or its server-sent events
(:func:`messages_events`). Sampling keys (``temperature``, ``top_p``, ``top_k``) are the
rollout's, as on chat.
"""

from __future__ import annotations

import json
from typing import Any

from miles_lite.agentic.turns import BadTurn

__all__ = ["chat_body", "messages_answer", "messages_error", "messages_events"]

#: Messages keys an agent may send (anything else is refused by name).
_ALLOWED = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "metadata",
        "thinking",
    }
)
#: Chat ``finish_reason`` -> Messages ``stop_reason``.
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "abort": "end_turn",
}


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat request of an agent's Messages ``body``. Raises :class:`BadTurn`
    naming a field it cannot take (an unknown key, a block of an unknown type, a URL
    image)."""
    unknown = sorted(set(body) - _ALLOWED)
    if unknown:
        raise BadTurn(
            f"{unknown[0]!r} is not accepted here: a rollout's Messages turns take"
            f" {', '.join(sorted(_ALLOWED))}; the rollout sets the sampling",
            unknown[0],
        )
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text(system, "system")})
    for i, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadTurn(f"messages[{i}] must be a user or assistant message", "messages")
        messages.extend(_chat_messages(message, i))
    out: dict[str, Any] = {"messages": messages}
    for key in ("model", "max_tokens", "stream", "temperature", "top_p", "top_k"):
        if key in body:
            out[key] = body[key]
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    tools = body.get("tools")
    if tools:
        out["tools"] = [_chat_tool(tool, i) for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _chat_tool_choice(choice)
    thinking = body.get("thinking")
    if thinking is not None:
        # Extended thinking is the template's switch on SGLang (Qwen3's enable_thinking).
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled"):
            raise BadTurn(f"thinking must be enabled or disabled, got {thinking!r:.80}", "thinking")
        out["chat_template_kwargs"] = {"enable_thinking": kind == "enabled"}
    return out


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of ``text`` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text":
                raise BadTurn(f"{where} takes text blocks only, got {block!r:.80}", where)
            parts.append(str(block.get("text", "")))
        return "".join(parts)
    raise BadTurn(f"{where} must be a string or a list of text blocks", where)


def _chat_messages(message: dict[str, Any], i: int) -> list[dict[str, Any]]:
    role = message["role"]
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadTurn(f"messages[{i}].content must be a string or a list of blocks", "messages")
    if role == "assistant":
        text = []
        calls = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": str(block.get("id", "")),
                        "type": "function",
                        "function": {
                            "name": str(block.get("name", "")),
                            "arguments": json.dumps(block.get("input") or {}),
                        },
                    }
                )
            elif kind not in ("thinking", "redacted_thinking"):
                raise BadTurn(f"messages[{i}] has a block of type {kind!r}", "messages")
        out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if calls:
            out["tool_calls"] = calls
        return [out]
    # A user turn: tool results first (chat's tool messages), then what the user says.
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            result = block.get("content")
            said = "" if result is None else _text(result, f"messages[{i}].tool_result")
            results.append(
                {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": said}
            )
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _data_url(block, i)}})
        else:
            raise BadTurn(f"messages[{i}] has a block of type {kind!r}", "messages")
    if parts and all(p["type"] == "text" for p in parts):
        results.append({"role": "user", "content": "".join(p["text"] for p in parts)})
    elif parts:
        results.append({"role": "user", "content": parts})
    return results


def _data_url(block: dict[str, Any], i: int) -> str:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise BadTurn(
            f"messages[{i}] has an image that is not base64: the engine would fetch it;"
            " send it inline (source type base64)",
            "messages",
        )
    return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"


def _chat_tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise BadTurn(f"tools[{i}] must be an object with a name", "tools")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {}}
    if "description" in tool:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadTurn(
        f"tool_choice {choice!r:.80} is not auto, any, none or a named tool", "tool_choice"
    )


def messages_answer(answer: dict[str, Any], *, model: str, stop: Any = None) -> dict[str, Any]:
    """The Messages answer of an engine's chat ``answer`` (one choice). ``stop``: the
    request's stop sequences (a matched one is reported as ``stop_sequence``)."""
    choice = (answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments or {}
        except ValueError:
            parsed = {"_raw": arguments}
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": parsed,
            }
        )
    finish = choice.get("finish_reason")
    stop_reason = _STOP_REASONS.get(finish, "end_turn")
    matched = choice.get("matched_stop")
    stop_sequence = None
    if finish == "stop" and isinstance(matched, str) and isinstance(stop, list) and matched in stop:
        stop_reason, stop_sequence = "stop_sequence", matched
    usage = answer.get("usage") or {}
    out = {
        "id": f"msg_{answer.get('id', '')}",
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }
    # Agents that read ids or versions find the engine's metadata, as on chat.
    if "metadata" in answer:
        out["metadata"] = answer["metadata"]
    return out


def messages_events(message: dict[str, Any]) -> list[bytes]:
    """The server-sent events of a whole Messages answer, as SGLang streams them
    (``message_start``, one start / delta / stop per block, ``message_delta``,
    ``message_stop``): each block in one delta (ids and log-probs need the whole answer)."""
    start = dict(message, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    events = [_event("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            empty = dict(block, input={})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": empty},
            )
        )
        events.append(
            _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        )
        events.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": message["stop_reason"],
                    "stop_sequence": message["stop_sequence"],
                },
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(_event("message_stop", {"type": "message_stop"}))
    return events


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def messages_error(openai_error: Any) -> dict[str, Any]:
    """An OpenAI error body (``{"error": {"message", "type", ...}}``) in Messages' shape."""
    error = openai_error.get("error") if isinstance(openai_error, dict) else None
    error = error if isinstance(error, dict) else {}
    return {
        "type": "error",
        "error": {
            "type": str(error.get("type") or "api_error"),
            "message": str(error.get("message") or ""),
        },
    }
