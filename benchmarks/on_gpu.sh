#!/usr/bin/env bash
# Issue 26's checks on a lent GPU machine (its own image: torch, triton, transformers; no
# network, no install of this project). Run from the repository root:
#     benchmarks/on_gpu.sh [STAGE...]     stages: env tests engine kernels sweep shared decode apps
# Each stage runs under its own time limit, so one that hangs or fails leaves the others
# their time. Logs (logs.tar.gz) and the updated docs/benchmarks.md go to $OUT.
#
# Carry .whl (the server's wheels for the image's Python, see gpu_apps.sh), .gpu_assets (the
# bundled model's tokenizer files) and, for the kernels' before/after columns, .gpu_before (a
# copy of an earlier engines/builtin/kernels as package kernels_before). On an H200 (issue 26,
# 2026-11-26) the stages took: tests 40 s, engine 22 s, kernels about 50 s, shared 16 s, decode
# 24 s, apps 65 s per workload at the quick size (GPU_APPS_BUDGET, GPU_APPS_SIZES,
# GPU_APPS_WORKLOADS choose), plus about 70 s for the machine to start.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/gpu-logs /tmp/p/parrot
# The parrot.* namespace over this checkout's folders (setup.py's mapping, without pip).
for r in platform engines sdk adapters web wire migrations; do ln -sfn "$PWD/$r" /tmp/p/parrot/$r; done
# The server's packages the image lacks come as wheels in .whl/ (carried; see gpu_apps.sh).
SITE=/tmp/parrot-gpu-apps/site
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl \
    >/tmp/gpu-logs/wheels.log 2>&1 && echo "== wheels installed" || tail -5 /tmp/gpu-logs/wheels.log
fi
export PYTHONPATH=/tmp/p:$PWD:$PWD/benchmarks:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

stage() {  # NAME SECONDS COMMAND...
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" >"/tmp/gpu-logs/$name.log" 2>&1
  rc=$?
  echo "== $name: rc=$rc in $(($(date +%s) - start)) s"
  tail -n "${TAIL:-30}" "/tmp/gpu-logs/$name.log" | cut -c1-400
}

run_stage() {
  case $1 in
    env) stage env 60 bash -c 'nvidia-smi -L; python3 -c "import torch, triton, transformers;
print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name(0),
torch.cuda.get_device_properties(0).multi_processor_count)"' ;;
    tests) TAIL=8 stage tests 150 python3 -m pytest --noconftest -q -n 8 -p no:cacheprovider \
      tests/engines/builtin/kernels/test_kernels.py tests/engines/builtin/test_cuda_graphs.py ;;
    engine) TAIL=8 stage engine 90 env PARROT_TOKENIZER_DIR=.gpu_assets python3 -m pytest -q -p no:cacheprovider \
      tests/engines/builtin/kernels/test_triton_engine.py ;;
    kernels) TAIL=60 stage kernels ${KERNELS_LIMIT:-200} python3 benchmarks/gpu_kernels.py \
      ${GPU_KERNEL_ARGS:-} $( [ -d .gpu_before ] && echo --before .gpu_before ) ;;
    sweep) TAIL=12 stage sweep 110 python3 benchmarks/gpu_kernels.py --sweep ;;
    shared) TAIL=30 stage shared 100 bash -c 'python3 benchmarks/attention_kernels.py --prefixes 1024 4096 16384 &&
      python3 benchmarks/attention_kernels.py --prefixes 2048 4096 8192 --seqs 4 8 16 --section thresholds' ;;
    decode) TAIL=16 stage decode 120 python3 benchmarks/gpu_decode_step.py ;;
    apps) TAIL=40 stage apps $((${GPU_APPS_BUDGET:-180} + 30)) env OUT=/tmp/gpu-logs/apps GPU_APPS_WHEELS=0 \
      bash benchmarks/gpu_apps.sh ;;
    *) echo "unknown stage $1" ;;
  esac
}

for s in ${@:-env tests engine kernels sweep shared decode apps}; do
  run_stage "$s"
  # After every stage, so that a call stopped at its time limit still brings back what ran.
  cp docs/benchmarks.md "$OUT/benchmarks.md"
  tar -czf "$OUT/logs.tar.gz" -C /tmp gpu-logs
done
