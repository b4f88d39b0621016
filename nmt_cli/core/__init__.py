"""The shared Transformer core: model, search, losses, data store, checkpoints.

Nothing here knows about the command line, rich or typer.
"""
