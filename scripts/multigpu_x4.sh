#!/usr/bin/env bash
# The multi-GPU "What must be shown" runs of docs/multi-gpu.md in ONE device call, for a 4-GPU
# machine (kind nvidia-h200-x4; on 2 or 3 GPUs the same steps at 2 GPUs). Steps, by priority:
#   1  pip install of the carried wheels (.whl) and the editable plugins; GPU list
#   2  atlas serve qwen3-235b-a22b (random weights, --load-format dummy) -tp 4 EP: /health
#      seconds, one chat completion (first 300 characters, usage), memory per GPU, SIGINT, exit
#   3  atlas bench qwen3-235b-a22b -tp 4 EP, batch 1,32, context 1024, 32 decode tokens
#   4  qwen3-8b decode at TP=1, 2, 4 (batch 1,8, context 1024, 48 tokens); speed-up line
#      against the targets 1.6x (TP=2) and 2.4x (TP=4)
#   5  qwen3-30b-a3b and qwen3.5-35b-a3b on one GPU, at EP=2 and EP=4 (batch 1,32); scaling
#   6  multigpu_compare.py --shape qwen3-8b -tp 4; --shape tiny-moe -tp 4 --ep (correctness)
#   7  network-transport stand-in (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1): compare -tp 2 and
#      bench -tp 2 batch 1,8, beside step 4's NVLink TP=2 run
# The 235B variant is the largest whose shard fits 85% of a GPU: bf16 on 4 x H200, FP8 on
# 4 x H100 or 2 x H200, none (steps 2-3 skipped) on 2 x H100.
#
# Every step has its own timeout; DEADLINE_S (default 560) bounds the call: a step starts only
# when its timeout still fits, else it prints a SKIPPED line. Stdout holds result lines only:
# bench tables (both headers, every row, prefill rows too), the memory-bandwidth and cold-start
# lines, compare results, serve/chat lines, scaling lines, and a step's error lines (at most 12
# unique, the rest counted). Each step's whole output is in LOG_DIR/STEP.log, bench JSON in
# LOG_DIR/*.json; with $OUT set (the device) they are packed into $OUT/multigpu_x4_logs.tgz
# after every step, so a killed call still brings them back.
#
# Device seconds (estimates from 2 x H200, 2026-11-27: 235B FP8 over 2 GPUs healthy 57 s after
# start incl. 46.6 s of kernel compile on a cold cache; a qwen3-8b bench 50-70 s incl. load;
# compare qwen3-8b 30-40 s after its 16 GB checkpoint is written in ~20 s):
#   step  estimate  timeout           step  estimate  timeout
#   1     20 s      90+90 s           5     6 x 60-80 s   6 x 150 s
#   2     100 s     240 s             6     60 s + 30 s   150 + 90 s
#   3     70 s      180 s             7     45 s + 60 s   120 + 120 s
#   4     3 x 60 s  3 x 120 s (+30)
# Steps 1-4 (~370 s) fit one 560 s call; 5 (~420 s) a second; 6-7 (~200 s) a third (or
# MOE_SHAPES=qwen3-30b-a3b to put 5 and 6-7 in one call). The kernel cache (ATLAS_CACHE_DIR,
# /tmp/atlas-cache) and LOG_DIR's JSON (step 7 reads step 4's) stay on a warm machine.
#
# Usage (repo root; the tokenizer of the 235B serve step, Qwen3's, in fx/ or TOKENIZER_DIR:
#   mkdir -p fx && cp /work/shared/fixtures/real-models/qwen3/tokenizer_config.json fx/ &&
#   gzip -c /work/shared/fixtures/real-models/qwen3/tokenizer.json > fx/tokenizer.json.gz
#   and `echo /fx/ >> .git/info/exclude`; then run with carry [".whl", "fx"]):
#   bash scripts/multigpu_x4.sh                          # STEPS=1,2,3,4,5,6,7
#   STEPS=1,2,3,4 bash scripts/multigpu_x4.sh            # device call 1
#   STEPS=1,5 bash scripts/multigpu_x4.sh                # call 2
#   STEPS=1,6,7 bash scripts/multigpu_x4.sh              # call 3
#   DRY=1 bash scripts/multigpu_x4.sh                    # CPU: numpy backend, tiny shapes, 2 ranks
#   DRY=1 DRY_GPUS=4 DEADLINE_S=300 bash scripts/multigpu_x4.sh   # the 4-GPU plan on CPU
# Other knobs: PY (python3; DRY: .venv/bin/python), LOG_DIR (/tmp/multigpu_x4[-dry]),
# TPS (step 4's TP sizes; "1 2 4"), EPS (step 5's EP sizes, 1 = one GPU; "1 2 4"),
# MOE_SHAPES, COMPARE_MOE_SHAPE (tiny-moe; qwen3-30b-a3b writes a 61 GB checkpoint first),
# BIG (the 235B shape), TIMEOUT_PCT (every step's timeout in % of the above; default 100).
set -uo pipefail
cd "$(dirname "$0")/.."
SELF=scripts/multigpu_x4.sh
UTIL=scripts/multigpu_x4_util.py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 ATLAS_LOG_LEVEL=${ATLAS_LOG_LEVEL:-WARNING}

