#!/usr/bin/env bash
# Regenerates the README's pictures from a short Multi30k EN-DE run:
#   docs/figures/curves-{steps,time}.png          nmt plot of the run's metrics.jsonl
#   docs/figures/attention/*.png, attention.html  nmt attention of one caption (best checkpoint)
# Needs the corpus where recipes/multi30k-en-de.toml's data.source_dir points. The run is
# resumable: rerunning continues it (MINUTES is the total training budget).
set -euo pipefail
cd "$(dirname "$0")/.."

NMT=${NMT:-.venv/bin/nmt}
MINUTES=${MINUTES:-50}
RUN=runs/multi30k-en-de
SENTENCE=${SENTENCE:-"A little girl in a pink dress is climbing the stairs of a playground."}

"$NMT" run recipes/multi30k-en-de.toml --until average \
  --set train.max_time_minutes="$MINUTES" \
  --set train.save_interval_minutes=5 \
  --set train.log_interval_steps=20 \
  --set train.validate_bleu_sentences=100
"$NMT" plot "$RUN" --out docs/figures --format png
rm -rf docs/figures/attention
"$NMT" attention --model "$RUN/checkpoints/best.pt" "$SENTENCE" --words \
  --out docs/figures/attention --format png,html
