/*
 * matmul_packed.c: the packed kinds (KIND_PQ*), which multiply a GGUF type's own fields at the file's size: f16
 * scales, 6-bit sub-scales and minimums, int8 sub-scales, nibbles with a fifth-bit or 2-bit plane. Their reference
 * loop (portable C), their AVX2 tiles (8 columns x 1, 2 or 4 rows), which every x86 path runs, and the tiles'
 * driver. A group's record (GROUP = 16 columns) is its super-blocks along k in order (sb = 32 weights for the
 * legacy types, 256 for the K-quants), each a header then the codes of its blocks of 32:
 *   header   FORM_LEGACY  d f16 [16]; Q4_1/Q5_1: m f16 [16]
 *            FORM_K       d f16 [16], dmin f16 [16], scale nibbles [4][16], minimum nibbles [4][16] (byte (p, c):
 *                         sub-block 2p's low 4 bits, 2p+1's in the high nibble), scale top bits [2][16], minimum
 *                         top bits [2][16] (byte (p, c), bits 2t..2t+1: the top 2 bits of sub-block 4p+t)
 *            FORM_Q6K     d f16 [16], int8 scales [16 sub-blocks of 16][16]
 *   codes    4 consecutive weights (a "chunk") of each of the 16 columns side by side, 64 bytes a vector:
 *            nibbles      4 vectors: per sub-block of `sub` weights sub/8 vectors, vector q holding chunk q in its
 *                         low nibbles and chunk q + sub/8 in its high ones (the record kinds' layout)
 *            bits 5       then a fifth-bit plane, 1 vector: byte (c, e), bit i: chunk i's fifth bit
 *            bits 6       then a 2-bit plane, 2 vectors: vector j (sub-block j of 16), byte (c, e), bits 2t..2t+1:
 *                         chunk 4j+t's top two bits
 *            bits 8       8 vectors, the int8 codes of chunk i in vector i
 * So each column holds exactly its row's bytes in the file.
 *
 * The arithmetic, per output (row, column), the same on every path, row count and thread count:
 *   legacy   the record kinds' order (../_cpu.c) on scale = float(d) and offset = float(m), both exact: for each
 *            block b, acc = fma(float(dot_b), scale * dx_b, acc), then with offsets acc = fma(offset, sx_b, acc);
 *            so the same bits as the float32-scale kind the same weights would repack into.
 *   K-quants as llama.cpp's q4_K/q5_K/q6_K x q8_K: the row is rounded to 8 bits with one scale dx_s per
 *            super-block s of 256 (blocks.c); then, in integers, isum_s = sum over its sub-blocks j of
 *            scale_j * dot_j (dot_j = sum of (code - zero) * the row's code; scale_j the 6-bit or int8 sub-scale)
 *            and, Q4_K/Q5_K, msum_s = sum over j of minimum_j * (sum of the row's codes over j); and in float32
 *            acc = fma(float(isum_s), float(d) * dx_s, acc), then acc = fma(float(msum_s), -(float(dmin) * dx_s),
 *            acc). Two float operations per 256 weights where the legacy order takes one or two per 32.
 * Every integer above is exact (bounds at the tiles), so the integer work may be split and ordered freely.
 * Not here: packing (kernels/packed.py), repacking a GGUF's rows (repack.c), the record kinds (matmul.c).
 */
#include "kernels.h"

/* Byte offsets in a FORM_K header. */
#define K_SCALE_LOW 64
#define K_MIN_LOW 128
#define K_SCALE_HIGH 192
#define K_MIN_HIGH 224
#define Q6K_SCALES 32

/* Column c of a group's record: its codes less the zero point [k]; per super-block d and m (or dmin) [k / sb];
 * per sub-block the integer sub-scale and minimum [k / sub] (1 and 0 for the legacy types). */
