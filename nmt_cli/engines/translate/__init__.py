"""`nmt translate`, `nmt attention` and the Python API: one decoding engine.

    translator.py  Translator: loading (one model or an ensemble), chunks of lines sorted
                   into batches, search, detokenized results; translate_lines
    loading.py     decoding settings, device and CPU threads a Translator is loaded with
    chunks.py      how lines become chunks: a caller's lines, or a stream read ahead
    workers.py     batches decoded side by side in forked worker processes
    stream.py      translate_file (the command's job), output formats
    views.py       the model as search sees it when attention is recorded
    forced.py      the phrase constraint: a forced prefix, phrases that must appear
    forced_input.py  prefixes and phrases from text and files, checked and encoded
    alignment.py   piece-to-word merging, hard word alignments
    attention.py   every attention weight of one sentence (`nmt attention`, training)

The model a Translator decodes is built by `engines/models.py`. Import from the modules:
this package's own namespace is empty, so importing one module never loads the others.
"""
