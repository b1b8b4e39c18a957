/*
 * matmul_avx2.c: the 256-bit tiles of the avx2 and avxvnni paths (one template, DEFINE_TILE256, compiled three
 * times: AVX2's maddubs + madd, or vpdpbusd in AVX-VNNI's or AVX512-VNNI's encoding, kernels.h's vnni_dot) for the
 * block kinds, the AVX2 tiles of the float kinds, and their tables (cpu_tiles_avx2, cpu_tiles_avxvnni,
 * cpu_tiles_vnni_evex, cpu_floats_avx2) that matmul.c's tiled driver runs. Each tile
 * computes every output element in the order ../_cpu.c's header comment gives.
 * Not here: the driver, the portable loop (matmul.c), the avx512vnni tiles (matmul_avx512.c); nothing at all on
 * CPUs other than x86-64.
 */
#include "kernels.h"

#if HAVE_X86
/* ---- AVX2 (and AVX-VNNI): 8 columns (half h of a group) x R rows a tile. ----
 * Nibbles: maddubs of the unsigned codes with the row's signed codes (at most 2 * 15 * 127 a pair of lanes, so the
 * eight chunks of a sub-block add up in 16 bits), then madd by ones to 32 bits. Bytes: the codes as signed values
 * (bytes of kinds with zero point 128 flipped back to int8), maddubs of their magnitude with the row's codes
 * carrying their signs. With AVX-VNNI, vpdpbusd of the unsigned codes with the row's codes. Either way the
 * integer sums are exact, then the float steps are those of the portable loop, lane by lane. */

#define AVX2_ROWS 4

