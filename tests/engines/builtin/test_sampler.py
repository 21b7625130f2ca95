"""Sampling against transformers' logits processors, seeds, and stop strings."""

from __future__ import annotations

import msgspec
import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from parrot.engines.builtin.sampler import Sampler, SequenceSampling, StopChecker, filter_top_k_top_p
from parrot.engines.protocol.sampling import SamplingParams

CPU = torch.device("cpu")


def seq(prompt=(), **params) -> SequenceSampling:
    return SequenceSampling(SamplingParams(**params), list(prompt), CPU)


def test_greedy_is_argmax_for_a_batch():
    logits = torch.randn(5, 100)
    assert Sampler().sample(logits, [seq() for _ in range(5)]) == logits.argmax(-1).tolist()


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(0)
    logits = torch.randn(1, 50)
    prompt = [3, 7, 7, 20, 49]
    s = seq(prompt, repetition_penalty=1.7)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt]), logits.clone())[0]
    torch.testing.assert_close(s.apply_penalties(logits[0]), expected)


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    logits = torch.zeros(10)
    s = seq([1, 2], presence_penalty=0.5, frequency_penalty=0.25)
    for t in (4, 4, 6):
        s.append(t)
    out = s.apply_penalties(logits)
    assert out[4] == pytest.approx(-(0.5 + 0.5)) and out[6] == pytest.approx(-0.75)
    assert out[1] == 0 and out[2] == 0


@pytest.mark.parametrize("top_k", [1, 5, 40])
def test_top_k_matches_transformers(top_k):
    logits = torch.randn(1, 100)
    expected = TopKLogitsWarper(top_k)(None, logits.clone())[0]
    got = filter_top_k_top_p(logits[0], top_k, 1.0)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9])
def test_top_p_keeps_the_same_nucleus_as_transformers(top_p):
    torch.manual_seed(1)
    logits = torch.randn(1, 200) * 3
    expected = TopPLogitsWarper(top_p)(None, logits.clone())[0]
    got = filter_top_k_top_p(logits[0], 0, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))


def test_seeded_sampling_is_reproducible_whatever_the_batch():
    logits = torch.randn(3, 1000)
    alone = [Sampler().sample(logits[1:2], [seq(temperature=1.0, seed=42)])[0] for _ in range(3)]
    a = seq(temperature=1.0, seed=42)
    batched = []
    others = [seq(temperature=0.7, seed=1), seq(temperature=1.3)]
    for _ in range(3):
        batched.append(Sampler().sample(logits, [others[0], a, others[1]])[1])
    fresh = seq(temperature=1.0, seed=42)
    assert [Sampler().sample(logits[1:2], [fresh])[0] for _ in range(3)] == batched
    assert len(set(alone)) == 1  # a fresh generator each time draws the same first token


def test_temperature_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    s = seq(temperature=1.0, seed=3)
    draws = [Sampler().sample(logits, [s])[0] for _ in range(2000)]
    freq = [draws.count(i) / len(draws) for i in range(3)]
    assert freq == pytest.approx([0.6, 0.3, 0.1], abs=0.05)


def test_top_k_one_equals_greedy():
    logits = torch.randn(4, 64)
    seqs = [seq(temperature=1.5, top_k=1, seed=i) for i in range(4)]
    assert Sampler().sample(logits, seqs) == logits.argmax(-1).tolist()


def test_stop_checker_finds_the_earliest_stop_and_holds_back_prefixes():
    stop = StopChecker(["END", "\n\n", "ab"])
    assert stop.check("hello") is None
    assert stop.check("xx ab yy END") == 3
    assert stop.check("one\n\ntwo") == 3
    assert stop.holdback("text E") == 1
    assert stop.holdback("text EN") == 2
    assert stop.holdback("text\n") == 1
    assert stop.holdback("text a") == 1
    assert stop.holdback("text x") == 0


@pytest.mark.parametrize(
    "body",
    [
        b'{"temperature": -1}',
        b'{"temperature": 11}',
        b'{"top_p": 0}',
        b'{"top_p": 1.5}',
        b'{"top_k": -1}',
        b'{"max_tokens": 0}',
        b'{"seed": -4}',
        b'{"presence_penalty": 3}',
        b'{"frequency_penalty": -2.5}',
        b'{"repetition_penalty": 0}',
        b'{"stop": [""]}',
        b'{"stop_token_ids": [-1]}',
        b'{"unknown": 1}',
    ],
)
def test_sampling_params_reject_absurd_values_naming_the_field(body):
    field = body.split(b'"')[1].decode()
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.json.decode(body, type=SamplingParams)
