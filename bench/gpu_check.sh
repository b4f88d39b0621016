#!/usr/bin/env bash
# One prepared check of nmt on a GPU, run once in one call, the headline figures first:
# the bf16 matmul rate; training speed of base and big as `nmt train` runs them (ms/step,
# tokens/s, % of that measured matmul rate); the Multi30k EN-DE recipe for 2 minutes of
# training on one GPU, with its BLEU; beam-4 decoding speed at batch 1 and batch 128; the
# fp16 step with its gradient scaler; `nmt train` under torchrun; and the one-line error
# of `nmt train --gpus N` with more GPUs than the machine has; the training loop's host
# time per update outside the model (bench/profile_train.py). About 8 minutes on one H200
# once the machine is up. Only measured rates are reported (no spec-sheet peaks).
#
#   bash bench/gpu_check.sh [DATA] [OUT_DIR]
#
# DATA      Multi30k EN-DE, prepared (a directory with manifest.json, as `nmt prepare`
#           writes it) or raw (the multi30k/dataset files: train.en.gz, train.de.gz,
#           val.*, test_2016_flickr.*, compressed or not), which the check prepares
#           itself in seconds (`nmt prepare multi30k-en-de --from DATA`, stage `prepare`).
#           Default: the repository's data/multi30k-en-de when it is prepared, else the
#           raw corpus beside the checkout, ../shared/data/multi30k. With neither, the
#           Multi30k and decoding stages cannot run and the check fails ("data").
# OUT_DIR   Logs, SUMMARY.txt and the Multi30k run's metrics and results (default: $OUT
#           when set, else a new temporary directory). The prepared data and the runs'
#           checkpoints (hundreds of MB) stay in a temporary directory.
#
# Needs a python with torch (CUDA build), numpy, typer, rich, sentencepiece and
# sacrebleu; the repository need not be installed (PYTHONPATH is set here), and nothing
# these stages run imports sacremoses or datasets. PYTHON picks the interpreter.
#
# Each stage has its own time limit (seconds: environment 15, prepare 30, train-speed
# 110, multi30k 170, multi30k-figures 5, decode-speed 30, host-time 25, train-fp16 50,
# torchrun 40, gpus-error 10; 485 in all), within GPU_CHECK_SECONDS (default 540), most important
# first, so a slow or failing stage costs only its own figures and a stage that finds
# the time spent is skipped; the exit status is 1 when a stage failed, timed out or was
# skipped, or the data was missing. The eager and pre-change ("baseline") training
# variants are not part of the check: `python bench/gpu_train.py --variants
# nmt,eager,baseline` measures them side by side.
#
# GPU_CHECK_DRY=1 runs every stage's command on the CPU with tiny settings (a tiny model,
# `nmt train`'s in fp32, a few updates, a few sentences, at most 2,000 training pairs,
# every stage limited to 90 s), so a broken stage fails on a machine without a GPU;
# tests/integration/test_gpu_check.py runs it. Without a GPU and without GPU_CHECK_DRY,
# only the environment and data stages run.

set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -ge 1 ]; then
    SOURCE="$1"
elif [ -f "$REPO/data/multi30k-en-de/manifest.json" ]; then
    SOURCE="$REPO/data/multi30k-en-de"
else
    SOURCE="$REPO/../shared/data/multi30k"
fi
[ -d "$SOURCE" ] && SOURCE="$(cd "$SOURCE" && pwd)"  # a relative path means from here
OUT_DIR="${2:-${OUT:-$(mktemp -d)}}"
PY="${PYTHON:-$(command -v python || command -v python3)}"
DEADLINE="${GPU_CHECK_SECONDS:-540}"
DRY="${GPU_CHECK_DRY:-0}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK="$(mktemp -d)"  # prepared data and checkpoints
SUMMARY="$OUT_DIR/SUMMARY.txt"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
NMT=("$PY" -m nmt_cli)
FAILED=()
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }

# stage NAME SECONDS COMMAND...: run with a time limit (90 s each in the dry run), its
# output in OUT_DIR/NAME.log, on the screen and in the summary (only the last lines of
# `nmt run`'s long progress); a failure or timeout is recorded and the next stage runs.
stage() {
    local name="$1" limit="$2"
    shift 2
    [ "$DRY" = 1 ] && limit=90
    local left=$((DEADLINE - SECONDS - 5))
    say ""
    if [ "$left" -lt 15 ]; then
        say "== $name: SKIPPED, the check's ${DEADLINE}s are spent: $*"
        FAILED+=("$name")
        return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    say "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=5 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    local took=$((SECONDS - start))
    if [ "$name" = multi30k ]; then
        tail -n 30 "$OUT_DIR/$name.log" | tee -a "$SUMMARY"
    else
        tee -a "$SUMMARY" <"$OUT_DIR/$name.log"
    fi
    if [ "$rc" -eq 0 ]; then
        say "-- $name: done in ${took}s"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        say "-- $name: TIMED OUT after ${took}s (figures above are partial)"
        FAILED+=("$name")
    else
        say "-- $name: FAILED (exit $rc) after ${took}s"
        FAILED+=("$name")
    fi
    return 0
}

