/*
 * matmul_packed_512.c: the packed kinds' avx512vnni tiles (cpu_tiles_packed_512): a whole group (16 columns, one
 * zmm; a record's 64-byte code vector is exactly one load) x 1-8 rows (any count in one pass), vpdpbusd of the
 * unsigned codes with the row's signed codes broadcast four at a time, so no 16-bit partial sums and no pairs of
 * halves. Each output element gets the integers and then the float operations of matmul_packed.c's header comment
 * in their order, so the bits of its AVX2 tiles and portable loop:
 *   legacy types, IQ4      per block: ia = -zero * (the row's code sum) + dot (vpdpbusd), then
 *                           acc = fma(float(ia), scale * dx, acc) and, with offsets, acc = fma(m, sx, acc);
 *                           Q8_0's int8 codes are made unsigned (+128, an xor), IQ4's nibbles looked up as their
 *                           table's value + 128 (a byte shuffle), and their zero point is 128 here
 *   Q6_K                    per sub-block of 16: ia as above, part = fma(float(ia), d * sub-scale, part); per
 *                           super-block acc = fma(part, dx, acc) (one activation scale per 256)
 *   K-quants (Q4_K, Q5_K)   per super-block: imin = sum of minimum pairs x the row's pairs of sub-block sums
 *                           (vpdpwssd), isum = sum of sub-scale x sub-block dot (vpdpbusd, then vpmulld), then
 *                           acc = fma(float(imin), -(dmin * dx), acc), acc = fma(float(isum), d * dx, acc)
 * Not here: the layout (matmul_packed.c), the driver (matmul.c), the record kinds' 512-bit tiles (matmul_avx512.c).
 */
#include "kernels.h"

#if HAVE_X86
#define PACKED_WIDE_ROWS 8

/* acc + vpdpbusd(codes, the 4 signed bytes at x broadcast to every lane), the broadcast as the instruction's memory
 * operand ({1to16}): GCC 12 keeps a separate vpbroadcastd for _mm512_set1_epi32 of a load, one more instruction per
 * multiply (the 0.5B's Q5_0 matrices at 8 and 16 rows: 3-4% faster so). The same integers either way. */
VNNI512 static inline __attribute__((always_inline)) __m512i dot_broadcast(__m512i acc, __m512i codes, const int8_t *x)
{
    typedef int32_t __attribute__((may_alias)) four_bytes;
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*(const four_bytes *)x));
    return acc;
}

/* A super-block header's 16 f16 values at `p` (d, m or dmin of the 16 columns) as float32. */
VNNI512 static inline __attribute__((always_inline)) __m512 halves16(const char *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Chunk q's and chunk q + 4's codes of a 4- or 5-bit block, all 16 columns, as bytes: the nibbles, and the fifth bit
 * moved to bit 4 from `plane` (a 16-bit shift by at most 4 carries only bits 0-3 or 5-7 across a byte). */
VNNI512 static inline __attribute__((always_inline)) void codes_45_512(const char *codes, __m512i plane, int q,
                                                                        const int BITS, __m512i *lo, __m512i *hi)
{
    const __m512i low = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(16);
    __m512i v = _mm512_loadu_si512((const void *)(codes + q * 64));
    *lo = _mm512_and_si512(v, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if (BITS == 5) {
        *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_slli_epi16(plane, 4 - q), fifth));
        *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_srli_epi16(plane, q), fifth));
    }
}

/* The R rows of a group's 16 columns into out (or added to it), the columns past n left alone. */
VNNI512 static inline __attribute__((always_inline)) void store_group(const MatmulTask *t, long g, long r0, const int R,
                                                                       const __m512 *acc)
{
    long count = t->n - g * GROUP;
    __mmask16 mask = count >= GROUP ? (__mmask16)0xFFFF : (__mmask16)((1u << count) - 1);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        float *at = t->out + (r0 + r) * t->out_stride + g * GROUP;
        __m512 value = t->accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), acc[r]) : acc[r];
        _mm512_mask_storeu_ps(at, mask, value);
    }
}

/* A header's 6-bit value of sub-block i for the 16 columns, one byte each (`low`, `high`: the nibble and top-bit
 * rows of FORM_K's scales or minimums, or of FORM_IQ4XS's scales). */
