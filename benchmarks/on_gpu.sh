#!/usr/bin/env bash
# Issue 26's checks on a lent GPU machine (its own image: torch, triton, transformers; no
# network, no install of this project). Run from the repository root:
#     benchmarks/on_gpu.sh [STAGE...]     stages: env tests kernels sweep shared decode apps
# Each stage runs under its own time limit, so one that hangs or fails leaves the others
# their time. Logs (logs.tar.gz) and the updated docs/benchmarks.md go to $OUT.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/gpu-logs /tmp/p/parrot
# The parrot.* namespace over this checkout's folders (setup.py's mapping, without pip).
for r in platform engines sdk adapters web wire migrations; do ln -sfn "$PWD/$r" /tmp/p/parrot/$r; done
export PYTHONPATH=/tmp/p:$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

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
      tests/engines/builtin/kernels/test_kernels.py ;;
    kernels) TAIL=60 stage kernels ${KERNELS_LIMIT:-300} python3 benchmarks/gpu_kernels.py \
      ${GPU_KERNEL_ARGS:-} $( [ -d .gpu_before ] && echo --before .gpu_before ) ;;
    sweep) TAIL=12 stage sweep 110 python3 benchmarks/gpu_kernels.py --sweep ;;
    shared) TAIL=30 stage shared 100 bash -c 'python3 benchmarks/attention_kernels.py --prefixes 1024 4096 16384 &&
      python3 benchmarks/attention_kernels.py --prefixes 128 256 512 1024 --seqs 2 4 8 --section thresholds' ;;
    decode) TAIL=30 stage decode 200 python3 benchmarks/gpu_decode_step.py ;;
    apps) TAIL=30 stage apps 300 bash benchmarks/gpu_apps.sh ;;
    *) echo "unknown stage $1" ;;
  esac
}

for s in ${@:-env tests kernels sweep shared decode apps}; do run_stage "$s"; done
cp docs/benchmarks.md "$OUT/benchmarks.md"
tar -czf "$OUT/logs.tar.gz" -C /tmp gpu-logs