static void packed_column(const KindInfo *info, const uint8_t *record, long k, long super_bytes, int c,
                          int16_t *codes, float *d, float *m, int *sub_scales, int *sub_mins)
{
    long supers = k / info->sb, header = cpu_packed_header_bytes(info), block_bytes = cpu_packed_block_bytes(info);
    int per_super = info->sb / info->sub, chunks = info->sub / 4, half = info->sub / 8;
    for (long s = 0; s < supers; s++) {
        const uint8_t *head = record + s * super_bytes;
        uint16_t bits;
        memcpy(&bits, head + 2 * c, 2);
        d[s] = cpu_half_to_float(bits);
        m[s] = 0.0f;
        if (info->offsets) {
            memcpy(&bits, head + 2 * GROUP + 2 * c, 2);
            m[s] = cpu_half_to_float(bits);
        }
        for (int j = 0; j < per_super; j++) {
            int scale = 1, minimum = 0;
            if (info->form == FORM_K) {
                scale = ((head[K_SCALE_LOW + (j >> 1) * GROUP + c] >> (4 * (j & 1))) & 15) |
                        (((head[K_SCALE_HIGH + (j >> 2) * GROUP + c] >> (2 * (j & 3))) & 3) << 4);
                minimum = ((head[K_MIN_LOW + (j >> 1) * GROUP + c] >> (4 * (j & 1))) & 15) |
                          (((head[K_MIN_HIGH + (j >> 2) * GROUP + c] >> (2 * (j & 3))) & 3) << 4);
            } else if (info->form == FORM_Q6K)
                scale = (int8_t)head[Q6K_SCALES + j * GROUP + c];
            sub_scales[s * per_super + j] = scale;
            sub_mins[s * per_super + j] = minimum;
        }
        for (long b = 0; b < info->sb / BLOCK; b++) {
            const uint8_t *p = head + header + b * block_bytes;
            int16_t *out = codes + s * info->sb + b * BLOCK;
            for (int i = 0; i < BLOCK / 4; i++)
                for (int e = 0; e < 4; e++) {
                    int code;
                    if (info->bits == 8)
                        code = (int8_t)p[i * 64 + c * 4 + e];
                    else {
                        int j = i / chunks, q = i % chunks;
                        uint8_t byte = p[(j * half + q % half) * 64 + c * 4 + e];
                        code = q < half ? byte & 15 : byte >> 4;
                        if (info->bits == 5)
                            code |= ((p[256 + c * 4 + e] >> i) & 1) << 4;
                        if (info->bits == 6)
                            code |= ((p[256 + j * 64 + c * 4 + e] >> (2 * q)) & 3) << 4;
                    }
                    out[i * 4 + e] = (int16_t)(code - info->zero);
                }
        }
    }
}

/* One row's value for one column, in the order of the header comment. */
static float packed_value(const MatmulTask *t, long row, const int16_t *codes, const float *d, const float *m,
                          const int *sub_scales, const int *sub_mins)
{
    const KindInfo *info = &t->info;
    long supers = t->k / info->sb, per_super = info->sb / info->sub, blocks_per_super = info->sb / BLOCK;
    float acc = 0.0f;
    for (long s = 0; s < supers; s++) {
        int32_t isum = 0, msum = 0; /* the K-quants' integer sums over the super-block */
        for (long j = s * per_super; j < (s + 1) * per_super; j++) {
            long b = j * info->sub / BLOCK, first = j * info->sub % BLOCK;
            const int8_t *x = t->qx + (b * t->rows + row) * BLOCK;
            int32_t dot = 0, codes_sum = 0;
            for (long i = first; i < first + info->sub; i++) {
                dot += codes[b * BLOCK + i] * x[i];
                codes_sum += x[i];
            }
            if (info->form == FORM_LEGACY) {
                acc = fmaf((float)dot, d[s] * t->dx[b * t->rows + row], acc);
                if (info->offsets)
                    acc = fmaf(m[s], t->sx[j * t->rows + row], acc);
            } else {
                isum += sub_scales[j] * dot;
                msum += sub_mins[j] * codes_sum;
            }
        }
        if (info->form != FORM_LEGACY) {
            float dx = t->dx[s * blocks_per_super * t->rows + row];
            acc = fmaf((float)isum, d[s] * dx, acc);
            if (info->offsets)
                acc = fmaf((float)msum, -(m[s] * dx), acc);
        }
    }
    return acc;
}

