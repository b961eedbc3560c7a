#!/usr/bin/env bash
# The shipped drafters' recipe, start to end on one GPU machine: regenerate the training answers
# with the target, train two EAGLE-3 arms from the shipped head and average them, train EAGLE-1,
# validate on the hold-out. docs/TRAINING.md explains every stage and what it costs.
#
#   python -m training.data prompts --all-turns --out artifacts/prompts-turns   # where ShareGPT is (CPU);
#   python -m training.data prompts --out artifacts/prompts                     # carry both to the GPUs
#   W=artifacts/run bash training/recipe.sh                                      # on the GPU machine
#
# Knobs: W (work directory), NGPU (GPUs to use; default: all), REGEN_MIN (minutes per regeneration
# pass; a pass resumes where it stopped when run again), TRAIN3_MIN and TRAIN1_MIN (minutes of
# training per EAGLE-3 arm and for EAGLE-1; TRAIN1_MIN=0 keeps the shipped EAGLE-1), SAMPLED_MIN
# (minutes for the sampling arm).
# Everything lands under $W: regen/, holdout-greedy/, eagle3-all/ and eagle3-greedy/ (the arms),
# eagle3-arms/ (their average), eagle3-t1/ (the sampling arm), eagle3/ (the mean of those two: the
# EAGLE-3 to ship), eagle/, validate/, logs/, and the reports
# headline.md (k = 7, T = 0, 50 prompts), full.md (every hold-out prompt) and table.md (k = 1..8,
# T = 0 and 1, 20 prompts). To ship:
#   cp $W/eagle3/{config.json,model*.safetensors*,average_log.json,hot_tokens.json} assets/drafters/smollm2-135m-eagle3/
#   cp $W/eagle/{config.json,model*.safetensors*,train_log.json} assets/drafters/smollm2-135m-eagle/
set -uo pipefail

W=${W:-artifacts/run}
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
REGEN_MIN=${REGEN_MIN:-4}
TRAIN3_MIN=${TRAIN3_MIN:-13}
TRAIN1_MIN=${TRAIN1_MIN:-6}
SAMPLED_MIN=${SAMPLED_MIN:-4.2}

TRAIN_PROMPTS=artifacts/prompts-turns/train  # every distinct user turn of the training records
HOLDOUT_PROMPTS=artifacts/prompts/holdout    # the validation prompts: never trained on
EAGLE3=assets/drafters/smollm2-135m-eagle3   # where both arms start
EAGLE1=assets/drafters/smollm2-135m-eagle
SAMPLED_PASSES=4                             # answers per prompt at T = 0.8, besides the greedy one
NEW_TOKENS=256                               # answer length, as validation decodes (vLLM's spec_decode default)
export PYTHONUNBUFFERED=1

[ "$NGPU" -ge 1 ] || { echo "no GPU found (set NGPU)"; exit 1; }
mkdir -p "$W/logs" "$W/validate"
log() { echo "[$(date +%T)] $*" | tee -a "$W/recipe.log"; }
on_gpu() { local g=$(( $1 % NGPU )); shift; CUDA_VISIBLE_DEVICES=$g "$@"; }
pids=()
bg() { "$@" & pids+=($!); }  # a job of this stage, in the background
join() {  # wait for the stage's jobs; stop the recipe if one failed
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  [ "$rc" = 0 ] || { log "$1 failed: see $W/logs"; exit 1; }
  log "$1 done"
}
sources() { local d s=""; for d in "$@"; do s+="${s:+,}regen:$d"; done; echo "$s"; }

# 1. Regenerate: the target answers every training prompt greedily, then SAMPLED_PASSES times at
# T = 0.8 with a new seed each (what the shipped EAGLE-3's arms trained on); each GPU takes every
# NGPU-th prompt. Then its greedy answers to the hold-out prompts, which the EAGLE-3 runs walk
# their chains over every 2 minutes.
regen() {  # regen GPU OUT [regen flags]
  local g=$1 out=$2; shift 2
  on_gpu "$g" python3 -m training.data regen --prompts "$TRAIN_PROMPTS" --out "$out" --shard "$g/$NGPU" \
    --max-new-tokens "$NEW_TOKENS" --max-prompt-tokens 512 --batch-size 512 --cuda-graph \
    --time-budget-min "$REGEN_MIN" "$@" > "$W/logs/$(basename "$out").log" 2>&1
}
regen_gpu() {  # regen_gpu GPU: its share of the prompts, the greedy pass and then the sampled ones
  local g=$1 p
  regen "$g" "$W/regen/greedy-$g" || return
  for ((p = 0; p < SAMPLED_PASSES; p++)); do
    regen "$g" "$W/regen/t08-$p-$g" --temperature 0.8 --seed $((p * NGPU + g)) || return
  done
}
greedy=() sampled=()
for ((g = 0; g < NGPU; g++)); do
  greedy+=("$W/regen/greedy-$g")
  for ((p = 0; p < SAMPLED_PASSES; p++)); do sampled+=("$W/regen/t08-$p-$g"); done
  bg regen_gpu "$g"
done
all=("${greedy[@]}" "${sampled[@]}")
join "regeneration on $NGPU GPU(s)"
bg on_gpu 0 python3 -m training.data regen --prompts "$HOLDOUT_PROMPTS" --out "$W/holdout-greedy" \
  --max-prompt-tokens 1024 --max-new-tokens "$NEW_TOKENS" --batch-size 512 --cuda-graph \
  > "$W/logs/holdout-greedy.log" 2>&1
