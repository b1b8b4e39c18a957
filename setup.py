"""Builds specdec's two small C extensions; all other metadata lives in pyproject.toml.

- specdec_cli.sam._native: the static suffix-automaton builder.
- specdec_cli.kernels._cpu: block-quantised matmuls and row-invariant attention for the CPU (AVX512-VNNI,
  AVX-VNNI and AVX2 paths chosen at run time through target attributes, portable C elsewhere). `-ffp-contract=off`: no multiply-add is fused behind the code's back, so
  the order of every floating-point operation is the one written.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "specdec_cli.sam._native",
            sources=["specdec_cli/sam/_native.c"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "specdec_cli.kernels._cpu",
            sources=["specdec_cli/kernels/_cpu.c"],
            extra_compile_args=["-O3", "-ffp-contract=off", "-std=gnu11"],
            extra_link_args=["-lpthread"],
        ),
    ]
)
