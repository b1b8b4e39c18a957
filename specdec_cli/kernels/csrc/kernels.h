/*
 * kernels.h: the one internal header of specdec's CPU kernels (the extension specdec_cli.kernels._cpu; ../_cpu.c
 * describes what they compute and in which order). Every C file of the extension includes it, and nothing else
 * of the extension's own.
 *
 * Holds: the standard includes; the x86 target attributes (AVX2, VNNI512) and HAVE_X86; the constants
 * (BLOCK, GROUP, MAX_THREADS, PREFETCH_AHEAD and PREFETCH_FAR, the packed kinds' sizes and offsets); the weights'
 * kinds and the instruction-set paths; the task structures the files hand each other (KindInfo, MatmulTask,
 * TileSet, AttentionTask); the few small helpers that several files inline in their loops (hsum8, hsum8i,
 * load_i32, exp8, four_scores, vnni_dot, prefetch_ahead); and the declaration of every function one file defines
 * and another calls, each named cpu_*. Everything else is `static` in its file.
 * Not here: any kernel's body, and Python: only ../_cpu.c includes Python.h.
 */
#ifndef SPECDEC_KERNELS_H
#define SPECDEC_KERNELS_H

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* x86-64: the vector paths, each function compiled for its instruction set by a target attribute and called only
 * when the CPU has it (../_cpu.c checks at import); their small helpers that several files inline. Every other
 * CPU: HAVE_X86 0, and only the portable loops are compiled. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

static inline void cpu_relax(void)
{
    _mm_pause();
}

/* The avxvnni path's multiply (its 256-bit tiles are AVX2 functions that hold it): acc + per 32-bit lane the dot
 * product of 4 unsigned bytes of `codes` with 4 signed bytes of `x`, vpdpbusd. VNNI_VEX: AVX-VNNI's encoding;
 * VNNI_EVEX: AVX512-VNNI's 256-bit form of the same instruction, which a CPU with AVX512-VNNI but not AVX-VNNI (Zen
 * 4, Ice Lake and later Xeons) runs when the avxvnni path is asked for, so the path is tested there. Written as
 * assembly because one source serves both encodings inside AVX2 functions (the intrinsics would each need their own
 * target); its result must be used, or the compiler drops it. */
enum { VNNI_NONE = 0, VNNI_VEX = 1, VNNI_EVEX = 2 };

AVX2 static inline __attribute__((always_inline)) __m256i vnni_dot(__m256i acc, __m256i codes, __m256i x,
                                                                   const int VNNI)
{
    if (VNNI == VNNI_VEX)
        __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(codes), "x"(x));
    else
        __asm__("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(codes), "x"(x));
    return acc;
}

AVX2 static inline float hsum8(__m256 v)
{
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
}

AVX2 static inline int hsum8i(__m256i v)
{
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4e));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xb1));
    return _mm_cvtsi128_si32(sum);
}

/* e^x for x <= 0 (scores minus their maximum): 2^n * p(r), x = n ln 2 + r, |r| <= ln 2 / 2, p of degree 6. */
AVX2 static inline __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

/* A key's score: its dot vector's 8 lanes summed as ((0+1)+(2+3)) + ((4+5)+(6+7)), times the scale. Four keys
 * are reduced together (hadd pairs neighbouring lanes within each 128-bit half), which sums every key's lanes in
 * that same order whichever keys share the group. */
AVX2 static inline __m128 four_scores(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d)); /* [a03 b03 c03 d03 | a47 b47 c47 d47] */
    return _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
}

#else
#define HAVE_X86 0

static inline void cpu_relax(void)
{
}
#endif

static inline __attribute__((always_inline)) int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The cpu_* names below stay inside the extension's shared object (calls between its files go direct). */
#pragma GCC visibility push(hidden)

#define BLOCK 32 /* weights (and activations) per quantisation block */
#define GROUP 16 /* output columns per record: the lanes of one 512-bit register of int32 or float32 */
#define MAX_THREADS 64

