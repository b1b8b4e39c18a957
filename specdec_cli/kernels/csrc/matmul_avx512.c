/*
 * matmul_avx512.c: the avx512vnni path's tiles: a whole group (16 columns, one zmm) x 1, 2, 4 or 8 rows for the
 * block kinds, two groups x 1, 2 or 4 rows for the nibble kinds' calls of 2-32 rows, 16 columns x 1, 2 or 4 rows
 * for the float kinds, and their tables (cpu_tiles_512, cpu_floats_512) that matmul.c's tiled driver runs. Each
 * tile computes every output element in the order ../_cpu.c's header comment gives.
 * Not here: the driver, the portable loop (matmul.c), the 256-bit tiles (matmul_avx2.c); nothing at all on CPUs
 * other than x86-64.
 */
#include "kernels.h"

#if HAVE_X86
/* ---- AVX512-VNNI: a whole group (16 columns, one zmm) x R rows a tile; vpdpbusd of the unsigned codes with the
 * row's signed codes, broadcast four at a time; the zero point's share is the accumulator's start. ---- */

#define WIDE_ROWS 8 /* the largest tile (12 measured no faster) */

/* NG groups (1 or 2: 16 or 32 columns) x R rows: with two groups each broadcast of a row's codes serves two
 * vpdpbusd. Every output element gets the operations of ../_cpu.c's header comment in their order. */
VNNI512 static inline __attribute__((always_inline)) void tile_512(const MatmulTask *t, long g, long r0, const int R,
                                                                   const int BITS, const int SUB, const int OFF,
                                                                   int prefetch, const int NG)
{
    const long blocks = t->k / BLOCK;
    const int S = BLOCK / SUB, C = SUB / 4;
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[2][WIDE_ROWS];
    _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++)
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) acc[n][r] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        const char *block[2];
        _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) {
            block[n] = t->weights + (g + n) * t->record + b * t->block;
            if (prefetch)
                prefetch_ahead(block[n], t->block, FORM_RECORDS, R);
        }
        _Pragma("GCC unroll 2") for (int j = 0; j < S; j++) {
            __m512i ia[2][WIDE_ROWS];
            const int8_t *xs = t->qx + (b * t->rows + r0) * BLOCK + j * SUB;
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
                __m512i init = _mm512_set1_epi32(t->init[(b * S + j) * t->rows + r0 + r]);
                _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) ia[n][r] = init;
            }
            if (BITS == 4) {
                _Pragma("GCC unroll 4") for (int q = 0; q < C / 2; q++) {
                    __m512i lo[2], hi[2];
                    _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) {
                        const char *codes = block[n] + 4 * GROUP * S * (1 + OFF);
                        __m512i v = _mm512_loadu_si512((const void *)(codes + (j * (C / 2) + q) * 64));
                        lo[n] = _mm512_and_si512(v, low);
                        hi[n] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                    }
                    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
                        __m512i xa = _mm512_set1_epi32(load_i32(xs + r * BLOCK + 4 * q));
                        __m512i xb = _mm512_set1_epi32(load_i32(xs + r * BLOCK + 4 * (q + C / 2)));
                        _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) {
                            ia[n][r] = _mm512_dpbusd_epi32(ia[n][r], lo[n], xa);
                            ia[n][r] = _mm512_dpbusd_epi32(ia[n][r], hi[n], xb);
                        }
                    }
                }
            } else {
                _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {
                    __m512i w[2];
                    _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) w[n] = _mm512_loadu_si512(
                        (const void *)(block[n] + 4 * GROUP * S * (1 + OFF) + (j * C + c) * 64));
                    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
                        __m512i x = _mm512_set1_epi32(load_i32(xs + r * BLOCK + 4 * c));
                        _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) ia[n][r] =
                            _mm512_dpbusd_epi32(ia[n][r], w[n], x);
                    }
                }
            }
            _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) {
                const float *scales = (const float *)block[n];
                __m512 scale = _mm512_loadu_ps(scales + j * GROUP);
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
                    __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(t->dx[b * t->rows + r0 + r]));
                    acc[n][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[n][r]), sd, acc[n][r]);
                }
                if (OFF) {
                    __m512 offset = _mm512_loadu_ps(scales + (S + j) * GROUP);
                    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) acc[n][r] = _mm512_fmadd_ps(
                        offset, _mm512_set1_ps(t->sx[(b * S + j) * t->rows + r0 + r]), acc[n][r]);
                }
            }
        }
    }
    _Pragma("GCC unroll 2") for (int n = 0; n < NG; n++) {
        long count = t->n - (g + n) * GROUP;
        __mmask16 mask = count >= GROUP ? (__mmask16)0xFFFF : (__mmask16)((1u << count) - 1);
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
            float *at = t->out + (r0 + r) * t->out_stride + (g + n) * GROUP;
            __m512 value = t->accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), acc[n][r]) : acc[n][r];
            _mm512_mask_storeu_ps(at, mask, value);
        }
    }
}