# ---- step bodies: each runs as its own `timeout ... bash $SELF` with output to its log ----

bench() {  # TAG ARGS...: atlas bench, its JSON to LOG_DIR/TAG.json (removed first: no stale)
  local tag=$1; shift
  rm -f "$LOG_DIR/$tag.json"
  $PY -m atlas_core bench "$@" $BACKEND_ARGS --json "$LOG_DIR/$tag.json"
}

compare() {  # ARGS...: scripts/multigpu_compare.py
  $PY scripts/multigpu_compare.py "$@" $BACKEND_ARGS --tokens 8
}

alive() {  # PID: running (a zombie counts as gone)
  local state=""
  [[ -r /proc/$1/stat ]] && read -r _ _ state _ < "/proc/$1/stat"
  [[ -n $state && $state != Z ]]
}

children() {  # PID: its direct children
  cat /proc/"$1"/task/*/children 2>/dev/null
}

gpu_memory() {
  if ! command -v nvidia-smi > /dev/null; then echo "gpu memory: no nvidia-smi here"; return; fi
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits |
    awk -F', *' '{printf "%s%s: %s/%s MiB", sep, $1, $2, $3; sep="; "} END {print ""}' |
    sed 's/^/gpu memory: /'
}

stop_server() {  # PID: SIGINT, wait up to 60 s, then SIGKILL it and its children
  local pid=$1 t=$SECONDS kids i
  kids=$(children "$pid")
  kill -INT "$pid" 2> /dev/null
  for ((i = 0; i < 60; i++)); do alive "$pid" || break; sleep 1; done
  if alive "$pid"; then
    kill -KILL "$pid" $kids 2> /dev/null
    wait "$pid" 2> /dev/null
    echo "server exit: still running 60 s after SIGINT, killed"
    return 1
  fi
  wait "$pid"
  local rc=$?
  echo "server exit: status $rc, $((SECONDS - t)) s after SIGINT"
  for i in $kids; do alive "$i" && echo "server exit: worker $i still running"; done
  ((rc == 0 || rc == 130))  # 130: atlas's exit after KeyboardInterrupt
}

step_serve() {
  local dir=$WORK/serve-$BIG port pid rc=0
  $PY $UTIL serve-dir "$BIG" "$dir" "$TOKENIZER_DIR" || return 2
  port=$($PY $UTIL free-port)
  # a background job of a script ignores SIGINT, which the server's shutdown needs: reset it
  $PY -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);
os.execvp(sys.argv[1], sys.argv[1:])' $PY -m atlas_core serve "$dir" --load-format dummy \
    -tp "$MAXTP" --enable-expert-parallel --served-model-name q235 \
    --gpu-memory-utilization "$GMU" --max-model-len "$MAXLEN" --port "$port" $BACKEND_ARGS &
  pid=$!
  $PY $UTIL wait-health "$port" "$pid" "$HEALTH_S" || rc=1
  if ((rc == 0)); then
    $PY $UTIL chat "$port" q235 || rc=1
    gpu_memory
  fi
  stop_server "$pid" || rc=1
  return $rc
}

# ---- the runner (parent process) ----

KEEP='^batch \| context \||^ *[0-9]+ \| +[0-9]+ \||^memory bandwidth|^cold start|^tp=[0-9]'
KEEP+='|^prompt logprobs|^model ready|^decode floor'
KEEP+='|^(serve|chat|gpu memory|server exit|scaling|network|gpu [0-9])[ :]'
ERR='Error|ERROR|Traceback|error:|Killed|[Oo]ut of memory|FAILED|CUDA_ERROR|NCCL WARN|WARNING'
QUIET='weights are RANDOM values|outputs are meaningless|pip as the .root. user|new release of pip'

show() {  # LOG RC: the log's result lines, then its unique error lines (12 at most)
  local log=$1 rc=$2 errs n
  grep -E "$KEEP" "$log"
  errs=$(grep -E "$ERR" "$log" | grep -vE "$KEEP|$QUIET" | cut -c1-300 | awk '!seen[$0]++')
  n=$(printf '%s' "$errs" | grep -c .)
  if ((n > 0)); then
    printf '%s\n' "$errs" | head -n 12 | sed 's/^/  ! /'
    ((n > 12)) && echo "  ! ... $((n - 12)) more in $log"
  fi
  if ((rc == 124 || rc == 137 || (rc != 0 && n == 0))); then  # where it was when it ended
    grep -vE "$KEEP" "$log" | tail -n 3 | cut -c1-300 | sed 's/^/  tail: /'
  fi
}

gpus_idle() {  # after a step: wait up to 10 s for its GPU processes to go, kill what stays
  local i pids p
  command -v nvidia-smi > /dev/null || return 0
  for ((i = 0; i < 10; i++)); do
    pids=""  # only this script's kind of process: nvidia-smi may list pids of another namespace
    for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2> /dev/null); do
      grep -qaE 'atlas_core|multiprocessing|multigpu_compare' "/proc/$p/cmdline" 2> /dev/null &&
        pids+="$p "
    done
    [[ -z $pids ]] && return 0
    sleep 1
  done
  echo "WARNING GPU processes left after the step, killed: $pids"
  kill -KILL $pids 2> /dev/null
}

save_logs() {
  [[ -n ${OUT:-} && -d ${OUT:-} ]] || return 0
  tar czf "$OUT/multigpu_x4_logs.tgz" -C "$LOG_DIR" . 2> /dev/null
}

run_step() {  # ID LIMIT_S WHAT FUNCTION ARGS...: FUNCTION under `timeout LIMIT_S`, if it fits
  local id=$1 limit=$(($2 * TIMEOUT_PCT / 100)) what=$3 fn=$4 t=$SECONDS left rc
  shift 4
  left=$((DEADLINE_S - (SECONDS - T0)))
  if ((left < limit)); then
    echo "SKIPPED $id $what: its timeout is $limit s, $left s left of DEADLINE_S=$DEADLINE_S"
    return 0
  fi
  echo "== $id $what (timeout $limit s, $left s left)"
  _STEP=$fn timeout -k 10 "$limit" bash "$SELF" "$@" > "$LOG_DIR/$id.log" 2>&1
  rc=$?
  show "$LOG_DIR/$id.log" "$rc"
  ((rc == 124 || rc == 137)) && echo "TIMEOUT $id after $limit s"
  echo "-- $id: rc $rc, $((SECONDS - t)) s"
  gpus_idle
  save_logs
}

wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

if [[ -n ${_STEP:-} ]]; then  # a step's own process (run_step)
  "$_STEP" "$@"
  exit
fi

# ---- the plan ----
export DRY=${DRY:-0} DEADLINE_S=${DEADLINE_S:-560} STEPS=${STEPS:-1,2,3,4,5,6,7}
export TIMEOUT_PCT=${TIMEOUT_PCT:-100} STEPS=${STEPS// /,}
if [[ $DRY == 1 ]]; then
  [[ -x .venv/bin/python ]] && export PY=${PY:-.venv/bin/python} || export PY=${PY:-python3}
  export LOG_DIR=${LOG_DIR:-/tmp/multigpu_x4-dry} N=${DRY_GPUS:-2} BACKEND_ARGS="--backend numpy"
  export ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-$LOG_DIR-work/cache} DEVICE="numpy (DRY)"
  export BIG=tiny-moe DENSE=tiny MOE_SHAPES=${MOE_SHAPES:-tiny-moe tiny-qwen3.5-moe}
  export CTX=64 BIGB=8 DEC_BIG=8 DEC_DENSE=8 MAXLEN=1024
else
  export PY=${PY:-python3} LOG_DIR=${LOG_DIR:-/tmp/multigpu_x4} BACKEND_ARGS=""
  export ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
  N=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
  MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null |
    sort -n | head -n 1)
  DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | sort -u | paste -sd/)
  if ((N < 2)); then echo "needs 2 or more GPUs, nvidia-smi lists $N"; exit 1; fi
  export N MEM DEVICE DENSE=qwen3-8b MOE_SHAPES=${MOE_SHAPES:-qwen3-30b-a3b qwen3.5-35b-a3b}
  export CTX=1024 BIGB=32 DEC_BIG=32 DEC_DENSE=48 MAXLEN=4096
fi
if ((N >= 4)); then export MAXTP=4 TPS=${TPS:-1 2 4} EPS=${EPS:-1 2 4}
else export MAXTP=2 TPS=${TPS:-1 2} EPS=${EPS:-1 2}; fi
export GMU=0.93 MOE_GMU=0.9 HEALTH_S=$((180 * TIMEOUT_PCT / 100)) WORK=${LOG_DIR}-work
export COMPARE_MOE_SHAPE=${COMPARE_MOE_SHAPE:-tiny-moe} TOKENIZER_DIR=${TOKENIZER_DIR:-fx}
mkdir -p "$LOG_DIR" "$WORK"
T0=$SECONDS

if wanted 1; then
  echo "== 1 install"
  if [[ $DRY == 1 ]]; then
    echo "install: DRY, the venv's packages as they are (no pip)"
  else
    if [[ -d .whl ]]; then
      timeout 90 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl > "$LOG_DIR/1-wheels.log" 2>&1 &&
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
      echo "install: carried wheels rc $?"
    fi
    timeout 90 $PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
      -e plugins/atlas-qwen35 -e plugins/atlas-cuda -e plugins/atlas-hopper \
      -e plugins/atlas-nccl > "$LOG_DIR/1-editable.log" 2>&1
    echo "install: editable plugins rc $?"
    show "$LOG_DIR/1-editable.log" 0
    $PY -c 'import nccl.core, atlas_nccl, atlas_qwen35; print("imports ok")' 2>&1 | tail -n 1 |
      sed 's/^/install: /'
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | sed 's/^/gpu /;s/,/:/'
  fi
  echo "-- 1: $((SECONDS - T0)) s"
fi
if [[ $DRY != 1 ]]; then
  BIG=${BIG:-$($PY $UTIL big-shape "$N" "$MEM")}
  export BIG=${BIG:-none}
  # FP8 weights stay FP8 on the device only with the quant_weights policy (off by default):
  # without it the FP8 shape is dequantized to bf16 and needs twice the memory (4 x H100: OOM)
  [[ $BIG == *-fp8 ]] && export ATLAS_CUDA_QUANT_WEIGHTS=${ATLAS_CUDA_QUANT_WEIGHTS:-1}
fi
if [[ $DRY == 1 ]]; then  # a tokenizer within the tiny shape's vocabulary
  export TOKENIZER_DIR=$WORK/fx-dry
  $PY $UTIL dry-tokenizer "$TOKENIZER_DIR" "$BIG"
fi
echo "plan: $N x $DEVICE; 235B shape $BIG at -tp $MAXTP; TP $TPS; EP $EPS; steps $STEPS;" \
  "deadline $DEADLINE_S s; logs $LOG_DIR"

if wanted 2; then
  if [[ $BIG == none ]]; then
    echo "SKIPPED 2 serve: no qwen3-235b-a22b variant fits $N GPUs of $MEM MiB"
  else
    run_step 2 240 "serve $BIG -tp $MAXTP EP" step_serve
  fi
fi
if wanted 3 && [[ $BIG != none ]]; then
  run_step 3 180 "bench $BIG -tp $MAXTP EP" bench big --model "$BIG" -tp "$MAXTP" \
    --enable-expert-parallel --gpu-memory-utilization "$GMU" --batch "1,$BIGB" \
    --context "$CTX" --decode-tokens "$DEC_BIG"
fi
if wanted 4; then
  runs=()
  for tp in $TPS; do
    parallel=()
    ((tp > 1)) && parallel=(-tp "$tp")
    run_step "4-tp$tp" 120 "bench $DENSE TP=$tp" bench "dense-tp$tp" --model "$DENSE" \
      "${parallel[@]}" --batch 1,8 --context "$CTX" --decode-tokens "$DEC_DENSE"
    runs+=("TP=$tp@$LOG_DIR/dense-tp$tp.json")
  done
  run_step 4-scaling 30 "TP scaling" $PY $UTIL scaling "scaling $DENSE" "TP=2:1.6,TP=4:2.4" \
    "${runs[@]}"
fi
if wanted 5; then
  for shape in $MOE_SHAPES; do
    runs=()
    for ep in $EPS; do
      parallel=()
      ((ep > 1)) && parallel=(-tp "$ep" --enable-expert-parallel)
      run_step "5-$shape-ep$ep" 150 "bench $shape EP=$ep" bench "$shape-ep$ep" \
        --model "$shape" "${parallel[@]}" --gpu-memory-utilization "$MOE_GMU" \
        --batch "1,$BIGB" --context "$CTX" --decode-tokens "$DEC_BIG"
      runs+=("EP=$ep@$LOG_DIR/$shape-ep$ep.json")
    done
    run_step "5-$shape-scaling" 30 "EP scaling" $PY $UTIL scaling "scaling $shape" - "${runs[@]}"
  done
fi
if wanted 6; then
  run_step 6-dense 150 "compare $DENSE -tp $MAXTP" compare --shape "$DENSE" -tp "$MAXTP"
  run_step 6-moe 90 "compare $COMPARE_MOE_SHAPE -tp $MAXTP --ep" compare \
    --shape "$COMPARE_MOE_SHAPE" -tp "$MAXTP" --ep
fi
if wanted 7; then
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
  run_step 7-compare 120 "compare $DENSE -tp 2, no P2P/SHM" compare --shape "$DENSE" -tp 2
  run_step 7-bench 120 "bench $DENSE -tp 2, no P2P/SHM" bench net-tp2 --model "$DENSE" -tp 2 \
    --batch 1,8 --context "$CTX" --decode-tokens "$DEC_DENSE"
  unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE
  run_step 7-versus 30 "network vs NVLink" $PY $UTIL scaling "network $DENSE TP=2" - \
    "NVLink@$LOG_DIR/dense-tp2.json" "no-P2P/SHM@$LOG_DIR/net-tp2.json"
fi
save_logs
echo "done in $((SECONDS - T0)) s${OUT:+; logs in \$OUT/multigpu_x4_logs.tgz}"