/* The weights' kinds (../_cpu.c's header comment; kernels/__init__.py names them too). */
enum {
    KIND_Q4 = 4,    /* nibbles, per 32: scale, offset */
    KIND_Q4Z = 5,   /* nibbles, per 32: scale; zero point 8 */
    KIND_Q8 = 8,    /* bytes (int8 + 128), per 32: scale; zero point 128 */
    KIND_U8 = 9,    /* bytes 0..127, per 32: scale, offset */
    KIND_Q8S = 16,  /* bytes 0..127, per 16: scale; zero point 32 */
    KIND_Q4S = 17,  /* nibbles, per 16: scale; zero point 4 */
    KIND_Q2S = 18,  /* nibbles, per 16: scale, offset */
    KIND_F32 = 32,  /* float32 weights */
    KIND_F16 = 33,  /* float16 weights */
    KIND_BF16 = 34, /* bfloat16 weights */
    /* Packed kinds: a GGUF type's own fields at the file's size (f16 scales, 6-bit sub-scales, bit planes),
     * interleaved 16 columns a record (matmul_packed.c has the layout). */
    KIND_PQ4_0 = 40, /* Q4_0: f16 d; nibbles, zero point 8 */
    KIND_PQ4_1 = 41, /* Q4_1: f16 d, f16 m; nibbles */
    KIND_PQ5_0 = 42, /* Q5_0: f16 d; nibbles and a fifth-bit plane, zero point 16 */
    KIND_PQ5_1 = 43, /* Q5_1: f16 d, f16 m; nibbles and a fifth-bit plane */
    KIND_PQ8_0 = 44, /* Q8_0: f16 d; int8 codes */
    KIND_PQ4_K = 45, /* Q4_K: per 256, f16 d and dmin, 6-bit scales and minimums per 32; nibbles */
    KIND_PQ5_K = 46, /* Q5_K: as Q4_K, and a fifth-bit plane */
    KIND_PQ6_K = 47, /* Q6_K: per 256, f16 d, int8 scales per 16; nibbles and a 2-bit plane, zero point 32 */
    KIND_PIQ4_NL = 48, /* IQ4_NL: Q4_0's bytes, the nibble an index into IQ4_TABLE's int8 values */
    KIND_PIQ4_XS = 49, /* IQ4_XS: per 256, f16 d, 6-bit scales (less 32) per 32; nibbles indexing IQ4_TABLE */
};

/* IQ4's 16 weight values: a weight is its scale times one of these (ggml's kvalues_iq4nl). */
#define IQ4_TABLE -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113

/* How a kind keeps its scales: float32 per sub-block (the record kinds above 32 excepted), or a packed form. */
enum { FORM_RECORDS = 0, FORM_LEGACY = 1, FORM_K = 2, FORM_Q6K = 3, FORM_IQ4XS = 4 };

/* The instruction sets, in order of preference. ../_cpu.c keeps the one in use (the best the CPU has, unless
 * set_isa chose another it has) and passes it to each kernel as `path`. */
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVXVNNI = 2, ISA_AVX512VNNI = 3 };

/* --------------------------------------------------------------------------------- the thread pool (pool.c) */

typedef void (*task_fn)(const void *ctx, long start, long stop);

void cpu_run_parallel(task_fn fn, const void *ctx, long items);
int cpu_threads(void);
int cpu_set_threads(int count);
void cpu_pool_init(void);
double cpu_now_seconds(void);

/* -------------------------------------------------------- the weights' kinds and the activations (blocks.c) */

typedef struct {
    int bits;    /* 4: two codes a byte; 8: one code a byte; 32/16: float32, float16 or bfloat16 weights */
    int sub;     /* weights per scale (16 or 32) */
    int zero;    /* the codes' zero point: W = scale * (code - zero) (+ offset) */
    int offsets; /* a float32 offset per sub-block */
    int bf16;    /* bits 16: bfloat16 rather than float16 */
    int form;    /* FORM_*: float32 scales (records), or a GGUF type's packed fields */
    int sb;      /* packed forms: weights per super-block along k (32 or 256) */
    int table;   /* IQ4_NL, IQ4_XS: a code is an index into IQ4_TABLE (zero 0), not a value */
} KindInfo;

int cpu_kind_info(int kind, KindInfo *info);
long cpu_block_bytes(const KindInfo *info);
long cpu_group_bytes(const KindInfo *info, long k);
long cpu_packed_header_bytes(const KindInfo *info);
long cpu_packed_block_bytes(const KindInfo *info);
long cpu_packed_super_bytes(const KindInfo *info);
float cpu_half_to_float(uint16_t h);
void cpu_quantize_rows(int path, const float *x, long rows, long k, int span, int8_t *qx, float *dx,
                       int32_t *sums);

/* ------------------------------------------- the matmul (matmul.c; tiles in matmul_avx2.c, matmul_avx512.c) */

