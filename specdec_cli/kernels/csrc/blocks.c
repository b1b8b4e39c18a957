/*
 * blocks.c: the block formats on the kernels' side. The weights' kinds (bits, weights per scale, zero point,
 * offsets) and the bytes of their records (cpu_kind_info, cpu_block_bytes, cpu_group_bytes); and each row of
 * activations rounded to 8 bits per block of 32 (cpu_quantize_rows: scale dx = max |x| / 127, code = round(x / dx),
 * as llama.cpp does; the K-quants' and Q6_K's packed kinds share one scale over each span of 8 blocks, a
 * super-block of 256, as llama.cpp's q8_K does), the first step of every block-kind matmul, on the portable or the
 * AVX2 path (the same bits).
 * Not here: packing weights into records (kernels/__init__.py's pack_records, from the GGUF blocks of
 * target_model/quant.py), and the products themselves (matmul*.c).
 */
#include "kernels.h"

/* --------------------------------------------------------------------------------------- the weights' kinds */

int cpu_kind_info(int kind, KindInfo *info)
{
    switch (kind) {
    case KIND_Q4: *info = (KindInfo){4, 32, 0, 1, 0}; return 1;
    case KIND_Q4Z: *info = (KindInfo){4, 32, 8, 0, 0}; return 1;
    case KIND_Q8: *info = (KindInfo){8, 32, 128, 0, 0}; return 1;
    case KIND_U8: *info = (KindInfo){8, 32, 0, 1, 0}; return 1;
    case KIND_Q8S: *info = (KindInfo){8, 16, 32, 0, 0}; return 1;
    case KIND_Q4S: *info = (KindInfo){4, 16, 4, 0, 0}; return 1;
    case KIND_Q2S: *info = (KindInfo){4, 16, 0, 1, 0}; return 1;
    case KIND_F32: *info = (KindInfo){32, 0, 0, 0, 0}; return 1;
    case KIND_F16: *info = (KindInfo){16, 0, 0, 0, 0}; return 1;
    case KIND_BF16: *info = (KindInfo){16, 0, 0, 0, 1}; return 1;
    case KIND_PQ4_0: *info = (KindInfo){4, 32, 8, 0, 0, FORM_LEGACY, 32}; return 1;
    case KIND_PQ4_1: *info = (KindInfo){4, 32, 0, 1, 0, FORM_LEGACY, 32}; return 1;
    case KIND_PQ5_0: *info = (KindInfo){5, 32, 16, 0, 0, FORM_LEGACY, 32}; return 1;
    case KIND_PQ5_1: *info = (KindInfo){5, 32, 0, 1, 0, FORM_LEGACY, 32}; return 1;
    case KIND_PQ8_0: *info = (KindInfo){8, 32, 0, 0, 0, FORM_LEGACY, 32}; return 1;
    case KIND_PQ4_K: *info = (KindInfo){4, 32, 0, 1, 0, FORM_K, 256}; return 1;
    case KIND_PQ5_K: *info = (KindInfo){5, 32, 0, 1, 0, FORM_K, 256}; return 1;
    case KIND_PQ6_K: *info = (KindInfo){6, 16, 32, 0, 0, FORM_Q6K, 256}; return 1;
    case KIND_PIQ4_NL: *info = (KindInfo){4, 32, 0, 0, 0, FORM_LEGACY, 32, 1}; return 1;
    case KIND_PIQ4_XS: *info = (KindInfo){4, 32, 0, 0, 0, FORM_IQ4XS, 256, 1}; return 1;
    default: return 0;
    }
}

/* Bytes of one block of 32 weights for a group of GROUP columns: scales, offsets, codes. */
long cpu_block_bytes(const KindInfo *info)
{
    long subs = BLOCK / info->sub;
    return 4 * GROUP * subs * (1 + info->offsets) + (info->bits == 4 ? 16 : 32) * GROUP;
}

/* Packed kinds, per group of GROUP columns: a super-block's header (f16 d [16]; f16 m or dmin [16]; FORM_K: 6-bit
 * scales and minimums, 12 bytes a column; FORM_Q6K: int8 scales [16 sub-blocks][16]), then each block of 32's codes
 * (nibbles 256 bytes, a fifth-bit plane 64, a 2-bit plane 128; int8 codes 512). Each column holds exactly the
 * bytes of its row in the GGUF. */
long cpu_packed_header_bytes(const KindInfo *info)
{
    return PACKED_HEADER_BYTES(info->form, info->offsets);
}

long cpu_packed_block_bytes(const KindInfo *info)
{
    return PACKED_BLOCK_BYTES(info->bits);
}

