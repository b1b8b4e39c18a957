/*
 * matmul_packed.c: the packed kinds (KIND_PQ*, KIND_PIQ4_*), which multiply a GGUF type's own fields at the file's
 * size: f16 scales, 6-bit sub-scales and minimums, int8 sub-scales, nibbles with a fifth-bit or 2-bit plane, IQ4's
 * nibbles indexing its table of int8 values (IQ4_NL: Q4_0's bytes; IQ4_XS: 6-bit scales less 32 per 32 weights;
 * the tiles look the values up with a byte shuffle and multiply them as Q8_0's int8 codes). Their 256-bit tiles (8
 * columns x 1 to 8 rows; for one row of the 4- and 5-bit kinds and the K-quants, a whole group's 16 columns in one
 * pass over the record) for the avx2 path (maddubs; most kinds with the row loop inside the block's, see its
 * section) and the avxvnni path (vpdpbusd; avx512vnni has its own: matmul_packed_512.c). A group's record
 * (GROUP = 16 columns) is its super-blocks along k in order (sb = 32 weights for the legacy types and IQ4_NL, 256
 * for the K-quants, Q6_K and IQ4_XS), each a header then the codes of its blocks of 32:
 *   header   FORM_LEGACY  d f16 [16]; Q4_1/Q5_1: m f16 [16]
 *            FORM_K       d f16 [16], dmin f16 [16], scale nibbles [4][16], minimum nibbles [4][16] (byte (p, c):
 *                         sub-block 2p's low 4 bits, 2p+1's in the high nibble), scale top bits [2][16], minimum
 *                         top bits [2][16] (byte (p, c), bits 2t..2t+1: the top 2 bits of sub-block 4p+t)
 *            FORM_Q6K     d f16 [16], int8 scales [16 sub-blocks of 16][16]
 *            FORM_IQ4XS   d f16 [16], scale nibbles [4][16], scale top bits [2][16] (as FORM_K's scales)
 *   codes    4 consecutive weights (a "chunk") of each of the 16 columns side by side, 64 bytes a vector:
 *            nibbles      4 vectors: per sub-block of `sub` weights sub/8 vectors, vector q holding chunk q in its
 *                         low nibbles and chunk q + sub/8 in its high ones (the record kinds' layout)
 *            bits 5       then a fifth-bit plane, 1 vector: byte (c, e), bit i: chunk i's fifth bit
 *            bits 6       then a 2-bit plane, 2 vectors: vector j (sub-block j of 16), byte (c, e), bits 2t..2t+1:
 *                         chunk 4j+t's top two bits
 *            bits 8       8 vectors, the int8 codes of chunk i in vector i
 * So each column holds exactly its row's bytes in the file. The arithmetic of the legacy types and IQ4: scale_j =
 * float(d) (IQ4_XS: float(d) * (6-bit scale - 32), exact in float32) and offset_j = float(m), then the record kinds'
 * order (../_cpu.c): acc = fma(float(dot_j), scale_j * dx_b, acc) and with offsets acc = fma(offset_j, sx_j, acc);
 * such a packed kind gives the same bits as the float32-scale kind the same weights would repack into. Q6_K's
 * activations share one scale dx_s per super-block of 256 (as the K-quants' below): scale_j = float(d) * int8
 * sub-scale (exact in float32), part = fma(float(dot_j), scale_j, part) over its 16 sub-blocks, then
 * acc = fma(part, dx_s, acc): one float operation a sub-block instead of two, which on a Zen 4 share the ports of
 * the integer dot products (8 rows 0.89-0.93x the time). The K-quants (FORM_K: Q4_K,
 * Q5_K) multiply as llama.cpp's q4_K x q8_K does, in integers over a whole super-block: the activations share one
 * scale dx_s per super-block of 256 (blocks.c), each sub-block's dot product is multiplied by its 6-bit sub-scale
 * and summed in 32 bits (isum), the minimums' term likewise against the sub-blocks' sums of codes (imin), then per
 * super-block acc = fma(float(imin), -(float(dmin) * dx_s), acc) and acc = fma(float(isum), float(d) * dx_s, acc):
 * two float operations a super-block instead of two a sub-block.
 * Not here: the reference loop every path is tested against (matmul_packed_portable.c), packing
 * (kernels/records.py), the driver (matmul.c), the record kinds' tiles (matmul_avx2.c, matmul_avx512.c).
 */
#include "kernels.h"

#if HAVE_X86
/* ---- 256-bit: 8 columns (half h of a group) x R rows a tile, compiled three times (VNNI: kernels.h's vnni_dot).
 * The codes are widened to bytes (a fifth or sixth bit OR-ed in from its plane). The avx2 path (VNNI_NONE)
 * multiplies them by the row's signed codes with maddubs and sums to 32 bits with madd, in 16 bits no further than
 * they cannot overflow (4-bit codes: a whole block; 5-bit: two vectors; 6-bit: one); int8 codes as the record
 * kinds' bytes are (magnitude times the row's codes carrying the weight's sign). The avxvnni path (VNNI_VEX,
 * VNNI_EVEX) takes vpdpbusd of the unsigned codes straight to 32 bits, int8 codes and IQ4's values + 128 (zero
 * point 128, as on avx512vnni), and the K-quants' sub-scales by vpmulld. Integers either way, so the same bits. */

#define PACKED_ROWS 8 /* the most rows a 256-bit tile takes */

/* Chunk q's and chunk q + 4's codes of half h of a 4- or 5-bit block as bytes: nibbles, with the fifth bit moved to
 * bit 4 from `plane` (a 16-bit shift by at most 4 carries only bits 0-3 or 5-7 across a byte). */
AVX2 static inline __attribute__((always_inline)) void codes_45(const char *codes, __m256i plane, int q, int h,
                                                                const int BITS, __m256i *lo, __m256i *hi)
{
    const __m256i low = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(16);
    __m256i v = _mm256_loadu_si256((const __m256i *)(codes + q * 64 + 32 * h));
    *lo = _mm256_and_si256(v, low);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if (BITS == 5) {
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(plane, 4 - q), fifth));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_srli_epi16(plane, q), fifth));
    }
}

