"""The SDK's additions for adapters, against a real ``parrot serve``: streamed completions
(``/v1/completions`` and ``/v1/chat/completions`` with ``stream``), chats rendered with the
model's template (``/v1/render_chat``) and the token usage of calls."""

from __future__ import annotations

import pytest

from parrot.sdk import AsyncClient, BadRequestError, NotFoundError, Output, UnauthorizedError

PROMPT = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"max_tokens": 12, "temperature": 0}


def test_stream_completion_yields_the_text_of_a_call_piece_by_piece(parrot):
    deltas = list(parrot.stream_completion(PROMPT, **GREEDY))
    texts = [d.text for d in deltas if d.text]
    assert len(texts) > 1
    assert deltas[-1].usage is not None and deltas[-1].usage.completion_tokens > 0
    assert any(d.finish_reason in ("stop", "length") for d in deltas)
    # The same prompt and settings as a semantic call (the prompt bound by value).
    with parrot.session() as session:
        call = session.submit("{{prompt}}{{reply}}", {"prompt": PROMPT}, {"reply": Output(**GREEDY)})
        assert "".join(texts) == call.outputs["reply"].get()


async def test_async_stream_chat(parrot_url):
    messages = [{"role": "user", "content": "Say hello."}]
    async with AsyncClient(parrot_url) as client:
        deltas = [d async for d in client.stream_chat(messages, **GREEDY)]
    assert len([d for d in deltas if d.text]) > 1
    assert deltas[-1].usage is not None and deltas[-1].usage.prompt_tokens > 0


def test_stream_errors_are_parrot_errors(parrot):
    with pytest.raises(BadRequestError, match="temperature"):
        list(parrot.stream_completion(PROMPT, temperature=-1))
    with pytest.raises(NotFoundError, match="not served"):
        list(parrot.stream_completion(PROMPT, model="no-such-model", max_tokens=2))


def test_render_chat_keeps_placeholders_in_the_model_template(parrot):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "{{question}}"}]
    rendered = parrot.render_chat(messages)
    assert rendered.model == parrot.engines()[0].model
    assert rendered.prompt == "".join(rendered.pieces)
    assert rendered.prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{{question}}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert rendered.pieces[0] == "<|im_start|>system\nBe brief.<|im_end|>\n"
    with pytest.raises(NotFoundError, match="not served"):
        parrot.render_chat(messages, model="no-such-model")
    with pytest.raises(BadRequestError):
        parrot.render_chat([])


def test_usage_of_calls(parrot):
    with parrot.session() as session:
        first = session.submit("Name a fruit: {{a}}", outputs={"a": Output(max_tokens=3, temperature=0)})
        second = session.submit("Name a tree: {{b}}", outputs={"b": Output(max_tokens=5, temperature=0)})
        pending = session.usage([second])
        assert [u.call_id for u in pending.calls] == [second.call_id]
        second.outputs["b"].get()
        first.outputs["a"].get()
        usage = {u.call_id: u for u in session.usage().calls}
        assert set(usage) == {first.call_id, second.call_id}
        assert 0 < usage[first.call_id].completion_tokens <= 3
        assert 0 < usage[second.call_id].completion_tokens <= 5
        assert usage[first.call_id].prompt_tokens > 0
        assert usage[second.call_id].finish_reason in ("stop", "length")
        with pytest.raises(NotFoundError, match="does not exist"):
            session.usage(["call-nope"])
        with pytest.raises(UnauthorizedError):
            parrot.attach(session.session_id, "").usage()
