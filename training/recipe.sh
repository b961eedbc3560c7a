#!/usr/bin/env bash
# The bundled drafters, end to end on one or more GPUs: regenerate the answers with the target,
# train EAGLE-3 and EAGLE-1, validate both on the hold-out, and compare eager / CUDA-graph /
# compiled decoding on the bench prompts. docs/DRAFTERS.md explains every stage.
#
#   python -m training.data prompts --all-turns --out artifacts/prompts-turns   # where ShareGPT is (CPU)
#   W=artifacts/run bash training/recipe.sh                                # on the GPU machine
#
# With two GPUs the stages run side by side: regeneration is split in halves (--shard), EAGLE-3
# trains on GPU 0 while EAGLE-1 trains on GPU 1 and then runs the target-only mode comparison there.
# Everything lands under $W (logs/, regen*/, eagle3/, eagle/, validate/, modes/); the last lines
# printed are the summary.
set -uo pipefail

W=${W:-artifacts/run}
TRAIN_PROMPTS=${TRAIN_PROMPTS:-artifacts/prompts-turns/train}
HOLDOUT_PROMPTS=${HOLDOUT_PROMPTS:-artifacts/prompts/holdout}
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
REGEN_MIN=${REGEN_MIN:-4}            # regeneration budget per GPU (resumable: rerun to finish)
REGEN_NEW_TOKENS=${REGEN_NEW_TOKENS:-256}
REGEN_TEMPERATURE=${REGEN_TEMPERATURE:-0}  # 0: greedy answers; e.g. 0.8 for sampled passes
REGEN_PASSES=${REGEN_PASSES:-1}      # answers per prompt (sampled passes differ by seed): regen<g>, regen<g>-p1, ...
REGEN_SEED=${REGEN_SEED:-0}          # seed of GPU g's pass p: REGEN_SEED + g + p * NGPU (new samples: a new base)
TRAIN3_MIN=${TRAIN3_MIN:-9}          # EAGLE-3 training budget
TRAIN1_MIN=${TRAIN1_MIN:-6}          # EAGLE-1 training budget (0: keep INIT1 as it is)
TRAIN3_ALL_GPUS=${TRAIN3_ALL_GPUS:-0}  # 1: EAGLE-3 data parallel over every GPU (torchrun), then EAGLE-1
TRAIN3_ARGS=${TRAIN3_ARGS:-}         # more training.train flags for EAGLE-3, e.g. --rebuild-draft-vocab
TRAIN3B_ARGS=${TRAIN3B_ARGS:-}       # an A/B variant: a second EAGLE-3 ($W/eagle3b) with these flags added, on
                                     # GPU 1 after EAGLE-1 (two GPUs, TRAIN3_ALL_GPUS=0) or beside EAGLE-3 on
                                     # one GPU, validated beside it
AVERAGE=${AVERAGE:-}                 # e.g. "eagle3b eagle3": after training, their weight average lands in
                                     # $W/eagle3avg (training.average; the first gives the hot tokens)
DATA=${DATA:-}                       # training data (default: this run's regen0..regenN-1)
EXTRA_DATA=${EXTRA_DATA:-}           # more sources for both trainings, e.g. carried shards: regen:DIR,regen:DIR
INIT3=${INIT3:-assets/drafters/smollm2-135m-eagle3}   # start from these weights ("" for a fresh head)
INIT3B=${INIT3B:-$INIT3}             # where the A/B variant eagle3b starts (default: where eagle3 does)
INIT1=${INIT1:-assets/drafters/smollm2-135m-eagle}
TRAIN3_EVAL_MIN=${TRAIN3_EVAL_MIN:-2}  # EAGLE-3 runs walk their chains over the target's greedy hold-out
                                     # answers ($W/holdout-greedy, made first) this often (training.walk_eval); 0: never
VAL_PROMPTS=${VAL_PROMPTS:-50}        # the headline row (k = 7, T = 0)
VAL_TABLE_PROMPTS=${VAL_TABLE_PROMPTS:-20}  # the full table (k = 1..8, T = 0 and 1)
VAL_NEW_TOKENS=${VAL_NEW_TOKENS:-256}  # vLLM's spec_decode example default output length
VAL_HEADLINE_MODES=${VAL_HEADLINE_MODES:-"cudagraph eager compile-all compile-drafter"}  # the headline's modes
VAL_DRAFTERS=${VAL_DRAFTERS:-}       # which of $W's drafters get the headline, one GPU each in turn (default: eagle3 eagle [eagle3b])
VAL_TABLE_DRAFTERS=${VAL_TABLE_DRAFTERS:-}  # which get the table (default: VAL_DRAFTERS; "best": the better EAGLE-3
                                     # and eagle; "best3": the better EAGLE-3 alone)
