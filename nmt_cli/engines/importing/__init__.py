"""`nmt import`: a model trained elsewhere as an nmt checkpoint.

One module per source (huggingface_marian.py with its vocabulary in marian_vocab.py;
fairseq.py), the shared pieces (refusals, the checkpoint built and checked, the BOS bias
gap) in common.py, SentencePiece models renumbered in spm_proto.py, and `import_model`
in run.py.
"""
