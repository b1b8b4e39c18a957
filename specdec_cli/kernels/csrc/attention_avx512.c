/*
 * attention_avx512.c: the avx512vnni path's attention steps for attention.c's units: scores and value sums of one
 * item on 512-bit registers (score_wide, value_wide), the same for 2-4 query heads of one row that read the same
 * keys (score_group, value_group), the softmax with its exponentials 16 at a time (cpu_softmax_weights_wide), and
 * the choice of steps for a head size (cpu_attention_wide_steps, cpu_attention_group_steps). An item's result does
 * not depend on whether it was computed alone or in a group, nor on the blocks, the unit or the rows.
 * Not here: the units, the AVX2 and portable steps (attention.c); nothing at all on CPUs other than x86-64.
 */
#include "kernels.h"

#if HAVE_X86
/* The same two steps on 512-bit registers (head_dim = 16 * CHUNKS): a score's 16 lanes are first added as
 * lane i + lane i + 8, then reduced as the AVX2 step reduces its 8; an accumulator lane sees the same operations
 * whatever the blocks, the unit or the rows (the avx512vnni path's own order, not AVX2's). */
VNNI512 static inline __m512 load16_f32(const char *base, long index)
{
    return _mm512_loadu_ps((const float *)base + index);
}

VNNI512 static inline __m512 load16_bf16(const char *base, long index)
{
    __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + index));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

VNNI512 static inline __m256 fold16(__m512 v)
{
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

#define DEFINE_ATTENTION512(CHUNKS, TYPE)                                                                          \
    VNNI512 static void score_wide_##CHUNKS##_##TYPE(const AttentionTask *t, long row, long head, float *scores,   \
                                                     long j0, long j1)                                             \
    {                                                                                                              \
        const long kv = head / (t->heads / t->kv_heads);                                                           \
        const long run_start = t->run_start[row], run = t->run_stop[row] - run_start;                              \
        const int32_t *extra = t->extra_pos + t->extra_start[row];                                                 \
        const long k_pos = t->k_pos, k_head = kv * t->k_head;                                                      \
        const char *k = t->k;                                                                                      \
        const float *query = t->q + row * t->q_row + head * t->q_head;                                             \
        __m512 q[CHUNKS];                                                                                          \
        __m128 scale = _mm_set1_ps(t->scale);                                                                      \
        _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) q[c] = _mm512_loadu_ps(query + 16 * c);         \
        for (long j = j0; j < j1; j += 4) {                                                                        \
            __m256 dots[4];                                                                                        \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                                                  \
                dots[i] = _mm256_setzero_ps();                                                                     \
                long key = j + i;                                                                                  \
                if (key < j1) {                                                                                    \
                    long base = k_head + (key < run ? run_start + key : (long)extra[key - run]) * k_pos;           \
                    __m512 dot = _mm512_mul_ps(q[0], load16_##TYPE(k, base));                                      \
                    _Pragma("GCC unroll 16") for (int c = 1; c < CHUNKS; c++)                                      \
                        dot = _mm512_fmadd_ps(q[c], load16_##TYPE(k, base + 16 * c), dot);                         \
                    dots[i] = fold16(dot);                                                                         \
                }                                                                                                  \
            }                                                                                                      \
            _mm_storeu_ps(scores + j, _mm_mul_ps(four_scores(dots[0], dots[1], dots[2], dots[3]), scale));         \
        }                                                                                                          \
    }                                                                                                              \
    VNNI512 static void value_wide_##CHUNKS##_##TYPE(const AttentionTask *t, long row, long head,                  \
                                                     const float *weights, float *acc_mem, long j0, long j1)       \
    {                                                                                                              \
        const long kv = head / (t->heads / t->kv_heads);                                                           \
        const long run_start = t->run_start[row], run = t->run_stop[row] - run_start;                              \
        const int32_t *extra = t->extra_pos + t->extra_start[row];                                                 \
        const long v_pos = t->v_pos, v_head = kv * t->v_head;                                                      \
        const char *v = t->v;                                                                                      \
        __m512 acc[CHUNKS];                                                                                        \
        _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) acc[c] = _mm512_loadu_ps(acc_mem + 16 * c);     \
        for (long key = j0; key < j1; key++) {                                                                     \
            long base = v_head + (key < run ? run_start + key : (long)extra[key - run]) * v_pos;                   \
            __m512 p = _mm512_set1_ps(weights[key]);                                                               \
            _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++)                                              \
                acc[c] = _mm512_fmadd_ps(p, load16_##TYPE(v, base + 16 * c), acc[c]);                              \
        }                                                                                                          \
        _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) _mm512_storeu_ps(acc_mem + 16 * c, acc[c]);     \
    }
