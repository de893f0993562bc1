"""Conversations in LangChain's shapes become judgestore's messages, keyed exactly as its own requests are."""

from __future__ import annotations

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_to_dict,
)
from langchain_core.prompts import ChatPromptTemplate

from inference import CompletionRequest
from inference.messages import chat_messages, text_prompt
from store import InvalidInputError, input_hash
from store.errors import UnsupportedMessageError

CONVERSATION = [
    {"role": "system", "content": "You are a judge."},
    {"role": "user", "content": "Turn 1?"},
    {"role": "assistant", "content": "Answer 1."},
    {"role": "user", "content": "Turn 2?"},
]


def key(messages: list[dict[str, str]]) -> str:
    return input_hash(CompletionRequest(messages=messages).render_bytes("chat"))


def test_a_multi_turn_langchain_history_keys_as_the_same_completion_request() -> None:
    langchain = [
        SystemMessage("You are a judge."),
        HumanMessage("Turn 1?"),
        AIMessage("Answer 1."),
        HumanMessage("Turn 2?"),
    ]
    assert chat_messages(langchain) == CONVERSATION
    assert key(chat_messages(langchain)) == key(CONVERSATION)


def test_every_shape_of_the_same_conversation_gives_the_same_messages() -> None:
    shapes = [
        [("system", "You are a judge."), ("human", "Turn 1?"), ("ai", "Answer 1."), ("human", "Turn 2?")],
        [
            {"type": "system", "content": "You are a judge."},
            {"type": "human", "content": "Turn 1?"},
            {"type": "ai", "content": "Answer 1."},
            {"type": "human", "content": "Turn 2?"},
        ],
        [
            {"role": "system", "content": "You are a judge."},
            {"role": "human", "content": "Turn 1?"},
            {"role": "ai", "content": "Answer 1."},
            {"role": "user", "content": "Turn 2?", "id": "m4"},
        ],
        ChatPromptTemplate.from_messages(
            [("system", "You are a {who}."), ("human", "Turn 1?"), ("ai", "Answer 1."), ("human", "{q}")]
        ).invoke({"who": "judge", "q": "Turn 2?"}),
        [
            SystemMessage("You are a judge."),
            ChatMessage(role="user", content="Turn 1?"),
            AIMessage("Answer 1."),
            HumanMessage("Turn 2?"),
        ],
    ]
    for shape in shapes:
        assert chat_messages(shape) == CONVERSATION


def test_a_message_and_its_dict_forms_are_the_same_message() -> None:
    """What an answer carries that never reaches the model (its metadata, token counts, id) counts in neither."""
    history = [
        SystemMessage("You are a judge.", id="m1"),
        HumanMessage("Turn 1?"),
        AIMessage(
            "Answer 1.",
            response_metadata={"finish_reason": "stop", "model_name": "m"},
            usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
        ),
        ChatMessage(role="user", content="Turn 2?"),
    ]
    assert chat_messages(history) == CONVERSATION
    assert chat_messages([message.model_dump() for message in history]) == CONVERSATION
    assert chat_messages(messages_to_dict(history)) == CONVERSATION


def test_a_streamed_answer_and_its_dict_forms_are_the_same_message() -> None:
    """The last chunk of a stream (CachedChatModel.stream's answer) marks its place: its dict forms were refused
    for carrying chunk_position (was), though the chunk itself was taken."""
    streamed = AIMessageChunk("Answer 1.", chunk_position="last")
    history = [SystemMessage("You are a judge."), HumanMessage("Turn 1?"), streamed, HumanMessage("Turn 2?")]
    assert chat_messages(history) == CONVERSATION
    assert chat_messages([message.model_dump() for message in history]) == CONVERSATION
    assert chat_messages(messages_to_dict(history)) == CONVERSATION


def test_a_string_is_one_user_message() -> None:
    assert chat_messages("Hi") == [{"role": "user", "content": "Hi"}]
    assert text_prompt("Hi") == "Hi" == text_prompt([HumanMessage("Hi")])


