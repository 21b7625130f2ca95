"""``parrot bench``'s options that name where a run's tables go (no run here)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.apps.cli import add_arguments
from benchmarks.apps.report import command_of, section_name
from benchmarks.apps.suite import Options


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_label_gives_a_run_docs_sections_of_its_own():
    assert parse("chatbot").label is None
    assert section_name("apps-chatbot", Options()) == "apps-chatbot"
    assert section_name("apps-chatbot", Options(size="quick")) == "apps-chatbot-quick"
    quick_cuda = Options(size="quick", label=parse("chatbot", "--label", "cuda").label)
    assert section_name("apps-chatbot", quick_cuda) == "apps-chatbot-quick-cuda"
    assert section_name("apps-summary", Options(label="cuda")) == "apps-summary-cuda"
    assert command_of("chatbot", quick_cuda) == "parrot bench chatbot --quick --label cuda"


@pytest.mark.parametrize("label", ["", "CUDA", "a b", "-x", "h200/1"])
def test_a_label_is_a_plain_name(label, capsys):
    with pytest.raises(SystemExit):
        parse("chatbot", "--label", label)
