#!/usr/bin/env bash
# The chatbot (shared system prompt) and map-reduce workloads of `parrot bench` on a GPU host
# (issue 26): Parrot against the request-level baseline on the same builtin engine, on a
# random-weight 1B-class Llama made here (no checkpoint can be downloaded there).
#
# Run from the repository root, as one command on a lent GPU machine: its image has torch,
# transformers, tokenizers, ... but not the server's other packages and no package index, so
# they come as wheels in .whl/ (Python 3.12, x86-64), and the model's tokenizer files
# (tokenizer.json, tokenizer_config.json of the bundled model) in .gpu_assets/. Neither is in
# git: carry both. Tables go into docs/benchmarks.md (sections `apps-*-cuda`, `--label`); the
# docs, the plots and every stage's log are copied to $OUT (the files that come back).
#
# Device time is lent by the minute, so the whole script keeps to a budget (GPU_APPS_BUDGET
# seconds, default 180): each workload runs at the quick size, then at the full size while
# time is left; a stage is killed (with its engine and ServeCore) when the budget is spent,
# its finished runs still in its log (one line per run and side).
#
# The engines' and ServeCores' own logs (at debug: the engine's step trace says which steps
# replayed a CUDA graph) go to $OUT/processes-WORKLOAD-SIZE.
#
# Settings (environment): GPU_APPS_RTT_MS (0), GPU_APPS_DEVICE (cuda), GPU_APPS_MODEL (1b | tiny), GPU_APPS_SIZES
# ("quick full"), GPU_APPS_RUNS (3), GPU_APPS_KV (KV cache, 16GiB), GPU_APPS_LABEL (cuda),
# GPU_APPS_WORKLOADS ("chatbot map-reduce"), GPU_APPS_BUDGET (180), GPU_APPS_ENGINE_ARGS (more
# engine flags, space-separated, e.g. --attention-backend=torch). On a CPU, to check the
# script itself:
#   GPU_APPS_DEVICE=cpu GPU_APPS_MODEL=tiny GPU_APPS_KV=1GiB GPU_APPS_LABEL=cpu-check \
#     GPU_APPS_RUNS=1 GPU_APPS_SIZES=quick bash benchmarks/gpu_apps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
device=${GPU_APPS_DEVICE:-cuda}
model_size=${GPU_APPS_MODEL:-1b}
sizes=${GPU_APPS_SIZES:-quick full}
budget=${GPU_APPS_BUDGET:-180}
runs=${GPU_APPS_RUNS:-3}
rtt=${GPU_APPS_RTT_MS:-0}  # a simulated client round trip before every request, as on the CPU tables
kv=${GPU_APPS_KV:-16GiB}
label=${GPU_APPS_LABEL:-cuda}
workloads=${GPU_APPS_WORKLOADS:-chatbot map-reduce}
py=${PYTHON:-python3}
out=${OUT:-/tmp/gpu-apps-out}
work=/tmp/parrot-gpu-apps
mkdir -p "$out" "$work"
start=$SECONDS

# A stage: its output in $out/NAME.log (the last lines shown), killed after LIMIT seconds.
stage() {
    local name=$1 limit=$2 rc=0
    shift 2
    echo "== $name (at $((SECONDS - start)) s, limit $limit s)"
    timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
    tail -n "${TAIL_LINES:-25}" "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    return "$rc"
}

# The server's packages the image lacks; the parrot namespace (import names parrot.platform
# <- platform/, ...: there is no install there).
if compgen -G ".whl/*.whl" >/dev/null && [ "${GPU_APPS_WHEELS:-1}" = 1 ]; then
    stage wheels 120 "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$work/site" .whl/*.whl
fi
mkdir -p "$work/ns/parrot"
for r in platform engines sdk adapters web wire migrations; do ln -sfn "$PWD/$r" "$work/ns/parrot/$r"; done
export PYTHONPATH="$work/site:$work/ns:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
stage versions 60 "$py" -c "
import sys, torch, transformers, triton, litestar, parrot.cli.main
print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'triton', triton.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"

model="$work/llama-$model_size"
rm -rf "$model"
stage model 180 "$py" benchmarks/random_llama.py "$model" --tokenizer .gpu_assets --size "$model_size" \
    --device "$device"

# More engine flags: GPU_APPS_ENGINE_ARGS="--attention-backend=torch ..." (each one word).
engine_args=(--engine-arg=--device="$device" --engine-arg=--model="$model")
for flag in ${GPU_APPS_ENGINE_ARGS:-}; do engine_args+=(--engine-arg="$flag"); done
# The Triton attention kernels (the default on CUDA) are the least tried part: if the first
# workload fails with them, the rest runs once more on torch's attention, labelled so.
fallback=0
[ "$device" = cuda ] && [[ "${GPU_APPS_ENGINE_ARGS:-}" != *--attention-backend* ]] && fallback=1
run_label=$label

failed=() cut=() skipped=()
for size in $sizes; do
    quick=()
    [ "$size" = quick ] && quick=(--quick)
    for w in $workloads; do
        for try in 1 2; do
            left=$((budget - (SECONDS - start)))
            if [ "$left" -lt 45 ] || [[ " ${failed[*]} ${cut[*]} " == *" $w/"* ]]; then
                skipped+=("$w/$size")
                break
            fi
            rc=0
            stage "bench-$w-$size-$run_label" "$left" "$py" -m parrot.cli.main bench "$w" \
                "${quick[@]}" --docs --label "$run_label" --runs "$runs" --rtt-ms "$rtt" \
                --logs "$out/processes-$w-$size" --kv-cache-memory "$kv" "${engine_args[@]}" || rc=$?
            if [ "$rc" = 0 ]; then
                fallback=0  # the engine works as it is
                break
            elif [ "$rc" = 124 ]; then
                cut+=("$w/$size")
                break
            elif [ "$fallback" = 1 ]; then
                fallback=0
                engine_args+=(--engine-arg=--attention-backend=torch)
                run_label="$label-torch-attention"
                echo "== $w/$size failed: again with --attention-backend=torch, label $run_label"
            else
                failed+=("$w/$size")
                break
            fi
        done
    done
done

mkdir -p "$out/docs/img"
cp docs/benchmarks.md "$out/docs/"
cp docs/img/apps-*-"$label"*.png "$out/docs/img/" 2>/dev/null || true
echo "== done after $((SECONDS - start)) s; failed: ${failed[*]:-none}; cut at the budget: ${cut[*]:-none};" \
    "skipped: ${skipped[*]:-none}"
[ ${#failed[@]} -eq 0 ]
