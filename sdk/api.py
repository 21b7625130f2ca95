"""The public API of the Parrot SDK, in one import::

    from parrot.sdk import Client, Input, Output, semantic_function

(``parrot.sdk`` re-exports these names; importing them from ``parrot.sdk.api`` works too.)
"""

from parrot.sdk.aclient import AsyncClient, AsyncSession, AsyncVar
from parrot.sdk.chat import ChatReply, ToolCall
from parrot.sdk.client import Client, Session, Var
from parrot.sdk.config import ClientConfig
from parrot.sdk.errors import (
    AuthError,
    BadRequestError,
    ConflictError,
    DefinitionError,
    EngineUnavailableError,
    ForbiddenError,
    GraphError,
    NotFoundError,
    ParrotError,
    PayloadTooLargeError,
    ProducerFailedError,
    ServerUnreachableError,
    ServiceUnavailableError,
    TemplateError,
    TooManyRequestsError,
    UnauthorizedError,
    WaitTimeoutError,
)
from parrot.sdk.functions import SemanticFunction, semantic_function
from parrot.sdk.handles import Call, current_session
from parrot.sdk.params import Input, Output
from parrot.sdk.results import (
    CallInfo,
    CallUsage,
    EngineInfo,
    Health,
    RenderedChat,
    SessionInfo,
    SessionUsage,
    VarInfo,
)
from parrot.sdk.streams import CompletionDelta

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "AsyncVar",
    "AuthError",
    "BadRequestError",
    "Call",
    "CallInfo",
    "CallUsage",
    "ChatReply",
    "Client",
    "ClientConfig",
    "CompletionDelta",
    "ConflictError",
    "DefinitionError",
    "EngineInfo",
    "EngineUnavailableError",
    "ForbiddenError",
    "GraphError",
    "Health",
    "Input",
    "NotFoundError",
    "Output",
    "ParrotError",
    "PayloadTooLargeError",
    "ProducerFailedError",
    "RenderedChat",
    "SemanticFunction",
    "ServerUnreachableError",
    "ServiceUnavailableError",
    "Session",
    "SessionInfo",
    "SessionUsage",
    "TemplateError",
    "TooManyRequestsError",
    "ToolCall",
    "UnauthorizedError",
    "Var",
    "VarInfo",
    "WaitTimeoutError",
    "current_session",
    "semantic_function",
]