VNNI512 static inline __attribute__((always_inline)) __m512 load16_weights(const char *p, int bits, int bf16)
{
    if (bits == 32)
        return _mm512_loadu_ps((const float *)p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

#define WIDE_FLOAT_ROWS 4
VNNI512 static inline __attribute__((always_inline)) void tile_float_512(const MatmulTask *t, long g, long r0,
                                                                         const int R, const int BITS, const int BF16)
{
    const long k = t->k, elem = BITS / 8;
    const char *record = t->weights + g * t->record;
    __m512 acc[WIDE_FLOAT_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int lane = 0; lane < 4; lane++)
            acc[r][lane] = _mm512_setzero_ps();
    for (long i = 0; i < k; i += 4) {
        _Pragma("GCC unroll 4") for (int lane = 0; lane < 4; lane++) {
            __m512 w = load16_weights(record + (i + lane) * GROUP * elem, BITS, BF16);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][lane] =
                _mm512_fmadd_ps(_mm512_set1_ps(t->x[(r0 + r) * k + i + lane]), w, acc[r][lane]);
        }
    }
    long count = t->n - g * GROUP;
    __mmask16 mask = count >= GROUP ? (__mmask16)0xFFFF : (__mmask16)((1u << count) - 1);
    for (int r = 0; r < R; r++) {
        __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
        float *at = t->out + (r0 + r) * t->out_stride + g * GROUP;
        _mm512_mask_storeu_ps(at, mask, t->accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), sum) : sum);
    }
}

/* One function per compiled shape (SHAPES) and tile size: one group 1, 2, 4, 8 rows; two groups 1, 2, 4 rows;
 * float kinds 1, 2, 4 rows. */
#define WIDE_FNS(BITS, SUB, OFF)                                                                                   \
    VNNI512 static void t5_##BITS##_##SUB##_##OFF##_1(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        tile_512(t, g, r0, 1, BITS, SUB, OFF, p, 1);                                                                  \
    }                                                                                                              \
    VNNI512 static void t5_##BITS##_##SUB##_##OFF##_2(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        tile_512(t, g, r0, 2, BITS, SUB, OFF, p, 1);                                                                  \
    }                                                                                                              \
    VNNI512 static void t5_##BITS##_##SUB##_##OFF##_4(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        tile_512(t, g, r0, 4, BITS, SUB, OFF, p, 1);                                                                  \
    }                                                                                                              \
    VNNI512 static void t5_##BITS##_##SUB##_##OFF##_8(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        tile_512(t, g, r0, 8, BITS, SUB, OFF, p, 1);                                                               \
    }                                                                                                              \
    VNNI512 static void p5_##BITS##_##SUB##_##OFF##_1(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        tile_512(t, g, r0, 1, BITS, SUB, OFF, p, 2);                                                               \
    }                                                                                                              \
    VNNI512 static void p5_##BITS##_##SUB##_##OFF##_2(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        tile_512(t, g, r0, 2, BITS, SUB, OFF, p, 2);                                                               \
    }                                                                                                              \
    VNNI512 static void p5_##BITS##_##SUB##_##OFF##_4(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        tile_512(t, g, r0, 4, BITS, SUB, OFF, p, 2);                                                               \
    }
SHAPES(WIDE_FNS)

#define FLOAT_FNS(BITS, BF16, NAME)                                                                                \
    VNNI512 static void f5_##NAME##_1(const MatmulTask *t, long g, int h, long r0, int p)                          \
    {                                                                                                              \
        tile_float_512(t, g, r0, 1, BITS, BF16);                                                                   \
    }                                                                                                              \
    VNNI512 static void f5_##NAME##_2(const MatmulTask *t, long g, int h, long r0, int p)                          \
    {                                                                                                              \
        tile_float_512(t, g, r0, 2, BITS, BF16);                                                                   \
    }                                                                                                              \
    VNNI512 static void f5_##NAME##_4(const MatmulTask *t, long g, int h, long r0, int p)                          \
    {                                                                                                              \
        tile_float_512(t, g, r0, 4, BITS, BF16);                                                                   \
    }
FLOAT_FNS(32, 0, f32)
FLOAT_FNS(16, 0, f16)
FLOAT_FNS(16, 1, bf16)

#define SET512(BITS, SUB, OFF)                                                                                     \
    {                                                                                                              \
        {t5_##BITS##_##SUB##_##OFF##_1, t5_##BITS##_##SUB##_##OFF##_2, t5_##BITS##_##SUB##_##OFF##_4,              \
         t5_##BITS##_##SUB##_##OFF##_8},                                                                           \
            {1, 2, 4, 8},                                                                                          \
            {p5_##BITS##_##SUB##_##OFF##_1, p5_##BITS##_##SUB##_##OFF##_2, p5_##BITS##_##SUB##_##OFF##_4}          \
    }
#define SET_T5(BITS, SUB, OFF) SET512(BITS, SUB, OFF),
const TileSet cpu_tiles_512[SHAPE_COUNT] = {SHAPES(SET_T5)};
const TileSet cpu_floats_512[3] = {{{f5_f32_1, f5_f32_2, f5_f32_4}, {1, 2, 4}},
                                   {{f5_f16_1, f5_f16_2, f5_f16_4}, {1, 2, 4}},
                                   {{f5_bf16_1, f5_bf16_2, f5_bf16_4}, {1, 2, 4}}};
#endif
