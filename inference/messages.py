"""Conversations as evaluation code holds them, turned into the chat messages judgestore keys.

Contract:

* :func:`chat_messages` takes what LangChain-based code passes a chat model
  (a string, a ``PromptValue`` such as ``ChatPromptTemplate.invoke``'s, a
  list of LangChain messages, ``(role, content)`` pairs, or message dicts with
  a ``role`` or LangChain's ``type``) and returns judgestore's
  ``[{"role", "content"}, ...]``. Nothing here imports LangChain: its objects
  are read by their ``type``, ``content`` (and ``to_messages``) attributes.
* Roles map as LangChain's own chat models send them: ``human`` -> ``user``,
  ``ai`` -> ``assistant``, ``system`` -> ``system``; ``user``, ``assistant``
  and ``system`` stay. So the same conversation keys the same, whether it
  came as LangChain messages, as dicts or as a
  :class:`~inference.requests.CompletionRequest` of ``{"role", "content"}``
  dicts: same rendered input, same input hash.
* What judgestore cannot key as it stands is refused with
  :class:`~store.errors.UnsupportedMessageError`, naming the message and what
  to do, rather than dropped or passed on silently: tool and function
  messages (and any other role), a message with tool calls (LangChain's
  ``tool_calls``, or OpenAI's ``tool_calls``/``function_call`` in its
  ``additional_kwargs``) or a ``name``, OpenAI's ``developer`` role, and
  content that is not text (content blocks; one text block alone, as
  LangChain's ``output_version="v1"`` answers hold, is its text).
* A message and its dict form (``message.model_dump()``, or
  ``messages_to_dict``'s ``{"type", "data"}``) are the same message: what a
  message carries that never reaches the model (its ``id``,
  ``response_metadata``, ``usage_metadata``) is left out of both.
* :class:`~inference.requests.CompletionRequest` itself takes
  ``{"role", "content"}`` dicts verbatim (its roles are what the chat
  template receives); this module is the way in for the other shapes.
* :func:`text_prompt` is the same for a model that takes text input: a
  string, or a conversation of one user message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from store.errors import UnsupportedMessageError

# LangChain's message types (and the OpenAI roles) -> the role the chat template receives.
ROLES: Mapping[str, str] = {
    "human": "user",
    "user": "user",
    "ai": "assistant",
    "assistant": "assistant",
    "system": "system",
    # a streamed message, as LangChain's chunks add up (a streamed answer put back into the history)
    "HumanMessageChunk": "user",
    "AIMessageChunk": "assistant",
    "SystemMessageChunk": "system",
}
# What a message (or its dict) may carry that never reaches the model: LangChain's id, what a provider said about
# an answer, where a streamed chunk stood in its stream, and the fields read separately below.
_UNSENT = frozenset(
    {"role", "type", "content", "id", "response_metadata", "usage_metadata", "additional_kwargs", "chunk_position"}
)
# What does reach the model, and judgestore cannot key: tool calls (a streamed answer's too) and a participant's name.
_UNKEYABLE = ("tool_calls", "invalid_tool_calls", "tool_call_chunks", "name")
# The same, as OpenAI's shapes carry them in ``additional_kwargs`` (LangChain's OpenAI models send them on).
_UNKEYABLE_KWARGS = ("tool_calls", "function_call")


def chat_messages(value: Any) -> list[dict[str, str]]:
    """``value`` as judgestore's ``[{"role", "content"}, ...]`` (see the module docstring)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    to_messages = getattr(value, "to_messages", None)
    if callable(to_messages):  # a LangChain PromptValue (ChatPromptValue, StringPromptValue)
        value = to_messages()
    if isinstance(value, Mapping) or not isinstance(value, Sequence):
        raise UnsupportedMessageError(
            f"a conversation is a string, a prompt value or a list of messages, not a {type(value).__name__}"
        )
    if not value:
        raise UnsupportedMessageError("the conversation is empty: give at least one message")
    return [_message(i, item) for i, item in enumerate(value)]


