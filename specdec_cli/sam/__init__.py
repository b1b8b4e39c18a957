"""Suffix automata for SAM-Decoding: the automata (`automaton`), the C builder (`_native`) and index files
(`index`). Submodules are imported explicitly by their users; importing this package loads nothing else."""