/* Q6_K: chunk 4j + q's and chunk 4j + q + 2's codes of half h of sub-block j (of 16) as bytes: nibbles, with the
 * top two bits moved to bits 4-5 from the sub-block's 2-bit plane. */
AVX2 static inline __attribute__((always_inline)) void codes_6(const char *codes, int j, int q, int h, __m256i *lo,
                                                               __m256i *hi)
{
    const __m256i low = _mm256_set1_epi8(0x0F), top_two = _mm256_set1_epi8(0x30);
    __m256i plane = _mm256_loadu_si256((const __m256i *)(codes + 256 + j * 64 + 32 * h));
    __m256i v = _mm256_loadu_si256((const __m256i *)(codes + (j * 2 + q) * 64 + 32 * h));
    *lo = _mm256_or_si256(_mm256_and_si256(v, low), _mm256_and_si256(_mm256_slli_epi16(plane, 4 - 2 * q), top_two));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                          _mm256_and_si256(_mm256_srli_epi16(plane, 2 * q), top_two));
}

/* A tile's R rows of 8 columns into out (or added to it), the columns past n left alone. */
AVX2 static inline __attribute__((always_inline)) void store_tile(const MatmulTask *t, long g, int h, long r0,
                                                                  const int R, const __m256 *acc)
{
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        float *at = t->out + (r0 + r) * t->out_stride + g * GROUP + 8 * h;
        long count = t->n - (g * GROUP + 8 * h);
        if (count >= 8)
            _mm256_storeu_ps(at, t->accumulate ? _mm256_add_ps(_mm256_loadu_ps(at), acc[r]) : acc[r]);
        else if (count > 0) {
            float values[8];
            _mm256_storeu_ps(values, acc[r]);
            for (long c = 0; c < count; c++)
                at[c] = t->accumulate ? at[c] + values[c] : values[c];
        }
    }
}

/* FORM_K's 6-bit values of sub-blocks 2p and 2p + 1 for the 8 columns of half h, as 16-bit lanes 2c (2p's) and
 * 2c + 1 (2p + 1's): madd's pairs of columns (`low`, `high`: the scales' or the minimums' bytes). */
AVX2 static inline __attribute__((always_inline)) __m256i k_pair16(const char *head, int low, int high, int p, int h)
{
    __m128i nibbles = _mm_loadl_epi64((const __m128i *)(head + low + p * GROUP + 8 * h));
    __m128i tops = _mm_srli_epi16(_mm_loadl_epi64((const __m128i *)(head + high + (p >> 1) * GROUP + 8 * h)),
                                  4 * (p & 1));
    const __m128i four = _mm_set1_epi8(15), two = _mm_set1_epi8(3);
    __m128i even = _mm_or_si128(_mm_and_si128(nibbles, four), _mm_slli_epi16(_mm_and_si128(tops, two), 4));
    __m128i odd = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(nibbles, 4), four),
                               _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(tops, 2), two), 4));
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(even, odd));
}

/* The 6-bit value of sub-block i for the 8 columns of half h, one byte each (the low 8 bytes), from a header's
 * nibble rows at `low` and top-bit rows at `high` (FORM_K's scales, FORM_IQ4XS's). */
AVX2 static inline __attribute__((always_inline)) __m128i six8(const char *head, int low, int high, int i, int h)
{
    __m128i nibbles = _mm_loadl_epi64((const __m128i *)(head + low + (i >> 1) * GROUP + 8 * h));
    __m128i tops = _mm_loadl_epi64((const __m128i *)(head + high + (i >> 2) * GROUP + 8 * h));
    return _mm_or_si128(_mm_and_si128(_mm_srli_epi16(nibbles, 4 * (i & 1)), _mm_set1_epi8(15)),
                        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(tops, 2 * (i & 3)), _mm_set1_epi8(3)), 4));
}

/* FORM_K's sub-scale of sub-block i for the 8 columns of half h, in both 16-bit lanes of each column (2c, 2c + 1):
 * madd's multiplier of a column's two partial sums. */
AVX2 static inline __attribute__((always_inline)) __m256i k_scale16(const char *head, int i, int h)
{
    __m128i value = six8(head, K_SCALE_LOW, K_SCALE_HIGH, i, h);
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(value, value));
}

/* Sub-block i's sub-scale for the 8 columns of half h in the form the path multiplies by: 32-bit lanes for vpmulld
 * (VNNI), or both 16-bit lanes of each column for madd (k_scale16). */
AVX2 static inline __attribute__((always_inline)) __m256i k_sub_scale(const char *head, int i, int h, const int VNNI)
{
    return VNNI ? _mm256_cvtepu8_epi32(six8(head, K_SCALE_LOW, K_SCALE_HIGH, i, h)) : k_scale16(head, i, h);
}

/* isum + sub-scale x a sub-block's sums: its 32-bit dot product (VNNI, vpmulld) or its 16-bit pair sums (madd). */
AVX2 static inline __attribute__((always_inline)) __m256i k_add_scaled(__m256i isum, __m256i sums, __m256i scale,
                                                                        const int VNNI)
{
    return _mm256_add_epi32(isum, VNNI ? _mm256_mullo_epi32(sums, scale) : _mm256_madd_epi16(sums, scale));
}

/* ia[r] += two chunks of unsigned codes (`lo`, `hi`: 8 columns x 4 weights) times row r's 4 codes at xa + r * BLOCK
 * and at xb + r * BLOCK: vpdpbusd (the avxvnni path). */
AVX2 static inline __attribute__((always_inline)) void vnni_chunks(__m256i *ia, __m256i lo, __m256i hi,
                                                                   const int8_t *xa, const int8_t *xb, const int R,
                                                                   const int VNNI)
{
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) ia[r] =
        vnni_dot(vnni_dot(ia[r], lo, _mm256_set1_epi32(load_i32(xa + r * BLOCK)), VNNI), hi,
                 _mm256_set1_epi32(load_i32(xb + r * BLOCK)), VNNI);
}

