"""A GGUF handed to transformers' GGUF loaders from a folder that holds it alone.

transformers reads a GGUF as `from_pretrained(folder, gguf_file=name)`, and reads the folder's own config and
tokenizer files too where they exist: a GGUF kept beside another model's tokenizer.json or config.json (a download
folder, a Hub snapshot of the original weights) got that other model's tokenizer or config. `alone(path)` yields
(folder, name) of a temporary folder holding only a link to the file, removed afterwards; nothing is copied.
tests/specdec_cli/target_model/test_native_first_load.py plants another model's tokenizer files beside a GGUF.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def alone(path: Path) -> Iterator[tuple[str, str]]:
    """(folder, file name) for `from_pretrained(folder, gguf_file=name)`: the file, linked into a folder of its
    own for the time of the `with`."""
    with tempfile.TemporaryDirectory(prefix="specdec-gguf-") as folder:
        (Path(folder) / path.name).symlink_to(Path(path).resolve())
        yield folder, path.name
