"""Sampling against transformers' logits processors, seeds, stop strings, parameter validation."""

from __future__ import annotations

import json

import msgspec
import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from parrot.engines.builtin.sampler import (
    RepeatedCallStop,
    Sampler,
    SequenceSampling,
    StopChecker,
    apply_penalties,
    filter_top_k_top_p,
)
from parrot.wire.sampling import SamplingParams

CPU = torch.device("cpu")


def seq(prompt=(), **params) -> SequenceSampling:
    return SequenceSampling(SamplingParams(**params), list(prompt), CPU)


def gen(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- greedy ------------------------------------------------------------------------------


def test_greedy_is_argmax_for_a_batch():
    logits = gen(0, 5, 100)
    assert Sampler().sample(logits, [seq() for _ in range(5)]) == logits.argmax(-1).tolist()


def test_greedy_rows_in_a_mixed_batch_are_argmax_and_the_input_is_untouched():
    logits = gen(1, 4, 100)
    before = logits.clone()
    seqs = [seq(), seq(temperature=1.0, seed=1), seq(temperature=0.0), seq(temperature=2.0, top_p=0.5)]
    tokens = Sampler().sample(logits, seqs)
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()
    assert torch.equal(logits, before)


def test_top_k_one_equals_greedy():
    logits = gen(2, 4, 64)
    seqs = [seq(temperature=1.5, top_k=1, seed=i) for i in range(4)]
    assert Sampler().sample(logits, seqs) == logits.argmax(-1).tolist()


def test_greedy_applies_penalties_before_the_argmax():
    logits = torch.tensor([[1.0, 3.0, 2.5, 0.0]])
    assert Sampler().sample(logits, [seq([1], repetition_penalty=2.0)]) == [2]
    s = seq(presence_penalty=1.0)
    s.append(1)
    assert Sampler().sample(logits, [s]) == [2]


# -- penalties -----------------------------------------------------------------------------


def test_repetition_penalty_matches_transformers_over_prompt_and_generated():
    logits = gen(3, 2, 50) * 3
    prompts = [[3, 7, 7, 20, 49], [0, 1, 2]]
    seqs = [seq(prompts[0], repetition_penalty=1.7), seq(prompts[1], repetition_penalty=0.6)]
    seqs[0].append(11)
    seqs[0].append(3)
    seqs[1].append(40)
    contexts = [prompts[0] + [11, 3], prompts[1] + [40]]
    got = apply_penalties(logits, seqs)
    for i, (s, ctx) in enumerate(zip(seqs, contexts, strict=True)):
        processor = RepetitionPenaltyLogitsProcessor(s.params.repetition_penalty)
        expected = processor(torch.tensor([ctx]), logits[i : i + 1].clone())[0]
        torch.testing.assert_close(got[i], expected, rtol=0, atol=0)


def test_repetition_penalty_ignores_ids_beyond_the_logits_vocab():
    logits = gen(4, 1, 10)
    got = apply_penalties(logits, [seq([2, 10, 12], repetition_penalty=2.0)])
    expected = RepetitionPenaltyLogitsProcessor(2.0)(torch.tensor([[2, 10, 12]]), logits.clone())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    logits = gen(5, 2, 10)
    a = seq([1, 2], presence_penalty=0.5, frequency_penalty=0.25)
    b = seq([4], frequency_penalty=-1.0)
    for t in (4, 4, 6, 1):
        a.append(t)
    b.append(9)
    got = apply_penalties(logits, [a, b])
    expected = logits.clone()
    expected[0, 4] -= 0.5 + 2 * 0.25
    expected[0, 6] -= 0.5 + 0.25
    expected[0, 1] -= 0.5 + 0.25
    expected[1, 9] += 1.0
    torch.testing.assert_close(got, expected)
    assert a.counts == {4: 2, 6: 1, 1: 1}


def test_penalties_do_not_touch_rows_without_them():
    logits = gen(6, 3, 20)
    s = seq([1, 2, 3], repetition_penalty=3.0, presence_penalty=1.0)
    s.append(5)
    got = apply_penalties(logits, [seq([1, 2, 3]), s, seq([5])])
    assert torch.equal(got[0], logits[0]) and torch.equal(got[2], logits[2])
    assert not torch.equal(got[1], logits[1])


# -- top-k / top-p ---------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [1, 5, 40, 100, 500])
def test_top_k_matches_transformers(top_k):
    logits = gen(7, 1, 100)
    expected = TopKLogitsWarper(top_k)(None, logits.clone())
    assert torch.equal(filter_top_k_top_p(logits, [top_k], None), expected)


@pytest.mark.parametrize("top_p", [0.05, 0.1, 0.5, 0.9, 0.999])
def test_top_p_matches_transformers(top_p):
    logits = gen(8, 1, 200) * 3
    expected = TopPLogitsWarper(top_p)(None, logits.clone())
    assert torch.equal(filter_top_k_top_p(logits, None, [top_p]), expected)


@pytest.mark.parametrize("top_p", [0.5, 0.75, 0.875])
def test_top_p_at_an_exact_boundary_matches_transformers(top_p):
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()  # cumulative masses are exact
    expected = TopPLogitsWarper(top_p)(None, logits.clone())
    assert torch.equal(filter_top_k_top_p(logits, None, [top_p]), expected)


def test_top_p_keeps_the_most_likely_token_however_small_p_is():
    logits = gen(3, 1, 1000)  # the cumulative mass of this row rounds to just below 1
    got = filter_top_k_top_p(logits, None, [1e-9])
    assert got.isfinite().sum() == 1 and got[0].argmax() == logits[0].argmax()
    assert torch.equal(got, TopPLogitsWarper(1e-9)(None, logits.clone()))


def test_per_row_top_k_then_top_p_match_transformers_in_one_batch():
    logits = gen(9, 4, 300) * 2
    top_k, top_p = [0, 10, 50, 3], [0.7, 1.0, 0.3, 0.95]
    got = filter_top_k_top_p(logits, top_k, top_p)
    for i in range(4):
        row = logits[i : i + 1].clone()
        if top_k[i]:
            row = TopKLogitsWarper(top_k[i])(None, row)
        if top_p[i] < 1:
            row = TopPLogitsWarper(top_p[i])(None, row)
        assert torch.equal(got[i : i + 1], row), i


def test_sampled_tokens_stay_inside_the_top_k_and_the_nucleus():
    logits = gen(10, 1, 50) * 2
    allowed_k = set(logits[0].topk(5).indices.tolist())
    s = seq(temperature=2.0, top_k=5, seed=0)
    assert {Sampler().sample(logits, [s])[0] for _ in range(300)} <= allowed_k
    nucleus = filter_top_k_top_p(logits, None, [0.5])[0].isfinite().nonzero().flatten().tolist()
    s = seq(temperature=1.0, top_p=0.5, seed=0)
    assert {Sampler().sample(logits, [s])[0] for _ in range(300)} <= set(nucleus)


# -- randomness ------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_whatever_the_batch():
    logits = gen(11, 3, 1000)
    params = dict(temperature=1.0, top_p=0.9, seed=42)
    alone = seq(**params)
    solo = [Sampler().sample(logits[1:2], [alone])[0] for _ in range(20)]
    mine = seq(**params)
    others = [seq(temperature=0.7, seed=1), seq(temperature=1.3, top_k=20)]
    batched = [Sampler().sample(logits, [others[0], mine, others[1]])[1] for _ in range(20)]
    assert batched == solo
    assert len(set(solo)) > 1  # the generator advances: not the same token every step


def test_unseeded_sequences_draw_differently():
    logits = torch.zeros(1, 1000)
    a, b = seq(temperature=1.0), seq(temperature=1.0)
    draws = [Sampler().sample(logits, [a])[0] for _ in range(10)]
    assert draws != [Sampler().sample(logits, [b])[0] for _ in range(10)]


def test_temperature_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    s = seq(temperature=1.0, seed=3)
    draws = Sampler().sample(probs.log().expand(2000, 3).contiguous(), [s] * 2000)
    freq = [draws.count(i) / len(draws) for i in range(3)]
    assert freq == pytest.approx(probs.tolist(), abs=0.05)


def test_temperature_sharpens_and_flattens_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0]]).expand(2000, 3).contiguous()
    for temperature in (0.5, 2.0):
        s = seq(temperature=temperature, seed=4)
        draws = Sampler().sample(logits, [s] * 2000)
        expected = (logits[0] / temperature).softmax(-1).tolist()
        assert [draws.count(i) / 2000 for i in range(3)] == pytest.approx(expected, abs=0.05)