VNNI512 static inline __attribute__((always_inline)) __m128i k_six16(const char *head, int low, int high, int i)
{
    __m128i nibbles = _mm_loadu_si128((const __m128i *)(head + low + (i >> 1) * GROUP));
    __m128i tops = _mm_loadu_si128((const __m128i *)(head + high + (i >> 2) * GROUP));
    return _mm_or_si128(_mm_and_si128(_mm_srli_epi16(nibbles, 4 * (i & 1)), _mm_set1_epi8(15)),
                        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(tops, 2 * (i & 3)), _mm_set1_epi8(3)), 4));
}

/* FORM_K's minimums of sub-blocks 2p and 2p + 1 as 16-bit lanes 2c and 2c + 1: vpdpwssd's pairs of a column. */
VNNI512 static inline __attribute__((always_inline)) __m512i k_min_pairs(const char *head, int p)
{
    __m128i even = k_six16(head, K_MIN_LOW, K_MIN_HIGH, 2 * p), odd = k_six16(head, K_MIN_LOW, K_MIN_HIGH, 2 * p + 1);
    __m256i both = _mm256_setr_m128i(_mm_unpacklo_epi8(even, odd), _mm_unpackhi_epi8(even, odd));
    return _mm512_cvtepu8_epi16(both);
}

/* FORM_K (Q4_K, Q5_K), 16 columns x R rows, in llama.cpp's integer order (the top). */
VNNI512 static inline __attribute__((always_inline)) void tile_k_512(const MatmulTask *t, long g, long r0, const int R,
                                                                      const int BITS, int prefetch)
{
    const long supers = t->k / 256, block_bytes = PACKED_BLOCK_BYTES(BITS);
    const char *record = t->weights + g * t->record;
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 acc[PACKED_WIDE_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM_K, R);
        const long pair0 = s * 4 * t->rows + r0; /* this super-block's pairs of sub-block sums, row r0 */
        const float *dx = t->dx + s * 8 * t->rows + r0;
        __m512i imin[PACKED_WIDE_ROWS];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) imin[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            __m512i minimums = k_min_pairs(head, p);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) imin[r] =
                _mm512_dpwssd_epi32(imin[r], minimums, _mm512_set1_epi32(t->pairs[pair0 + p * t->rows + r]));
        }
        const __m512 dmin = halves16(head + 2 * GROUP);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(imin[r]),
            _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, _mm512_set1_ps(dx[r]))), sign)),
            acc[r]);
        __m512i isum[PACKED_WIDE_ROWS];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            const char *codes = head + PACKED_HEADER_BYTES(FORM_K, 1) + i * block_bytes;
            const int8_t *xs = t->qx + ((s * 8 + i) * t->rows + r0) * BLOCK;
            if (prefetch)
                prefetch_slice(head, t->block, FORM_K, R, i);
            const __m512i plane = BITS == 5 ? _mm512_loadu_si512((const void *)(codes + 256)) : _mm512_setzero_si512();
            __m512i dot[PACKED_WIDE_ROWS];
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) dot[r] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                __m512i lo, hi;
                codes_45_512(codes, plane, q, BITS, &lo, &hi);
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                    dot[r] = dot_broadcast(dot[r], lo, xs + r * BLOCK + 4 * q);
                    dot[r] = dot_broadcast(dot[r], hi, xs + r * BLOCK + 4 * (q + 4));
                }
            }
            const __m512i scale = _mm512_cvtepu8_epi32(k_six16(head, K_SCALE_LOW, K_SCALE_HIGH, i));
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) isum[r] =
                _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot[r], scale));
        }
        const __m512 d = halves16(head);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, _mm512_set1_ps(dx[r])), acc[r]);
    }
    store_group(t, g, r0, R, acc);
}