/* acc + a row's minimums term of a FORM_K super-block, in tile_k's order: the minimums (k_pair16's, pairs p = 0..3)
 * against the row's pairs of sub-block sums (t->pairs[pair + p * rows]), times -(dmin * dx). */
AVX2 static inline __attribute__((always_inline)) __m256 k_minimums_term(const MatmulTask *t, const __m256i *minimums,
                                                                         __m256 dmin, long pair, float dx, __m256 acc)
{
    __m256i imin = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) imin = _mm256_add_epi32(
        imin, _mm256_madd_epi16(minimums[p], _mm256_set1_epi32(t->pairs[pair + p * t->rows])));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin),
                           _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(dx)), _mm256_set1_ps(-0.0f)), acc);
}

/* FORM_K (Q4_K, Q5_K), 8 columns x R rows, or (W = 2, one row) both halves of the group at once, in the integer
 * order at the top: per sub-block the codes' 16-bit partial sums times the sub-scale (madd), or their 32-bit dot
 * product times it (vpmulld), into isum, per super-block the minimums against the pairs of sub-block sums, then two
 * float operations. Accumulators are indexed r * W + w, half h + w; a row's activation codes are broadcast once for
 * the W halves. */
AVX2 static inline __attribute__((always_inline)) void tile_k(const MatmulTask *t, long g, int h, long r0, const int R,
                                                              const int W, const int BITS, const int VNNI,
                                                              int prefetch)
{
    const long supers = t->k / 256, block_bytes = PACKED_BLOCK_BYTES(BITS);
    const char *record = t->weights + g * t->record;
    const __m256 negative_zero = _mm256_set1_ps(-0.0f);
    __m256 acc[PACKED_ROWS];
    _Pragma("GCC unroll 4") for (int a = 0; a < R * W; a++) acc[a] = _mm256_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM_K, R);
        const long pair0 = s * 4 * t->rows + r0; /* this super-block's pairs of sub-block sums, row r0 */
        _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) {
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * (h + w))));
            __m256i imin[PACKED_ROWS];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) imin[r] = _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
                __m256i minimums = k_pair16(head, K_MIN_LOW, K_MIN_HIGH, p, h + w);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) imin[r] = _mm256_add_epi32(
                    imin[r], _mm256_madd_epi16(minimums, _mm256_set1_epi32(t->pairs[pair0 + p * t->rows + r])));
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r * W + w] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(imin[r]),
                _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(t->dx[s * 8 * t->rows + r0 + r])), negative_zero),
                acc[r * W + w]);
        }
        __m256i isum[PACKED_ROWS];
        _Pragma("GCC unroll 4") for (int a = 0; a < R * W; a++) isum[a] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            const char *codes = head + PACKED_HEADER_BYTES(FORM_K, 1) + i * block_bytes;
            const int8_t *xs = t->qx + ((s * 8 + i) * t->rows + r0) * BLOCK;
            if (prefetch)
                prefetch_slice(head, t->block, FORM_K, R, i);
            __m256i scale[2], plane[2], m16[PACKED_ROWS]; /* m16: 16-bit pair sums, or (VNNI) 32-bit dots */
            _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) {
                scale[w] = k_sub_scale(head, i, h + w, VNNI);
                plane[w] = BITS == 5 ? _mm256_loadu_si256((const __m256i *)(codes + 256 + 32 * (h + w)))
                                     : _mm256_setzero_si256();
            }
            _Pragma("GCC unroll 4") for (int a = 0; a < R * W; a++) m16[a] = _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                __m256i lo[2], hi[2];
                _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) codes_45(codes, plane[w], q, h + w, BITS, &lo[w],
                                                                             &hi[w]);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    __m256i xa = _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * q));
                    __m256i xb = _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * (q + 4)));
                    _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) m16[r * W + w] =
                        VNNI ? vnni_dot(vnni_dot(m16[r * W + w], lo[w], xa, VNNI), hi[w], xb, VNNI)
                             : _mm256_add_epi16(m16[r * W + w], _mm256_add_epi16(_mm256_maddubs_epi16(lo[w], xa),
                                                                                 _mm256_maddubs_epi16(hi[w], xb)));
                }
                if (!VNNI && BITS == 5 && (q & 1)) { /* 4 products of 5-bit codes: at most 31,496 in 16 bits */
                    _Pragma("GCC unroll 4") for (int a = 0; a < R * W; a++) {
                        isum[a] = k_add_scaled(isum[a], m16[a], scale[a % W], VNNI);
                        m16[a] = _mm256_setzero_si256();
                    }
                }
            }
            if (VNNI || BITS == 4) { /* (5-bit pair sums were added every two vectors) */
                _Pragma("GCC unroll 4") for (int a = 0; a < R * W; a++)
                    isum[a] = k_add_scaled(isum[a], m16[a], scale[a % W], VNNI);
            }
        }
        _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * (h + w))));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r * W + w] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(isum[r * W + w]),
                _mm256_mul_ps(d, _mm256_set1_ps(t->dx[s * 8 * t->rows + r0 + r])), acc[r * W + w]);
        }
    }
    _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) {
        __m256 rows[PACKED_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) rows[r] = acc[r * W + w];
        store_tile(t, g, h + w, r0, R, rows);
    }
}

/* FORM_K on the avxvnni path, 8 columns x 8 rows: tile_k's integers and float operations in its order, each row's
 * integer sum and float accumulator kept in memory (volatile: the compiler would otherwise hold them in registers and
 * spill the rows' dot products instead, 0.87x the rate of two tiles of 4), so that the eight rows' dot products, the
 * codes and a row's activations fit in the 16 registers; the codes are unpacked and the sub-scales read once for
 * eight rows. On a Zen 4, 1.09-1.25x the rate of two tiles of 4. (avx2's: tile_k_rows.) */
