#!/usr/bin/env bash
# The project's GPU path, checked on a machine with one CUDA GPU, in one go (a few minutes):
#   1. fused trials, what only a GPU can tell (docs/fused.md): the CUDA tests (tests/ponder/test_cuda.py:
#      fused members against plain runs, eager and compiled; checkpoints across devices), a whole
#      fused study against four packed trials for 60 s each (bench/fused_throughput.py: member-
#      iterations a second and their ratio), 256 trials x 5,000 iterations with ASHA to the end
#      (its wall time), then the fused step's speed (bench/fused_speed.py, eager and compiled), and
#      the same for fused MNIST (a study against four packed trials, the step's speed);
#   2. a parity-smoke study with a quarter of the GPU per trial (four trials at once), its
#      status, and `evaluate` of its best trial on the GPU and on the CPU;
#   3. bench/iteration_speed.py --device cuda: reference, eager, compiled (CUDA graphs), compiled without;
#   4. bench/gpu_packing.py (trials per GPU against throughput);
#   5. tests/study/test_gpu.py (step 2 as a test);
#   6. the speed figures on the GPU, if time is left: bench/iteration_speed.py --task mnist,
#      bench/study_throughput.py --gpu 0.25 (a study's wall time, default against eager) and
#      bench/time_to_accuracy.py --device cuda (three seeds, with a compile cache of its own).
# Each step has its own time limit, so one that hangs leaves time to the rest; every log goes to
# OUT_DIR (default results/gpu-checks), the figures at the end of each. With 15 minutes of device
# time (a machine's start included), run the fused steps in two calls that each leave time to
# rerun: GPU_CHECKS_ONLY='unit-tests|fused-throughput' (about 5 min), then
# GPU_CHECKS_ONLY='fused-study-256|fused-speed|fused-speed-compiled' (about 5 min); fused MNIST:
# GPU_CHECKS_ONLY='fused-mnist-throughput|fused-mnist-speed' (about 4 min).
#
#   bash bench/gpu_checks.sh [OUT_DIR]
# PYTHON=... picks the interpreter (default: .venv's, else python3); GPU_CHECKS_BUDGET_S the whole
# run's seconds (540); GPU_CHECKS_SKIP='study|gpu-packing' skips steps by name, GPU_CHECKS_ONLY
# runs only the steps it names (the machine's facts are always printed).
set -u
OUT_DIR=${1:-results/gpu-checks}
mkdir -p "$OUT_DIR"
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PONDER_STUDY_CACHE=${PONDER_STUDY_CACHE:-$OUT_DIR/cache}  # one compile cache for every step
DEADLINE=$(( $(date +%s) + ${GPU_CHECKS_BUDGET_S:-540} ))

step() {  # step NAME LIMIT_S COMMAND...: run it with its log, at most LIMIT_S and never past the deadline
    local name=$1 limit=$2
    shift 2
    if [[ -n "${GPU_CHECKS_SKIP:-}" && $name =~ ^(${GPU_CHECKS_SKIP})$ ]]; then
        echo "== $name: skipped (GPU_CHECKS_SKIP)" | tee -a "$OUT_DIR/summary.txt"
        return
    fi
    if [[ -n "${GPU_CHECKS_ONLY:-}" && ! $name =~ ^(${GPU_CHECKS_ONLY})$ ]]; then
        return
    fi
    local left=$(( DEADLINE - $(date +%s) ))
    (( limit > left )) && limit=$left
    if (( limit < 20 )); then
        echo "== $name: skipped, ${left} s left" | tee -a "$OUT_DIR/summary.txt"
        return
    fi
    echo "== $name (at most ${limit} s): $*"
    local start=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT_DIR/summary.txt"
    tail -n 25 "$OUT_DIR/$name.log"
}

{
    nvidia-smi -L
    "$PYTHON" -c 'import sys, torch, ray, optuna, pandas, pyarrow; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "ray", ray.__version__, "optuna", optuna.__version__, "pandas", pandas.__version__, "pyarrow", pyarrow.__version__)'
    nproc
} 2>&1 | tee "$OUT_DIR/machine.txt"