def text_prompt(value: Any) -> str:
    """The prompt of a model that takes text input: a string, or a conversation of one user message."""
    if isinstance(value, str):
        return value
    messages = chat_messages(value)
    if len(messages) != 1 or messages[0]["role"] != "user":
        roles = ", ".join(m["role"] for m in messages)
        raise UnsupportedMessageError(
            f"this model takes text input, and the conversation has {len(messages)} messages ({roles}): pass the "
            "prompt as a string, or use a model with input_mode='chat'"
        )
    return messages[0]["content"]


def _message(i: int, item: Any) -> dict[str, str]:
    if isinstance(item, str):
        return {"role": "user", "content": item}
    if isinstance(item, Mapping):
        if set(item) == {"type", "data"} and isinstance(item["data"], Mapping):  # messages_to_dict's shape
            item = item["data"]
        fields: Mapping[str, Any] = item
        kind = item.get("role", item.get("type"))
    elif isinstance(item, tuple | list) and len(item) == 2:
        return _checked(i, item[0], item[1], [])
    elif getattr(item, "type", None) is None or not hasattr(item, "content"):
        raise UnsupportedMessageError(
            f"message {i} is a {type(item).__name__}: give a LangChain message, a (role, content) pair or a dict "
            "with 'role' and 'content'"
        )
    else:
        fields = {name: getattr(item, name, None) for name in (*_UNKEYABLE, "additional_kwargs", "content")}
        kind = item.type
    if kind in ("chat", "ChatMessageChunk"):  # LangChain's ChatMessage names its role itself
        kind = fields.get("role", getattr(item, "role", kind))
    kwargs = fields.get("additional_kwargs")
    extra = [name for name in _UNKEYABLE if _given(fields.get(name))]
    if isinstance(kwargs, Mapping):
        if kwargs.get("__openai_role__") == "developer":
            kind = "developer"
        extra += [f"additional_kwargs[{name!r}]" for name in _UNKEYABLE_KWARGS if _given(kwargs.get(name))]
    elif _given(kwargs):
        extra.append("additional_kwargs that are not a dict")
    if isinstance(item, Mapping):  # a dict names any field it likes: one no message has is refused, not dropped
        extra += sorted(k for k, v in item.items() if k not in _UNSENT and k not in _UNKEYABLE and _given(v))
    return _checked(i, kind, fields.get("content"), extra)


def _given(value: Any) -> bool:
    """Whether a message field holds something (a dict form writes every field, most of them empty)."""
    return not (value is None or value is False or value in ("", [], {}))


def _checked(i: int, kind: Any, content: Any, extra: Sequence[str]) -> dict[str, str]:
    role = ROLES.get(kind) if isinstance(kind, str) else None
    if role is None:
        raise UnsupportedMessageError(
            f"message {i} is a {kind!r} message: judgestore keys user, assistant and system messages (LangChain's "
            "human, ai and system); tool, function and other messages are not supported yet. Render the exchange "
            "into the text of a user message, or leave it out"
        )
    if extra:
        raise UnsupportedMessageError(
            f"message {i} ({kind}) carries {', '.join(extra)}, which judgestore cannot key (only the role and the "
            "text reach the model through it): leave them out"
        )
    content = _one_text_block(content)
    if not isinstance(content, str):
        raise UnsupportedMessageError(
            f"message {i} ({kind}) has {type(content).__name__} content: judgestore keys text; join text blocks "
            "into one string (images and other blocks are not supported)"
        )
    return {"role": role, "content": content}


# What a text block may carry beside its text that never reaches the model: where it stood in a stream, its id.
_BLOCK_UNSENT = frozenset({"type", "text", "id", "index"})


def _one_text_block(content: Any) -> Any:
    """The text of content that is one text block and nothing else (an answer in LangChain's
    ``output_version="v1"``, put back into the history): the same message as that string. Anything else as it is
    (several blocks would need a separator the chat template decides)."""
    if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], Mapping):
        return content
    (block,) = content
    text = block.get("text")
    extra = [k for k, v in block.items() if k not in _BLOCK_UNSENT and _given(v)]
    return text if block.get("type") == "text" and isinstance(text, str) and not extra else content