/* The reference: one column at a time. */
void cpu_matmul_packed_portable(const void *arg, long start, long stop)
{
    const MatmulTask *t = arg;
    const KindInfo *info = &t->info;
    long k = t->k, subs = k / info->sub, supers = k / info->sb;
    int16_t *codes = malloc(sizeof(int16_t) * (size_t)k);
    float *d = malloc(sizeof(float) * (size_t)supers), *m = malloc(sizeof(float) * (size_t)supers);
    int *sub_scales = malloc(sizeof(int) * (size_t)subs), *sub_mins = malloc(sizeof(int) * (size_t)subs);
    if (codes != NULL && d != NULL && m != NULL && sub_scales != NULL && sub_mins != NULL)
        for (long g = start; g < stop; g++) {
            const uint8_t *record = (const uint8_t *)t->weights + g * t->record;
            float values[32][GROUP];
            for (long r0 = 0; r0 < t->rows; r0 += 32) {
                long rows = t->rows - r0 < 32 ? t->rows - r0 : 32;
                for (int c = 0; c < GROUP; c++) {
                    packed_column(info, record, k, t->block, c, codes, d, m, sub_scales, sub_mins);
                    for (long r = 0; r < rows; r++)
                        values[r][c] = packed_value(t, r0 + r, codes, d, m, sub_scales, sub_mins);
                }
                for (long r = 0; r < rows; r++)
                    cpu_store_values(t, r0 + r, g * GROUP, values[r]);
            }
        }
    else
        cpu_store_nan(t, start, stop);
    free(codes);
    free(d);
    free(m);
    free(sub_scales);
    free(sub_mins);
}

#if HAVE_X86
/* ---- AVX2: 8 columns (half h of a group) x R rows a tile, over a range of super-blocks. The codes are widened to
 * bytes (a fifth or sixth bit OR-ed in from its plane), multiplied by the row's signed codes with maddubs, summed in
 * 16 bits no further than they cannot overflow (4-bit codes: a whole block, at most 8 x 2 x 15 x 127 = 30,480;
 * 5-bit: two vectors, 31,496; 6-bit: one, 32,004) and then to 32 bits with madd against a multiplier: ones
 * (legacy), or the sub-block's scale in both 16-bit halves of each column's lane (K-quants); int8 codes as the
 * record kinds' bytes are (magnitude times the row's codes carrying the weight's sign). The K-quants' integer sums
 * stay far inside 32 bits: Q5_K 8 x 63 x 32 x 31 x 127, Q6_K 16 x 128 x 16 x 63 x 127. */

#define PACKED_ROWS 4

/* Row r's dot products with one block of 32 codes of the 8 columns of half h, times `mult` (6-bit codes: two
 * sub-blocks of 16, mult[0] and mult[1]), added to ia[r]. */
