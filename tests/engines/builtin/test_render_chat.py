"""``/render_chat``: the model's chat template in message-boundary pieces, for a ServeCore."""

from __future__ import annotations


def test_pieces_join_to_the_template_and_end_at_messages(client, engine):
    messages = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Sky color?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Grass color?"},
    ]
    r = client.post("/render_chat", json={"messages": messages})
    assert r.status_code == 200, r.text
    pieces = r.json()["pieces"]
    assert "".join(pieces) == engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert len(pieces) == 4 and pieces[0].endswith("<|im_end|>\n") and "Grass" in pieces[-1]
    # A longer chat starts with the same pieces: a chat history is a shared prefix.
    more = client.post(
        "/render_chat", json={"messages": [*messages, {"role": "assistant", "content": "Green."}]}
    )
    assert more.json()["pieces"][:3] == pieces[:3]


def test_bad_chats_get_400(client):
    assert client.post("/render_chat", json={"messages": []}).status_code == 400
    r = client.post("/render_chat", json={"messages": [{"role": "user"}]})
    assert r.status_code == 400 and "content" in r.json()["error"]["message"]
