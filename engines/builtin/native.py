"""The builtin engine's C++ extension for the CPU (``csrc/``), compiled where it runs.

It holds what eager torch does slowly on the CPU: the fused decode step (fused_decode.py).
torch's C++ extension loader compiles it (g++ and ninja) the first time it
is needed, about 25 s, once per source, torch and CPU, into :func:`extensions_dir`;
``make install`` compiles it ahead (``python -m parrot.engines.builtin.native``). Where it
cannot be built, :func:`load_extension` logs why and returns None, and the engine runs on
torch's own ops.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

from parrot.engines.builtin.model.loader import default_cache_dir

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = (CSRC / "decode_step.cpp",)
# -march=native: the extension is compiled on the machine that runs it (its name hashes the
# CPU's flags). PARROT_NATIVE_ARCH names another target (haswell: AVX2 only), to measure an
# older CPU's code on a newer one (model/cpu_paths.py). -ffast-math lets exp and the
# reductions vectorize; it only reorders float sums.
# -fopenmp: at::parallel_for is OpenMP in torch's headers, serial without it; the library it
# needs (libgomp.so.1) is the one torch has already loaded, so both share one thread pool.
CFLAGS = ["-O3", f"-march={os.environ.get('PARROT_NATIVE_ARCH', 'native')}", "-ffast-math", "-fopenmp"]


def _build_name() -> str:
    """A hash of the sources, flags, torch, Python and this CPU's model and flags, so that a
    build is reused exactly where it was made for (and a stale one never loads)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        cpu = [line for line in cpuinfo.splitlines() if line.startswith(("flags", "model name"))][:2]
    except OSError:
        cpu = [platform.processor()]
    texts = [path.read_text() for path in sorted(CSRC.glob("*.[ch]*"))]  # the headers too
    key = [*texts, *CFLAGS, torch.__version__, sys.version, *cpu]
    return "parrot_native_" + hashlib.sha1("\n".join(key).encode()).hexdigest()[:12]


def extensions_dir() -> Path:
    """Where builds are kept: beside the converted models (``$PARROT_CACHE_DIR/../extensions``)."""
    return default_cache_dir().parent / "extensions"


@cache
def load_extension() -> ModuleType | None:
    """The compiled extension (built on first use), or None (logged) where it cannot be built."""
    name = _build_name()
    folder = extensions_dir() / name
    built = folder / f"{name}.so"
    if built.exists():  # imported directly: torch's loader takes a second to check a build
        spec = importlib.util.spec_from_file_location(name, built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    from torch.utils.cpp_extension import load

    folder.mkdir(parents=True, exist_ok=True)
    log.info("compiling the engine's C++ extension into %s (once, about 30 s)", folder)
    try:
        sources = [str(path) for path in SOURCES]
        return load(
            name, sources, extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], build_directory=str(folder)
        )
    except Exception as error:  # no compiler, no ninja, a failed build: torch's own ops remain
        log.warning("the engine's C++ extension could not be built (torch's ops run instead): %s", error)
        return None


if __name__ == "__main__":  # make install: compile the extension ahead of the first engine
    logging.basicConfig(level=logging.INFO)
    sys.exit(0 if load_extension() is not None else 1)
