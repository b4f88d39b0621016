"""Every tree of the Penn Treebank sample (or of a WSJ copy) through the parsing pipeline.

For each sentence of the preset's splits: its linearization read back over its words
(`delinearize(linearize(tree), words)`) must be the normalised tree itself with no repair,
scored by EVALB against the gold tree it must get F1 100 with no error sentence, and each
token of its linearization must be one piece of a SentencePiece model trained the way
`nmt prepare` trains it (whole-word symbols for the tree tokens). Prints the counts; exits
1 if any tree fails.

    python bench/check_trees.py                      # ptb-sample, downloaded and verified
    python bench/check_trees.py --from treebank.zip  # a local copy of it
    python bench/check_trees.py --preset ptb --from treebank_3/parsed/mrg/wsj
"""

from __future__ import annotations

import argparse
import sys

from nmt_cli.core.vocab import Vocab, train_sentencepiece
from nmt_cli.engines.prepare.treebank import TREEBANKS, read_treebank, target_form
from nmt_cli.trees.linearize import delinearize, normalize
from nmt_cli.trees.scoring import score_trees
from nmt_cli.trees.tree import TOP, Tree, read_tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ptb-sample", choices=sorted(TREEBANKS))
    parser.add_argument("--from", dest="source", default="", help="zip or folder; default: fetch")
    args = parser.parse_args()
    read = read_treebank(TREEBANKS[args.preset], args.source, "")
    failures = 0
    total = 0
    for split, pairs in read.pairs.items():
        golds = [gold for _, gold in pairs]
        words = [w for w, _ in pairs]
        outputs = [target_form(gold) for gold in golds]
        back = 0
        for output, sentence, gold in zip(outputs, words, golds, strict=True):
            tree, _ = read_tree(gold)
            assert tree is not None
            made = delinearize(output, sentence.split())
            expected = Tree(TOP, tuple(normalize(tree)))
            back += not made.repairs and made.tree.bracketed() == expected.bracketed()
        score = score_trees(outputs, golds, words)
        ok = back == len(pairs) and score.f1 == 100.0 and score.all.error_sentences == 0
        failures += not ok
        total += len(pairs)
        print(
            f"{split}: {len(pairs):,} trees, {back:,} read back exactly, EVALB F1 "
            f"{score.f1:.2f} (<= 40 words: {score.short.f1:.2f}), {score.repaired} repaired"
        )
    train = read.pairs["train"]
    proto = train_sentencepiece(
        [w for w, _ in train] + [target_form(g) for _, g in train],
        min(8000, 2 * len(read.whole_words) + 2000),
        max_sentences=0,
        whole_words=read.whole_words,
    )
    vocab = Vocab.from_proto(proto)
    tokens = sorted({t for _, g in train for t in target_form(g).split()})
    split_tokens = [t for t in tokens if len(vocab.processor.EncodeAsPieces(t)) != 1]
    print(f"{len(tokens)} tree tokens, {len(split_tokens)} not one piece {split_tokens[:5]}")
    print(f"{total:,} trees in all; {'every check passed' if not failures else 'FAILED'}")
    return 1 if failures or split_tokens else 0


if __name__ == "__main__":
    sys.exit(main())