AVX2 static inline __attribute__((always_inline)) void tile_k8(const MatmulTask *t, long g, int h, long r0,
                                                               const int BITS, const int VNNI, int prefetch)
{
    const long supers = t->k / 256, block_bytes = PACKED_BLOCK_BYTES(BITS);
    const char *record = t->weights + g * t->record;
    volatile __m256 acc[8];
    volatile __m256i isum[8];
    for (int r = 0; r < 8; r++)
        acc[r] = _mm256_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM_K, 8);
        const long pair0 = s * 4 * t->rows + r0; /* this super-block's pairs of sub-block sums, row r0 */
        const float *dx = t->dx + s * 8 * t->rows + r0;
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * h)));
        __m256i minimums[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) minimums[p] = k_pair16(head, K_MIN_LOW, K_MIN_HIGH, p, h);
        _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
            acc[r] = k_minimums_term(t, minimums, dmin, pair0 + r, dx[r], acc[r]);
            isum[r] = _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 1") for (int i = 0; i < 8; i++) {
            const char *codes = head + PACKED_HEADER_BYTES(FORM_K, 1) + i * block_bytes;
            const int8_t *xs = t->qx + ((s * 8 + i) * t->rows + r0) * BLOCK;
            if (prefetch)
                prefetch_slice(head, t->block, FORM_K, 8, i);
            const __m256i plane = BITS == 5 ? _mm256_loadu_si256((const __m256i *)(codes + 256 + 32 * h))
                                            : _mm256_setzero_si256();
            __m256i dot[8]; /* 32-bit dot products */
            _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) dot[r] = _mm256_setzero_si256();
            const __m256i scale = k_sub_scale(head, i, h, VNNI);
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                __m256i lo, hi;
                codes_45(codes, plane, q, h, BITS, &lo, &hi);
                vnni_chunks(dot, lo, hi, xs + 4 * q, xs + 4 * (q + 4), 8, VNNI);
            }
            _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) isum[r] = k_add_scaled(isum[r], dot[r], scale, VNNI);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
        _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) acc[r] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, _mm256_set1_ps(dx[r])), acc[r]);
    }
    __m256 rows[8];
    for (int r = 0; r < 8; r++)
        rows[r] = acc[r];
    store_tile(t, g, h, r0, 8, rows);
}

/* ia[r] += the chunk of int8 codes `w` (8 columns x 4 weights) times row r's 4 codes at x + r * BLOCK: maddubs of
 * the magnitudes with the row's codes carrying the weights' signs, widened at once (two products of int8 values
 * can reach 32,258; two pairs of them could not add in 16 bits). */
AVX2 static inline __attribute__((always_inline)) void int8_chunk(__m256i *ia, __m256i w, const int8_t *x, const int R)
{
    const __m256i magnitude = _mm256_sign_epi8(w, w), ones = _mm256_set1_epi16(1);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        __m256i xa = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(x + r * BLOCK)), w);
        ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xa), ones));
    }
}

/* The legacy types, IQ4 and Q6_K on the avxvnni path, 8 columns x R rows (up to 8: with no 16-bit partial sums their
 * accumulators fit, and 8 rows ran 1.10-1.22x the rate of two tiles of 4 on a Zen 4), and on the avx2 path IQ4 and
 * 1 to 4 rows of Q8_0 (the other kinds and sizes take the tiles with the rows inside, below), in their float orders
 * at the top. */
