"""The model's own marker tokens in its tool syntax (issue 36 §2), with the real tokenizers of
tests/tool_models.py and the marker tokens their real versions hold (Qwen2.5's
``<tool_call>``, text; Mistral's ``[TOOL_CALLS]``, special).

llguidance matches an added token only as a special token, never as a string literal's
text, and its jump-forward tokenizes forced text with the model's tokenizer, which turns
``<tool_call>`` into that token: a grammar that forced the tag gave a token the same
grammar then refused (a 500, found with Qwen2.5-Coder-0.5B). Now a rule literal that is an
added token's text also matches that token, forced runs stop before a token the grammar
refuses, and a syntax's special marker tokens stay in the decoded text."""

from __future__ import annotations

import json

import llguidance
import llguidance.hf
import pytest
import transformers
from tool_models import missing_assets, write_tool_model

from parrot.engines.builtin.constraints import Constraint
from parrot.engines.builtin.grammars import GrammarCompiler, GrammarLimits
from parrot.engines.builtin.tokenizer import Tokenizer
from parrot.engines.protocol.token_literals import with_token_literals
from parrot.wire.openai_schemas import FunctionDefinition
from parrot.wire.tool_calls import plan_tools
from parrot.wire.tool_syntax import syntax_of_template

ADDED = {"<tool_call>": 151657, "</tool_call>": 151658, "[TOOL_CALLS]": 5}
ADD = FunctionDefinition(name="add", parameters={
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"], "additionalProperties": False})  # fmt: skip
needs_assets = pytest.mark.skipif(missing_assets() is not None, reason=missing_assets() or "")


def test_rule_literals_of_an_added_tokens_text_also_match_the_token():
    grammar = "\n".join([
        'start: "<tool_call>" body ("\\n" "<tool_call>" body)*',
        'body: "{" %json {"enum": ["<tool_call>"], "x": "}"} "</tool_call>"',
        'TEXT: /[^<"\\/]*/ "<tool_call>"',  # a terminal: a lexeme holds no special token
        '// "<tool_call>" in a comment',
        'c: "<tool_call>"i | "[TOOL_CALLS]" | "<tool_call>x" | "\\u005bTOOL_CALLS]"',
    ])  # fmt: skip
    assert with_token_literals(grammar, ADDED).splitlines() == [
        'start: ("<tool_call>" | <[151657]>) body ("\\n" ("<tool_call>" | <[151657]>) body)*',
        'body: "{" %json {"enum": ["<tool_call>"], "x": "}"} ("</tool_call>" | <[151658]>)',
        'TEXT: /[^<"\\/]*/ "<tool_call>"',
        '// "<tool_call>" in a comment',
        'c: "<tool_call>"i | ("[TOOL_CALLS]" | <[5]>) | "<tool_call>x" | ("\\u005bTOOL_CALLS]" | <[5]>)',
    ]
    assert with_token_literals(grammar, {}) == grammar


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = write_tool_model(tmp_path_factory.mktemp("qwen") / "qwen2.5", "qwen2.5")
    return transformers.AutoTokenizer.from_pretrained(str(folder)), folder


@needs_assets
def test_a_forced_run_stops_before_a_token_the_grammar_refuses(qwen):
    hf, _ = qwen
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=[eos])
    tag = hf.get_added_vocab()["<tool_call>"]
    # The literal alone (no rewrite): jump-forward tokenizes "ab<tool_call>x" into "ab", the
    # tag's token and "x", and llguidance refuses its own second token.
    template = llguidance.LLMatcher(
        tokenizer, llguidance.LLMatcher.grammar_from_lark('start: "ab<tool_call>" "x"')
    )
    assert tag in template.deep_copy().compute_ff_tokens()
    constraint = Constraint(template)
    run = constraint.forced()
    assert tag not in run and hf.decode(run) == "ab"
    for token in run:
        constraint.consume(token)  # never refused


@needs_assets
def test_the_tool_grammar_takes_the_models_tag_token_and_the_spelled_tag(qwen):
    hf, folder = qwen
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    compiler = GrammarCompiler(hf, len(hf), frozenset({eos}), GrammarLimits())
    syntax = syntax_of_template(Tokenizer(folder).chat_template)
    assert syntax.name == "hermes"
    call = hf.encode('{"name": "add", "arguments": {"a": 3}}', add_special_tokens=False)
    tag, end = hf.get_added_vocab()["<tool_call>"], hf.get_added_vocab()["</tool_call>"]
    newline = hf.encode("\n", add_special_tokens=False)
    as_tokens = [tag, *newline, *call, *newline, end, eos]
    spelled = hf.encode("<", add_special_tokens=False) + hf.encode("tool_call>\n", add_special_tokens=False)
    spelled += (
        call + hf.encode("\n<", add_special_tokens=False) + hf.encode("/tool_call>", add_special_tokens=False)
    )
    assert tag not in spelled
    text_first = hf.encode("Let me add. ", add_special_tokens=False) + as_tokens
    for choice, answers in (("required", [as_tokens, [*spelled, eos]]), ("auto", [as_tokens, text_first])):
        plan = plan_tools([ADD], choice)
        fmt = syntax.output_format(plan)
        template = compiler._compile(fmt)
        for tokens in answers:
            matcher = template.deep_copy()
            assert matcher.validate_tokens(tokens) == len(tokens), (choice, hf.decode(tokens))
            assert matcher.consume_tokens(tokens) and matcher.is_stopped()
    compiler.close()


@needs_assets
def test_a_syntaxs_special_marker_tokens_stay_in_the_text(tmp_path):
    folder = write_tool_model(tmp_path / "devstral", "devstral")
    tokenizer = Tokenizer(folder)
    ids = tokenizer.encode("[TOOL_CALLS]add[ARGS]{}")
    assert tokenizer.decode(ids) == "[TOOL_CALLS]add[ARGS]{}"
    assert tokenizer.decode(tokenizer.encode("</s>")) == ""  # other special tokens still go
    generic = Tokenizer(folder, tool_format="generic")  # Parrot's format: no markers of its own
    assert generic.decode(ids) == "add{}"
    assert json.loads(tokenizer.decode(tokenizer.encode('{"a": 1}'))) == {"a": 1}
