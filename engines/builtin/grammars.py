"""Compiling output formats for the engine's vocabulary, off the step loop (issue 21).

:class:`GrammarCompiler` owns llguidance's view of the tokenizer (built once, on its
worker), one worker thread, and a bounded LRU cache of compiled formats: for each distinct
format (``OutputFormat.key()``) a *template* matcher, checked and with its first mask
computed (llguidance builds its lexer lazily; the first mask is where a grammar too complex
for the vocabulary fails). The asyncio side awaits :meth:`GrammarCompiler.compile` before it
submits a job; the engine thread only ``deep_copy()``s the template for each generation, so
a slow or bad format never holds up a step, and a bad one is a 400 that changes nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy

from parrot.engines.protocol.errors import BadFormatError
from parrot.engines.protocol.grammar import check_grammar, check_size, matcher_error, to_grammar
from parrot.engines.protocol.token_literals import with_token_literals
from parrot.wire.formats import OutputFormat


@dataclass(frozen=True)
class GrammarLimits:
    max_format_chars: int = 65_536  # --max-format-chars: a format's JSON, in characters (413)
    compile_timeout_s: float = 10.0  # --format-compile-timeout: longer is a 400
    cache_size: int = 64  # --format-cache-size: compiled formats kept (least recently used go)

    @classmethod
    def given(cls, **values: float | None) -> GrammarLimits:
        """The limits with these values, a value None meaning the default (as CLI flags give them)."""
        return cls(**{name: value for name, value in values.items() if value is not None})

    def __post_init__(self) -> None:
        if self.max_format_chars < 1 or self.cache_size < 1 or self.compile_timeout_s <= 0:
            raise ValueError("max_format_chars, cache_size and compile_timeout_s must be positive")


class GrammarCompiler:
    """Compiled, validated template matchers by format, for one tokenizer.

    ``hf_tokenizer``: the engine's transformers tokenizer; ``n_vocab``: the width of the
    model's logits (the LM head may be wider than the tokenizer); ``eos_token_ids``: every
    id that ends a generation (the grammar allows them exactly where it may end).
    """

    def __init__(
        self, hf_tokenizer: Any, n_vocab: int, eos_token_ids: frozenset[int], limits: GrammarLimits
    ) -> None:
        self.limits = limits
        self.n_vocab = n_vocab
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parrot-grammar")
        eos = sorted(eos_token_ids)
        self._tokenizer: Future[llguidance.LLTokenizer] = self._worker.submit(
            llguidance.hf.from_tokenizer, hf_tokenizer, n_vocab=n_vocab, eos_token=eos
        )
        # Added tokens a grammar's literal may stand for (not the end of a generation, which
        # the grammar's end stands for): see parrot.engines.protocol.token_literals.
        self._added: dict[str, int] = {
            text: id
            for text, id in hf_tokenizer.get_added_vocab().items()
            if len(text) > 1 and id < n_vocab and id not in eos_token_ids
        }
        self._lock = threading.RLock()  # read by any event loop's thread and by the worker
        # Compiled formats, least recently used first; formats being compiled apart, so a bad
        # one (never kept) evicts nothing.
        self._cache: OrderedDict[bytes, Future[llguidance.LLMatcher]] = OrderedDict()
        self._compiling: dict[bytes, Future[llguidance.LLMatcher]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    async def compile(self, fmt: OutputFormat) -> llguidance.LLMatcher:
        """The template matcher of ``fmt`` (shared: ``deep_copy()`` it, never advance it).
        Raises :class:`FormatTooLargeError` (413) or :class:`BadFormatError` (400)."""
        check_size(fmt, self.limits.max_format_chars)
        key = fmt.key()
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
            elif (future := self._compiling.get(key)) is None:
                future = self._compiling[key] = self._worker.submit(self._compile, fmt)
                future.add_done_callback(partial(self._settled, key))
        try:
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), self.limits.compile_timeout_s
            )
        except TimeoutError:
            raise BadFormatError(
                f"compiling the output format took longer than {self.limits.compile_timeout_s:g} s "
                "(--format-compile-timeout); simplify it"
            ) from None

    def _settled(self, key: bytes, future: Future[llguidance.LLMatcher]) -> None:
        """A compile ended: a good format joins the cache, the least recently used goes."""
        with self._lock:
            self._compiling.pop(key, None)
            if future.cancelled() or future.exception() is not None:
                return
            self._cache[key] = future
            while len(self._cache) > self.limits.cache_size:
                self._cache.popitem(last=False)

    def _compile(self, fmt: OutputFormat) -> llguidance.LLMatcher:
        """On the worker: the format's grammar, checked for this vocabulary, as a matcher in
        its start state with its first mask computed."""
        tokenizer = self._tokenizer.result()
        if (
            fmt.grammar is not None
            and (tokens := with_token_literals(fmt.grammar, self._added)) != fmt.grammar
        ):
            try:
                return self._checked(fmt, to_grammar(OutputFormat(grammar=tokens)), tokenizer)
            except BadFormatError:
                pass  # said as the format's own error below, if it has one
        return self._checked(fmt, to_grammar(fmt), tokenizer)

    def _checked(
        self, fmt: OutputFormat, grammar: str, tokenizer: llguidance.LLTokenizer
    ) -> llguidance.LLMatcher:
        check_grammar(fmt, grammar, tokenizer)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        bitmask = llguidance.numpy.allocate_token_bitmask(1, self.n_vocab)  # [1, words]
        llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, 0)
        if matcher.is_error():
            raise matcher_error(fmt, matcher)
        return matcher

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
