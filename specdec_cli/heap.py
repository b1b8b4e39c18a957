"""The interpreter's heap in a process that runs on after loading a model (`serve`, `chat`, `bench`).

Loading leaves some 300,000 objects alive for the process's life (torch's, transformers', the tokenizer's). The
interpreter's cycle collector walks every one of them in each full collection, and it starts one whenever enough
new objects have outlived the younger generations: every few answers in a server, 17-116 ms each, inside whichever
request was running (a later turn's time to first token 9 ms, then 132 ms; docs/measurements.md). `settle_heap`
collects once, then sets what survives apart from later collections (`gc.freeze`): those objects are freed by
reference counting as before, only cycles among them wait for the process's end; everything made later is
collected as before. What it does not do: turn the collector off.
"""

from __future__ import annotations


def settle_heap() -> None:
    """Collect what loading left as garbage, then leave the rest out of later cycle collections."""
    import gc

    gc.collect()
    gc.freeze()