VAL_FULL_DRAFTERS=${VAL_FULL_DRAFTERS:-}  # which get the headline row on every hold-out prompt ("best": the better EAGLE-3)
VAL_FULL_SHARDS=${VAL_FULL_SHARDS:-8}  # processes per GPU for it (validate --shard, merged count for count)
VAL_TABLE_MODE=${VAL_TABLE_MODE:-cudagraph}  # the table's mode (its counts are eager's: the headline's merge
                                     # checks it at k = 7, tests/test_cuda.py at T = 0 and T > 0; eager costs 5x)
BENCH_NEW_TOKENS=${BENCH_NEW_TOKENS:-256}
STAGES=${STAGES:-"regen train validate modes"}
MODES_METHODS=${MODES_METHODS:-"eagle3 eagle none"}  # the mode comparison's methods
export PYTHONUNBUFFERED=1
# data-parallel training needs plain NCCL all-reduces only: NVLink multicast stays off, on shared hosts too
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

[ "$NGPU" -ge 1 ] || { echo "no GPU found (set NGPU)"; exit 1; }
mkdir -p "$W/logs" "$W/validate" "$W/modes"
log() { echo "[$(date +%T)] $*" | tee -a "$W/pipe.log"; }
on_gpu() { local g=$(( $1 % NGPU )); shift; CUDA_VISIBLE_DEVICES=$g "$@"; }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }

regen_dirs() {
  local d="$DATA"
  if [ -z "$d" ]; then  # this run's shards, where regeneration wrote any
    for r in "$W"/regen*/; do ls "$r"part-*.npz >/dev/null 2>&1 && d+="${d:+,}regen:${r%/}"; done
  fi
  [ -z "$d" ] && { echo "${EXTRA_DATA:?no training data: this run regenerated none and EXTRA_DATA is empty}"; return; }
  echo "$d${EXTRA_DATA:+,$EXTRA_DATA}"
}

modes() {  # modes GPU METHOD [drafter dir]: eager, graph and compiled graph on the bench prompts, then compared
  local g=$1 m=$2 d=${3:+--drafter $3}
  local b="python3 -m demo.bench --prompts assets/prompts/questions.jsonl --max-new-tokens $BENCH_NEW_TOKENS -k 7 --method $m $d"
  local runs="eager graph compile compile-drafter"
  [ "$m" = none ] && runs="eager eager2 graph compile"  # eager twice: is eager itself repeatable across processes?
  for r in $runs; do
    local flags="--mode eager"
    [ "$r" = graph ] && flags="--mode cudagraph"
    [ "$r" = compile ] && flags="--mode cudagraph --compile all"
    [ "$r" = compile-drafter ] && flags="--mode cudagraph --compile drafter"
    on_gpu "$g" $b $flags --json "$W/modes/$m-$r.json" > "$W/logs/modes-$m-$r.log" 2>&1
  done
  python3 -m demo.compare $(for r in $runs; do echo "$W/modes/$m-$r.json"; done) > "$W/modes/$m.md" 2>&1
  log "modes $m done"
}

merge_validation() {  # merge_validation NAME JSON...: one report, $W/NAME.json and .md, from split validation runs
  local name=$1; shift
  python3 -m training.validate --merge "$@" --json "$W/$name.json" --markdown "$W/$name.md" >> "$W/logs/validate-merge.log" 2>&1
}