typedef struct {
    KindInfo info;
    long rows, k, n;
    const float *x;       /* float kinds: the rows themselves */
    const int8_t *qx;     /* block kinds: the rows' 8-bit codes [k/32][rows][32] */
    const float *dx;      /* their scales [k/32][rows] */
    const int32_t *init;  /* [k/sub][rows]: -zero * (sum of the row's codes over the sub-block), the integer
                           * accumulator's start (so the dot product comes out of codes - zero) */
    const float *sx;      /* [k/sub][rows]: dx * (sum of the row's codes over the sub-block), for offsets */
    const int32_t *pairs; /* FORM_K: [k/64][rows]: the sums of the row's codes over sub-blocks 2p (low 16 bits) and
                           * 2p + 1 (high 16 bits), for the minimums' integer dot product */
    const char *weights;  /* one record per group of GROUP columns */
    long record, block;   /* bytes per group record, per block of it (packed kinds: per super-block) */
    float *out;
    long out_stride; /* elements between rows of out */
    int accumulate;  /* out += product instead of out = product (a residual connection) */
} MatmulTask;

int cpu_matmul(const KindInfo *info, const float *x, long rows, long k, long n, const char *weights, float *out,
               long out_stride, int accumulate, int path);
void cpu_store_values(const MatmulTask *t, long row, long col, const float *values); /* the portable loops' store */
void cpu_store_nan(const MatmulTask *t, long start, long stop);

/* The block kinds' compiled shapes: (bits, sub, offsets) of each kind, and tiles of 1, 2, 4 (and 8) rows. */
#define SHAPES(X)                                                                                                  \
    X(4, 32, 1)                                                                                                    \
    X(4, 32, 0)                                                                                                    \
    X(8, 32, 0)                                                                                                    \
    X(8, 32, 1)                                                                                                    \
    X(8, 16, 0)                                                                                                    \
    X(4, 16, 0)                                                                                                    \
    X(4, 16, 1)
#define SHAPE_COUNT 7

/* How far ahead of the bytes it is reading a tile prefetches (the first tile of a group). Into L1, a short distance
 * keeps a thread's stream of records in flight without evicting what it is about to read (one record ahead, as
 * before, was 1.3-1.5x slower for one row on a Zen 4, its records 14-80 KB). Tiles of 4 or more rows, which spend
 * longer on each byte, ask L2 for what lies PREFETCH_FAR ahead as well: on a Zen 4, 8 rows of Q4_K 0.83-0.91x the
 * time with 16-64 KB (8 KB changed nothing), of the legacy types 0.89-1.0x, Q6_K 0.96x; the super-block kinds'
 * L1 prefetch is left out there (K-quants and Q6_K 0.85-0.97x without it, IQ4_XS 0.68-0.83x), the legacy types'
 * kept (1.02-1.03x without). The super-block kinds' wide tiles ask for a super-block's far lines an eighth at a
 * time, one slice per sub-block (a burst of a whole super-block's 36 lines at its start held up the tile's own loads:
 * sliced, 8 rows of the 1.5B shape's matrices 0.91-0.93x the time on avx512vnni, 4 rows on avxvnni 0.96x). One row
 * asks only L1 (a far prefetch was 1.05-1.2x slower). */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2048
#endif
#ifndef PREFETCH_FAR
#define PREFETCH_FAR 16384
#endif

#if HAVE_X86
/* The `bytes` a tile of `rows` rows of a kind of form `form` is about to read at `at`, prefetched a cache line at a
 * time as said above: PREFETCH_AHEAD further on into L1 (not for the super-block kinds' tiles of 4 or more rows:
 * K-quants, Q6_K, IQ4_XS), and for the legacy packed kinds' tiles of 4 or more rows PREFETCH_FAR further on into L2
 * (the super-block kinds' wide tiles take that in slices, prefetch_slice; the float32-scale record kinds keep
 * the L1 prefetch alone, as measured for them). */
static inline __attribute__((always_inline)) void prefetch_ahead(const char *at, long bytes, int form, int rows)
{
    int wide = rows >= 4 && form != FORM_RECORDS;
    if (!wide || form == FORM_LEGACY)
        for (long line = 0; line < bytes; line += 64)
            _mm_prefetch(at + PREFETCH_AHEAD + line, _MM_HINT_T0);
    if (wide && form == FORM_LEGACY)
        for (long line = 0; line < bytes; line += 64)
            _mm_prefetch(at + PREFETCH_FAR + line, _MM_HINT_T1);
}

