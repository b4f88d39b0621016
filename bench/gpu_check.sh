#!/usr/bin/env bash
# One prepared check of nmt on a GPU, run once: the bf16 matmul rate, training speed of
# base and big (ms/step, tokens/s, % of the measured matmul rate), the Multi30k EN-DE
# recipe for 2 minutes of training on one GPU, and beam-4 decoding speed at batch 128 and
# batch 1. About 8 minutes on one H200 once the machine is up.
#
#   bash bench/gpu_check.sh [DATA_DIR] [OUT_DIR]
#
# DATA_DIR  Multi30k EN-DE as `nmt prepare` writes it (default: the repository's
#           data/multi30k-en-de).
#           A GPU machine without internet needs it brought along: on a machine that
#           has the corpus, prepare it inside the repository, where data/ is git-ignored,
#               nmt run recipes/multi30k-en-de.toml --until prepare   # ~3 MB
#           then copy that directory next to the repository's files on the GPU machine
#           (or, with a tool that ships the working tree, name data/multi30k-en-de among
#           the ignored paths it carries). Without it the Multi30k and decoding stages
#           are skipped; the training-speed stages need no data.
# OUT_DIR   Logs, SUMMARY.txt and the Multi30k run's metrics and results (default: $OUT
#           when set, else a new temporary directory). The run's checkpoints (hundreds of
#           MB) stay in a temporary directory.
#
# Needs a python with torch (CUDA build), numpy, typer, rich, sentencepiece and
# sacrebleu; the repository need not be installed (PYTHONPATH is set here), and nothing
# these stages run imports sacremoses or datasets. PYTHON picks the interpreter. Each
# stage has its own time limit, and all together stay within GPU_CHECK_SECONDS (default
# 540), most important first, so a slow or failing stage costs only its own figures and
# those after it; the exit status is 1 when a stage failed, timed out or was skipped for
# time. Without a GPU the GPU stages are skipped with a message, and the checks that run
# anywhere (imports, data, recipe) still run.

set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${1:-$REPO/data/multi30k-en-de}"
[ -d "$DATA" ] && DATA="$(cd "$DATA" && pwd)"  # a relative path means from here
OUT_DIR="${2:-${OUT:-$(mktemp -d)}}"
PY="${PYTHON:-$(command -v python || command -v python3)}"
DEADLINE="${GPU_CHECK_SECONDS:-540}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
SUMMARY="$OUT_DIR/SUMMARY.txt"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
NMT=("$PY" -m nmt_cli)
FAILED=()
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }

# stage NAME SECONDS COMMAND...: run with a time limit, its output in OUT_DIR/NAME.log, on
# the screen and in the summary (only the last lines of `nmt run`'s long progress); a
# failure or timeout is recorded and the next stage runs.
stage() {
    local name="$1" limit="$2"
    shift 2
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
    timeout --kill-after=20 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
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

cd "$REPO" || exit 1
say "nmt GPU check, $(date -u +%Y-%m-%dT%H:%MZ), repository $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '(not a git checkout)')"
say "output: $OUT_DIR"

# -- checks that run anywhere --------------------------------------------------------------
stage environment 30 "$PY" - <<'PY'
import sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
else:
    print("GPU: none visible")
# Every module these stages use, and none of the optional heavy dependencies.
import nmt_cli.cli, nmt_cli.engines.run, nmt_cli.engines.train, nmt_cli.engines.translate  # noqa
import nmt_cli.engines.score, nmt_cli.engines.average  # noqa
heavy = sorted({"sacremoses", "datasets"} & set(sys.modules))
if heavy:
    sys.exit(f"imported at start-up, but needed only by prepare/score options: {heavy}")
print("imports: nmt_cli's commands load without sacremoses or datasets")
PY

HAVE_DATA=0
if [ -f "$DATA/manifest.json" ]; then
    HAVE_DATA=1
    stage recipe 60 "${NMT[@]}" train recipes/multi30k-en-de.toml --dry-run \
        --set "data.dir=$DATA"
else
    say ""
    say "== data: no prepared Multi30k directory at '$DATA' (no manifest.json): the Multi30k"
    say "   and decoding stages are skipped. Prepare it as this script's header says."
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    say ""
    say "no CUDA GPU visible: skipping the GPU stages (matmul rate, kernel probe, training"
    say "speed of base and big, the Multi30k run, decoding speed). Run this script on a GPU"
    say "machine for those figures."
    if [ ${#FAILED[@]} -gt 0 ]; then
        say "failed: ${FAILED[*]}"
        exit 1
    fi
    exit 0
fi

# -- GPU stages, most important first ---------------------------------------------------------
# Training speed as `nmt train` runs it on a GPU (compiled: the first update, compilation
# included, is reported on its own), then the step before these changes (baseline) for a
# ratio measured in the same run.
stage train-speed 200 "$PY" bench/gpu_train.py --models base,big --variants nmt \
    --steps 60 --max-tokens 25000
stage train-speed-baseline 45 "$PY" bench/gpu_train.py --models base --variants baseline \
    --steps 40 --max-tokens 25000 --no-probe

if [ "$HAVE_DATA" -eq 1 ]; then
    RUN="$(mktemp -d)/multi30k-en-de"
    stage multi30k 220 "${NMT[@]}" run recipes/multi30k-en-de.toml --gpus 1 --from train \
        --set "data.dir=$DATA" --set "train.run_dir=$RUN" \
        --set train.max_time_minutes=2 --set train.save_interval_minutes=0.4 \
        --set train.log_interval_steps=25 --set score.paper_bleu=false
    stage multi30k-figures 20 "$PY" bench/run_figures.py "$RUN"
    cp "$RUN"/metrics.jsonl "$RUN"/results.json "$RUN"/config.json "$OUT_DIR"/ 2>/dev/null
    MODEL="$RUN/average.pt"
    [ -f "$MODEL" ] || MODEL="$RUN/checkpoints/last.pt"
    stage decode-speed 60 "$PY" bench/gpu_decode.py --model "$MODEL" \
        --input "$DATA/test.src.txt" --single 200
fi

# What torch.compile adds, in the same run (eager: everything else as `nmt train`).
stage train-speed-eager 60 "$PY" bench/gpu_train.py --models base,big --variants eager \
    --steps 40 --max-tokens 25000 --no-probe

say ""
if [ ${#FAILED[@]} -gt 0 ]; then
    say "failed or timed out: ${FAILED[*]} (logs in $OUT_DIR)"
    exit 1
fi
say "all stages ran; the figures are above and in $SUMMARY"