/* The legacy types, IQ4 and Q6_K, 16 columns x R rows, in their float orders (the top). */
VNNI512 static inline __attribute__((always_inline)) void tile_packed_512(const MatmulTask *t, long g, long r0,
                                                                           const int R, const int BITS, const int FORM,
                                                                           const int OFF, const int TABLE, int prefetch)
{
    /* IQ4's values + 128 as unsigned bytes, for vpdpbusd (its zero point is 128 on this path) */
    const __m512i values = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_setr_epi8(IQ4_TABLE)), _mm512_set1_epi8(-128));
    const int NB = FORM == FORM_LEGACY ? 1 : 8, SUB = BITS == 6 ? 16 : 32;
    const long supers = t->k / (NB * BLOCK);
    const long header = PACKED_HEADER_BYTES(FORM, OFF), block_bytes = PACKED_BLOCK_BYTES(BITS);
    const char *record = t->weights + g * t->record;
    const __m512i low = _mm512_set1_epi8(0x0F), top_two = _mm512_set1_epi8(0x30), flip = _mm512_set1_epi8(-128);
    __m512 acc[PACKED_WIDE_ROWS], part[PACKED_WIDE_ROWS]; /* part: Q6_K's products over the super-block */
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = part[r] = _mm512_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM, R);
        const __m512 d = halves16(head), m = OFF ? halves16(head + 2 * GROUP) : _mm512_setzero_ps();
        _Pragma("GCC unroll 8") for (int i = 0; i < NB; i++) {
            const long b = s * NB + i;
            const char *codes = head + header + i * block_bytes;
            const int8_t *xs = t->qx + (b * t->rows + r0) * BLOCK;
            if (prefetch)
                prefetch_slice(head, t->block, FORM, R, i);
            _Pragma("GCC unroll 2") for (int j = 0; j < BLOCK / SUB; j++) {
                const long sj = b * (BLOCK / SUB) + j; /* the sub-block's index along k */
                __m512 scale = d;
                if (FORM == FORM_Q6K) {
                    __m128i sc = _mm_loadu_si128((const __m128i *)(head + Q6K_SCALES + (i * 2 + j) * GROUP));
                    scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
                }
                if (FORM == FORM_IQ4XS) {
                    __m512i six = _mm512_cvtepu8_epi32(k_six16(head, IQ4XS_SCALE_LOW, IQ4XS_SCALE_HIGH, i));
                    scale = _mm512_mul_ps(
                        d, _mm512_cvtepi32_ps(_mm512_sub_epi32(six, _mm512_set1_epi32(IQ4XS_SCALE_ZERO))));
                }
                __m512i ia[PACKED_WIDE_ROWS];
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
                    ia[r] = _mm512_set1_epi32(t->init[sj * t->rows + r0 + r]);
                if (BITS == 8) {
                    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                        __m512i w = _mm512_xor_si512(_mm512_loadu_si512((const void *)(codes + c * 64)), flip);
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) ia[r] =
                            dot_broadcast(ia[r], w, xs + r * BLOCK + 4 * c);
                    }
                } else if (BITS == 6) {
                    __m512i plane = _mm512_loadu_si512((const void *)(codes + 256 + j * 64));
                    _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) {
                        __m512i v = _mm512_loadu_si512((const void *)(codes + (j * 2 + q) * 64));
                        __m512i lo = _mm512_or_si512(_mm512_and_si512(v, low),
                                                     _mm512_and_si512(_mm512_slli_epi16(plane, 4 - 2 * q), top_two));
                        __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                                                     _mm512_and_si512(_mm512_srli_epi16(plane, 2 * q), top_two));
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                            const int8_t *x = xs + r * BLOCK + j * SUB;
                            ia[r] = dot_broadcast(ia[r], lo, x + 4 * q);
                            ia[r] = dot_broadcast(ia[r], hi, x + 4 * (q + 2));
                        }
                    }
                } else {
                    __m512i ib[PACKED_WIDE_ROWS]; /* the high nibbles' products: a second chain a row, added last */
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) ib[r] = _mm512_setzero_si512();
                    const __m512i plane =
                        BITS == 5 ? _mm512_loadu_si512((const void *)(codes + 256)) : _mm512_setzero_si512();
                    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                        __m512i lo, hi;
                        codes_45_512(codes, plane, q, BITS, &lo, &hi);
                        if (TABLE) {
                            lo = _mm512_shuffle_epi8(values, lo);
                            hi = _mm512_shuffle_epi8(values, hi);
                        }
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                            ia[r] = dot_broadcast(ia[r], lo, xs + r * BLOCK + 4 * q);
                            ib[r] = dot_broadcast(ib[r], hi, xs + r * BLOCK + 4 * (q + 4));
                        }
                    }
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) ia[r] = _mm512_add_epi32(ia[r], ib[r]);
                }
                if (FORM == FORM_Q6K) {
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) part[r] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), scale, part[r]);
                    continue;
                }
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                    __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(t->dx[b * t->rows + r0 + r]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), sd, acc[r]);
                }
                if (OFF) {
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] =
                        _mm512_fmadd_ps(m, _mm512_set1_ps(t->sx[sj * t->rows + r0 + r]), acc[r]);
                }
            }
        }
        if (FORM == FORM_Q6K) {
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                acc[r] = _mm512_fmadd_ps(part[r], _mm512_set1_ps(t->dx[s * NB * t->rows + r0 + r]), acc[r]);
                part[r] = _mm512_setzero_ps();
            }
        }
    }
    store_group(t, g, r0, R, acc);
}