DEFINE_ATTENTION512(1, f32)
DEFINE_ATTENTION512(2, f32)
DEFINE_ATTENTION512(4, f32)
DEFINE_ATTENTION512(6, f32)
DEFINE_ATTENTION512(8, f32)
DEFINE_ATTENTION512(16, f32)
DEFINE_ATTENTION512(1, bf16)
DEFINE_ATTENTION512(2, bf16)
DEFINE_ATTENTION512(4, bf16)
DEFINE_ATTENTION512(6, bf16)
DEFINE_ATTENTION512(8, bf16)
DEFINE_ATTENTION512(16, bf16)

/* exp8 on 16 lanes: each lane sees exp8's operations (the same rounding to nearest, polynomial and exponent). */
VNNI512 static inline __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
}

/* softmax_weights with the exponentials 16 at a time: the same maximum, the same weights, and the same lane-wise
 * sum (each group of 8 added to the 8 totals in key order, the low half of 16 before the high half). */
VNNI512 float cpu_softmax_weights_wide(float *scores, long keys)
{
    __m256 best8 = _mm256_set1_ps(-INFINITY);
    for (long j = keys; j < keys + 8; j++)
        scores[j] = -INFINITY;
    for (long j = 0; j < keys; j += 8)
        best8 = _mm256_max_ps(best8, _mm256_loadu_ps(scores + j));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(best8), _mm256_extractf128_ps(best8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float top = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    __m512 best = _mm512_set1_ps(top), minus_infinity = _mm512_set1_ps(-INFINITY);
    __m256 total8 = _mm256_setzero_ps();
    long j = 0;
    for (; j + 8 < keys; j += 16) { /* groups j .. j+7 and j+8 .. j+15, both of which the 8-wide loop visits */
        __m512 score = _mm512_loadu_ps(scores + j);
        __mmask16 dead = _mm512_cmp_ps_mask(score, minus_infinity, _CMP_EQ_OQ);
        __m512 p = _mm512_mask_blend_ps(dead, exp16(_mm512_sub_ps(score, best)), _mm512_setzero_ps());
        _mm512_storeu_ps(scores + j, p);
        total8 = _mm256_add_ps(total8, _mm512_castps512_ps256(p));
        total8 = _mm256_add_ps(total8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1)));
    }
    if (j < keys) {
        __m256 score = _mm256_loadu_ps(scores + j);
        __m256 p = _mm256_blendv_ps(exp8(_mm256_sub_ps(score, _mm512_castps512_ps256(best))), _mm256_setzero_ps(),
                                    _mm256_cmp_ps(score, _mm512_castps512_ps256(minus_infinity), _CMP_EQ_OQ));
        _mm256_storeu_ps(scores + j, p);
        total8 = _mm256_add_ps(total8, p);
    }
    return hsum8(total8);
}

/* Two keys' dot vectors folded at once: [fold16(a) | fold16(b)]. */
VNNI512 static inline __m512 fold16_pair(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

/* _mm256_hadd_ps in each 128-bit lane of two 512-bit registers: [x0+x1, x2+x3, y0+y1, y2+y3] per lane. */
VNNI512 static inline __m512 hadd512(__m512 x, __m512 y)
{
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}

/* The scores of keys j .. j+7 from their dot vectors d[0..7], times the scale: each key's lanes summed exactly
 * as fold16 then four_scores sum them (lane i + lane i+8, then ((0+1)+(2+3)) + ((4+5)+(6+7))), on 512-bit
 * registers, eight keys at a time. */
VNNI512 static inline __m256 eight_scores(__m512 d0, __m512 d1, __m512 d2, __m512 d3, __m512 d4, __m512 d5,
                                          __m512 d6, __m512 d7, __m256 scale)
{
    __m512 h0 = hadd512(fold16_pair(d0, d2), fold16_pair(d1, d3)); /* lanes: a01 a23 b01 b23 | a45 .. | c01 .. | c45 .. */
    __m512 h1 = hadd512(fold16_pair(d4, d6), fold16_pair(d5, d7));
    __m512 h = hadd512(h0, h1); /* lanes: [a03 b03 e03 f03] [a47 b47 e47 f47] [c03 d03 g03 h03] [c47 d47 g47 h47] */
    __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(_mm512_shuffle_f32x4(h, h, 0x88)),
                               _mm512_castps512_ps256(_mm512_shuffle_f32x4(h, h, 0xDD))); /* a b e f | c d g h */
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_mul_ps(sum, scale)), 0xD8));
}

