"""Routes that framework adapters (LangChain) need besides the Parrot API itself:

- ``POST /v1/render_chat``: a chat in the model's own chat template (as the OpenAI front
  renders ``/v1/chat/completions``), so a client can turn a chat prompt into a semantic
  call template whose constant parts are shared prefixes;
- ``GET /v1/session/{id}/usage``: the token usage of a session's calls (``call_id``
  repeatable to pick some), for the usage metadata of LangChain results.
"""

from __future__ import annotations

from litestar import Controller, get, post
from litestar.params import FromPath, FromQuery, JSONBody

from parrot.engines.protocol.error_docs import BODY, PARAMS, SESSION, error_responses
from parrot.engines.protocol.errors import NotFoundError
from parrot.engines.protocol.schemas import RenderChatRequest
from parrot.platform.api.auth import Sessions
from parrot.platform.api.deps import Core
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.sessions.oneshot import render_chat
from parrot.wire.adapter_bodies import CallUsage, RenderChat, RenderedChat, SessionUsage


def _served_model(core: ServeCore, asked: str | None) -> str:
    served = core.engines.models()
    if asked is None and served:
        return served[0]
    if asked in served:
        return asked
    raise NotFoundError(f"model {asked!r} is not served here; the engines serve {served}")


def _call_usage(call: RequestChain) -> CallUsage:
    results = [chain.result for chain in call.chains if chain.result is not None]
    return CallUsage(
        call_id=call.call_id,
        prompt_tokens=sum(r.prompt_tokens for r in results),
        completion_tokens=sum(len(r.token_ids) for r in results),
        cached_tokens=sum(r.cached_tokens for r in results),
        finish_reason=results[-1].finish_reason if results else None,
    )


class AdapterController(Controller):
    path = "/v1"

    @post("/render_chat", status_code=200, responses=error_responses(BODY, 404, 503))
    async def render_chat_text(self, data: JSONBody[RenderChat], core: Core) -> RenderedChat:
        model = _served_model(core, data.model)
        pieces, _ = await render_chat(core, model, RenderChatRequest(messages=data.messages))
        return RenderedChat(model=model, prompt="".join(pieces), pieces=pieces)

    @get("/session/{session_id:str}/usage", responses=error_responses(PARAMS, SESSION))
    async def session_usage(
        self,
        session_id: FromPath[str],
        sessions: Sessions,
        core: Core,
        call_id: FromQuery[list[str] | None] = None,
    ) -> SessionUsage:
        session = sessions(session_id)
        calls = [core.calls.find(session, c) for c in call_id] if call_id else list(session.calls.values())
        return SessionUsage(session_id=session_id, calls=[_call_usage(c) for c in calls])