AVX2 static inline __attribute__((always_inline)) void tile_packed(const MatmulTask *t, long g, int h, long r0,
                                                                   const int R, const int BITS, const int FORM,
                                                                   const int OFF, const int TABLE, const int VNNI,
                                                                   int prefetch)
{
    /* IQ4's values: signed (maddubs), or + 128 as unsigned bytes (vpdpbusd, zero point 128) */
    const __m256i values = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_setr_epi8(IQ4_TABLE)),
                                            _mm256_set1_epi8(VNNI ? -128 : 0));
    const int NB = FORM == FORM_LEGACY ? 1 : 8, SUB = BITS == 6 ? 16 : 32;
    const long supers = t->k / (NB * BLOCK);
    const long header = PACKED_HEADER_BYTES(FORM, OFF), block_bytes = PACKED_BLOCK_BYTES(BITS);
    const char *record = t->weights + g * t->record;
    const __m256i low = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8(-128);
    __m256 acc[PACKED_ROWS], part[PACKED_ROWS]; /* part: Q6_K's products over the super-block */
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = part[r] = _mm256_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM, R);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
        const __m256 m = OFF ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * h)))
                             : _mm256_setzero_ps();
        _Pragma("GCC unroll 8") for (int i = 0; i < NB; i++) {
            const long b = s * NB + i;
            const char *codes = head + header + i * block_bytes;
            const int8_t *xs = t->qx + (b * t->rows + r0) * BLOCK;
            if (prefetch)
                prefetch_slice(head, t->block, FORM, R, i);
            _Pragma("GCC unroll 2") for (int j = 0; j < BLOCK / SUB; j++) {
                const long sj = b * (BLOCK / SUB) + j; /* the sub-block's index along k */
                __m256 scale = d, offset = m;
                if (FORM == FORM_Q6K) {
                    __m128i sc = _mm_loadl_epi64((const __m128i *)(head + Q6K_SCALES + (i * 2 + j) * GROUP + 8 * h));
                    scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
                }
                if (FORM == FORM_IQ4XS) {
                    __m256i six = _mm256_cvtepu8_epi32(six8(head, IQ4XS_SCALE_LOW, IQ4XS_SCALE_HIGH, i, h));
                    scale = _mm256_mul_ps(
                        d, _mm256_cvtepi32_ps(_mm256_sub_epi32(six, _mm256_set1_epi32(IQ4XS_SCALE_ZERO))));
                }
                __m256i ia[PACKED_ROWS];
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
                    ia[r] = _mm256_set1_epi32(t->init[sj * t->rows + r0 + r]);
                if (TABLE) { /* IQ4: each nibble's value from the table, then as int8 codes (BITS 8) */
                    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(codes + q * 64 + 32 * h));
                        __m256i lo = _mm256_shuffle_epi8(values, _mm256_and_si256(v, low));
                        __m256i hi = _mm256_shuffle_epi8(values, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
                        if (VNNI)
                            vnni_chunks(ia, lo, hi, xs + 4 * q, xs + 4 * (q + 4), R, VNNI);
                        else {
                            int8_chunk(ia, lo, xs + 4 * q, R);
                            int8_chunk(ia, hi, xs + 4 * (q + 4), R);
                        }
                    }
                } else if (BITS == 8) {
                    _Pragma("GCC unroll 4") for (int c = 0; c < 8; c += 2) {
                        __m256i lo = _mm256_loadu_si256((const __m256i *)(codes + c * 64 + 32 * h));
                        __m256i hi = _mm256_loadu_si256((const __m256i *)(codes + (c + 1) * 64 + 32 * h));
                        if (VNNI)
                            vnni_chunks(ia, _mm256_xor_si256(lo, flip), _mm256_xor_si256(hi, flip), xs + 4 * c,
                                        xs + 4 * (c + 1), R, VNNI);
                        else {
                            int8_chunk(ia, lo, xs + 4 * c, R);
                            int8_chunk(ia, hi, xs + 4 * (c + 1), R);
                        }
                    }
                } else if (BITS == 6) {
                    _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) {
                        __m256i lo, hi;
                        codes_6(codes, j, q, h, &lo, &hi);
                        vnni_chunks(ia, lo, hi, xs + j * SUB + 4 * q, xs + j * SUB + 4 * (q + 2), R, VNNI);
                    }
                } else {
                    __m256i plane = BITS == 5 ? _mm256_loadu_si256((const __m256i *)(codes + 256 + 32 * h))
                                              : _mm256_setzero_si256();
                    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                        __m256i lo, hi;
                        codes_45(codes, plane, q, h, BITS, &lo, &hi);
                        vnni_chunks(ia, lo, hi, xs + 4 * q, xs + 4 * (q + 4), R, VNNI);
                    }
                }
                if (FORM == FORM_Q6K) {
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) part[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), scale, part[r]);
                    continue;
                }
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                    __m256 sd = _mm256_mul_ps(scale, _mm256_set1_ps(t->dx[b * t->rows + r0 + r]));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), sd, acc[r]);
                }
                if (OFF) {
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] =
                        _mm256_fmadd_ps(offset, _mm256_set1_ps(t->sx[sj * t->rows + r0 + r]), acc[r]);
                }
            }
        }
        if (FORM == FORM_Q6K) {
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                acc[r] = _mm256_fmadd_ps(part[r], _mm256_set1_ps(t->dx[s * NB * t->rows + r0 + r]), acc[r]);
                part[r] = _mm256_setzero_ps();
            }
        }
    }
    store_tile(t, g, h, r0, R, acc);
}

/* ---- avx2: the rows inside. tile_packed and tile_k hold every row's sums at once and share each chunk's unpacking
 * among them; on avx2, whose 16-bit pair sums take a register a row beside its 32-bit sum, that spills past 4 rows
 * and caps a tile there. The tiles below turn the loops around: a block's codes are unpacked once into eight
 * registers, then each row in turn takes its dot products, its pair sums and its float operations against them, so a
 * tile needs the same few registers for any R and reads and unpacks a record once for up to 8 rows. Per column and
 * row the same integers and float operations in the same order as the other paths' tiles, so the same bits. On a
 * Zen 3 (the real 0.5B's block matmuls, 2 threads) 8 rows cost 0.67-0.87x two tiles of 4 (docs/kernels.md). */

/* sum + a row's products with a 4- or 5-bit block's codes (lo, hi: codes_45's for chunks 0-3) in 16-bit pair sums,
 * widened by madd with `weight` (ones; the K-quants: the sub-scale, k_scale16) as often as 16 bits need: once a
 * block for 4-bit codes, every two vectors for 5-bit ones. */
AVX2 static inline __attribute__((always_inline)) __m256i row_nibbles(__m256i sum, const __m256i *lo, const __m256i *hi,
                                                                      const int8_t *x, __m256i weight, const int BITS)
{
    __m256i m16 = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
        m16 = _mm256_add_epi16(m16, _mm256_add_epi16(_mm256_maddubs_epi16(lo[q], _mm256_set1_epi32(load_i32(x + 4 * q))),
                                                     _mm256_maddubs_epi16(hi[q], _mm256_set1_epi32(load_i32(x + 4 * q + 16)))));
        if (BITS == 5 && (q & 1)) { /* 4 products of 5-bit codes: at most 31,496 in 16 bits */
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(m16, weight));
            m16 = _mm256_setzero_si256();
        }
    }
    return BITS == 4 ? _mm256_add_epi32(sum, _mm256_madd_epi16(m16, weight)) : sum;
}

/* The legacy types (Q4_0, Q4_1, Q5_0, Q5_1: nibbles; Q8_0: int8 codes as int8_chunk multiplies them), 8 columns x R
 * rows. (Q8_0's 1 to 4 rows take tile_packed, which shares each chunk's codes among the rows: 5-10% cheaper there.) */
