"""The packed kinds (kernels/packed.py, csrc/matmul_packed.c): a GGUF type's own fields at the file's size.

Each packed kind must (1) hold exactly the file's bytes, (2) give back the fields it was packed from, (3) multiply to
the same bits on every instruction-set path, whatever the number of rows or threads: the legacy types the bits of
the float32-scale kind the same weights repack into (so nothing a user saw before changes), the K-quants (Q4_K,
Q5_K: integer sums over a super-block, one activation scale per 256, as llama.cpp's q8_K) and Q6_K (its 16
sub-blocks' products summed over a super-block before one product by that scale) the bits of their portable loop
one row at a time, and (4) agree with a float64 reference of their activations' rounding. The
fields come from gguf's own quantiser where it has one and are random elsewhere, with the extremes (int8 -128
codes and scales, every code at its maximum) that could overflow a 16-bit partial sum.
"""

from __future__ import annotations

import pytest
import torch

from specdec_cli import kernels
from specdec_cli.kernels import packed

pytestmark = [pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled"),
              pytest.mark.usefixtures("kernel_settings")]  # threads and path restored after each test

PACKED_KINDS = sorted(packed.PACKED)
GGUF_BYTES_PER_BLOCK = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176,
                        "Q6_K": 210, "IQ4_NL": 18, "IQ4_XS": 136}  # ggml's (gguf.constants.GGML_QUANT_SIZES)


def _random_fields(kind: int, n: int, k: int, seed: int = 0, extreme: bool = False) -> packed.Fields:
    info = packed.packed_kind(kind)
    generator = torch.Generator().manual_seed(seed)
    supers = k // info.super_block
    top = 1 << info.bits

    def integers(low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        if extreme:
            return torch.full(shape, high - 1 if low >= 0 else low, dtype=torch.int32)
        return torch.randint(low, high, shape, generator=generator, dtype=torch.int32)

    if info.bits == 8:
        codes = integers(-128, 128, (n, k)).to(torch.int8).view(torch.uint8)
    else:
        codes = integers(0, top, (n, k)).to(torch.uint8)
    d = (torch.rand(n, supers, generator=generator) * 0.02 + 1e-3).half()
    m = (torch.randn(n, supers, generator=generator) * 0.02).half() if info.offsets else None
    scales = minimums = None
    if info.form == packed.FORM_K:
        m = m.abs() if m is not None else None  # dmin
        scales = integers(0, 64, (n, supers, 8)).to(torch.uint8)
        minimums = integers(0, 64, (n, supers, 8)).to(torch.uint8)
    elif info.form == packed.FORM_Q6K:
        scales = integers(-128, 128, (n, supers, 16)).to(torch.int8)
    elif info.form == packed.FORM_IQ4XS:
        scales = integers(0, 64, (n, supers, 8)).to(torch.uint8)
    return packed.Fields(codes, d, m, scales, minimums)


def _record_kind_twin(kind: int, fields: packed.Fields) -> tuple[int, torch.Tensor]:
    """The float32-scale record kind and records the same weights repacked into before packed kinds existed."""
    info = packed.packed_kind(kind)
    codes, scales, offsets = packed.fields_codes(kind, fields)  # codes less the zero point
    if info.table:  # IQ4_NL: its table's values are int8 codes
        twin = kernels.KIND_Q8
    elif info.bits == 6:
        twin = kernels.KIND_Q8S
    elif info.bits == 4:
        twin = kernels.KIND_Q4 if info.offsets else kernels.KIND_Q4Z
    else:
        twin = kernels.KIND_U8 if info.offsets else kernels.KIND_Q8
    stored = codes + kernels.kind_of(twin).zero
    return twin, kernels.pack_records(twin, stored.to(torch.uint8), scales, offsets)


@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_packed_records_hold_exactly_the_files_bytes(kind):
    info = packed.packed_kind(kind)
    k = 2 * info.super_block if info.super_block == 256 else 512
    per_block = GGUF_BYTES_PER_BLOCK[info.name]
    file_bytes_per_row = k // info.super_block * per_block
    assert kernels.record_bytes(kind, k) == kernels.GROUP * file_bytes_per_row


@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_fields_unpack_to_what_was_packed_and_columns_select(kind):
    fields = _random_fields(kind, 37, 512, seed=1)  # 37 columns: two whole groups and a part one
    records = packed.pack_fields(kind, fields)
    assert records.shape == (kernels.groups(37), kernels.record_bytes(kind, 512))
    back = packed.unpack_fields(kind, records, 37)
    for name in ("codes", "d", "m", "scales", "minimums"):
        made, got = getattr(fields, name), getattr(back, name)
        assert (made is None) == (got is None), name
        if made is not None:
            assert torch.equal(made.view(torch.uint8) if made.dtype == torch.float16 else made,
                               got.view(torch.uint8) if got.dtype == torch.float16 else got), name
    ids = torch.tensor([36, 3, 3, 17, 0])
    picked = kernels.select_columns(kind, records, 37, ids)
    x = torch.randn(3, 512)
    assert torch.equal(kernels.matmul(x, kind, picked, 5), kernels.matmul(x, kind, records, 37)[:, ids])
    dense = kernels.dequantize(kind, *kernels.unpack_records(kind, records, 37))
    assert torch.equal(dense, packed.fields_dequantize(kind, fields))


@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_packed_kinds_multiply_to_the_same_bits_on_every_path(kind, extreme):
    """The same bits, row for row, for 1-32 rows, 1-2 threads, on every path this CPU has, as the float32-scale kind
    the weights repacked into before (the K-quants and Q6_K, whose activations share a scale per 256: as their own
    portable loop, one row at a time); extreme: every code and scale at its limit, rows at +-max (a 16-bit partial
    sum's worst case)."""
    fields = _random_fields(kind, 70, 512, seed=2, extreme=extreme)
    records = packed.pack_fields(kind, fields)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, 512, generator=generator)
    if extreme:
        x = torch.where(x >= 0, 1.0, -1.0) * 3.0  # every activation code at +-127
    kernels.force_isa("portable")
    kernels.set_threads(1)
    if packed.packed_kind(kind).form in (packed.FORM_K, packed.FORM_Q6K):
        twin, twin_records = kind, records
    else:
        twin, twin_records = _record_kind_twin(kind, fields)
    expected = torch.cat([kernels.matmul(x[row : row + 1], twin, twin_records, 70) for row in range(32)])
    for path in kernels.isas():
        kernels.force_isa(path)
        for threads in (1, 2):
            kernels.set_threads(threads)
            for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 15, 16, 31, 32):
                assert torch.equal(kernels.matmul(x[:rows], kind, records, 70), expected[:rows]), (path, threads, rows)
            one_by_one = torch.cat([kernels.matmul(x[row : row + 1], kind, records, 70) for row in range(32)])
            assert torch.equal(one_by_one, expected), (path, threads)