/* The far prefetch of a super-block kind's tile of `rows` rows (K-quants, Q6_K, IQ4_XS; 4 or more rows), as said
 * above: at its sub-block `part` of 8, slice `part` of the super-block's `bytes` at `at`, PREFETCH_FAR ahead into L2
 * a cache line at a time. Nothing for other forms or fewer rows (prefetch_ahead does theirs). */
static inline __attribute__((always_inline)) void prefetch_slice(const char *at, long bytes, int form, int rows,
                                                                 int part)
{
    if (rows < 4 || form == FORM_RECORDS || form == FORM_LEGACY)
        return;
    const long lines = (bytes + 63) / 64;
    for (long line = part * lines / 8; line < (part + 1) * lines / 8; line++)
        _mm_prefetch(at + PREFETCH_FAR + 64 * line, _MM_HINT_T1);
}
#endif

/* A packed kind's bytes per group (blocks.c, matmul_packed.c have the layout): a super-block's header, a block of 32's
 * codes; the offsets in a FORM_K header, and of Q6_K's int8 sub-scales. */
#define PACKED_HEADER_BYTES(FORM, OFF)                                                                             \
    ((FORM) == FORM_K       ? 16 * GROUP                                                                           \
     : (FORM) == FORM_Q6K   ? 18 * GROUP                                                                           \
     : (FORM) == FORM_IQ4XS ? 8 * GROUP                                                                            \
                            : 2 * GROUP * (1 + (OFF)))
#define PACKED_BLOCK_BYTES(BITS) (4 * (BITS) * GROUP)
#define K_SCALE_LOW 64
#define K_MIN_LOW 128
#define K_SCALE_HIGH 192
#define K_MIN_HIGH 224
#define Q6K_SCALES 32
#define IQ4XS_SCALE_LOW 32  /* FORM_IQ4XS: its 6-bit scales' nibbles and top bits, laid out as FORM_K's */
#define IQ4XS_SCALE_HIGH 96
#define IQ4XS_SCALE_ZERO 32 /* a sub-block's scale is d * (the 6-bit value - 32) */

/* A tile: (task, group, half of the group (256-bit paths), first row, prefetch ahead of what it reads). */
typedef void (*tile_fn)(const MatmulTask *, long, int, long, int);

/* A path's tiles for one kind, largest last: fn[i] takes rows[i] rows (NULL past the path's largest). */
typedef struct {
    tile_fn fn[5];
    int rows[5];
    tile_fn pairs[3]; /* 512-bit tiles of two groups: 1, 2, 4 rows (NULL on other paths) */
    tile_fn whole;    /* a one-row tile of a whole group, both halves of 8 columns in one pass (or NULL) */
    tile_fn rest[8];  /* rest[r]: r rows in one pass, for what the largest tiles leave (or NULL: the smaller ones) */
} TileSet;

/* A TileSet's `rest` from a path's tiles NAME_3 .. NAME_7: where its tiles reach 8 rows, 3, 5, 6 and 7 rows in one
 * pass; where they reach 4, 3 rows. */
#define REST_TO_8(NAME) {NULL, NULL, NULL, NAME##_3, NULL, NAME##_5, NAME##_6, NAME##_7}
#define REST_TO_4(NAME) {NULL, NULL, NULL, NAME##_3}

/* Indexed as SHAPES lists the block kinds' shapes, and float32, float16, bfloat16. */
extern const TileSet cpu_tiles_avx2[SHAPE_COUNT], cpu_tiles_avxvnni[SHAPE_COUNT], cpu_tiles_vnni_evex[SHAPE_COUNT],
    cpu_floats_avx2[3];
extern const TileSet cpu_tiles_512[SHAPE_COUNT], cpu_floats_512[3];

/* The packed kinds: their 256-bit tiles (matmul_packed.c: maddubs for the avx2 path, vpdpbusd in either encoding for
 * the avxvnni path) and avx512vnni tiles (matmul_packed_512.c), indexed by kind - KIND_PQ4_0, and their portable
 * reference loop (matmul_packed_portable.c: a task over record groups, like matmul.c's). */
#define PACKED_COUNT 10
extern const TileSet cpu_tiles_packed[PACKED_COUNT], cpu_tiles_packed_vnni[PACKED_COUNT],
    cpu_tiles_packed_vnni_evex[PACKED_COUNT], cpu_tiles_packed_512[PACKED_COUNT];
