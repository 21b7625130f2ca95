"""Text contexts: the OpenAI engine's equivalent of the builtin engine's KV contexts.

A context is text. A child forked from a parent sees the parent's text as it was at the
fork, by reference (the parent's node is kept alive by its children even after it is
freed), so a system prompt shared by many forks is held once. A context stores only the
text filled into it (and generated into it) after the fork; its whole text is assembled
when a generation needs it.

Lengths ("tokens" in the engine API) are counted in characters: this engine has no
tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parrot.engines.protocol.errors import (
    BadRequestError,
    ContextConflictError,
    ParrotError,
    UnknownContextError,
)


@dataclass(eq=False)
class TextContext:
    context_id: int
    parent: TextContext | None = None
    parent_id: int | None = None
    parent_len: int = 0  # characters of the parent's text this context sees (its length at the fork)
    own: str = ""  # text appended to this context itself

    def __len__(self) -> int:
        return self.parent_len + len(self.own)

    def append(self, text: str) -> None:
        self.own += text

    def text(self) -> str:
        """The whole text: the visible part of each ancestor, then its own."""
        chunks: list[str] = []
        node: TextContext | None = self
        visible = len(self)
        while node is not None:
            if visible > node.parent_len:
                chunks.append(node.own[: visible - node.parent_len])
            # A fork may see less of its parent than the parent sees of its own parent.
            visible = min(visible, node.parent_len)
            node = node.parent
        return "".join(reversed(chunks))


class ContextStore:
    """The contexts of one engine, by id."""

    def __init__(self) -> None:
        self._contexts: dict[int, TextContext] = {}

    def __len__(self) -> int:
        return len(self._contexts)

    def get(self, context_id: int) -> TextContext | None:
        return self._contexts.get(context_id)

    def context_for(
        self, context_id: int, parent_id: int | None, parent_len: int | None = None
    ) -> TextContext:
        """The context ``context_id``, created (forked from ``parent_id``, its first
        ``parent_len`` characters or all of it, if given) when new.

        An existing context is returned as is when ``parent_id`` is None or its own parent;
        another parent is a conflict (as on the builtin engine)."""
        if parent_len is not None and parent_id is None:
            raise BadRequestError("parent_len needs parent_context_id")
        ctx = self._contexts.get(context_id)
        if ctx is not None:
            if parent_id is not None and parent_id != ctx.parent_id:
                raise ContextConflictError(
                    f"context {context_id} already exists with parent {ctx.parent_id}, not {parent_id}"
                )
            return ctx
        parent = None
        length = 0
        if parent_id is not None:
            if parent_id == context_id:
                raise BadRequestError("a context cannot be its own parent")
            parent = self._contexts.get(parent_id)
            if parent is None:
                raise UnknownContextError(f"parent context {parent_id} does not exist")
            length = len(parent) if parent_len is None else parent_len
            if parent_len is not None and not 0 < parent_len <= len(parent):
                raise BadRequestError(
                    f"cannot fork {length} characters of context {parent_id}: it holds {len(parent)}"
                )
        ctx = TextContext(context_id, parent, parent_id, length)
        self._contexts[context_id] = ctx
        return ctx

    def existing(
        self, context_id: int, parent_id: int | None, parent_len: int | None = None, tail: str = ""
    ) -> TextContext:
        """For a generation: the context, or a new fork of ``parent_id`` (or a new root when
        the generation brings its own prompt ``tail``)."""
        if parent_id is None and context_id not in self._contexts and not tail:
            raise UnknownContextError(
                f"context {context_id} does not exist: fill it first, or pass parent_context_id to fork"
            )
        return self.context_for(context_id, parent_id, parent_len)

    def target(
        self,
        context_id: int,
        parent_id: int | None,
        parent_len: int | None,
        token_ids: list[int] | None,
        tail: str | None,
    ) -> tuple[TextContext, bool]:
        """The context a generation runs in, with its prompt ``tail`` appended; and whether
        it was created for it."""
        if token_ids:
            raise BadRequestError("an openai engine's contexts are text: give the prompt as text")
        created = self.get(context_id) is None
        ctx = self.existing(context_id, parent_id, parent_len, tail or "")
        if tail:
            ctx.append(tail)
        return ctx, created

    def mark_checkpoints(self, ctx: TextContext, marks: Sequence[tuple[int, int]], created: bool) -> None:
        """Checkpoints ``(context id, length)`` of ``ctx``; none of them (nor ``ctx``, if
        ``created``) when one fails."""
        try:
            for context_id, length in marks:
                self.checkpoint(context_id, ctx, length)
        except ParrotError:
            self.forget(ctx.context_id if created else None, marks)
            raise

    def forget(self, context_id: int | None, marks: Sequence[tuple[int, int]]) -> None:
        """Undo a request that failed: the context it created, and its checkpoints."""
        if context_id is not None:
            self.free(context_id)
        for cid, _ in marks:
            self.free(cid)

    def checkpoint(self, context_id: int, parent: TextContext, length: int) -> None:
        """A new context: the first ``length`` characters of ``parent``."""
        if context_id in self._contexts:
            raise ContextConflictError(f"checkpoint context {context_id} already exists")
        if not 0 < length <= len(parent):
            raise BadRequestError(f"checkpoint length {length} is outside the prompt (1..{len(parent)})")
        self._contexts[context_id] = TextContext(context_id, parent, parent.context_id, length)

    def free(self, context_id: int) -> int:
        """Forget a context; returns the characters it held itself (0 if unknown). Its
        children keep working: they hold their parent's node."""
        ctx = self._contexts.pop(context_id, None)
        return len(ctx.own) if ctx is not None else 0

    def own_chars(self) -> int:
        return sum(len(c.own) for c in self._contexts.values())