# -- stop strings ----------------------------------------------------------------------------


def test_stop_checker_finds_the_earliest_stop():
    stop = StopChecker(["END", "\n\n", "ab"])
    assert stop.check("hello") is None
    assert stop.check("xx ab yy END") == 3
    assert stop.check("one\n\ntwo END") == 3
    assert stop.check("END") == 0


def test_stop_checker_with_overlapping_stops():
    stop = StopChecker(["bcd", "abc"])
    assert stop.check("xabcd") == 1
    assert stop.check("xbcd abc") == 1
    assert StopChecker(["aa"]).check("baaa") == 1


def test_holdback_keeps_the_longest_possible_start_of_a_stop():
    stop = StopChecker(["END", "\n\n", "ab", "aab"])
    assert stop.holdback("text E") == 1
    assert stop.holdback("text EN") == 2
    assert stop.holdback("text\n") == 1
    assert stop.holdback("text a") == 1
    assert stop.holdback("text aa") == 2
    assert stop.holdback("text x") == 0
    assert stop.holdback("") == 0
    assert StopChecker([]).holdback("abc") == 0


def test_streaming_with_holdback_never_shows_part_of_a_stop():
    stop = StopChecker(["<|end|>", "STOP"])
    full = "Hello <|en world ST <|end|> tail"
    shown = ""
    for n in range(1, len(full) + 1):
        text = full[:n]
        cut = stop.check(text)
        if cut is not None:
            shown = text[:cut]
            break
        shown = text[: len(text) - stop.holdback(text)]
    assert shown == "Hello <|en world ST "
    # At every step before the stop, what was shown is a prefix of the final text.
    for n in range(1, full.index("<|end|>")):
        text = full[:n]
        visible = text[: len(text) - stop.holdback(text)]
        assert "Hello <|en world ST ".startswith(visible)