long cpu_packed_super_bytes(const KindInfo *info)
{
    return cpu_packed_header_bytes(info) + (info->sb / BLOCK) * cpu_packed_block_bytes(info);
}

/* Bytes of one group's record (k weights of GROUP columns). */
long cpu_group_bytes(const KindInfo *info, long k)
{
    if (info->form != FORM_RECORDS)
        return (k / info->sb) * cpu_packed_super_bytes(info);
    if (info->bits >= 16)
        return k * GROUP * (info->bits / 8);
    return (k / BLOCK) * cpu_block_bytes(info);
}

/* ---------------------------------------------------------------------- activations rounded to 8-bit blocks */

/* Row r of `rows`, block b of 32, laid out block by block so that a tile of rows finds its codes at fixed offsets
 * from one pointer: codes qx[b, r, 0..31], scale dx[b, r]; sums[2b + h, r] = the sum of codes 16h .. 16h+15 of
 * that block (the kinds with zero points or offsets need them per sub-block). Each span of `span` blocks (1, or 8
 * for a super-block of 256; k a multiple of span * 32) shares one scale: the largest |x| over the span / 127. */
static float span_max_portable(const float *v, long count)
{
    float amax = 0.0f;
    for (long i = 0; i < count; i++)
        amax = fmaxf(amax, fabsf(v[i]));
    return amax;
}

static void quantize_rows_portable(const float *x, long rows, long k, int span, int8_t *qx, float *dx, int32_t *sums)
{
    long blocks = k / BLOCK;
    float amax = 0.0f;
    for (long r = 0; r < rows; r++)
        for (long b = 0; b < blocks; b++) {
            const float *v = x + r * k + b * BLOCK;
            if (b % span == 0)
                amax = span_max_portable(v, span * BLOCK);
            float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
            int8_t *codes = qx + (b * rows + r) * BLOCK;
            int sum[2] = {0, 0};
            for (int i = 0; i < BLOCK; i++) {
                int code = (int)nearbyintf(v[i] * inverse);
                codes[i] = (int8_t)code;
                sum[i / 16] += code;
            }
            dx[b * rows + r] = scale;
            sums[2 * b * rows + r] = sum[0];
            sums[(2 * b + 1) * rows + r] = sum[1];
        }
}

#if HAVE_X86
/* The largest |x| over `count` floats (a multiple of 32): max is exact, so any order gives the portable value. */
AVX2 static float span_max_avx2(const float *v, long count)
{
    const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 amax = _mm256_setzero_ps();
    for (long i = 0; i < count; i += 32)
        amax = _mm256_max_ps(amax, _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + i), sign_off),
                                                               _mm256_and_ps(_mm256_loadu_ps(v + i + 8), sign_off)),
                                                 _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + i + 16), sign_off),
                                                               _mm256_and_ps(_mm256_loadu_ps(v + i + 24), sign_off))));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

AVX2 static void quantize_rows_avx2(const float *x, long rows, long k, int span, int8_t *qx, float *dx,
                                    int32_t *sums)
{
    long blocks = k / BLOCK;
    float amax = 0.0f;
    for (long r = 0; r < rows; r++)
        for (long b = 0; b < blocks; b++) {
            const float *v = x + r * k + b * BLOCK;
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
                   v3 = _mm256_loadu_ps(v + 24);
            if (b % span == 0)
                amax = span_max_avx2(v, span * BLOCK);
            float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
            __m256 mul = _mm256_set1_ps(inverse);
            const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), round));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), round));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), round));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), round));
            /* pack 32 int32 -> 32 int8 in order (packs interleave 128-bit lanes; the permute restores order) */
            __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
            __m256i packed = _mm256_packs_epi16(p01, p23);
            packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(qx + (b * rows + r) * BLOCK), packed);
            dx[b * rows + r] = scale;
            sums[2 * b * rows + r] = hsum8i(_mm256_add_epi32(i0, i1));
            sums[(2 * b + 1) * rows + r] = hsum8i(_mm256_add_epi32(i2, i3));
        }
}
#else /* no vector path on this CPU: the path is always ISA_PORTABLE (the AVX2 name stands for the portable loop) */
#define quantize_rows_avx2 quantize_rows_portable
#endif

void cpu_quantize_rows(int path, const float *x, long rows, long k, int span, int8_t *qx, float *dx, int32_t *sums)
{
    if (path >= ISA_AVX2)
        quantize_rows_avx2(x, rows, k, span, qx, dx, sums);
    else
        quantize_rows_portable(x, rows, k, span, qx, dx, sums);
}
