#!/usr/bin/env bash
# One GPU lease in three commands of under ten minutes each (the device tool's limits): the
# runbook's steps (scripts/gpu_check.py) and the paper-preset extrapolation, arranged so that
# nothing timed shares the GPU with anything else.
#
#   bash scripts/gpu_session.sh 1 OUT   # env; the paper trainings (detached, then the
#                                       # evaluation); the GPU tests and a flex compile warm-up
#                                       # beside them (correctness only: sharing is fine)
#   bash scripts/gpu_session.sh 2 OUT   # waits for the evaluation; dense, Triton, FLASH batch 1,
#                                       # profiles, timing-order A/B (the GPU to itself)
#   bash scripts/gpu_session.sh 3 OUT   # flex patterns, the paper rows' forward times
#   bash scripts/gpu_session.sh 4 OUT   # round 3: env, the library paths' GPU tests, FLA's
#                                       # kernels beside ours (the GPU to itself)
#   bash scripts/gpu_session.sh 5 OUT   # round 3: SageAttention, the causal window by three
#                                       # libraries, round 2's missing rows, profiles
#   bash scripts/gpu_session.sh 6 OUT   # round 3 in one command, for a 15-minute lease: env,
#                                       # every GPU test in one pytest, the profiles, FLA's
#                                       # kernels beside ours
#   bash scripts/gpu_session.sh 7 OUT   # round 4, one command: the GPU tests round 3 did not
#                                       # reach, FLA at 16k and 64k, SageAttention
#   bash scripts/gpu_session.sh 8 OUT   # round 5, one command: the kernel tests round 4 did not
#                                       # reach, FLA's forward at 8k-64k, FLA's test cases
#   bash scripts/gpu_session.sh 9 OUT   # round 6, one command: FLA's chunk-kernel cases round 5
#                                       # left (4 workers), then the library sweep at 16k and
#                                       # 64k, forward and forward+backward
#
# Before the lease: bash scripts/fetch_library_wheels.sh (the library paths' wheels in .whl/,
# carried with each command). Everything goes to $WORK (default .gpuwork/ in the checkout:
# ignored by git, so the device machine keeps it between commands while it is held, where each
# command's OUT is new); each command packs what it has into OUT/phaseN.tgz. The trainings run in their own process session
# (setsid), so they outlive the command that started them. Phase budgets: PHASE_S seconds
# (default 560) from the phase's start; every step gets what is left.
set -uo pipefail
phase=${1:?phase 1-9}
out=${2:?output folder}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
WORK=${WORK:-$root/.gpuwork}
PHASE_S=${PHASE_S:-560}
STEPS=${STEPS:-5000}
WARMUP=${WARMUP:-500}
export PYTHONPATH=$root PYTHONUNBUFFERED=1
# The library-backed paths' packages, as wheels fetched beforehand by
# scripts/fetch_library_wheels.sh (the device tool's call names .whl in `carry`).
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$root:/tmp/site
fi
export TORCHINDUCTOR_CACHE_DIR=$root/.gpucache/inductor TRITON_CACHE_DIR=$root/.gpucache/triton
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$WORK/logs" "$out"
started=$(date +%s)
left() { echo $((PHASE_S - ($(date +%s) - started))); }
# step N with at most min(WANT, what is left - RESERVE) seconds
step() {
  local n=$1 want=$2 reserve=${3:-25}
  local budget=$(( $(left) - reserve ))
  (( budget > want )) && budget=$want
  if (( budget < 20 )); then echo "step $n: skipped, $(left) s left"; return; fi
  echo "step $n: budget $budget s ($(date +%T))"
  python scripts/gpu_check.py "$n" "$WORK/gpu" --budget-s "$budget"
}
# the machine as found (nvidia-smi), then step 0 (env) with at most $1 seconds
begin() {
  nvidia-smi > "$WORK/logs/nvidia-smi-start.txt" 2>&1
  step 0 "$1"
}
pack() {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
    > "$WORK/logs/clocks-end-phase$phase.csv" 2>&1
  tar czf "$out/phase$phase.tgz" -C "$WORK" --exclude='*.pt' --exclude='*.pt.tmp' \
    logs gpu paper train checkpoints/curves 2>/dev/null
  ls -la "$out"
}

paper_args=(run extrapolate --preset paper --steps "$STEPS" --warmup "$WARMUP"
            --checkpoints "$WORK/checkpoints" --threads 1)