step unit-tests 140 "$PYTHON" -m pytest -p no:cacheprovider -v -rs --durations=10 tests/ponder/test_cuda.py tests/ponder/test_checkpoint.py

# fused trials first: what only a GPU can tell (docs/fused.md). A group on CUDA compiles its step
# (compile = "auto"); 256 trials at once are 256 Ray processes (about 30 GB: docs/fused.md)
step fused-throughput 200 "$PYTHON" bench/fused_throughput.py --gpu 0.25 --fuse 256 --num-samples 1024 --seconds 60
step fused-study-256 330 "$PYTHON" bench/fused_throughput.py --to-end --gpu 1 --fuse 256 --num-samples 256 --iterations 5000 --seconds 300
step fused-speed 100 "$PYTHON" bench/fused_speed.py --device cuda --iters 20 --rounds 2 --ks 1,64,256,1024
step fused-speed-compiled 150 "$PYTHON" bench/fused_speed.py --device cuda --compile --iters 20 --rounds 2 --ks 16,256 --max-steps 4-20
# fused MNIST (docs/fused.md, "Fused MNIST"): a study against four packed trials, then its step
step fused-mnist-throughput 200 "$PYTHON" bench/fused_throughput.py --task mnist --gpu 0.25 --fuse 64 --num-samples 256 --seconds 60
step fused-mnist-speed 100 "$PYTHON" bench/fused_speed.py --task mnist --device cuda --iters 10 --rounds 2 --ks 1,8,64

SPEC="$OUT_DIR/parity-gpu-quarter.toml"
"$PYTHON" - "$SPEC" <<'EOF'
import sys
from study.spec.spec import load_spec
source = load_spec("parity-smoke").source
for old, new in [("num_samples = 6", "num_samples = 4"), ("max_concurrent = 2", "max_concurrent = 4"),
                 ("gpu = 0\n", "gpu = 0.25\n")]:
    assert old in source, old
    source = source.replace(old, new)
open(sys.argv[1], "w").write(source)
EOF
STORAGE="$OUT_DIR/results"
step study 120 "$PYTHON" -m study run "$SPEC" --storage "$STORAGE"
step status 20 "$PYTHON" -m study status parity-gpu-quarter --storage "$STORAGE"
step evaluate-cuda 40 "$PYTHON" -m study evaluate parity-gpu-quarter --storage "$STORAGE" --device cuda --repeats 5
step evaluate-cpu 30 "$PYTHON" -m study evaluate parity-gpu-quarter --storage "$STORAGE" --device cpu --repeats 5
[ -d "$STORAGE/trials" ] && "$PYTHON" - "$STORAGE" <<'EOF' 2>&1 | tee "$OUT_DIR/study-parquet.txt"
import sys, pandas as pd
df = pd.read_parquet(f"{sys.argv[1]}/trials/study=parity-gpu-quarter")
cols = [c for c in ["trial_id", "status", "device", "gpu_ids", "max_steps", "iteration", "time_total_s",
                    "test/halted_accuracy", "nan_events"] if c in df]
print(df[cols].to_string())
EOF

step iteration-speed 190 "$PYTHON" bench/iteration_speed.py --device cuda --iterations 400 --rounds 2 --warmup 20

step gpu-packing 200 "$PYTHON" bench/gpu_packing.py --packings 1,2,4,8 --iterations 1000 --eval-interval 250 --out "$OUT_DIR/packing.json"

step study-test 80 "$PYTHON" -m pytest -p no:cacheprovider -v -rs tests/study/test_gpu.py

step iteration-speed-mnist 130 "$PYTHON" bench/iteration_speed.py --task mnist --device cuda --iterations 300 --rounds 2 --warmup 20
step study-throughput 330 "$PYTHON" bench/study_throughput.py --gpu 0.25
step time-to-accuracy 210 env PONDER_STUDY_CACHE="$OUT_DIR/cache-tta" "$PYTHON" bench/time_to_accuracy.py --device cuda --seeds 0,1,2 --budget 60
"$PYTHON" -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
cat "$OUT_DIR/summary.txt" 2>/dev/null || echo "no step ran"