/* One function per packed kind and tile size (1-8 rows: 1, 2, 4 and 8 the tiles, 3, 5, 6 and 7 what 8-row tiles
 * leave, in one pass), and their table, indexed by kind - KIND_PQ4_0. */
#define WIDE_TILE(NAME, R, CALL)                                                                                   \
    VNNI512 static void NAME##_##R(const MatmulTask *t, long g, int h, long r0, int p)                             \
    {                                                                                                              \
        (void)h;                                                                                                   \
        CALL;                                                                                                      \
    }
#define WIDE_PACKED(NAME, BITS, FORM, OFF, TABLE)                                                                  \
    WIDE_TILE(NAME, 1, tile_packed_512(t, g, r0, 1, BITS, FORM, OFF, TABLE, p))                                    \
    WIDE_TILE(NAME, 2, tile_packed_512(t, g, r0, 2, BITS, FORM, OFF, TABLE, p))                                    \
    WIDE_TILE(NAME, 3, tile_packed_512(t, g, r0, 3, BITS, FORM, OFF, TABLE, p))                                    \
    WIDE_TILE(NAME, 4, tile_packed_512(t, g, r0, 4, BITS, FORM, OFF, TABLE, p))                                    \
    WIDE_TILE(NAME, 5, tile_packed_512(t, g, r0, 5, BITS, FORM, OFF, TABLE, p))                                    \
    WIDE_TILE(NAME, 6, tile_packed_512(t, g, r0, 6, BITS, FORM, OFF, TABLE, p))                                    \
    WIDE_TILE(NAME, 7, tile_packed_512(t, g, r0, 7, BITS, FORM, OFF, TABLE, p))                                    \
    WIDE_TILE(NAME, 8, tile_packed_512(t, g, r0, 8, BITS, FORM, OFF, TABLE, p))
#define WIDE_K(NAME, BITS)                                                                                         \
    WIDE_TILE(NAME, 1, tile_k_512(t, g, r0, 1, BITS, p))                                                           \
    WIDE_TILE(NAME, 2, tile_k_512(t, g, r0, 2, BITS, p))                                                           \
    WIDE_TILE(NAME, 3, tile_k_512(t, g, r0, 3, BITS, p))                                                           \
    WIDE_TILE(NAME, 4, tile_k_512(t, g, r0, 4, BITS, p))                                                           \
    WIDE_TILE(NAME, 5, tile_k_512(t, g, r0, 5, BITS, p))                                                           \
    WIDE_TILE(NAME, 6, tile_k_512(t, g, r0, 6, BITS, p))                                                           \
    WIDE_TILE(NAME, 7, tile_k_512(t, g, r0, 7, BITS, p))                                                           \
    WIDE_TILE(NAME, 8, tile_k_512(t, g, r0, 8, BITS, p))
WIDE_PACKED(w_pq4_0, 4, FORM_LEGACY, 0, 0)
WIDE_PACKED(w_pq4_1, 4, FORM_LEGACY, 1, 0)
WIDE_PACKED(w_pq5_0, 5, FORM_LEGACY, 0, 0)
WIDE_PACKED(w_pq5_1, 5, FORM_LEGACY, 1, 0)
WIDE_PACKED(w_pq8_0, 8, FORM_LEGACY, 0, 0)
WIDE_K(w_pq4_k, 4)
WIDE_K(w_pq5_k, 5)
WIDE_PACKED(w_pq6_k, 6, FORM_Q6K, 0, 0)
WIDE_PACKED(w_piq4_nl, 4, FORM_LEGACY, 0, 1)
WIDE_PACKED(w_piq4_xs, 4, FORM_IQ4XS, 0, 1)

#define WIDE_SET(NAME) {{NAME##_1, NAME##_2, NAME##_4, NAME##_8}, {1, 2, 4, 8}, {NULL}, NULL, REST_TO_8(NAME)}
const TileSet cpu_tiles_packed_512[PACKED_COUNT] = {WIDE_SET(w_pq4_0), WIDE_SET(w_pq4_1), WIDE_SET(w_pq5_0),
                                                    WIDE_SET(w_pq5_1), WIDE_SET(w_pq8_0), WIDE_SET(w_pq4_k),
                                                    WIDE_SET(w_pq5_k), WIDE_SET(w_pq6_k), WIDE_SET(w_piq4_nl),
                                                    WIDE_SET(w_piq4_xs)};
#endif
