"""The target model as specdec runs it: finding and loading it, its weights in blocks, specdec's own decoder
(native.py), exact (row-invariant) verification, one forward over new tokens, the KV cache and its rollback, and
the masks and checks of token trees.

Nothing here knows about drafters or the draft-then-verify loop (decoding/): this package answers "what does the
target say about these tokens", quickly and the same way whatever the row count.
"""
