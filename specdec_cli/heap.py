"""The process's heaps in a process that runs on after loading a model (`serve`, `chat`, `bench`, `distill`).

Loading leaves some 300,000 objects alive for the process's life (torch's, transformers', the tokenizer's). The
interpreter's cycle collector walks every one of them in each full collection, and it starts one whenever enough
new objects have outlived the younger generations: every few answers in a server, 17-116 ms each, inside whichever
request was running (a later turn's time to first token 9 ms, then 132 ms; docs/measurements.md). `settle_heap`
collects once, then sets what survives apart from later collections (`gc.freeze`): those objects are freed by
reference counting as before, only cycles among them wait for the process's end; everything made later is
collected as before. What it does not do: turn the collector off.

The C heap keeps what a stage freed (a model's forward over long pieces, a training run's optimizer) for the next
allocation rather than giving it back, so a later stage's peak stands on the earlier one's. `return_free_memory`
asks glibc to give its free pages back (`malloc_trim`); elsewhere it does nothing.
"""

from __future__ import annotations


def settle_heap() -> None:
    """Collect what loading left as garbage, then leave the rest out of later cycle collections."""
    import gc

    gc.collect()
    gc.freeze()


def return_free_memory() -> None:
    """Collect garbage, then give the C heap's free pages back to the system (glibc's malloc_trim; a no-op where
    the C library has none)."""
    import ctypes
    import gc

    gc.collect()
    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # (the process's own symbols: its C library's)
    except (OSError, TypeError):  # pragma: no cover - no C library to open this way (Windows)
        trim = None
    if trim is not None:  # (glibc; musl and macOS have none)
        trim(0)