@pytest.mark.parametrize(
    ("conversation", "says"),
    [
        ([HumanMessage("hi"), ToolMessage("42", tool_call_id="c1")], "'tool' message"),
        ([{"role": "tool", "content": "42"}], "'tool' message"),
        ([{"role": "function", "content": "42"}], "'function' message"),
        ([AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}])], "carries tool_calls"),
        ([HumanMessage("hi", name="alice")], "carries name"),
        ([{"role": "user", "content": "hi", "name": "alice"}], "carries name"),
        ([{"role": "developer", "content": "be brief"}], "'developer' message"),
        ([AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}]).model_dump()], "carries tool_calls"),
        (messages_to_dict([HumanMessage("hi", name="alice")]), "carries name"),
        (
            [AIMessageChunk("", tool_call_chunks=[{"name": "f", "args": "{}", "id": "c1", "index": 0}]).model_dump()],
            "carries tool_calls",
        ),
        (
            [{"type": "AIMessageChunk", "content": "", "tool_call_chunks": [{"name": "f", "args": "{}", "index": 0}]}],
            "carries tool_call_chunks",
        ),
        (
            [AIMessage("", additional_kwargs={"function_call": {"name": "f", "arguments": "{}"}})],
            r"carries additional_kwargs\['function_call'\]",
        ),
        (
            [{"type": "ai", "content": "", "additional_kwargs": {"tool_calls": [{"id": "c1"}]}}],
            r"carries additional_kwargs\['tool_calls'\]",
        ),
        ([{"role": "user", "content": "hi", "weight": 2}], "carries weight"),
        ([{"role": "user", "content": "hi", "additional_kwargs": "x"}], "additional_kwargs that are not a dict"),
        ([HumanMessage(content=[{"type": "text", "text": "h"}, {"type": "text", "text": "i"}])], "list content"),
        ([HumanMessage(content=[{"type": "image", "url": "https://x/y.png"}])], "list content"),
        ([HumanMessage(content=[{"type": "text", "text": "hi", "annotations": [{"type": "citation"}]}])], "list"),
        ([HumanMessage(content=[{"type": "text", "text": 5}])], "list content"),
        ([], "empty"),
        ([42], "int"),
        ({"role": "user", "content": "hi"}, "not a dict"),
    ],
)
def test_what_cannot_be_keyed_is_refused_with_a_typed_error(conversation: object, says: str) -> None:
    with pytest.raises(UnsupportedMessageError, match=says) as raised:
        chat_messages(conversation)
    assert isinstance(raised.value, InvalidInputError)


def test_a_text_model_takes_one_user_message_only() -> None:
    with pytest.raises(UnsupportedMessageError, match="takes text input"):
        text_prompt([SystemMessage("s"), HumanMessage("hi")])


def test_a_completion_request_given_langchain_dicts_says_how_to_convert_them() -> None:
    request = CompletionRequest(messages=[{"type": "human", "content": "hi"}])
    with pytest.raises(InvalidInputError, match=r"inference\.messages\.chat_messages"):
        request.render_bytes("chat")


@pytest.mark.parametrize("messages", [5, 2.5, {"role": "user", "content": "hi"}, "hi"])
def test_messages_that_are_not_a_list_are_refused_with_the_typed_error(messages: object) -> None:
    request = CompletionRequest(messages=messages)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="messages must be a list"):
        request.render_bytes("chat")


def test_one_text_block_alone_is_its_text() -> None:
    """An answer in LangChain's output_version="v1" holds one text block: put back into the history, it keys as
    the string it is (it was refused, so every chat loop under LC_OUTPUT_VERSION=v1 broke at its second turn)."""
    answer = AIMessage(content="Answer 1.").content_blocks
    as_blocks = [HumanMessage("Turn 1?"), AIMessage(content=answer), HumanMessage("Turn 2?")]  # type: ignore[arg-type]
    as_text = [HumanMessage("Turn 1?"), AIMessage("Answer 1."), HumanMessage("Turn 2?")]
    assert chat_messages(as_blocks) == chat_messages(as_text)
    streamed = {"type": "AIMessageChunk", "content": [{"type": "text", "text": "Answer 1.", "index": 0}]}
    assert chat_messages([streamed]) == [{"role": "assistant", "content": "Answer 1."}]