# expect_error TEXT COMMAND...: succeeds when COMMAND exits with 1 and says one line,
# `error: ...` containing TEXT, with no traceback (what a user sees for a mistake).
expect_error() {
    local text="$1" out rc
    shift
    out="$("$@" 2>&1)"
    rc=$?
    printf '%s\n' "$out"
    if [ "$rc" -eq 1 ] && [ "$(grep -c . <<<"$out")" -eq 1 ] && grep -q '^error: ' <<<"$out" \
        && grep -qF -- "$text" <<<"$out"; then
        echo "(the expected one-line error, exit 1)"
        return 0
    fi
    echo "expected exit 1 and one line 'error: ...$text...', got exit $rc"
    return 1
}
export -f expect_error

finish() {
    say ""
    if [ ${#FAILED[@]} -gt 0 ]; then
        say "failed, timed out or skipped: ${FAILED[*]} (logs in $OUT_DIR)"
        exit 1
    fi
    say "all stages ran; the figures are above and in $SUMMARY"
    exit 0
}

cd "$REPO" || exit 1
say "nmt GPU check, $(date -u +%Y-%m-%dT%H:%MZ), repository $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '(not a git checkout)')"
[ "$DRY" = 1 ] && say "DRY RUN (GPU_CHECK_DRY=1): every stage on the CPU with tiny settings"
say "output: $OUT_DIR; prepared data and checkpoints: $WORK"

# -- the environment, which also says how many GPUs the GPU stages get ---------------------
stage environment 15 "$PY" - <<'PY'
import sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
if gpus:
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {gpus} x {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
else:
    print("GPU: none visible")
# Every module these stages use, and none of the optional heavy dependencies.
import nmt_cli.cli, nmt_cli.engines.run, nmt_cli.engines.train, nmt_cli.engines.translate  # noqa
import nmt_cli.engines.score, nmt_cli.engines.average, nmt_cli.engines.prepare  # noqa
heavy = sorted({"sacremoses", "datasets"} & set(sys.modules))
if heavy:
    sys.exit(f"imported at start-up, but needed only by prepare/score options: {heavy}")
print("imports: nmt_cli's commands load without sacremoses or datasets")
print(f"cuda devices: {gpus}")
PY
GPUS="$(sed -n 's/^cuda devices: \([0-9]*\)$/\1/p' "$OUT_DIR/environment.log" 2>/dev/null)"
NO_GPU="no CUDA GPU visible"
[ -z "$GPUS" ] && NO_GPU="the environment stage did not count the GPUs"
GPUS="${GPUS:-0}"

# -- the data: prepared, or raw files prepared here -------------------------------------------
DATA=""
if [ -f "$SOURCE/manifest.json" ]; then
    DATA="$SOURCE"
    say ""
    say "== data: the prepared Multi30k directory $DATA"
elif [ -d "$SOURCE" ]; then
    PREPARE_DRY=()
    [ "$DRY" = 1 ] && PREPARE_DRY=(--max-pairs 2000 --vocab-size 200 --workers 1)
    stage prepare 30 "${NMT[@]}" prepare multi30k-en-de --from "$SOURCE" \
        --out "$WORK/multi30k-en-de" -q "${PREPARE_DRY[@]}"
    [ -f "$WORK/multi30k-en-de/manifest.json" ] && DATA="$WORK/multi30k-en-de"
else
    say ""
    say "== data: no Multi30k at '$SOURCE' (neither prepared nor raw): the Multi30k and"
    say "   decoding stages cannot run. Name the raw files' directory (train.en.gz, ...)"
    say "   or a prepared directory as this script's first argument."
    FAILED+=(data)
fi

if [ "$GPUS" -eq 0 ] && [ "$DRY" != 1 ]; then
    say ""
    say "$NO_GPU: skipping the GPU stages (matmul rate, training speed of base"
    say "and big, the Multi30k run, decoding speed, fp16, torchrun, the --gpus error). Run"
    say "this script on a GPU machine for those figures, or with GPU_CHECK_DRY=1 to run"
    say "every stage's command on this CPU with tiny settings."
    finish
fi

# -- what each stage runs: on the GPU, or tiny on the CPU ------------------------------------
if [ "$DRY" = 1 ]; then
    ON=0  # --gpus
    NPROC=1
    # eager: compiling on a CPU takes minutes; the baseline variant, which the GPU
    # stages leave out, rides along so that its code stays checked too
    TINY_SPEED=(--tiny --device cpu --models tiny --steps 2 --batches 2 --max-tokens 400
        --no-probe)
    SPEED=("${TINY_SPEED[@]}" --variants eager,baseline)
    FP16=("${TINY_SPEED[@]}" --variants eager --precision fp16)
    # fp32: `nmt train` measures the matmul rate in its precision at start, and bf16
    # products take seconds on a CPU without bf16 units
    TINY=(--set model.encoder_layers=1 --set model.decoder_layers=1 --set model.d_model=32
        --set model.d_ff=64 --set model.n_heads=2 --set train.batch_tokens=300
        --set train.warmup_steps=4 --set train.threads=1 --set train.log_interval_steps=1
        --set train.precision=fp32)
    RUN_SET=("${TINY[@]}" --set train.max_steps=3 --set train.save_interval_steps=1
        --set decode.max_len_b=5 --set decode.threads=1 --set decode.compiled_step=false)
    DECODE=(--device cpu --python-step --threads 1 --sentences 16 --single 3 --max-len-b 3)
    HOST=(--updates 5 --precision fp32 "${TINY[@]}")
    TORCHRUN_SET=("${TINY[@]}" --set train.max_steps=2)
else
    ON=1
    NPROC=1
    [ "$GPUS" -ge 2 ] && NPROC=2
    SPEED=(--models base,big --variants nmt --steps 40 --max-tokens 25000)
    FP16=(--models base --variants nmt --precision fp16 --steps 20 --max-tokens 25000 --no-probe)
    RUN_SET=(--set train.max_time_minutes=2 --set train.save_interval_minutes=0.4
        --set train.log_interval_steps=25)
    DECODE=(--single 200)
    # the base model's size and batches, eager: the host's share, not compilation's
    HOST=(--updates 40 --precision bf16 --set model.encoder_layers=6
        --set model.decoder_layers=6 --set model.d_model=512 --set model.d_ff=2048
        --set model.n_heads=8 --set train.batch_tokens=25000 --set train.compile=false)
    TORCHRUN_SET=(--set train.max_steps=30 --set train.compile=false
        --set train.log_interval_steps=10)
fi

# -- the stages, headline figures first --------------------------------------------------------
# The matmul rate, then training speed as `nmt train` runs it on a GPU (compiled: the
# first update, compilation included, is reported on its own).
stage train-speed 110 "$PY" bench/gpu_train.py "${SPEED[@]}"

if [ -n "$DATA" ]; then
    RUN="$WORK/multi30k-en-de-run"
    stage multi30k 170 "${NMT[@]}" run recipes/multi30k-en-de.toml --gpus "$ON" --from train \
        --set "data.dir=$DATA" --set "train.run_dir=$RUN" --set score.paper_bleu=false \
        "${RUN_SET[@]}"
    stage multi30k-figures 5 "$PY" bench/run_figures.py "$RUN"
    cp "$RUN"/metrics.jsonl "$RUN"/results.json "$RUN"/config.json "$OUT_DIR"/ 2>/dev/null
    MODEL="$RUN/average.pt"
    [ -f "$MODEL" ] || MODEL="$RUN/checkpoints/last.pt"
    stage decode-speed 30 "$PY" bench/gpu_decode.py --model "$MODEL" \
        --input "$DATA/test.src.txt" "${DECODE[@]}"
    # The training loop's host time per update outside the model's forward, loss,
    # backward and optimizer (the target: under 2 ms), with the split of each update.
    stage host-time 25 "$PY" bench/profile_train.py --data "$DATA" --gpus "$ON" --alone 0 \
        "${HOST[@]}"
fi

stage train-fp16 50 "$PY" bench/gpu_train.py "${FP16[@]}"

# `nmt train` as torchrun starts it (RANK, WORLD_SIZE, LOCAL_RANK from the environment;
# rendezvous on this machine), on every GPU up to 2; uncompiled, a few updates.
if [ -n "$DATA" ]; then
    stage torchrun 40 "$PY" -m torch.distributed.run --standalone --nnodes 1 \
        --nproc-per-node "$NPROC" -m nmt_cli train recipes/multi30k-en-de.toml \
        --gpus "$((ON * NPROC))" --set "data.dir=$DATA" --set "train.run_dir=$WORK/torchrun" \
        "${TORCHRUN_SET[@]}"
fi

# More GPUs than there are: one line saying so, before anything is read or written.
stage gpus-error 10 bash -c 'expect_error "$@"' expect_error "CUDA GPU(s) are visible" \
    "${NMT[@]}" train recipes/multi30k-en-de.toml --gpus "$((GPUS + 1))"

finish
