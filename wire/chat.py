"""One turn of a chat, as a client sends it to be rendered with a model's chat template
(``POST /v1/render_chat`` of the ServeCore, ``/render_chat`` of an engine).

A turn may carry the tool fields of an OpenAI conversation: an assistant's ``tool_calls``
and a tool result's ``tool_call_id``. Chat templates see only ``role`` and ``content``, so
these turns are first rewritten into plain ones in Parrot's generic tool format
(:func:`parrot.wire.tool_calls.render_turns`); a renderer that gets them unrewritten sees
only their content.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from parrot.wire.openai_schemas import ToolCall


class ChatTurn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    role: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    content: str
    tool_calls: list[ToolCall] | None = None  # an assistant's calls of tools
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # a tool result: the tool's name (found from the call when absent)