AVX2 static inline __attribute__((always_inline)) void block_dots(const char *codes, const int8_t *xs, int h,
                                                                  const int R, const int BITS, const __m256i *mult,
                                                                  __m256i *ia)
{
    const __m256i low = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(16), top_two = _mm256_set1_epi8(0x30);
    if (BITS == 8) {
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(codes + c * 64 + 32 * h));
            __m256i magnitude = _mm256_sign_epi8(w, w);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                __m256i xa = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * c)), w);
                ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xa), mult[0]));
            }
        }
    } else if (BITS == 6) {
        _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) {
            __m256i plane = _mm256_loadu_si256((const __m256i *)(codes + 256 + j * 64 + 32 * h));
            _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(codes + (j * 2 + q) * 64 + 32 * h));
                __m256i lo = _mm256_or_si256(_mm256_and_si256(v, low),
                                             _mm256_and_si256(_mm256_slli_epi16(plane, 4 - 2 * q), top_two));
                __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                             _mm256_and_si256(_mm256_srli_epi16(plane, 2 * q), top_two));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    __m256i xa = _mm256_set1_epi32(load_i32(xs + r * BLOCK + j * 16 + 4 * q));
                    __m256i xb = _mm256_set1_epi32(load_i32(xs + r * BLOCK + j * 16 + 4 * (q + 2)));
                    __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb));
                    ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(pairs, mult[j]));
                }
            }
        }
    } else {
        __m256i plane = BITS == 5 ? _mm256_loadu_si256((const __m256i *)(codes + 256 + 32 * h)) : _mm256_setzero_si256();
        __m256i m16[PACKED_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) m16[r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(codes + q * 64 + 32 * h));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (BITS == 5) {
                __m256i bit_lo = _mm256_set1_epi8((char)(1 << q)), bit_hi = _mm256_set1_epi8((char)(1 << (q + 4)));
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(plane, bit_lo), bit_lo),
                                                          fifth));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(plane, bit_hi), bit_hi),
                                                          fifth));
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                __m256i xa = _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * q));
                __m256i xb = _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * (q + 4)));
                m16[r] = _mm256_add_epi16(m16[r],
                                          _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb)));
            }
            if (BITS == 4 ? q == 3 : (q & 1)) {
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(m16[r], mult[0]));
                    m16[r] = _mm256_setzero_si256();
                }
            }
        }
    }
}

/* Legacy types (one block a super-block): the record kinds' float order per block. */
AVX2 static inline __attribute__((always_inline)) void tile_legacy(const MatmulTask *t, long g, int h, long r0,
                                                                   long s0, long s1, float *io, int prefetch,
                                                                   const int R, const int BITS, const int OFF)
{
    const char *record = t->weights + g * t->record;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[PACKED_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_loadu_ps(io + r * GROUP);
    for (long b = s0; b < s1; b++) {
        const char *head = record + b * t->block;
        if (prefetch)
            for (long line = 0; line < t->block; line += 64)
                _mm_prefetch(head + t->record + line, _MM_HINT_T0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
        __m256i ia[PACKED_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) ia[r] = _mm256_set1_epi32(t->init[b * t->rows + r0 + r]);
        block_dots(head + 32 * (1 + OFF), t->qx + (b * t->rows + r0) * BLOCK, h, R, BITS, &ones, ia);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            __m256 sd = _mm256_mul_ps(d, _mm256_set1_ps(t->dx[b * t->rows + r0 + r]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), sd, acc[r]);
        }
        if (OFF) {
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * h)));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] =
                _mm256_fmadd_ps(m, _mm256_set1_ps(t->sx[b * t->rows + r0 + r]), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _mm256_storeu_ps(io + r * GROUP, acc[r]);
}

/* Eight 6-bit values of the columns of half h (sub-block i's scales or minimums of a FORM_K header, from the
 * nibble row at `low` and the top bits at `high`), as bytes. */
AVX2 static inline __attribute__((always_inline)) __m128i k_six_bits(const char *head, int low, int high, int i,
                                                                      int h)
{
    __m128i nibbles = _mm_loadl_epi64((const __m128i *)(head + low + (i >> 1) * GROUP + 8 * h));
    __m128i tops = _mm_loadl_epi64((const __m128i *)(head + high + (i >> 2) * GROUP + 8 * h));
    return _mm_or_si128(_mm_and_si128(_mm_srli_epi16(nibbles, 4 * (i & 1)), _mm_set1_epi8(15)),
                        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(tops, 2 * (i & 3)), _mm_set1_epi8(3)), 4));
}