AVX2 static inline __attribute__((always_inline)) void tile_legacy_rows(const MatmulTask *t, long g, int h, long r0,
                                                                        const int R, const int BITS, const int OFF,
                                                                        int prefetch)
{
    const long supers = t->k / BLOCK, header = PACKED_HEADER_BYTES(FORM_LEGACY, OFF);
    const char *record = t->weights + g * t->record;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[PACKED_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block, *codes = head + header;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM_LEGACY, R);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
        const __m256 m = OFF ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * h)))
                             : _mm256_setzero_ps();
        __m256i lo[4], hi[4]; /* nibbles: chunks q and q + 4 as bytes; int8: chunks 2q and 2q + 1's magnitudes */
        if (BITS == 8) {
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                lo[q] = _mm256_loadu_si256((const __m256i *)(codes + 2 * q * 64 + 32 * h));
                hi[q] = _mm256_loadu_si256((const __m256i *)(codes + (2 * q + 1) * 64 + 32 * h));
                lo[q] = _mm256_sign_epi8(lo[q], lo[q]);
                hi[q] = _mm256_sign_epi8(hi[q], hi[q]);
            }
        } else {
            const __m256i plane = BITS == 5 ? _mm256_loadu_si256((const __m256i *)(codes + 256 + 32 * h))
                                            : _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) codes_45(codes, plane, q, h, BITS, &lo[q], &hi[q]);
        }
        const int8_t *xs = t->qx + (s * t->rows + r0) * BLOCK;
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const int8_t *x = xs + r * BLOCK;
            __m256i ia = _mm256_set1_epi32(t->init[s * t->rows + r0 + r]);
            if (BITS == 8) { /* the row's codes carrying the weights' signs (read again: no register to spare) */
                _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                    const char *signs = codes + 2 * q * 64 + 32 * h;
                    __m256i xa = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(x + 8 * q)),
                                                  _mm256_loadu_si256((const __m256i *)signs));
                    __m256i xb = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(x + 8 * q + 4)),
                                                  _mm256_loadu_si256((const __m256i *)(signs + 64)));
                    ia = _mm256_add_epi32(ia, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[q], xa), ones));
                    ia = _mm256_add_epi32(ia, _mm256_madd_epi16(_mm256_maddubs_epi16(hi[q], xb), ones));
                }
            } else
                ia = row_nibbles(ia, lo, hi, x, ones, BITS);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(d, _mm256_set1_ps(t->dx[s * t->rows + r0 + r])),
                                     acc[r]);
            if (OFF)
                acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(t->sx[s * t->rows + r0 + r]), acc[r]);
        }
    }
    store_tile(t, g, h, r0, R, acc);
}

/* Q6_K, 8 columns x R rows: a block's two sub-blocks of 16 (four vectors of codes each, with their top two bits),
 * then per row each sub-block's integer dot product, its product by the sub-scale into the super-block's part, and
 * per super-block the part times the row's scale. */
AVX2 static inline __attribute__((always_inline)) void tile_q6k_rows(const MatmulTask *t, long g, int h, long r0,
                                                                     const int R, int prefetch)
{
    const long supers = t->k / (8 * BLOCK), header = PACKED_HEADER_BYTES(FORM_Q6K, 0);
    const char *record = t->weights + g * t->record;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[PACKED_ROWS], part[PACKED_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = part[r] = _mm256_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM_Q6K, R);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
        _Pragma("GCC unroll 1") for (int i = 0; i < 8; i++) {
            const long b = s * 8 + i;
            const char *codes = head + header + i * PACKED_BLOCK_BYTES(6);
            if (prefetch)
                prefetch_slice(head, t->block, FORM_Q6K, R, i);
            __m256i lo[2][2], hi[2][2]; /* [sub-block j][q]: chunks 4j + q and 4j + q + 2 as bytes */
            __m256 scale[2];
            _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) {
                __m128i sc = _mm_loadl_epi64((const __m128i *)(head + Q6K_SCALES + (i * 2 + j) * GROUP + 8 * h));
                scale[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
                _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) codes_6(codes, j, q, h, &lo[j][q], &hi[j][q]);
            }
            const int8_t *xs = t->qx + (b * t->rows + r0) * BLOCK;
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                const int8_t *x = xs + r * BLOCK;
                _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) {
                    __m256i ia = _mm256_set1_epi32(t->init[(b * 2 + j) * t->rows + r0 + r]);
                    _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) { /* 6-bit codes: one vector's pairs */
                        __m256i pairs =
                            _mm256_add_epi16(_mm256_maddubs_epi16(lo[j][q], _mm256_set1_epi32(load_i32(x + j * 16 + 4 * q))),
                                             _mm256_maddubs_epi16(hi[j][q], _mm256_set1_epi32(load_i32(x + j * 16 + 4 * q + 8))));
                        ia = _mm256_add_epi32(ia, _mm256_madd_epi16(pairs, ones));
                    }
                    part[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), scale[j], part[r]);
                }
            }
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            acc[r] = _mm256_fmadd_ps(part[r], _mm256_set1_ps(t->dx[s * 8 * t->rows + r0 + r]), acc[r]);
            part[r] = _mm256_setzero_ps();
        }
    }
    store_tile(t, g, h, r0, R, acc);
}

/* FORM_K (Q4_K, Q5_K), 8 columns x R rows: per super-block each row's minimums term, then per sub-block the codes
 * once and each row's 16-bit pair sums times the sub-scale into its isum, then per row two float operations. */
AVX2 static inline __attribute__((always_inline)) void tile_k_rows(const MatmulTask *t, long g, int h, long r0,
                                                                   const int R, const int BITS, int prefetch)
{
    const long supers = t->k / 256;
    const char *record = t->weights + g * t->record;
    __m256 acc[PACKED_ROWS];
    __m256i isum[PACKED_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM_K, R);
        const long pair0 = s * 4 * t->rows + r0; /* this super-block's pairs of sub-block sums, row r0 */
        const float *dx = t->dx + s * 8 * t->rows + r0;
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * h)));
        __m256i minimums[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) minimums[p] = k_pair16(head, K_MIN_LOW, K_MIN_HIGH, p, h);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            acc[r] = k_minimums_term(t, minimums, dmin, pair0 + r, dx[r], acc[r]);
            isum[r] = _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 1") for (int i = 0; i < 8; i++) {
            const char *codes = head + PACKED_HEADER_BYTES(FORM_K, 1) + i * PACKED_BLOCK_BYTES(BITS);
            const int8_t *xs = t->qx + ((s * 8 + i) * t->rows + r0) * BLOCK;
            if (prefetch)
                prefetch_slice(head, t->block, FORM_K, R, i);
            const __m256i plane = BITS == 5 ? _mm256_loadu_si256((const __m256i *)(codes + 256 + 32 * h))
                                            : _mm256_setzero_si256();
            const __m256i scale = k_sub_scale(head, i, h, VNNI_NONE);
            __m256i lo[4], hi[4];
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) codes_45(codes, plane, q, h, BITS, &lo[q], &hi[q]);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) isum[r] =
                row_nibbles(isum[r], lo, hi, xs + r * BLOCK, scale, BITS);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, _mm256_set1_ps(dx[r])), acc[r]);
    }
    store_tile(t, g, h, r0, R, acc);
}