join "the target's greedy hold-out answers"

# 2. EAGLE-3: two arms from the shipped head at the trainer's defaults (the shipped settings) and a
# gentler restart, one per GPU (side by side on one): on all the answers, and on the greedy ones alone.
train() {  # train GPU NAME [training.train flags]
  local g=$1 name=$2; shift 2
  on_gpu "$g" python3 -m training.train --out "$W/$name" --no-progress "$@" > "$W/logs/train-$name.log" 2>&1
}
eagle3=(--method eagle3 --init-drafter "$EAGLE3" --lr 2.5e-4 --time-budget-min "$TRAIN3_MIN"
        --eval-data "regen:$W/holdout-greedy" --eval-every-min 2)
bg train 0 eagle3-all "${eagle3[@]}" --data "$(sources "${all[@]}")"
bg train 1 eagle3-greedy "${eagle3[@]}" --data "$(sources "${greedy[@]}")"
join "EAGLE-3 arms"

# 3. EAGLE-1, on the greedy answers.
if [ "$TRAIN1_MIN" = 0 ]; then
  mkdir -p "$W/eagle" && cp "$EAGLE1"/config.json "$EAGLE1"/model*.safetensors* "$W/eagle/"
  log "EAGLE-1 kept as shipped (TRAIN1_MIN=0)"
else
  bg train 0 eagle --method eagle --init-drafter "$EAGLE1" --time-budget-min "$TRAIN1_MIN" \
    --data "$(sources "${greedy[@]}")"
  join "EAGLE-1"
fi

# 4. Average the arms: heads trained from one start draft better as their mean. The greedy arm
# goes first: its hot tokens are the ones kept (what the T = 0 metric decodes).
bg python3 -m training.average --out "$W/eagle3-arms" "$W/eagle3-greedy" "$W/eagle3-all" > "$W/logs/average.log" 2>&1
join "average"

# 4b. The sampling round: the target answers every training prompt once more at T = 1 (the
# distribution a T = 1 step verifies against), an arm continues the arms' mean on those answers with
# the soft loss alone (no top-1 term, every chain root weighed alike), and the head to ship is the
# mean of the two: the arm alone drafts better at T = 1 but worse at T = 0 than the mean does.
t1=()
for ((g = 0; g < NGPU; g++)); do
  t1+=("$W/regen/t1-$g")
  bg regen "$g" "$W/regen/t1-$g" --temperature 1.0 --seed $((11 + g))
done
join "the T = 1 answers"
bg train 0 eagle3-t1 --method eagle3 --init-drafter "$W/eagle3-arms" --lr 2e-4 --top1-weight 0 \
  --chain-start-weight 1 --time-budget-min "$SAMPLED_MIN" --data "$(sources "${t1[@]}")"
join "the sampling arm"
bg python3 -m training.average --out "$W/eagle3" "$W/eagle3-arms" "$W/eagle3-t1" >> "$W/logs/average.log" 2>&1
join "average with the sampling arm"

# 5. Validate through the app's engine in graph mode (the same counts as eager, faster): the
# headline for every head; the EAGLE-3 to ship on every hold-out prompt, 8 prompt shards per GPU;
# the table for both heads to ship, one process per (drafter, T, k). Shards and splits merge
# count for count.
validate() {  # validate GPU NAME JSON [training.validate flags]
  local g=$1 name=$2 json=$3; shift 3
  on_gpu "$g" python3 -m training.validate --prompts "$HOLDOUT_PROMPTS" --drafter "$W/$name" \
    --max-new-tokens "$NEW_TOKENS" --mode cudagraph --no-progress --json "$W/validate/$json.json" "$@" \
    > "$W/logs/validate-$json.log" 2>&1
}
merge() {  # merge REPORT PREFIX: $W/REPORT.json and .md from $W/validate/PREFIX*.json
  python3 -m training.validate --merge "$W"/validate/"$2"*.json --json "$W/$1.json" --markdown "$W/$1.md" \
    >> "$W/logs/validate-merge.log" 2>&1 || { log "merge $1 failed"; exit 1; }
}
i=0
for m in eagle3 eagle3-arms eagle3-t1 eagle3-greedy eagle3-all eagle; do
  bg validate $i "$m" "headline-$m" --num-prompts 50 --ks 7 --temperatures 0
  i=$((i + 1))
done
join "validation: headline"
merge headline headline-
n=$((NGPU * 8))
for ((s = 0; s < n; s++)); do
  bg validate $s eagle3 "full-$s" --num-prompts 0 --shard "$s/$n" --ks 7 --temperatures 0
done
join "validation: every hold-out prompt"
merge full full-
i=0
for m in eagle3 eagle; do
  for t in 0 1; do
    for k in 1 2 3 4 5 6 7 8; do
      bg validate $i "$m" "table-$m-T$t-k$k" --num-prompts 20 --ks $k --temperatures $t
      i=$((i + 1))
    done
  done
done
join "validation: table"
merge table table-

log "summary"
for m in eagle3-all eagle3-greedy eagle3-t1 eagle; do grep -h "final window" "$W/logs/train-$m.log" 2>/dev/null | sed "s/^/$m: /"; done
cat "$W/headline.md" "$W/full.md" "$W/table.md"
