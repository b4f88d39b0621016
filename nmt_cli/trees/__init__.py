"""Constituency trees: the paper's section 6.3 task as sequences, and its scoring.

    tree.py       trees and the Penn Treebank's bracketed notation (one tolerant reader)
    linearize.py  Vinyals et al.'s linearization, its normalisations, and the way back
    evalb.py      EVALB with COLLINS.prm: labelled bracket P/R/F1, complete match, tags
    scoring.py    lines of hypotheses and gold trees in, EVALB's summaries out
    constraint.py the search constraint that makes a parsing model write only trees

No torch and no sentencepiece outside constraint.py, which only decoding imports:
`nmt score --trees` stays as light as BLEU scoring.
The treebank presets that make a corpus of trees are in engines/prepare/treebank.py.
"""