/* The 4- and 5-bit legacy types (Q4_0, Q4_1, Q5_0, Q5_1), one row over a whole group: both halves of 8 columns in
 * one pass over the record, the row's codes broadcast once for both; per column the operations of tile_packed in
 * its order, so the same bits. */
AVX2 static inline __attribute__((always_inline)) void tile_legacy_whole(const MatmulTask *t, long g, const int BITS,
                                                                         const int OFF, const int VNNI, int prefetch)
{
    const long supers = t->k / BLOCK, header = PACKED_HEADER_BYTES(FORM_LEGACY, OFF);
    const char *record = t->weights + g * t->record;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (long s = 0; s < supers; s++) {
        const char *head = record + s * t->block, *codes = head + header;
        if (prefetch)
            prefetch_ahead(head, t->block, FORM_LEGACY, 1);
        const int8_t *xs = t->qx + s * t->rows * BLOCK; /* the one row (rows is 1) */
        __m256i ia[2], m16[2], plane[2];
        _Pragma("GCC unroll 2") for (int w = 0; w < 2; w++) {
            ia[w] = _mm256_set1_epi32(t->init[s * t->rows]);
            m16[w] = _mm256_setzero_si256();
            plane[w] = BITS == 5 ? _mm256_loadu_si256((const __m256i *)(codes + 256 + 32 * w)) : _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            __m256i xa = _mm256_set1_epi32(load_i32(xs + 4 * q)), xb = _mm256_set1_epi32(load_i32(xs + 4 * (q + 4)));
            _Pragma("GCC unroll 2") for (int w = 0; w < 2; w++) {
                __m256i lo, hi;
                codes_45(codes, plane[w], q, w, BITS, &lo, &hi);
                if (VNNI) {
                    ia[w] = vnni_dot(vnni_dot(ia[w], lo, xa, VNNI), hi, xb, VNNI);
                    continue;
                }
                m16[w] = _mm256_add_epi16(m16[w], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa),
                                                                   _mm256_maddubs_epi16(hi, xb)));
                if (BITS == 5 && (q & 1)) {
                    ia[w] = _mm256_add_epi32(ia[w], _mm256_madd_epi16(m16[w], ones));
                    m16[w] = _mm256_setzero_si256();
                }
            }
        }
        _Pragma("GCC unroll 2") for (int w = 0; w < 2; w++) {
            if (BITS == 4 && !VNNI)
                ia[w] = _mm256_add_epi32(ia[w], _mm256_madd_epi16(m16[w], ones));
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * w)));
            acc[w] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[w]), _mm256_mul_ps(d, _mm256_set1_ps(t->dx[s * t->rows])),
                                     acc[w]);
            if (OFF)
                acc[w] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * GROUP + 16 * w))),
                                         _mm256_set1_ps(t->sx[s * t->rows]), acc[w]);
        }
    }
    store_tile(t, g, 0, 0, 1, &acc[0]);
    store_tile(t, g, 1, 0, 1, &acc[1]);
}

/* One function per packed kind, tile size and path (P: a for avx2, v and e for avxvnni's two encodings; avx2's Q8_0
 * from two tiles: tile_packed to 4 rows, tile_legacy_rows from 5), and the paths' tables, indexed by kind -
 * KIND_PQ4_0: tiles of 1, 2, 4 and 8 rows, and what the 8-row tiles leave in one pass (`rest`: 3, 5, 6 or 7 rows),
 * but for IQ4 on avx2 (tiles up to 4 rows, 3 left in one pass) and the K-quants on avxvnni (tile_k up to 4 rows,
 * tile_k8; 3 left in one pass). A one-row call of the 4- and 5-bit legacy types and the K-quants takes a whole group
 * in one pass (`w`). */
#define PACKED_FN(NAME, R, CALL)                                                                                   \
    AVX2 static __attribute__((unused)) void NAME##_##R(const MatmulTask *t, long g, int h, long r0, int p)         \
    {                                                                                                              \
        (void)h;                                                                                                   \
        (void)r0;                                                                                                  \
        CALL;                                                                                                      \
    }
#define SIZES_TO_4(NAME, TILE, ...)                                                                                \
    PACKED_FN(NAME, 1, TILE(t, g, h, r0, 1, __VA_ARGS__))                                                          \
    PACKED_FN(NAME, 2, TILE(t, g, h, r0, 2, __VA_ARGS__))                                                          \
    PACKED_FN(NAME, 3, TILE(t, g, h, r0, 3, __VA_ARGS__))                                                          \
    PACKED_FN(NAME, 4, TILE(t, g, h, r0, 4, __VA_ARGS__))
#define SIZES_FROM_5(NAME, TILE, ...)                                                                              \
    PACKED_FN(NAME, 5, TILE(t, g, h, r0, 5, __VA_ARGS__))                                                          \
    PACKED_FN(NAME, 6, TILE(t, g, h, r0, 6, __VA_ARGS__))                                                          \
    PACKED_FN(NAME, 7, TILE(t, g, h, r0, 7, __VA_ARGS__))                                                          \
    PACKED_FN(NAME, 8, TILE(t, g, h, r0, 8, __VA_ARGS__))