#define DEFINE_TILE256(NAME, VNNI)                                                                                 \
    AVX2 static inline __attribute__((always_inline)) void NAME(const MatmulTask *t, long g, int h, long r0,       \
                                                                  const int R, const int BITS, const int SUB,       \
                                                                  const int OFF, int prefetch)                      \
    {                                                                                                              \
        const long blocks = t->k / BLOCK;                                                                          \
        const int S = BLOCK / SUB, C = SUB / 4;                                                                    \
        const char *record = t->weights + g * t->record;                                                          \
        const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);    \
        const int flip_bytes = !(VNNI) && t->info.zero == 128;                                                     \
        __m256 acc[AVX2_ROWS];                                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                          \
        for (long b = 0; b < blocks; b++) {                                                                        \
            const char *block = record + b * t->block;                                                             \
            const float *scales = (const float *)block;                                                            \
            const char *codes = block + 4 * GROUP * S * (1 + OFF);                                                 \
            if (prefetch)                                                                                          \
                prefetch_ahead(block, t->block, FORM_RECORDS, R);                                                  \
            _Pragma("GCC unroll 2") for (int j = 0; j < S; j++) {                                                  \
                __m256i ia[AVX2_ROWS];                                                                             \
                const int8_t *xs = t->qx + (b * t->rows + r0) * BLOCK + j * SUB;                                   \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                \
                    ia[r] = _mm256_set1_epi32(t->init[(b * S + j) * t->rows + r0 + r]);                            \
                if (BITS == 4) {                                                                                   \
                    __m256i m16[AVX2_ROWS];                                                                        \
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) m16[r] = _mm256_setzero_si256();           \
                    _Pragma("GCC unroll 4") for (int q = 0; q < C / 2; q++) {                                      \
                        __m256i v = _mm256_loadu_si256((const __m256i *)(codes + (j * (C / 2) + q) * 64 + 32 * h)); \
                        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low); \
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                      \
                            __m256i xa = _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * q));                           \
                            __m256i xb = _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * (q + C / 2)));                 \
                            if (VNNI) {                                                                            \
                                ia[r] = vnni_dot(ia[r], lo, xa, VNNI);                                             \
                                ia[r] = vnni_dot(ia[r], hi, xb, VNNI);                                             \
                            } else                                                                                 \
                                m16[r] = _mm256_add_epi16(                                                         \
                                    m16[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb))); \
                        }                                                                                          \
                    }                                                                                              \
                    if (!(VNNI)) {                                                                                 \
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                        \
                            ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(m16[r], ones));                      \
                    }                                                                                              \
                } else {                                                                                           \
                    _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {                                          \
                        __m256i w = _mm256_loadu_si256((const __m256i *)(codes + (j * C + c) * 64 + 32 * h));      \
                        if (VNNI) {                                                                                \
                            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) ia[r] = vnni_dot(                  \
                                ia[r], w, _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * c)), VNNI);                  \
                        } else {                                                                                   \
                            if (flip_bytes)                                                                        \
                                w = _mm256_xor_si256(w, flip);                                                     \
                            __m256i magnitude = _mm256_sign_epi8(w, w);                                            \
                            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                  \
                                __m256i xa = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * c)), w); \
                                ia[r] = _mm256_add_epi32(                                                          \
                                    ia[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xa), ones));          \
                            }                                                                                      \
                        }                                                                                          \
                    }                                                                                              \
                }                                                                                                  \
                __m256 scale = _mm256_loadu_ps(scales + j * GROUP + 8 * h);                                        \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                              \
                    __m256 sd = _mm256_mul_ps(scale, _mm256_set1_ps(t->dx[b * t->rows + r0 + r]));                 \
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), sd, acc[r]);                               \
                }                                                                                                  \
                if (OFF) {                                                                                         \
                    __m256 offset = _mm256_loadu_ps(scales + (S + j) * GROUP + 8 * h);                             \
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(                  \
                        offset, _mm256_set1_ps(t->sx[(b * S + j) * t->rows + r0 + r]), acc[r]);                    \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                      \
            float *at = t->out + (r0 + r) * t->out_stride + g * GROUP + 8 * h;                                     \
            long count = t->n - (g * GROUP + 8 * h);                                                               \
            if (count >= 8) {                                                                                      \
                _mm256_storeu_ps(at, t->accumulate ? _mm256_add_ps(_mm256_loadu_ps(at), acc[r]) : acc[r]);         \
            } else if (count > 0) {                                                                                \
                float values[8];                                                                                   \
                _mm256_storeu_ps(values, acc[r]);                                                                  \
                for (long c = 0; c < count; c++)                                                                   \
                    at[c] = t->accumulate ? at[c] + values[c] : values[c];                                         \
            }                                                                                                      \
        }                                                                                                          \
    }

DEFINE_TILE256(tile_avx2, VNNI_NONE)
DEFINE_TILE256(tile_avxvnni, VNNI_VEX)
DEFINE_TILE256(tile_vnni_evex, VNNI_EVEX)

/* Float kinds, 8 columns x R rows: per row four accumulators (k mod 4), the portable loop's order. */
AVX2 static inline __attribute__((always_inline)) __m256 load8_weights(const char *p, int bits, int bf16)
{
    if (bits == 32)
        return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

#define FLOAT_ROWS 2
AVX2 static inline __attribute__((always_inline)) void tile_float_avx2(const MatmulTask *t, long g, int h, long r0,
                                                                       const int R, const int BITS, const int BF16)
{
    const long k = t->k, elem = BITS / 8;
    const char *record = t->weights + g * t->record + 8 * h * elem;
    __m256 acc[FLOAT_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int lane = 0; lane < 4; lane++)
            acc[r][lane] = _mm256_setzero_ps();
    for (long i = 0; i < k; i += 4) {
        _Pragma("GCC unroll 4") for (int lane = 0; lane < 4; lane++) {
            __m256 w = load8_weights(record + (i + lane) * GROUP * elem, BITS, BF16);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][lane] =
                _mm256_fmadd_ps(_mm256_set1_ps(t->x[(r0 + r) * k + i + lane]), w, acc[r][lane]);
        }
    }
    for (int r = 0; r < R; r++) {
        __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
        float values[8];
        _mm256_storeu_ps(values, sum);
        float *at = t->out + (r0 + r) * t->out_stride + g * GROUP + 8 * h;
        long count = t->n - (g * GROUP + 8 * h);
        for (long c = 0; c < count && c < 8; c++)
            at[c] = t->accumulate ? at[c] + values[c] : values[c];
    }
}