case $phase in
1)
  begin 60
  # The trainings: O and E, seeds 0-2, each its own process sharing the GPU; then one
  # evaluation of every row on the same checkpoints, paired by seed.
  setsid bash -c '
    cd "$0"; W="$1"; shift
    for v in O E; do for s in 0 1 2; do
      python -m attnbench "$@" --variants $v --seed-start $s --seeds 1 --train-only \
        --out "$W/train/$v-$s" > "$W/logs/train-$v-$s.log" 2>&1 &
    done; done
    wait
    date +%s > "$W/TRAINED"
    python -m attnbench "$@" --variants O,E --seeds 3 --eval-only \
      --eval-lengths 64,128,256,512,1024,2048,4096 --out "$W/paper" > "$W/logs/eval.log" 2>&1
    echo $? > "$W/EVALUATED"
  ' "$root" "$WORK" "${paper_args[@]}" < /dev/null > "$WORK/logs/trainings.log" 2>&1 &
  mkdir -p "$WORK/train"
  # The flex sweeps' compiles into the on-disk caches (timings thrown away), beside the tests.
  setsid bash -c '
    nice -n 5 python scripts/gpu_check.py 4 "$0/warm" --budget-s 420 > "$0/logs/flex-warm.log" 2>&1
    nice -n 5 python scripts/gpu_check.py 10 "$0/warm" --budget-s 120 >> "$0/logs/flex-warm.log" 2>&1
  ' "$WORK" < /dev/null > /dev/null 2>&1 &
  warm_pid=$!
  step 1 200
  step 2 $(( $(left) - 30 )) 30
  kill -INT -- -"$warm_pid" 2>/dev/null  # the warm-up's whole group: phase 2 times alone
  tail -n 3 "$WORK"/logs/train-*.log > "$WORK/logs/trainings-progress.txt" 2>&1
  pack
  ;;
2)
  # Nothing timed while a training or the evaluation runs.
  while [ ! -f "$WORK/EVALUATED" ] && (( $(left) > 120 )); do sleep 5; done
  if [ ! -f "$WORK/EVALUATED" ]; then
    echo "the evaluation is still running after $(( $(date +%s) - started )) s; no timing now"
    pack; exit 0
  fi
  echo "evaluation done (exit $(cat "$WORK/EVALUATED")) at +$(( $(date +%s) - started )) s"
  step 3 190
  step 5 150
  step 7 60
  step 8 50
  step 9 $(( $(left) - 20 )) 20
  pack
  ;;
3)
  if [ ! -f "$WORK/EVALUATED" ]; then
    echo "the evaluation is still running; no timing now"; pack; exit 0
  fi
  step 4 300 140
  step 10 $(( $(left) - 20 )) 20
  pack
  ;;
4)
  # Round 3, the library kernels: env, their GPU tests, then FLA beside our Triton kernels.
  begin 60
  step 11 180
  step 12 $(( $(left) - 20 )) 20
  pack
  ;;
5)
  # Round 3, the rest: SageAttention, the causal window by three libraries, round 2's missing
  # rows, the profiles (FLA's chunk kernel, SDPA's default beside cuDNN).
  step 13 130
  step 14 110
  step 15 180
  step 8 $(( $(left) - 20 )) 20
  pack
  ;;
6)
  # Round 3 in one command (a lease of 15 minutes holds one command and the machine's start):
  # what matters most first. The tests share the GPU only with each other; the profiles and the
  # timings have it to themselves.
  begin 40
  step 16 280
  step 8 60
  step 12 $(( $(left) - 20 )) 20
  pack
  ;;
7)
  # Round 4 in one command: what round 3 left (results/speed/nvidia-h100/README.md).
  begin 30
  step 17 170
  step 18 200
  step 13 $(( $(left) - 20 )) 20
  pack
  ;;
8)
  # Round 5 in one command: what round 4 left (results/speed/nvidia-h100/README.md). The
  # kernel tests first (quick to compile), then FLA's forward timings (its autotuning took
  # round 4's long sweep), then FLA's test cases with whatever is left.
  begin 30
  step 19 170
  step 21 170
  step 20 $(( $(left) - 20 )) 20
  pack
  ;;
9)
  # Round 6 in one command: what round 5 left (results/speed/nvidia-h100/README.md). FLA's
  # chunk-kernel cases with 4 workers (its backward autotunes for minutes per process), then the
  # fwd+bwd library sweep that round 4's step 18 never reached (FLA's kernels are warm by then).
  begin 30
  step 22 260
  step 18 $(( $(left) - 20 )) 20
  pack
  ;;
*) echo "unknown phase $phase; accepted: 1-9"; exit 2 ;;
esac