train() {  # train GPU|all METHOD MINUTES INIT [NAME EXTRA_FLAGS]: the drafter lands in $W/NAME (default METHOD)
  local init=${4:+--init-drafter $4} name=${5:-$2}
  if [ "$2" = eagle ] && [ "$3" = 0 ]; then  # no training: the starting head is the result
    mkdir -p "$W/eagle" && cp "$4"/config.json "$4"/model*.safetensors* "$W/eagle/"
    log "train eagle skipped (TRAIN1_MIN=0): $4"
    return
  fi
  local extra=""; [ "$2" = eagle3 ] && extra="$TRAIN3_ARGS ${6:-}"
  [ "$2" = eagle3 ] && [ "$TRAIN3_EVAL_MIN" != 0 ] && [ -e "$W/holdout-greedy/meta.json" ] &&
    extra+=" --eval-data regen:$W/holdout-greedy --eval-every-min $TRAIN3_EVAL_MIN"
  local args=(-m training.train --method "$2" --data "$(regen_dirs)" --out "$W/$name" --time-budget-min "$3" $init $extra
              --no-progress)
  if [ "$1" = all ]; then
    python3 -m torch.distributed.run --nproc-per-node "$NGPU" "${args[@]}" > "$W/logs/train-$name.log" 2>&1
  else
    on_gpu "$1" python3 "${args[@]}" > "$W/logs/train-$name.log" 2>&1
  fi
  log "train $name rc=$?"
}

if has_stage regen; then
  log "regen on $NGPU GPU(s), $REGEN_PASSES pass(es)"
  for ((g = 0; g < NGPU; g++)); do
    for ((p = 0; p < REGEN_PASSES; p++)); do  # one GPU's passes in turn
      s=$g; [ "$p" -gt 0 ] && s="$g-p$p"
      on_gpu "$g" python3 -m training.data regen --prompts "$TRAIN_PROMPTS" --out "$W/regen$s" --shard "$g/$NGPU" \
        --max-new-tokens "$REGEN_NEW_TOKENS" --max-prompt-tokens 512 --batch-size 512 --cuda-graph \
        --temperature "$REGEN_TEMPERATURE" --seed "$((REGEN_SEED + g + p * NGPU))" \
        --time-budget-min "$REGEN_MIN" > "$W/logs/regen$s.log" 2>&1
    done &
  done
  wait
  log "regen done"
fi

if has_stage train; then
  if [ "$TRAIN3_EVAL_MIN" != 0 ] && [ ! -e "$W/holdout-greedy/meta.json" ]; then  # seconds on a GPU
    on_gpu 0 python3 -m training.data regen --prompts "$HOLDOUT_PROMPTS" --out "$W/holdout-greedy" \
      --max-prompt-tokens 1024 --max-new-tokens "$VAL_NEW_TOKENS" --batch-size 512 --cuda-graph \
      > "$W/logs/regen-holdout-greedy.log" 2>&1
    log "hold-out greedy answers for the training walks rc=$?"
  fi
  if [ "$TRAIN3_ALL_GPUS" = 1 ]; then
    train all eagle3 "$TRAIN3_MIN" "$INIT3"
    train 0 eagle "$TRAIN1_MIN" "$INIT1"
  elif [ "$NGPU" -ge 2 ]; then
    train 0 eagle3 "$TRAIN3_MIN" "$INIT3" &
    { train 1 eagle "$TRAIN1_MIN" "$INIT1"
      [ -n "$TRAIN3B_ARGS" ] && train 1 eagle3 "$TRAIN3_MIN" "$INIT3B" eagle3b "$TRAIN3B_ARGS"
      has_stage modes && [[ " $MODES_METHODS " == *" none "* ]] && modes 1 none; } &
    wait
  else  # one GPU: an A/B variant trains beside EAGLE-3 on it (each got 40 % of a lone run's steps)
    [ -n "$TRAIN3B_ARGS" ] && train 0 eagle3 "$TRAIN3_MIN" "$INIT3B" eagle3b "$TRAIN3B_ARGS" &
    train 0 eagle3 "$TRAIN3_MIN" "$INIT3"
    wait
    train 0 eagle "$TRAIN1_MIN" "$INIT1"
  fi
fi

if [ -n "$AVERAGE" ]; then  # heads trained from one start: their mean often drafts better than either
  python3 -m training.average --out "$W/eagle3avg" $(for m in $AVERAGE; do echo "$W/$m"; done) \
    > "$W/logs/average.log" 2>&1
  log "average ($AVERAGE) into eagle3avg rc=$?"
fi

