#!/usr/bin/env bash
# The first start of a new user (issue 38): a fresh clone of this repository, `make run`,
# until /healthz answers ok, each stage timed from the lines `make run` prints. Parrot's
# caches (the converted model, the compiled C++ extension) start empty; pip's download
# cache is left off with NO_PIP_CACHE=1 (then every wheel is downloaded, as on a new
# machine). Run it on a quiet machine; it prints a Markdown table.
#
#   benchmarks/first_start.sh [PORT]     (default 9400; the engine on PORT+1)
set -euo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
port=${1:-9400}
work=$(mktemp -d /tmp/parrot-first-start.XXXXXX)
trap 'cd "$work/clone" 2>/dev/null && make -s stop PORT=$port >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
cd "$work/clone"
export PARROT_CACHE_DIR="$work/cache/models" PARROT_DATA_DIR="$work/data"
if [ "${NO_PIP_CACHE:-0}" = 1 ]; then export PIP_NO_CACHE_DIR=1; fi
start=$(date +%s.%N)
since() { awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
# Every line of `make run`, with its second since the start.
(make run PORT="$port" ENGINE_PORT=$((port + 1)) 2>&1 | while IFS= read -r line; do
    printf '%7s %s\n' "$(since)" "$line"
done) > "$work/run.log" &
first_answer=""
until curl -sf "http://127.0.0.1:$port/healthz" >/dev/null; do
    if [ -z "$first_answer" ] && curl -s -o /dev/null "http://127.0.0.1:$port/healthz"; then
        first_answer=$(since)
    fi
    if [ "$(since | cut -d. -f1)" -gt 3600 ]; then echo "no ok within an hour" >&2; exit 1; fi
    sleep 0.5
done
ok=$(since)
at() { grep -m1 -F "$1" "$work/run.log" | awk '{print $1}'; }
echo "| stage | starts at (s) |"
echo "| --- | ---: |"
for stage in "[1/5]" "[2/5]" "[3/5]" "[4/5]" "[5/5]" "compiled" "admin token" "Parrot API on" \
    "now converting" "now loading the weights" "now preparing the decode step" "serving "; do
    echo "| \`$stage\` | $(at "$stage") |"
done
echo "| port answers (503 loading) | ${first_answer:--} |"
echo "| /healthz ok | $ok |"
grep -i "warn" "$work/run.log" | head -5 || true
