"""What a session keeps of each chat turn: the ids and log-probs the engine returned (TITO)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from miles_lite.errors import EngineProtocolError

__all__ = ["TurnRecord", "record_from_choice"]


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    """One recorded chat turn of a session.

    ``prompt_ids`` is the templated prompt the engine tokenized, ``output_ids`` /
    ``output_log_probs`` what it generated (one log-prob per id), ``finish_reason`` the
    OpenAI string (``stop``, ``tool_calls``, ``length``, ``abort``). ``request`` is the
    body forwarded to the engine without ``messages`` / ``tools`` (their counts instead)
    and ``response`` the engine's answer without per-token lists, kept for debugging
    (``GET /sessions/<id>``).
    """

    rid: str
    engine_url: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str
    weight_version: str | None = None
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON (for ``GET /sessions/<id>``)."""
        return {
            "rid": self.rid,
            "engine_url": self.engine_url,
            "prompt_token_ids": self.prompt_ids,
            "output_token_ids": self.output_ids,
            "output_log_probs": self.output_log_probs,
            "finish_reason": self.finish_reason,
            "weight_version": self.weight_version,
            "request": self.request,
            "response": self.response,
        }


def record_from_choice(
    answer: Any, *, rid: str, engine_url: str, request: dict[str, Any]
) -> TurnRecord:
    """Read the first choice of an engine's chat answer into a :class:`TurnRecord`.

    Needs ``prompt_token_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, id,
    text]`` triples, one per output token, as SGLang 0.5.23 returns them with
    ``return_prompt_token_ids`` / ``return_meta_info``). Raises
    :class:`EngineProtocolError` naming what is missing.
    """
    where = {"url": engine_url, "request_id": rid}
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise EngineProtocolError("chat answer has no 'choices' list", **where)
    if not answer["choices"] or not isinstance(answer["choices"][0], dict):
        raise EngineProtocolError("chat answer has an empty 'choices' list", **where)
    choice = answer["choices"][0]
    prompt_ids = choice.get("prompt_token_ids")
    meta = choice.get("meta_info")
    # set(map(type, ...)) checks the ids at C speed: a turn's prompt is the whole history.
    if not isinstance(prompt_ids, list) or not set(map(type, prompt_ids)) <= {int}:
        raise EngineProtocolError(
            "chat answer lacks choices[0].prompt_token_ids; the engine must honour "
            "return_prompt_token_ids (SGLang >= 0.5.23)",
            **where,
        )
    triples = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(triples, list):
        raise EngineProtocolError(
            "chat answer lacks choices[0].meta_info.output_token_logprobs; the engine must "
            "honour return_meta_info with logprobs",
            **where,
        )
    ids, log_probs = _ids_and_log_probs(triples, where)
    finish = choice.get("finish_reason")
    version = meta.get("weight_version") if isinstance(meta, dict) else None
    return TurnRecord(
        rid=rid,
        engine_url=engine_url,
        prompt_ids=list(prompt_ids),
        output_ids=ids,
        output_log_probs=log_probs,
        finish_reason=finish if isinstance(finish, str) else "abort",
        weight_version=version if isinstance(version, str) else None,
        request=_slim_request(request),
        response=_slim_response(answer),
    )


def _slim_request(request: dict[str, Any]) -> dict[str, Any]:
    """The request without its history: every turn resends the whole conversation, so
    keeping it would make a session's records grow with the square of its turns."""
    slim = {k: v for k, v in request.items() if k not in ("messages", "tools")}
    messages = request.get("messages")
    slim["num_messages"] = len(messages) if isinstance(messages, list) else 0
    slim["num_tools"] = len(request.get("tools") or [])
    return slim


def _slim_response(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer without per-token lists, which the record holds as ids and log-probs."""
    slim = dict(answer)
    choices = []
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        choice = {k: v for k, v in choice.items() if k not in ("logprobs", "prompt_token_ids")}
        meta = choice.get("meta_info")
        if isinstance(meta, dict):
            choice["meta_info"] = {
                k: v
                for k, v in meta.items()
                if k not in ("output_token_logprobs", "input_token_logprobs")
            }
        choices.append(choice)
    slim["choices"] = choices
    return slim


def _ids_and_log_probs(triples: list[Any], where: dict[str, str]) -> tuple[list[int], list[float]]:
    """The ids and log-probs of ``[logprob, id, text]`` triples, checked at C speed; the
    first bad triple is named in an :class:`EngineProtocolError`."""
    try:
        ids = [t[1] for t in triples]
        log_probs = [t[0] for t in triples]
        if (
            set(map(type, triples)) <= {list, tuple}
            and set(map(type, ids)) <= {int}
            and set(map(type, log_probs)) <= {float, int}
        ):
            return ids, list(map(float, log_probs))
    except (TypeError, IndexError, KeyError):
        pass
    for i, triple in enumerate(triples):
        if (
            not isinstance(triple, list | tuple)
            or len(triple) < 2
            or type(triple[1]) is not int
            or type(triple[0]) not in (float, int)
        ):
            raise EngineProtocolError(
                f"meta_info.output_token_logprobs[{i}] is {triple!r}, not [logprob, id, text]",
                **where,
            )
    raise AssertionError("unreachable: a triple failed the fast check only")  # pragma: no cover
