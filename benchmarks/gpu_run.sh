#!/usr/bin/env bash
# Issue 39's one prepared device run: `make test-gpu`, then `make bench-gpu`, within 8 minutes, on a lent GPU
# machine (no network; its own python3 with torch, triton and transformers). Run from the repository root:
#
#     bash benchmarks/gpu_run.sh          # the device tool: carry [".whl"], timeout_s 560
#
# - the server's packages that machine lacks (grpc's health and reflection, opentelemetry, starlette, uvicorn,
#   pydantic, gguf) come from the wheels `make gpu-wheels` downloads here into .whl/ (~11 MB, carried);
# - the `infer` import root is made in place while it runs: infer/<part> -> ../<part> (what the editable
#   install maps);
# - test-gpu gets TEST_GPU_S seconds at most (0: not run); bench-gpu's budget is what is left of TOTAL_S less BENCH_SLACK_S
#   (a part that starts just before the budget ends runs on: an 8B load, a server start);
# - the logs, the GPU's name and docs/benchmarks/cuda.* are copied to $OUT (the device tool brings them back).
set -uo pipefail
TOTAL_S=${TOTAL_S:-470}
TEST_GPU_S=${TEST_GPU_S:-240}
BENCH_SLACK_S=${BENCH_SLACK_S:-120}
PYTHON=${PYTHON:-python3}
out=${OUT:-/tmp/gpu-run}
mkdir -p "$out"
start=$SECONDS
site=/tmp/infer-wheels
if compgen -G ".whl/*.whl" >/dev/null; then
    rm -rf "$site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || exit 1
    export PYTHONPATH="$site"
fi
linked=()
for part in api engine kernels server clients; do
    [ -e "infer/$part" ] || { ln -s "../$part" "infer/$part" && linked+=("infer/$part"); }
done
trap 'rm -f "${linked[@]}"' EXIT  # NOTE: a checkout with the editable install must not keep them
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
bin=$(dirname "$(command -v "$PYTHON")")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
"$PYTHON" -c "import infer.server.cli, infer.engine.loader, infer.clients.bench.load, torch, triton, transformers; \
print('imports ok', \
torch.__version__, triton.__version__, transformers.__version__)" 2>&1 | tee "$out/imports.txt" || exit 1
if [ "$TEST_GPU_S" -gt 0 ]; then  # TEST_GPU_S=0: bench-gpu alone (a rerun on a warm machine)
    timeout "$TEST_GPU_S" make test-gpu BIN="$bin" GPU_PREREQ= 2>&1 | tee "$out/test-gpu.log"
    echo "test-gpu: exit $?, $((SECONDS - start)) s"
fi
budget=$((TOTAL_S - (SECONDS - start) - BENCH_SLACK_S))
make bench-gpu BIN="$bin" GPU_PREREQ= ARGS="--budget-s $((budget > 30 ? budget : 30))" 2>&1 | tee "$out/bench-gpu.log"
echo "bench-gpu: exit $?, $((SECONDS - start)) s in all"
cp docs/benchmarks/cuda.json docs/benchmarks/cuda.md "$out/" 2>/dev/null