# -- parameter validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"max_tokens": 0}',
        b'{"max_tokens": 1000001}',
        b'{"temperature": -1}',
        b'{"temperature": 11}',
        b'{"top_p": 0}',
        b'{"top_p": 1.5}',
        b'{"top_k": -1}',
        b'{"top_k": 1000001}',
        b'{"seed": -4}',
        b'{"seed": 9223372036854775808}',
        b'{"stop": [""]}',
        b'{"stop": ["' + b"x" * 257 + b'"]}',
        b'{"stop": [' + b",".join(b'"s%d"' % i for i in range(17)) + b"]}",
        b'{"stop_token_ids": [-1]}',
        b'{"stop_token_ids": [' + b",".join(b"1" for _ in range(65)) + b"]}",
        b'{"ignore_eos": "yes"}',
        b'{"presence_penalty": 3}',
        b'{"presence_penalty": -2.5}',
        b'{"frequency_penalty": -2.5}',
        b'{"frequency_penalty": 2.1}',
        b'{"repetition_penalty": 0}',
        b'{"repetition_penalty": 11}',
        b'{"unknown": 1}',
    ],
)
def test_sampling_params_reject_absurd_values_naming_the_field(body):
    field = body.split(b'"')[1].decode()
    with pytest.raises(msgspec.ValidationError, match=rf"\b{field}\b"):
        msgspec.json.decode(body, type=SamplingParams)


def test_sampling_params_defaults_and_limits_are_accepted():
    params = msgspec.json.decode(b"{}", type=SamplingParams)
    assert params == SamplingParams() and params.is_greedy and not params.has_penalties
    edge = (
        b'{"temperature": 10, "top_p": 1, "top_k": 1000000, "seed": 0, "stop": ["a"], "stop_token_ids": [0]}'
    )
    assert not msgspec.json.decode(edge, type=SamplingParams).is_greedy
    assert SamplingParams(temperature=1.0, top_k=1).is_greedy


def test_a_repeated_call_ends_the_tool_list_whole_and_streams_no_partial_call():
    """Issue 36: a generic tool answer's list of calls ends where a call comes again; the
    text is cut after the last new call and closed, and what streams never runs past it."""
    call = '{"name":"get_weather","arguments":{"city":"Oslo"}}'
    other = '{"name":"get_weather","arguments":{"city":"Bergen"}}'
    whole = '{"tool_calls":[' + call + ", " + other  # the calls before the repeat
    text = whole + ", " + call + ", " + call
    stop = RepeatedCallStop([])
    for end in range(1, len(text) + 1):  # a character at a time, as tokens come
        assert end - stop.holdback(text[:end]) <= len(whole), end  # never a repeat's text
        if (cut := stop.check(text[:end])) is not None:
            break
    assert end == len(whole + ", " + call)  # as soon as the repeat is whole
    answer = json.loads(text[:cut] + stop.closing)
    assert [c["arguments"]["city"] for c in answer["tool_calls"]] == ["Oslo", "Bergen"]


def test_a_stop_string_cuts_a_tool_answer_as_sent():
    stop = RepeatedCallStop(["Bergen"])
    text = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Bergen"}}'
    assert stop.check(text) == text.index("Bergen") and stop.closing == ""
    plain = RepeatedCallStop([])
    response = '{"response":"It is sunny in Oslo'
    assert plain.check(response) is None and plain.holdback(response) == 0  # a response streams