/* Bytes a and b of each of 8 columns as the two 16-bit halves of the column's 32-bit lane (signed: int8 scales). */
AVX2 static inline __attribute__((always_inline)) __m256i lane_pairs(__m128i a, __m128i b, int is_signed)
{
    __m128i pairs = _mm_unpacklo_epi8(a, b);
    return is_signed ? _mm256_cvtepi8_epi16(pairs) : _mm256_cvtepu8_epi16(pairs);
}

/* The K-quants: integer sums per super-block, then two float steps (the header comment's order). */
AVX2 static inline __attribute__((always_inline)) void tile_k(const MatmulTask *t, long g, int h, long r0, long s0,
                                                              long s1, float *io, int prefetch, const int R,
                                                              const int BITS, const int FORM)
{
    const long header = FORM == FORM_K ? 256 : 288, block_bytes = BITS == 4 ? 256 : BITS == 5 ? 320 : 384;
    const int pairs_per_super = FORM == FORM_K ? 4 : 8;
    const char *record = t->weights + g * t->record;
    const __m256 negative_zero = _mm256_set1_ps(-0.0f);
    for (long s = s0; s < s1; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            for (long line = 0; line < t->block; line += 64)
                _mm_prefetch(head + t->record + line, _MM_HINT_T0);
        __m256i isum[PACKED_ROWS], msum[PACKED_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) isum[r] = msum[r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            __m256i mult[2];
            if (FORM == FORM_K) {
                __m128i scale = k_six_bits(head, K_SCALE_LOW, K_SCALE_HIGH, i, h);
                mult[0] = lane_pairs(scale, scale, 0);
            } else
                _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) {
                    __m128i scale = _mm_loadl_epi64((const __m128i *)(head + Q6K_SCALES + (2 * i + j) * GROUP + 8 * h));
                    mult[j] = lane_pairs(scale, scale, 1);
                }
            block_dots(head + header + i * block_bytes, t->qx + ((s * 8 + i) * t->rows + r0) * BLOCK, h, R, BITS,
                       mult, isum);
        }
        /* Q4_K/Q5_K: sum of minimum_j x the row's code sum over j; Q6_K: of scale_j x it, the zero point's part */
        _Pragma("GCC unroll 8") for (int p = 0; p < pairs_per_super; p++) {
            __m256i weights;
            if (FORM == FORM_K)
                weights = lane_pairs(k_six_bits(head, K_MIN_LOW, K_MIN_HIGH, 2 * p, h),
                                     k_six_bits(head, K_MIN_LOW, K_MIN_HIGH, 2 * p + 1, h), 0);
            else
                weights = lane_pairs(_mm_loadl_epi64((const __m128i *)(head + Q6K_SCALES + 2 * p * GROUP + 8 * h)),
                                     _mm_loadl_epi64((const __m128i *)(head + Q6K_SCALES + (2 * p + 1) * GROUP + 8 * h)),
                                     1);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) msum[r] = _mm256_add_epi32(
                msum[r],
                _mm256_madd_epi16(weights, _mm256_set1_epi32(t->pairs[(s * pairs_per_super + p) * t->rows + r0 + r])));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * h)));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            __m256 dx = _mm256_set1_ps(t->dx[s * 8 * t->rows + r0 + r]), acc = _mm256_loadu_ps(io + r * GROUP);
            if (FORM == FORM_K) {
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, dx), acc);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[r]), _mm256_xor_ps(_mm256_mul_ps(dmin, dx), negative_zero),
                                      acc);
            } else {
                __m256i total = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(msum[r], 5)); /* codes less 32 */
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, dx), acc);
            }
            _mm256_storeu_ps(io + r * GROUP, acc);
        }
    }
}

/* A tile: (task, group, half, first row, super-blocks s0 .. s1-1, the rows' running sums, prefetch the next
 * group). One function per packed kind and tile size (1, 2, 4 rows), indexed by kind - KIND_PQ4_0. */
typedef void (*packed_tile)(const MatmulTask *, long, int, long, long, long, float *, int);
#define LEGACY_FNS(NAME, BITS, OFF, R)                                                                             \
    AVX2 static void NAME##_##R(const MatmulTask *t, long g, int h, long r0, long s0, long s1, float *io, int p)  \
    {                                                                                                              \
        tile_legacy(t, g, h, r0, s0, s1, io, p, R, BITS, OFF);                                                     \
    }
