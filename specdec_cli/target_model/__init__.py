"""The target model as specdec runs it, in six wings, each leaning only on those below it:

- load/      finding and loading the target: the name or file, the load plan, the ways of loading, the tokenizer,
             a loaded model put on block weights, and the verifying forward chosen for it (forward_choice.py);
- device/    the device engine: a fixed-shape torch decoder, exact by construction, for a GPU (and the CPU);
- verify/    one forward over new tokens chosen once, exact (row-invariant) verification and its check, token
             trees' masks and checks, the KV cache's rollback;
- in_place/  a GGUF loaded in place: the file checked first, its proven cache (repacked blocks, stored config,
             tokenizer) and the model built on the mapping;
- gguf/      the GGUF format: the one reader of a file, a family's expected layout, configs from metadata, each
             ggml type's blocks decoded;
- native/    specdec's own decoder: block weights on the CPU kernels, the decoder's layers, the KV cache;

and three root modules every wing may read: families.py (the one table of family facts), placement.py (device,
dtype, threads) and quiet.py (transformers kept quiet). tests/test_structure.py holds the arrows downward.

Nothing here knows about drafters or the draft-then-verify loop (decoding/): this package answers "what does the
target say about these tokens", quickly and the same way whatever the row count.
"""