/* One function per compiled shape (SHAPES) and tile size: 1, 2 and 4 rows; float kinds 1 and 2. */
#define TILE256_FNS(PREFIX, BODY, BITS, SUB, OFF)                                                                   \
    AVX2 static void PREFIX##_##BITS##_##SUB##_##OFF##_1(const MatmulTask *t, long g, int h, long r0, int p)     \
    {                                                                                                              \
        BODY(t, g, h, r0, 1, BITS, SUB, OFF, p);                                                                   \
    }                                                                                                              \
    AVX2 static void PREFIX##_##BITS##_##SUB##_##OFF##_2(const MatmulTask *t, long g, int h, long r0, int p)     \
    {                                                                                                              \
        BODY(t, g, h, r0, 2, BITS, SUB, OFF, p);                                                                   \
    }                                                                                                              \
    AVX2 static void PREFIX##_##BITS##_##SUB##_##OFF##_4(const MatmulTask *t, long g, int h, long r0, int p)     \
    {                                                                                                              \
        BODY(t, g, h, r0, 4, BITS, SUB, OFF, p);                                                                   \
    }
#define AVX2_FNS(BITS, SUB, OFF) TILE256_FNS(t2, tile_avx2, BITS, SUB, OFF)
#define AVXVNNI_FNS(BITS, SUB, OFF) TILE256_FNS(tv, tile_avxvnni, BITS, SUB, OFF)
#define EVEX_FNS(BITS, SUB, OFF) TILE256_FNS(te, tile_vnni_evex, BITS, SUB, OFF)
SHAPES(AVX2_FNS)
SHAPES(AVXVNNI_FNS)
SHAPES(EVEX_FNS)

#define FLOAT_FNS(BITS, BF16, NAME)                                                                                \
    AVX2 static void f2_##NAME##_1(const MatmulTask *t, long g, int h, long r0, int p)                             \
    {                                                                                                              \
        tile_float_avx2(t, g, h, r0, 1, BITS, BF16);                                                               \
    }                                                                                                              \
    AVX2 static void f2_##NAME##_2(const MatmulTask *t, long g, int h, long r0, int p)                             \
    {                                                                                                              \
        tile_float_avx2(t, g, h, r0, 2, BITS, BF16);                                                               \
    }
FLOAT_FNS(32, 0, f32)
FLOAT_FNS(16, 0, f16)
FLOAT_FNS(16, 1, bf16)

#define SET256(PREFIX, BITS, SUB, OFF)                                                                             \
    {                                                                                                              \
        {PREFIX##_##BITS##_##SUB##_##OFF##_1, PREFIX##_##BITS##_##SUB##_##OFF##_2, PREFIX##_##BITS##_##SUB##_##OFF##_4},   \
            {1, 2, 4}                                                                                              \
    }
#define SET_T2(BITS, SUB, OFF) SET256(t2, BITS, SUB, OFF),
#define SET_TV(BITS, SUB, OFF) SET256(tv, BITS, SUB, OFF),
#define SET_TE(BITS, SUB, OFF) SET256(te, BITS, SUB, OFF),
const TileSet cpu_tiles_avx2[SHAPE_COUNT] = {SHAPES(SET_T2)};
const TileSet cpu_tiles_avxvnni[SHAPE_COUNT] = {SHAPES(SET_TV)};
const TileSet cpu_tiles_vnni_evex[SHAPE_COUNT] = {SHAPES(SET_TE)};
const TileSet cpu_floats_avx2[3] = {{{f2_f32_1, f2_f32_2}, {1, 2}}, {{f2_f16_1, f2_f16_2}, {1, 2}},
                                    {{f2_bf16_1, f2_bf16_2}, {1, 2}}};
#endif
