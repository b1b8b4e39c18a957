"""The GGUF format: the one reader of a file's header, metadata and tensors (gguf_file), a family's
expected layout and hyperparameter checks (gguf_layout), configs and families read from metadata
(gguf_config, gguf_families) and each ggml type's blocks decoded (gguf_decode). Knows no model
loading or cache; stands on native/'s block weights and the family table.
"""