#define K_FNS(NAME, BITS, FORM, R)                                                                                 \
    AVX2 static void NAME##_##R(const MatmulTask *t, long g, int h, long r0, long s0, long s1, float *io, int p)  \
    {                                                                                                              \
        tile_k(t, g, h, r0, s0, s1, io, p, R, BITS, FORM);                                                         \
    }
#define THREE(FNS, NAME, A, B) FNS(NAME, A, B, 1) FNS(NAME, A, B, 2) FNS(NAME, A, B, 4)
THREE(LEGACY_FNS, pq4_0, 4, 0)
THREE(LEGACY_FNS, pq4_1, 4, 1)
THREE(LEGACY_FNS, pq5_0, 5, 0)
THREE(LEGACY_FNS, pq5_1, 5, 1)
THREE(LEGACY_FNS, pq8_0, 8, 0)
THREE(K_FNS, pq4_k, 4, FORM_K)
THREE(K_FNS, pq5_k, 5, FORM_K)
THREE(K_FNS, pq6_k, 6, FORM_Q6K)
#define PACKED_SET(NAME) {NAME##_1, NAME##_2, NAME##_4}
static const packed_tile packed_tiles[PACKED_COUNT][3] = {PACKED_SET(pq4_0), PACKED_SET(pq4_1), PACKED_SET(pq5_0),
                                                          PACKED_SET(pq5_1), PACKED_SET(pq8_0), PACKED_SET(pq4_k),
                                                          PACKED_SET(pq5_k), PACKED_SET(pq6_k)};

#ifndef PACKED_CHUNK_BYTES
#define PACKED_CHUNK_BYTES 12288 /* of a group's record per pass: both halves' tiles find it in L1 */
#endif

/* A thread's groups on the tiles: each group's record goes in chunks of super-blocks small enough to stay in L1
 * while both halves and every row tile read it (the next group's chunk prefetched meanwhile); each row's running
 * sums wait in `io` between chunks, so a chunk continues the order where the last one stopped. */
void cpu_matmul_packed_tiled(const void *arg, long start, long stop)
{
    const MatmulTask *t = arg;
    const KindInfo *info = &t->info;
    const packed_tile *tiles = packed_tiles[info->form == FORM_LEGACY ? (info->bits == 4   ? info->offsets
                                                                         : info->bits == 5 ? 2 + info->offsets
                                                                                           : 4)
                                            : info->form == FORM_K ? (info->bits == 4 ? 5 : 6)
                                                                   : 7];
    long supers = t->k / info->sb, chunk = PACKED_CHUNK_BYTES / t->block;
    if (chunk < 1)
        chunk = 1;
    float *io = malloc(sizeof(float) * (size_t)(t->rows * GROUP));
    if (io == NULL) {
        cpu_store_nan(t, start, stop);
        return;
    }
    for (long g = start; g < stop; g++) {
        memset(io, 0, sizeof(float) * (size_t)(t->rows * GROUP));
        for (long s0 = 0; s0 < supers; s0 += chunk) {
            long s1 = s0 + chunk < supers ? s0 + chunk : supers;
            int prefetch = g + 1 < stop;
            for (int h = 0; h < 2 && h * 8 < t->n - g * GROUP; h++) {
                long r0 = 0;
                for (int size = 2; size >= 0; size--)
                    while (t->rows - r0 >= (1L << size)) {
                        tiles[size](t, g, h, r0, s0, s1, io + r0 * GROUP + 8 * h, prefetch);
                        prefetch = 0;
                        r0 += 1L << size;
                    }
            }
        }
        for (long r = 0; r < t->rows; r++)
            cpu_store_values(t, r, g * GROUP, io + r * GROUP);
    }
    free(io);
}
#endif
