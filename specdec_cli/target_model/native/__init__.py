"""specdec's own decoder and its parts: block weights on the CPU kernels (block_weights, quant), the
native decoder's layers and what it supports (native, native_support), the KV cache and the row
keys of attention. The lowest wing: stands on the kernels and the family table only.
"""