@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_packed_dot_products_against_a_float64_reference(kind):
    """Against the float64 product of the dequantised weights and the activations as the kernel rounds them: one
    scale per block of 32, or per super-block of 256 for the K-quants and Q6_K (a tolerance that tells the two
    apart)."""
    fields = _random_fields(kind, 24, 768 if packed.packed_kind(kind).super_block == 256 else 96, seed=4)
    k = fields.codes.shape[1]
    records = packed.pack_fields(kind, fields)
    dense = packed.fields_dequantize(kind, fields).double()
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(5))
    blocks = x.reshape(7, -1, kernels.kind_of(kind).span)
    per_super = packed.packed_kind(kind).form in (packed.FORM_K, packed.FORM_Q6K)
    assert kernels.kind_of(kind).span == (256 if per_super else 32)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    rounded = (torch.round(blocks / scale) * scale).reshape(7, k).double()  # the kernel's 8-bit activations
    reference = rounded @ dense.T
    for path in kernels.isas():
        kernels.force_isa(path)
        out = kernels.matmul(x, kind, records, 24).double()
        assert torch.allclose(out, reference, rtol=1e-5, atol=2e-6 * float(reference.abs().max())), path


def test_packed_kinds_accumulate_into_a_strided_output_and_refuse_a_partial_super_block():
    kind = kernels.KIND_PQ4_K if hasattr(kernels, "KIND_PQ4_K") else packed.KIND_PQ4_K
    records = packed.pack_fields(kind, _random_fields(kind, 40, 256, seed=6))
    for path in kernels.isas():
        kernels.force_isa(path)
        x = torch.randn(5, 256)
        product = kernels.matmul(x, kind, records, 40)
        wide = torch.randn(5, 100)
        expected = wide.clone()
        expected[:, 30:70] += product
        kernels.matmul(x, kind, records, out=wide[:, 30:70], accumulate=True)
        assert torch.equal(wide, expected), path
    with pytest.raises(ValueError):
        kernels.record_bytes(kind, 288)  # not a whole super-block of 256
    with pytest.raises(ValueError):
        kernels.matmul(torch.randn(2, 288), kind, records, 40)


@pytest.mark.parametrize("type_name", sorted(GGUF_BYTES_PER_BLOCK))
def test_the_c_repacking_of_a_gguf_tensor_is_its_fields_packed(type_name):
    """kernels.repack_gguf (C, at load) and pack_fields(gguf_decode.gguf_fields(...)) (torch, the readable reference)
    write the same bytes, for gguf-quantised and random blocks, with a part group of rows."""
    import numpy as np
    from helpers import gguf_bytes as _gguf_bytes

    from specdec_cli.target_model.gguf import gguf_decode

    kind = packed.KIND_OF_GGUF_TYPE[type_name]
    for seed in (0, 1):
        raw = _gguf_bytes(type_name, 37, 512, seed=seed)  # [37, bytes per row]
        rows = torch.from_numpy(np.ascontiguousarray(raw))
        fields = gguf_decode.gguf_fields(type_name, raw.reshape(37, 512 // packed.PACKED[kind].super_block, -1))
        assert torch.equal(kernels.repack_gguf(kind, rows, 512), packed.pack_fields(kind, fields)), seed
    with pytest.raises(ValueError):
        kernels.repack_gguf(kind, rows[:, :-1].contiguous(), 512)  # rows of another size


def test_iq4_table_values_are_on_the_codes_device():
    """The dense device engine dequantises IQ4 records on the GPU: the table was made in CPU memory and indexed
    with the GPU's codes (torch refuses that on cuda; on `meta` it quietly answered on the CPU)."""
    codes = torch.tensor([0, 15, 8], dtype=torch.uint8)
    assert packed.table_values(codes).tolist() == [packed.IQ4_VALUES[0], packed.IQ4_VALUES[15], packed.IQ4_VALUES[8]]
    assert packed.table_values(codes.to("meta")).device.type == "meta"
