"""Builds the suffix automaton's small C extension; all other metadata lives in pyproject.toml."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "specdec_cli.sam._native",
            sources=["specdec_cli/sam/_native.c"],
            extra_compile_args=["-O3"],
        )
    ]
)
