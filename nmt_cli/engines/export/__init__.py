"""`nmt export`: a checkpoint as a CTranslate2 or Hugging Face transformers model directory.

One module per target (ctranslate2.py, huggingface.py), the shared steps (output checks,
staging, library imports, vocabulary files) in output.py, and `export_model` in run.py.
"""
