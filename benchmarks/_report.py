"""Writes a benchmark's table into docs/benchmarks.md between markers of its own."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {torch.get_num_threads()} torch threads, {gpu}, torch {torch.__version__}"


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of docs/benchmarks.md."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\nWritten by the scripts in `benchmarks/`.\n"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)
