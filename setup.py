"""Builds specdec's two small C extensions; all other metadata lives in pyproject.toml.

- specdec_cli.sam._native: the static suffix-automaton builder.
- specdec_cli.kernels._cpu: block-quantised matmuls and row-invariant attention for the CPU (AVX512-VNNI,
  AVX-VNNI and AVX2 paths chosen at run time through target attributes, portable C elsewhere): kernels/_cpu.c (the
  Python module) and kernels/csrc/*.c (one concern a file), sharing one header, kernels/csrc/kernels.h.
  `-ffp-contract=off`: no multiply-add is fused behind the code's back, so the order of every floating-point
  operation is the one written.
"""
from setuptools import Extension, setup

KERNEL_SOURCES = [
    "specdec_cli/kernels/_cpu.c",
    "specdec_cli/kernels/csrc/attention.c",
    "specdec_cli/kernels/csrc/attention_avx512.c",
    "specdec_cli/kernels/csrc/blocks.c",
    "specdec_cli/kernels/csrc/elementwise.c",
    "specdec_cli/kernels/csrc/matmul.c",
    "specdec_cli/kernels/csrc/matmul_avx2.c",
    "specdec_cli/kernels/csrc/matmul_avx512.c",
    "specdec_cli/kernels/csrc/matmul_packed.c",
    "specdec_cli/kernels/csrc/matmul_packed_512.c",
    "specdec_cli/kernels/csrc/matmul_packed_portable.c",
    "specdec_cli/kernels/csrc/peak.c",
    "specdec_cli/kernels/csrc/pool.c",
    "specdec_cli/kernels/csrc/repack.c",
    "specdec_cli/kernels/csrc/top_tokens.c",
]
KERNEL_HEADERS = ["specdec_cli/kernels/csrc/kernels.h"]

setup(
    ext_modules=[
        Extension(
            "specdec_cli.sam._native",
            sources=["specdec_cli/sam/_native.c"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "specdec_cli.kernels._cpu",
            sources=KERNEL_SOURCES,
            depends=KERNEL_HEADERS,  # a change to the header rebuilds every file
            extra_compile_args=["-O3", "-ffp-contract=off", "-std=gnu11"],
            extra_link_args=["-lpthread"],
        ),
    ]
)
