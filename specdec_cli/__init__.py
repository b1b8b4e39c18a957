"""specdec: lossless speculative decoding for local language models.

The library lives in this package; the command line (Typer + Rich) lives in `specdec_cli.cli` and is the
only place that imports them. torch and transformers are imported lazily, so `specdec --help` is instant.
"""

__version__ = "0.5.0.dev0"  # the one place the version is written (pyproject.toml reads it); CHANGELOG.md's newest