/* The avxvnni path's encoding (vnni_dot): VNNI_VEX, or VNNI_EVEX on a CPU with AVX512-VNNI but not AVX-VNNI
 * (../_cpu.c sets it at import; matmul.c picks the tiles by it). */
extern int cpu_avxvnni_encoding;
void cpu_matmul_packed_portable(const void *arg, long start, long stop);
int cpu_repack_gguf(int kind, const uint8_t *rows, long n, long row_bytes, long k, uint8_t *records);

/* ------------------------------------------------------------------- row-invariant attention (attention*.c) */

typedef struct {
    long rows, heads, kv_heads, dim;
    const float *q;
    long q_row, q_head; /* strides in elements */
    const char *k, *v;
    int kv_bf16;
    long k_head, k_pos, v_head, v_pos; /* strides in elements */
    const int32_t *run_start, *run_stop; /* [rows]: row r's keys begin with the run run_start .. run_stop-1 */
    const int32_t *extra_start;          /* [rows + 1]: then extra_pos[extra_start[r] .. extra_start[r+1]-1] */
    const int32_t *extra_pos;
    float scale;
    float *out;
    long o_row, o_head;
    long row_tile;  /* AVX2 work units: 0 = one (row, head) each; else heads of one key/value head x row_tile rows */
    long head_tile; /* (row_tile > 0) the query heads of a unit: a key/value head's group, or part of it */
    int wide; /* the 512-bit score and value steps (the avx512vnni path) */
    float cap; /* > 0: scores soft-capped before the softmax, cap * tanh(score / cap) (gemma2); 0: none */
} AttentionTask;

void cpu_attention(AttentionTask *t, int path);
#define MAX_MANY_TASKS 64 /* cpu_attention_many's tasks at most */
void cpu_attention_many(AttentionTask *tasks, long count, int path);

/* The two steps over a block of keys, for one item (score_fn, value_fn) or for n query heads of one row
 * (score_group_fn, value_group_fn; attention_avx512.c). */
typedef void (*score_fn)(const AttentionTask *, long, long, float *, long, long);
typedef void (*value_fn)(const AttentionTask *, long, long, const float *, float *, long, long);
typedef void (*score_group_fn)(const AttentionTask *, long, long, float *, long, long, long);
typedef void (*value_group_fn)(const AttentionTask *, long, long, const float *, long, float *, long, long, long);
#define MAX_GROUP 4

void cpu_attention_wide_steps(long dim, int bf16, score_fn *score, value_fn *value);
void cpu_attention_group_steps(long dim, int bf16, int wide, score_group_fn *score, value_group_fn *value,
                               long *score_most, long *value_most);
float cpu_softmax_weights_wide(float *scores, long keys);

/* ---------------------------------------------------------------------------- per-row steps (elementwise.c) */

void cpu_rms_norm(const float *x, long rows, long dim, long x_stride, const float *weight, float eps, float *out,
                  long out_stride);
void cpu_rms_norm_heads(float *x, long rows, long row_stride, long heads, long head_dim, const float *weight,
                        float eps);
void cpu_rope(float *base, long rows, long row_stride, long heads, long head_dim, long half, const int32_t *positions,
              const float *cos_table, const float *sin_table);
void cpu_store_rows(const float *src, long rows, long row_stride, long heads, long dim, void *dst, long head_stride,
                    long pos_stride, long start, int bf16);
void cpu_silu_mul(int path, const float *gate_up, long rows, long ffn, float *out);
void cpu_gelu_tanh_mul(int path, const float *gate_up, long rows, long ffn, float *out);
/* Each row's k (<= 16) largest logits' ids, largest first, ties to the lower id, NaN largest (top_tokens.c):
 * column 0 is torch.argmax's first maximum. 0, or -1 for a bad k, -2 when memory runs out. */
int cpu_top_tokens(int path, const float *logits, long rows, long vocab, long k, int32_t *out);

void cpu_soft_cap(int path, float *x, long count, float cap);
void cpu_soft_cap_portable(float *x, long count, float cap); /* attention.c soft-caps its scores with these */
void cpu_soft_cap_avx2(float *x, long count, float cap);     /* x86 only */

/* --------------------------------------------------------------------------------- the paths' peak (peak.c) */

double cpu_peak(int path, double seconds);

#endif /* SPECDEC_KERNELS_H */
