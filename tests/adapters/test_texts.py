"""Markers and call templates: a prompt formatted by LangChain with markers for its texts
is, with the texts put back, the prompt LangChain formats from the texts themselves."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompt_values import ChatPromptValue
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate

from parrot.adapters.langchain.templates import call_template
from parrot.adapters.langchain.texts import Texts, TextSlot

VALUES = {"topic": "tides {and} moons", "style": "a limerick"}


def test_a_prompt_with_markers_splits_into_text_and_slots():
    texts = Texts()
    prompt = PromptTemplate.from_template("Write {style} about {topic}; {{braces}} stay. Again: {topic}")
    marked = prompt.format(**{k: texts.known(k, v) for k, v in VALUES.items()})
    pieces = texts.split(marked)
    assert [p.name if isinstance(p, TextSlot) else p for p in pieces] == [
        "Write ",
        "style",
        " about ",
        "topic",
        "; {braces} stay. Again: ",
        "topic",
    ]
    assert texts.fill(marked, {}) == prompt.format(**VALUES)
    call = call_template(pieces, "poem")
    # Text with a brace is bound by value (never parsed); a slot read twice is one input.
    assert call.template == "Write {{style}} about {{topic}}{{text}}{{topic}}{{poem}}"
    assert call.inputs["text"].value == "; {braces} stay. Again: " and call.output == "poem"
    rendered = call.template.replace("{{poem}}", "")
    for name, slot in call.inputs.items():
        rendered = rendered.replace("{{" + name + "}}", slot.value)
    assert rendered == prompt.format(**VALUES)


def test_placeholder_names_are_valid_and_unique():
    slots = [TextSlot("my-var"), TextSlot("my_var"), TextSlot("1st"), TextSlot("")]
    call = call_template(["Go: ", *slots], "my-var")
    assert call.output == "my_var"
    assert list(call.inputs) == ["my_var_2", "my_var_3", "_1st", "text"]


def test_fill_rebuilds_messages_and_prompt_values():
    texts = Texts()
    reply = TextSlot("reply")
    marker = texts.add(reply)
    value = {
        "chat": ChatPromptValue(messages=[SystemMessage("Hi"), AIMessage(marker)]),
        "pair": (marker, [marker]),
        "n": 3,
    }
    assert texts.slots_in(value) == [reply]
    filled = texts.fill(value, {reply: "Hello"})
    assert filled["chat"].messages[1].content == "Hello" and filled["pair"] == ("Hello", ["Hello"])
    assert filled["n"] == 3 and value["chat"].messages[1].content == marker  # a copy


def test_chat_template_renders_markers_where_the_texts_go(parrot):
    """The server renders the chat with markers as contents: putting the texts back gives
    the render of the chat itself."""
    texts = Texts()
    prompt = ChatPromptTemplate.from_messages([("system", "Answer {style}."), ("human", "About {topic}?")])
    marked = prompt.invoke({k: texts.known(k, v) for k, v in VALUES.items()}).to_messages()
    real = prompt.invoke(VALUES).to_messages()

    def turns(messages):
        roles = {SystemMessage: "system", HumanMessage: "user"}
        return [{"role": roles[type(m)], "content": m.content} for m in messages]

    rendered = parrot.render_chat(turns(marked)).prompt
    assert texts.fill(rendered, {}) == parrot.render_chat(turns(real)).prompt
