"""transformers kept quiet while it loads or converts: no logging, no progress bars of its own or the hub's.

specdec draws one progress line of its own (the CLI's) and writes the result alone to a log; transformers and
huggingface_hub would otherwise print theirs on stderr whatever stderr is. Used by every way of loading that goes
through transformers (models.py, converted.py, gguf_model.py's first load). Not here: what is loaded.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


def quiet_transformers() -> None:
    """No logging and no tqdm bars from transformers or the hub's downloads: stderr gets specdec's one progress
    line in a terminal (the CLI's), and the result alone in a log."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:  # pragma: no cover - transformers depends on it
        return
    disable_progress_bars()


@contextmanager
def no_tqdm() -> Iterator[None]:
    """transformers draws its GGUF conversion with tqdm on stderr whatever stderr is; specdec says it itself."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - another transformers layout
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda iterable=None, *args, **kwargs: iterable
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original