#define SIZES(NAME, TILE, ...) SIZES_TO_4(NAME, TILE, __VA_ARGS__) SIZES_FROM_5(NAME, TILE, __VA_ARGS__)
#define PACKED_FNS(NAME, V, BITS, FORM, OFF, TABLE) SIZES(NAME, tile_packed, BITS, FORM, OFF, TABLE, V, p)
#define K_FNS(NAME, V, BITS)                                                                                       \
    PACKED_FN(NAME, 1, tile_k(t, g, h, r0, 1, 1, BITS, V, p))                                                      \
    PACKED_FN(NAME, 2, tile_k(t, g, h, r0, 2, 1, BITS, V, p))                                                      \
    PACKED_FN(NAME, 3, tile_k(t, g, h, r0, 3, 1, BITS, V, p))                                                      \
    PACKED_FN(NAME, 4, tile_k(t, g, h, r0, 4, 1, BITS, V, p))                                                      \
    PACKED_FN(NAME, 8, tile_k8(t, g, h, r0, BITS, V, p))
#define K_WHOLE(NAME, V, BITS) PACKED_FN(NAME, w, tile_k(t, g, h, r0, 1, 2, BITS, V, p))
#define LEGACY_WHOLE(NAME, V, BITS, OFF) PACKED_FN(NAME, w, tile_legacy_whole(t, g, BITS, OFF, V, p))
#define VNNI_FNS(P, V)                                                                                             \
    PACKED_FNS(P##_pq4_0, V, 4, FORM_LEGACY, 0, 0) LEGACY_WHOLE(P##_pq4_0, V, 4, 0)                                \
    PACKED_FNS(P##_pq4_1, V, 4, FORM_LEGACY, 1, 0) LEGACY_WHOLE(P##_pq4_1, V, 4, 1)                                \
    PACKED_FNS(P##_pq5_0, V, 5, FORM_LEGACY, 0, 0) LEGACY_WHOLE(P##_pq5_0, V, 5, 0)                                \
    PACKED_FNS(P##_pq5_1, V, 5, FORM_LEGACY, 1, 0) LEGACY_WHOLE(P##_pq5_1, V, 5, 1)                                \
    PACKED_FNS(P##_pq8_0, V, 8, FORM_LEGACY, 0, 0)                                                                 \
    K_FNS(P##_pq4_k, V, 4) K_WHOLE(P##_pq4_k, V, 4)                                                                \
    K_FNS(P##_pq5_k, V, 5) K_WHOLE(P##_pq5_k, V, 5)                                                                \
    PACKED_FNS(P##_pq6_k, V, 6, FORM_Q6K, 0, 0)                                                                    \
    PACKED_FNS(P##_piq4_nl, V, 4, FORM_LEGACY, 0, 1)                                                               \
    PACKED_FNS(P##_piq4_xs, V, 4, FORM_IQ4XS, 0, 1)
VNNI_FNS(v, VNNI_VEX)
VNNI_FNS(e, VNNI_EVEX)
SIZES(a_pq4_0, tile_legacy_rows, 4, 0, p) LEGACY_WHOLE(a_pq4_0, VNNI_NONE, 4, 0)
SIZES(a_pq4_1, tile_legacy_rows, 4, 1, p) LEGACY_WHOLE(a_pq4_1, VNNI_NONE, 4, 1)
SIZES(a_pq5_0, tile_legacy_rows, 5, 0, p) LEGACY_WHOLE(a_pq5_0, VNNI_NONE, 5, 0)
SIZES(a_pq5_1, tile_legacy_rows, 5, 1, p) LEGACY_WHOLE(a_pq5_1, VNNI_NONE, 5, 1)
SIZES_TO_4(a_pq8_0, tile_packed, 8, FORM_LEGACY, 0, 0, VNNI_NONE, p) SIZES_FROM_5(a_pq8_0, tile_legacy_rows, 8, 0, p)
SIZES(a_pq4_k, tile_k_rows, 4, p) K_WHOLE(a_pq4_k, VNNI_NONE, 4)
SIZES(a_pq5_k, tile_k_rows, 5, p) K_WHOLE(a_pq5_k, VNNI_NONE, 5)
SIZES(a_pq6_k, tile_q6k_rows, p)
PACKED_FNS(a_piq4_nl, VNNI_NONE, 4, FORM_LEGACY, 0, 1)
PACKED_FNS(a_piq4_xs, VNNI_NONE, 4, FORM_IQ4XS, 0, 1)

#define SET4(NAME) {{NAME##_1, NAME##_2, NAME##_4}, {1, 2, 4}, {NULL}, NULL, REST_TO_4(NAME)}
#define SET8(NAME) {{NAME##_1, NAME##_2, NAME##_4, NAME##_8}, {1, 2, 4, 8}, {NULL}, NULL, REST_TO_8(NAME)}
#define WHOLE_SET8(NAME) {{NAME##_1, NAME##_2, NAME##_4, NAME##_8}, {1, 2, 4, 8}, {NULL}, NAME##_w, REST_TO_8(NAME)}
#define K_SET(NAME) {{NAME##_1, NAME##_2, NAME##_4, NAME##_8}, {1, 2, 4, 8}, {NULL}, NAME##_w, REST_TO_4(NAME)}
const TileSet cpu_tiles_packed[PACKED_COUNT] = {
    WHOLE_SET8(a_pq4_0), WHOLE_SET8(a_pq4_1), WHOLE_SET8(a_pq5_0), WHOLE_SET8(a_pq5_1), SET8(a_pq8_0),
    WHOLE_SET8(a_pq4_k), WHOLE_SET8(a_pq5_k), SET8(a_pq6_k),       SET4(a_piq4_nl),     SET4(a_piq4_xs)};
#define VNNI_SETS(P)                                                                                               \
    {WHOLE_SET8(P##_pq4_0), WHOLE_SET8(P##_pq4_1), WHOLE_SET8(P##_pq5_0), WHOLE_SET8(P##_pq5_1), SET8(P##_pq8_0),  \
     K_SET(P##_pq4_k),      K_SET(P##_pq5_k),      SET8(P##_pq6_k),       SET8(P##_piq4_nl),     SET8(P##_piq4_xs)}
const TileSet cpu_tiles_packed_vnni[PACKED_COUNT] = VNNI_SETS(v);
const TileSet cpu_tiles_packed_vnni_evex[PACKED_COUNT] = VNNI_SETS(e);
#endif