if has_stage validate; then
  # First the headline (k = 7, T = 0, VAL_PROMPTS prompts) in each of VAL_HEADLINE_MODES: graph and
  # eager runs of one drafter merge into one row (the merge refuses them if they disagree); compiled
  # runs, all steps or the drafter's only, are rows of their own (acceptance next to eager's). Then
  # the table: k = 1..8, T = 0 and 1, VAL_TABLE_PROMPTS prompts, in VAL_TABLE_MODE, one process
  # per (drafter, T, k), so the longest run no longer holds up the stage.
  log "validate"
  v="python3 -m training.validate --prompts $HOLDOUT_PROMPTS --max-new-tokens $VAL_NEW_TOKENS --no-progress"
  drafters=${VAL_DRAFTERS:-"eagle3 eagle"}
  for m in eagle3b eagle3avg; do [ -z "${VAL_DRAFTERS:-}" ] && [ -e "$W/$m/config.json" ] && drafters+=" $m"; done
  i=0
  for m in $drafters; do
    for tag in $VAL_HEADLINE_MODES; do
      mode=$tag; [[ $tag == compile-* ]] && mode="cudagraph --compile ${tag#compile-}"
      tag=${tag/#compile-/cudagraph-compile-}
      on_gpu $i $v --num-prompts "$VAL_PROMPTS" --drafter "$W/$m" --mode $mode --temperatures 0 --ks 7 \
        --json "$W/validate/headline-$m-$tag.json" > "$W/logs/validate-headline-$m-$tag.log" 2>&1 &
    done
    i=$((i + 1))
  done
  wait
  merge_validation headline $(for m in $drafters; do echo "$W"/validate/headline-$m-*.json; done)
  log "validate headline done rc=$?"
  best="$(python3 -c 'import json, os, sys
runs = [r for r in json.load(open(sys.argv[1]))["runs"] if r["method"] == "eagle3" and not r.get("compile")]
best = max(runs, key=lambda r: r["mean_acceptance_length"], default=None)
print(os.path.basename(best["path"]) if best else "")' "$W/headline.json")"
  full=$VAL_FULL_DRAFTERS; [ "$full" = best ] && full=$best
  if [ -n "$full" ]; then  # the headline row on every hold-out prompt, in prompt shards over all GPUs
    n=$((NGPU * VAL_FULL_SHARDS))
    for m in $full; do
      for ((s = 0; s < n; s++)); do
        on_gpu $s $v --num-prompts 0 --shard "$s/$n" --drafter "$W/$m" --mode cudagraph --temperatures 0 --ks 7 \
          --json "$W/validate/full-$m-$s.json" > "$W/logs/validate-full-$m-$s.log" 2>&1 &
      done
      wait
    done
    merge_validation full $(for m in $full; do echo "$W"/validate/full-$m-*.json; done)
    log "validate full hold-out ($full) done rc=$?"
  fi
  table=${VAL_TABLE_DRAFTERS:-$drafters}
  [ "$table" = best ] && table="$best eagle"  # the EAGLE-3 variant with the best headline, and EAGLE-1
  [ "$table" = best3 ] && table="$best"        # that variant alone (EAGLE-1 kept as it was: its table stands)
  n=0
  for m in $table; do
    for t in 0 1; do
      for k in 1 2 3 4 5 6 7 8; do
        on_gpu $n $v --num-prompts "$VAL_TABLE_PROMPTS" --drafter "$W/$m" --mode "$VAL_TABLE_MODE" --temperatures $t \
          --ks $k --json "$W/validate/table-$m-T$t-k$k.json" > "$W/logs/validate-table-$m-T$t-k$k.log" 2>&1 &
        n=$((n + 1))
      done
    done
  done
  wait
  merge_validation validate $(for m in $table; do echo "$W"/validate/table-$m-*.json; done)
  log "validate table ($table, $VAL_TABLE_MODE) done rc=$?"
fi

if has_stage modes; then
  # one method per GPU, side by side (with more methods than GPUs some share one: mind the timings);
  # target-only may already have run on GPU 1 during EAGLE-3's training
  i=0
  for m in $MODES_METHODS; do
    [ "$m" = none ] && [ -e "$W/modes/none.md" ] && continue
    d=""; [ "$m" != none ] && d="$W/$m"
    modes $i "$m" $d &
    i=$((i + 1))
  done
  wait
fi

log "summary"
for m in eagle3 eagle3b eagle; do grep -h "final window" "$W/logs/train-$m.log" 2>/dev/null | sed "s/^/$m: /"; done
grep -h "tokens_per_s\|\"answered\"" "$W"/logs/regen*.log 2>/dev/null
cat "$W/headline.md" "$W/full.md" 2>/dev/null
for m in none eagle3 eagle; do cat "$W/modes/$m.md" 2>/dev/null; done