/* The same two steps for N query heads of one key/value head in one row (GQA: they read the same keys): each
 * key vector (and value vector) is loaded once for the N items, and each item's score and accumulator lanes see
 * exactly the operations of score_wide / value_wide above, in the same order, so an item's result does not
 * depend on whether it was computed alone or in a group. `scores` and `acc_mem` are the items' rows, `stride`
 * and `acc_stride` floats apart. */
#define DEFINE_GROUP512(N, CHUNKS, TYPE)                                                                           \
    VNNI512 static void score_group_##N##_##CHUNKS##_##TYPE(const AttentionTask *t, long row, long head,           \
                                                            float *scores, long stride, long j0, long j1)          \
    {                                                                                                              \
        const long kv = head / (t->heads / t->kv_heads);                                                           \
        const long run_start = t->run_start[row], run = t->run_stop[row] - run_start;                              \
        const int32_t *extra = t->extra_pos + t->extra_start[row];                                                 \
        const long k_pos = t->k_pos, k_head = kv * t->k_head;                                                      \
        const char *k = t->k;                                                                                      \
        __m512 q[N][CHUNKS];                                                                                       \
        __m256 scale = _mm256_set1_ps(t->scale);                                                                   \
        _Pragma("GCC unroll 4") for (int g = 0; g < N; g++) {                                                      \
            const float *query = t->q + row * t->q_row + (head + g) * t->q_head;                                   \
            _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) q[g][c] = _mm512_loadu_ps(query + 16 * c);  \
        }                                                                                                          \
        for (long j = j0; j < j1; j += 8) {                                                                        \
            __m512 dots[N][8];                                                                                     \
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {                                                  \
                long key = j + i;                                                                                  \
                if (key < j1) {                                                                                    \
                    long base = k_head + (key < run ? run_start + key : (long)extra[key - run]) * k_pos;           \
                    __m512 kc = load16_##TYPE(k, base);                                                            \
                    _Pragma("GCC unroll 4") for (int g = 0; g < N; g++) dots[g][i] = _mm512_mul_ps(q[g][0], kc);   \
                    _Pragma("GCC unroll 16") for (int c = 1; c < CHUNKS; c++) {                                    \
                        kc = load16_##TYPE(k, base + 16 * c);                                                      \
                        _Pragma("GCC unroll 4") for (int g = 0; g < N; g++)                                        \
                            dots[g][i] = _mm512_fmadd_ps(q[g][c], kc, dots[g][i]);                                 \
                    }                                                                                              \
                } else {                                                                                           \
                    _Pragma("GCC unroll 4") for (int g = 0; g < N; g++) dots[g][i] = _mm512_setzero_ps();          \
                }                                                                                                  \
            }                                                                                                      \
            _Pragma("GCC unroll 4") for (int g = 0; g < N; g++)                                                    \
                _mm256_storeu_ps(scores + g * stride + j,                                                          \
                                 eight_scores(dots[g][0], dots[g][1], dots[g][2], dots[g][3], dots[g][4],          \
                                              dots[g][5], dots[g][6], dots[g][7], scale));                         \
        }                                                                                                          \
    }                                                                                                              \
    VNNI512 static void value_group_##N##_##CHUNKS##_##TYPE(const AttentionTask *t, long row, long head,           \
                                                            const float *weights, long stride, float *acc_mem,     \
                                                            long acc_stride, long j0, long j1)                     \
    {                                                                                                              \
        const long kv = head / (t->heads / t->kv_heads);                                                           \
        const long run_start = t->run_start[row], run = t->run_stop[row] - run_start;                              \
        const int32_t *extra = t->extra_pos + t->extra_start[row];                                                 \
        const long v_pos = t->v_pos, v_head = kv * t->v_head;                                                      \
        const char *v = t->v;                                                                                      \
        __m512 acc[N][CHUNKS];                                                                                     \
        _Pragma("GCC unroll 4") for (int g = 0; g < N; g++)                                                        \
            _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++)                                              \
                acc[g][c] = _mm512_loadu_ps(acc_mem + g * acc_stride + 16 * c);                                    \
        for (long key = j0; key < j1; key++) {                                                                     \
            long base = v_head + (key < run ? run_start + key : (long)extra[key - run]) * v_pos;                   \
            __m512 p[N];                                                                                           \
            _Pragma("GCC unroll 4") for (int g = 0; g < N; g++) p[g] = _mm512_set1_ps(weights[g * stride + key]);  \
            _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) {                                            \
                __m512 vc = load16_##TYPE(v, base + 16 * c);                                                       \
                _Pragma("GCC unroll 4") for (int g = 0; g < N; g++)                                                \
                    acc[g][c] = _mm512_fmadd_ps(p[g], vc, acc[g][c]);                                              \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 4") for (int g = 0; g < N; g++)                                                        \
            _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++)                                              \
                _mm512_storeu_ps(acc_mem + g * acc_stride + 16 * c, acc[g][c]);                                    \
    }
#define DEFINE_GROUPS512(CHUNKS, TYPE)                                                                             \
    DEFINE_GROUP512(2, CHUNKS, TYPE)                                                                               \
    DEFINE_GROUP512(3, CHUNKS, TYPE)                                                                               \
    DEFINE_GROUP512(4, CHUNKS, TYPE)
DEFINE_GROUPS512(1, f32)
DEFINE_GROUPS512(2, f32)
DEFINE_GROUPS512(4, f32)
DEFINE_GROUPS512(6, f32)
DEFINE_GROUPS512(8, f32)
DEFINE_GROUPS512(16, f32)
DEFINE_GROUPS512(1, bf16)
DEFINE_GROUPS512(2, bf16)
DEFINE_GROUPS512(4, bf16)
DEFINE_GROUPS512(6, bf16)
DEFINE_GROUPS512(8, bf16)
DEFINE_GROUPS512(16, bf16)

#define WIDE_VARIANT(CHUNKS)                                                                                       \
    if (bf16) {                                                                                                    \
        *score = score_wide_##CHUNKS##_bf16;                                                                       \
        *value = value_wide_##CHUNKS##_bf16;                                                                       \
    } else {                                                                                                       \
        *score = score_wide_##CHUNKS##_f32;                                                                        \
        *value = value_wide_##CHUNKS##_f32;                                                                        \
    }

/* The one-item 512-bit steps for head_dim `dim` (16 * CHUNKS; any other size takes those of 128). */
void cpu_attention_wide_steps(long dim, int bf16, score_fn *score, value_fn *value)
{
    switch (dim) {
    case 16: WIDE_VARIANT(1) break;
    case 32: WIDE_VARIANT(2) break;
    case 64: WIDE_VARIANT(4) break;
    case 96: WIDE_VARIANT(6) break;
    case 256: WIDE_VARIANT(16) break;
    default: WIDE_VARIANT(8) break;
    }
}
#undef WIDE_VARIANT

#define GROUP_VARIANT(CHUNKS)                                                                                      \
    if (bf16) {                                                                                                    \
        score[2] = score_group_2_##CHUNKS##_bf16, value[2] = value_group_2_##CHUNKS##_bf16;                        \
        score[3] = score_group_3_##CHUNKS##_bf16, value[3] = value_group_3_##CHUNKS##_bf16;                        \
        score[4] = score_group_4_##CHUNKS##_bf16, value[4] = value_group_4_##CHUNKS##_bf16;                        \
    } else {                                                                                                       \
        score[2] = score_group_2_##CHUNKS##_f32, value[2] = value_group_2_##CHUNKS##_f32;                          \
        score[3] = score_group_3_##CHUNKS##_f32, value[3] = value_group_3_##CHUNKS##_f32;                          \
        score[4] = score_group_4_##CHUNKS##_f32, value[4] = value_group_4_##CHUNKS##_f32;                          \
    }                                                                                                              \
    chunks = CHUNKS;

/* The grouped steps of the 512-bit path (score[n], value[n] for n = 2 .. MAX_GROUP query heads of one row), and
 * the most heads each step takes at once: as many as keep the items' queries (score) or accumulators (value)
 * in registers; 1 = the one-item steps only (the AVX2 path). */
void cpu_attention_group_steps(long dim, int bf16, int wide, score_group_fn *score, value_group_fn *value,
                               long *score_most, long *value_most)
{
    long chunks;
    *score_most = *value_most = 1;
    if (!wide)
        return;
    switch (dim) {
    case 16: GROUP_VARIANT(1) break;
    case 32: GROUP_VARIANT(2) break;
    case 64: GROUP_VARIANT(4) break;
    case 96: GROUP_VARIANT(6) break;
    case 256: GROUP_VARIANT(16) break;
    default: GROUP_VARIANT(8) break;
    }
    for (long n = 2; n <= MAX_GROUP; n++) {
        if (n * chunks <= 16)
            *score_most = n;
        if (n * chunks <= 24)
            *value_most = n;
    }
}
#undef GROUP_VARIANT
#endif
