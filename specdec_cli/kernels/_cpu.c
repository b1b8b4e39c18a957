/*
 * specdec's CPU kernels: block-quantised matrix products and row-invariant attention, on a small thread pool.
 *
 * Why they exist: a CPU decoding step is bound by reading the weights, so a GGUF's 4-bit blocks should be read as
 * they are stored (llama.cpp's approach), and verification needs every row of a block to come out bit for bit as a
 * one-row forward would compute it. torch's kernels give neither on every CPU (their reduction order changes
 * with the row count; their int4 path is slow without AVX512). Here each output element is computed by the same
 * sequence of operations whatever the number of rows or threads, so the kernels are row-invariant by
 * construction (exact.py still checks it end to end).
 *
 *   matmul(kind, x, rows, k, n, weights, out[, out_stride, accumulate])
 *       out[rows, n] = x[rows, k] @ W^T; with `accumulate`, out += the product (a residual connection). W is held
 *       as one record per group of GROUP = 16 output columns (read as one stream; columns past n are padding),
 *       made of blocks of 32 weights along k. A block kind's block is: float32 scales [32/sub][16 columns],
 *       float32 offsets [32/sub][16] (kinds with offsets), then the codes, 4 bytes (4 consecutive k) of each of
 *       the 16 columns side by side, 64 bytes a "chunk vector":
 *         byte codes (8 bits): the block's 8 chunks in order, 8 x 64 bytes;
 *         nibble codes (4 bits): per sub-block of `sub` weights (sub/4 chunks), sub/8 vectors; vector q holds
 *                 chunk q in its low nibbles and chunk q + sub/8 in its high nibbles; 4 x 64 bytes a block.
 *       W = scale * (code - zero) (+ offset), scale and offset per sub-block of `sub` weights. The kinds:
 *         kind  codes   sub zero offset  GGUF types (quant.py)
 *          4    nibble  32   0    yes    Q4_1, Q4_K (and int4 made on load)
 *          5    nibble  32   8    no     Q4_0
 *          8    byte    32  128   no     Q8_0, Q5_0, IQ4_NL, IQ4_XS: the int8 value + 128 (and int8)
 *          9    byte    32   0    yes    Q5_1, Q5_K (codes 0..31)
 *         16    byte    16   32   no     Q6_K (codes 0..63)
 *         17    nibble  16   4    no     Q3_K (codes 0..7)
 *         18    nibble  16   0    yes    Q2_K (codes 0..3)
 *       Each row of x is first rounded to 8 bits per block of 32 (scale dx = max |x| / 127, code = round(x / dx)),
 *       as llama.cpp does. Output (row, column) is then, in this order for every path, row count and thread count:
 *         acc = 0; for each sub-block j along k: acc = fma(float(dot_j), scale_j * dx_b, acc) and, with offsets,
 *         acc = fma(offset_j, dx_b * float(sum of the row's codes over j), acc)
 *       where dot_j = sum over the sub-block of (code - zero) * the row's code, an exact integer (so the integer
 *       work may be split and ordered freely: vpdpbusd of the unsigned codes with the row's codes broadcast 4 at a
 *       time, its accumulator started at -zero * the row's code sum; AVX2's maddubs; the portable loop).
 *       Float kinds (32: float32, 33: float16, 34: bfloat16) hold the weights as they are, [k][16 columns] per
 *       record; x is not rounded, and output (row, column) = (s0 + s1) + (s2 + s3), s_i the fma chain over
 *       k = i mod 4 in order.
 *       Paths: "avx512vnni" (a tile is 16 columns x up to 8 rows, one zmm accumulator a row; nibble kinds with
 *       2-32 rows take two groups, 32 columns x up to 4 rows, so that each broadcast of a row's codes serves two
 *       vpdpbusd), "avxvnni" (256-bit vpdpbusd, 8 columns x up to 4 rows), "avx2" (maddubs + madd, 8 x 4) and
 *       "portable" C; the best the CPU has is chosen at import (set_isa forces another). They give the same
 *       bits: each computes the order above. A tile unpacks each block of weights once for all its rows; the
 *       rows of a call go in tiles of 8, 4, 2, 1 (from L1 after the first); the threads split the groups.
 *   attention(...[, cap])
 *       softmax(q . k * scale) v per query row and head, each row over its own keys: a contiguous run of cache
 *       positions plus a list of further positions (a tree node's ancestors), in that order. Keys and values
 *       are float32 or bfloat16, read in place through strides; scores, softmax and sums are float32. The
 *       avx512vnni path computes scores and value sums on 512-bit registers. cap > 0 soft-caps the scores
 *       (cap * tanh(score / cap), gemma2) before the softmax.
 *   rms_norm, rms_norm_heads, rope, store_rows, silu_mul, gelu_tanh_mul, soft_cap
 *       the decoder's small per-row steps (native.py composes a layer from them): RMS normalisation (of whole
 *       rows, or of each head of q or k in every row: QK-norm), rotary position embedding in place (Hugging
 *       Face's rotate-half convention, partial rotary included), copying key/value rows into the cache,
 *       SiLU(gate) * up, GeLU-tanh(gate) * up and cap * tanh(x / cap) in place. Each row is computed alone, on
 *       the calling thread (soft_cap: pieces of a long call on the pool); the last two give every element the
 *       same bits on every path and wherever it sits (see "elementwise functions").
 *   set_threads(n), threads(), isa(), isas(), set_isa(name), record_bytes(kind, k), peak(isa)
 *
 * Pointers arrive as integers (the Python side, kernels/__init__.py, checks dtypes, shapes and contiguity).
 * The GIL is released while a kernel runs; a second caller arriving while the pool is busy runs on its own
 * thread. x86-64 CPUs take the best vectorised path they have (AVX512-VNNI, AVX-VNNI, AVX2 with FMA and F16C),
 * chosen at import; every other CPU takes the portable C loops (the same matmul results, slower; attention's
 * portable, AVX2 and 512-bit steps each round in their own order, each row-invariant). This file knows nothing
 * of models or GGUF files.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define HAVE_X86 0
#endif

#define BLOCK 32 /* weights (and activations) per quantisation block */
#define GROUP 16 /* output columns per record: the lanes of one 512-bit register of int32 or float32 */
#define MAX_THREADS 64
#define SPIN_SECONDS 5e-4 /* an idle worker spins this long before sleeping: kernels come in quick succession */

/* The weights' kinds (the header comment; kernels/__init__.py names them too). */
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
};

/* The instruction sets, in order of preference; `isa_path` is the one in use (the best the CPU has, unless
 * set_isa chose another it has). */
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVXVNNI = 2, ISA_AVX512VNNI = 3 };
static const char *const isa_names[] = {"portable", "avx2", "avxvnni", "avx512vnni"};
static int isa_path = ISA_PORTABLE, isa_best = ISA_PORTABLE;
static int cpu_has[4] = {1, 0, 0, 0};
#define use_avx2 (isa_path >= ISA_AVX2)

/* ------------------------------------------------------------------------------------------ thread pool */

typedef void (*task_fn)(const void *ctx, long start, long stop);

static struct {
    pthread_t threads[MAX_THREADS];
    int count;                /* threads working on a job, the caller included */
    pthread_mutex_t job_lock; /* one job at a time; a second caller runs alone */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    atomic_long generation; /* bumped for each job */
    atomic_llong claim;     /* (the job's generation << 32) | the next item to hand out */
    atomic_long done;       /* items of the current job finished */
    atomic_int sleepers;
    atomic_int stopping;
    long base_generation; /* the generation when the workers were started: their first job comes after it */
    task_fn fn;
    const void *ctx;
    long items, chunk;
} pool = {.count = 1,
          .job_lock = PTHREAD_MUTEX_INITIALIZER,
          .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void)
{
#if HAVE_X86
    _mm_pause();
#endif
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Take chunks of job `generation`'s items until none is left. Any thread may compute any item: every kernel
 * computes an item by the same operations whichever thread takes it, so results never depend on timing, and a
 * thread the OS preempts delays only the chunk it holds. A claim is valid only while the claim word still names
 * the job (run_parallel renews it before it writes the next job's fields). */
static void work_on(long generation)
{
    task_fn fn = pool.fn;
    const void *ctx = pool.ctx;
    long items = pool.items, chunk = pool.chunk;
    long long tag = (long long)(generation & 0xffffffffL) << 32;
    for (;;) {
        long long word = atomic_load(&pool.claim);
        if ((word & ~0xffffffffLL) != tag)
            return;
        long start = (long)(word & 0xffffffffLL);
        if (start >= items)
            return;
        long stop = start + chunk < items ? start + chunk : items;
        if (!atomic_compare_exchange_weak(&pool.claim, &word, tag | stop))
            continue;
        fn(ctx, start, stop);
        atomic_fetch_add(&pool.done, stop - start);
    }
}

static void *worker_main(void *arg)
{
    (void)arg;
    long seen = pool.base_generation; /* not the current one: a job may already have been posted */
    for (;;) {
        double spin_until = now_seconds() + SPIN_SECONDS;
        long spins = 0, generation;
        while ((generation = atomic_load(&pool.generation)) == seen && !atomic_load(&pool.stopping)) {
            if ((++spins & 255) != 0 || now_seconds() < spin_until) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool.sleep_lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.generation) == seen && !atomic_load(&pool.stopping))
                pthread_cond_wait(&pool.wake, &pool.sleep_lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.sleep_lock);
            spin_until = now_seconds() + SPIN_SECONDS;
        }
        if (atomic_load(&pool.stopping))
            return NULL;
        seen = generation;
        work_on(generation);
    }
}

static void wake_all(void)
{
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
}

/* fn(ctx, start, stop) over items [0, items), split across the pool; returns when every share is done. */
static void run_parallel(task_fn fn, const void *ctx, long items)
{
    if (pool.count <= 1 || items < 2 || pthread_mutex_trylock(&pool.job_lock) != 0) {
        fn(ctx, 0, items);
        return;
    }
    long generation = atomic_load(&pool.generation) + 1;
    atomic_store(&pool.claim, (long long)(generation & 0xffffffffL) << 32); /* stale claims fail from here */
    pool.fn = fn;
    pool.ctx = ctx;
    pool.items = items;
    pool.chunk = items / (4 * pool.count) > 1 ? items / (4 * pool.count) : 1;
    atomic_store(&pool.done, 0);
    atomic_store(&pool.generation, generation);
    wake_all();
    work_on(generation);
    while (atomic_load(&pool.done) < items)
        cpu_relax();
    pthread_mutex_unlock(&pool.job_lock);
}

static void stop_workers(void)
{
    if (pool.count <= 1)
        return;
    atomic_store(&pool.stopping, 1);
    pthread_mutex_lock(&pool.sleep_lock);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.sleep_lock);
    for (int i = 1; i < pool.count; i++)
        pthread_join(pool.threads[i], NULL);
    pool.count = 1;
    atomic_store(&pool.stopping, 0);
}

static int start_workers(int count)
{
    pool.base_generation = atomic_load(&pool.generation);
    for (int i = 1; i < count; i++) {
        if (pthread_create(&pool.threads[i], NULL, worker_main, (void *)(intptr_t)i) != 0) {
            pool.count = i;
            return -1;
        }
        pool.count = i + 1;
    }
    return 0;
}

/* A forked child has none of the parent's workers: it starts single-threaded. */
static void after_fork_in_child(void)
{
    pool.count = 1;
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.stopping, 0);
    pthread_mutex_init(&pool.job_lock, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
}

/* ------------------------------------------------------------------ activations rounded to 8-bit blocks */

/* Row r of `rows`, block b of 32, laid out block by block so that a tile of rows finds its codes at fixed offsets
 * from one pointer: codes qx[b, r, 0..31], scale dx[b, r]; sums[2b + h, r] = the sum of codes 16h .. 16h+15 of
 * that block (the kinds with zero points or offsets need them per sub-block). */
static void quantize_rows_portable(const float *x, long rows, long k, int8_t *qx, float *dx, int32_t *sums)
{
    long blocks = k / BLOCK;
    for (long r = 0; r < rows; r++)
        for (long b = 0; b < blocks; b++) {
            const float *v = x + r * k + b * BLOCK;
            float amax = 0.0f;
            for (int i = 0; i < BLOCK; i++)
                amax = fmaxf(amax, fabsf(v[i]));
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

AVX2 static void quantize_rows_avx2(const float *x, long rows, long k, int8_t *qx, float *dx, int32_t *sums)
{
    long blocks = k / BLOCK;
    const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (long r = 0; r < rows; r++)
        for (long b = 0; b < blocks; b++) {
            const float *v = x + r * k + b * BLOCK;
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
                   v3 = _mm256_loadu_ps(v + 24);
            __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, sign_off), _mm256_and_ps(v1, sign_off)),
                                        _mm256_max_ps(_mm256_and_ps(v2, sign_off), _mm256_and_ps(v3, sign_off)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float scale = _mm_cvtss_f32(m4) / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
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
#endif

static void quantize_rows(const float *x, long rows, long k, int8_t *qx, float *dx, int32_t *sums)
{
#if HAVE_X86
    if (isa_path >= ISA_AVX2) {
        quantize_rows_avx2(x, rows, k, qx, dx, sums);
        return;
    }
#endif
    quantize_rows_portable(x, rows, k, qx, dx, sums);
}

/* ------------------------------------------------------------------------------ the weights' kinds */

typedef struct {
    int bits;    /* 4: two codes a byte; 8: one code a byte; 32/16: float32, float16 or bfloat16 weights */
    int sub;     /* weights per scale (16 or 32) */
    int zero;    /* the codes' zero point: W = scale * (code - zero) (+ offset) */
    int offsets; /* a float32 offset per sub-block */
    int bf16;    /* bits 16: bfloat16 rather than float16 */
} KindInfo;

static int kind_info(int kind, KindInfo *info)
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
    default: return 0;
    }
}

/* Bytes of one block of 32 weights for a group of GROUP columns: scales, offsets, codes. */
static long block_bytes(const KindInfo *info)
{
    long subs = BLOCK / info->sub;
    return 4 * GROUP * subs * (1 + info->offsets) + (info->bits == 4 ? 16 : 32) * GROUP;
}

/* Bytes of one group's record (k weights of GROUP columns). */
static long group_bytes(const KindInfo *info, long k)
{
    if (info->bits >= 16)
        return k * GROUP * (info->bits / 8);
    return (k / BLOCK) * block_bytes(info);
}

/* ------------------------------------------------------------------------------ the matmul */

typedef struct {
    KindInfo info;
    long rows, k, n;
    const float *x;       /* float kinds: the rows themselves */
    const int8_t *qx;     /* block kinds: the rows' 8-bit codes [k/32][rows][32] */
    const float *dx;      /* their scales [k/32][rows] */
    const int32_t *init;  /* [k/sub][rows]: -zero * (sum of the row's codes over the sub-block), the integer
                           * accumulator's start (so the dot product comes out of codes - zero) */
    const float *sx;      /* [k/sub][rows]: dx * (sum of the row's codes over the sub-block), for offsets */
    const char *weights;  /* one record per group of GROUP columns */
    long record, block;   /* bytes per group record, per block of it */
    float *out;
    long out_stride; /* elements between rows of out */
    int accumulate;  /* out += product instead of out = product (a residual connection) */
} MatmulTask;

/* Row r, columns col .. col+GROUP-1 of a group's results in `values` (only the columns below n are written). */
static inline void store_values(const MatmulTask *t, long row, long col, const float *values)
{
    float *at = t->out + row * t->out_stride + col;
    long count = t->n - col < GROUP ? t->n - col : GROUP;
    for (long c = 0; c < count; c++)
        at[c] = t->accumulate ? at[c] + values[c] : values[c];
}

/* The 32 codes of column c in a block's codes (the layout in the header comment), less the zero point. */
static void column_codes(const KindInfo *info, const uint8_t *codes, int c, int16_t *out)
{
    if (info->bits == 8) {
        for (int chunk = 0; chunk < BLOCK / 4; chunk++)
            for (int e = 0; e < 4; e++)
                out[chunk * 4 + e] = (int16_t)(codes[chunk * 4 * GROUP + c * 4 + e] - info->zero);
        return;
    }
    int sub = info->sub, half = sub / 8; /* vectors per sub-block: chunk q low nibbles, chunk q + half high */
    for (int j = 0; j < BLOCK / sub; j++)
        for (int q = 0; q < half; q++)
            for (int e = 0; e < 4; e++) {
                uint8_t byte = codes[(j * half + q) * 4 * GROUP + c * 4 + e];
                out[j * sub + q * 4 + e] = (int16_t)((byte & 15) - info->zero);
                out[j * sub + (q + half) * 4 + e] = (int16_t)((byte >> 4) - info->zero);
            }
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023, bits;
    if (exponent == 31)
        bits = sign | 0x7f800000u | (mantissa << 13);
    else if (exponent != 0)
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else if (mantissa == 0)
        bits = sign;
    else { /* subnormal: normalise */
        exponent = 113;
        while (!(mantissa & 1024)) {
            mantissa <<= 1;
            exponent--;
        }
        bits = sign | (exponent << 23) | ((mantissa & 1023) << 13);
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* The reference order every path reproduces, one column at a time. Block kinds: for each sub-block j in order,
 * acc = fma(float(integer dot of codes - zero with the row's codes), scale_j * dx_b, acc), then with offsets
 * acc = fma(offset_j, sx_j, acc). Float kinds: four partial sums over k = 0, 1, 2, 3 mod 4, each an fma chain
 * in order, added as (s0 + s1) + (s2 + s3). */
static void matmul_groups_portable(const void *arg, long start, long stop)
{
    const MatmulTask *t = arg;
    const KindInfo *info = &t->info;
    long k = t->k, blocks = k / BLOCK;
    float *column = malloc(sizeof(float) * (size_t)k); /* float kinds: one column's weights */
    int16_t *codes = malloc(sizeof(int16_t) * (size_t)k); /* block kinds: one column's codes - zero */
    if (column == NULL || codes == NULL) {
        free(column);
        free(codes);
        float nan[GROUP];
        for (int c = 0; c < GROUP; c++)
            nan[c] = NAN;
        for (long g = start; g < stop; g++)
            for (long r = 0; r < t->rows; r++)
                store_values(t, r, g * GROUP, nan);
        return;
    }
    for (long g = start; g < stop; g++) {
        const char *record = t->weights + g * t->record;
        float values[32][GROUP];
        for (long r0 = 0; r0 < t->rows; r0 += 32) {
            long rows = t->rows - r0 < 32 ? t->rows - r0 : 32;
            for (int c = 0; c < GROUP; c++) {
                if (info->bits >= 16) {
                    for (long i = 0; i < k; i++) {
                        if (info->bits == 32)
                            memcpy(&column[i], record + (i * GROUP + c) * 4, 4);
                        else {
                            uint16_t h;
                            memcpy(&h, record + (i * GROUP + c) * 2, 2);
                            if (info->bf16) {
                                uint32_t bits = (uint32_t)h << 16;
                                memcpy(&column[i], &bits, 4);
                            } else
                                column[i] = half_to_float(h);
                        }
                    }
                    for (long r = 0; r < rows; r++) {
                        const float *x = t->x + (r0 + r) * k;
                        float s[4] = {0, 0, 0, 0};
                        for (long i = 0; i < k; i += 4)
                            for (int lane = 0; lane < 4; lane++)
                                s[lane] = fmaf(x[i + lane], column[i + lane], s[lane]);
                        values[r][c] = (s[0] + s[1]) + (s[2] + s[3]);
                    }
                    continue;
                }
                for (long b = 0; b < blocks; b++) {
                    const uint8_t *block_codes =
                        (const uint8_t *)record + b * t->block + 4 * GROUP * (BLOCK / info->sub) * (1 + info->offsets);
                    column_codes(info, block_codes, c, codes + b * BLOCK);
                }
                long subs = k / info->sub, per_block = BLOCK / info->sub;
                for (long r = 0; r < rows; r++) {
                    float acc = 0.0f;
                    for (long j = 0; j < subs; j++) {
                        long b = j / per_block, first = (j % per_block) * info->sub;
                        const int8_t *x = t->qx + (b * t->rows + r0 + r) * BLOCK;
                        const float *scales = (const float *)(record + b * t->block);
                        int dot = 0;
                        for (long i = first; i < first + info->sub; i++)
                            dot += codes[b * BLOCK + i] * x[i];
                        acc = fmaf((float)dot, scales[(j % per_block) * GROUP + c] * t->dx[b * t->rows + r0 + r], acc);
                        if (info->offsets)
                            acc = fmaf(scales[(per_block + j % per_block) * GROUP + c], t->sx[j * t->rows + r0 + r], acc);
                    }
                    values[r][c] = acc;
                }
            }
            for (long r = 0; r < rows; r++)
                store_values(t, r0 + r, g * GROUP, values[r]);
        }
    }
    free(column);
    free(codes);
}

#if HAVE_X86
/* ---- AVX2 (and AVX-VNNI): 8 columns (half h of a group) x R rows a tile. ----
 * Nibbles: maddubs of the unsigned codes with the row's signed codes (at most 2 * 15 * 127 a pair of lanes, so the
 * eight chunks of a sub-block add up in 16 bits), then madd by ones to 32 bits. Bytes: the codes as signed values
 * (bytes of kinds with zero point 128 flipped back to int8), maddubs of their magnitude with the row's codes
 * carrying their signs. With AVX-VNNI, vpdpbusd of the unsigned codes with the row's codes. Either way the
 * integer sums are exact, then the float steps are those of the portable loop, lane by lane. */

#define AVX2_ROWS 4

static inline __attribute__((always_inline)) int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define DEFINE_TILE256(NAME, TARGET, VNNI)                                                                         \
    TARGET static inline __attribute__((always_inline)) void NAME(const MatmulTask *t, long g, int h, long r0,     \
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
                for (long line = 0; line < t->block; line += 64)                                                   \
                    _mm_prefetch(block + t->record + line, _MM_HINT_T0);                                           \
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
                                ia[r] = _mm256_dpbusd_avx_epi32(ia[r], lo, xa);                                    \
                                ia[r] = _mm256_dpbusd_avx_epi32(ia[r], hi, xb);                                    \
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
                            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) ia[r] = _mm256_dpbusd_avx_epi32(   \
                                ia[r], w, _mm256_set1_epi32(load_i32(xs + r * BLOCK + 4 * c)));                        \
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

#define AVXVNNI __attribute__((target("avx2,fma,avxvnni")))
DEFINE_TILE256(tile_avx2, AVX2, 0)
DEFINE_TILE256(tile_avxvnni, AVXVNNI, 1)

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

/* ---- AVX512-VNNI: a whole group (16 columns, one zmm) x R rows a tile; vpdpbusd of the unsigned codes with the
 * row's signed codes, broadcast four at a time; the zero point's share is the accumulator's start. ---- */

#define VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define WIDE_ROWS 8 /* the largest tile (12 measured no faster) */
#ifndef PAIR_ROWS
#define PAIR_ROWS 32 /* calls of up to this many rows take two-group tiles */
#endif

/* NG groups (1 or 2: 16 or 32 columns) x R rows: with two groups each broadcast of a row's codes serves two
 * vpdpbusd. Every output element gets the operations of the header comment in their order. */
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
                for (long line = 0; line < t->block; line += 64)
                    _mm_prefetch(block[n] + NG * t->record + line, _MM_HINT_T0);
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

/* The block kinds' compiled shapes: (bits, sub, offsets) of each kind, and tiles of 1, 2, 4 (and 8) rows. */
#define SHAPES(X)                                                                                                  \
    X(4, 32, 1)                                                                                                    \
    X(4, 32, 0)                                                                                                    \
    X(8, 32, 0)                                                                                                    \
    X(8, 32, 1)                                                                                                    \
    X(8, 16, 0)                                                                                                    \
    X(4, 16, 0)                                                                                                    \
    X(4, 16, 1)

typedef void (*tile_fn)(const MatmulTask *, long, int, long, int);

#define TILE256_FNS(PREFIX, TARGET, BODY, BITS, SUB, OFF)                                                           \
    TARGET static void PREFIX##_##BITS##_##SUB##_##OFF##_1(const MatmulTask *t, long g, int h, long r0, int p)     \
    {                                                                                                              \
        BODY(t, g, h, r0, 1, BITS, SUB, OFF, p);                                                                   \
    }                                                                                                              \
    TARGET static void PREFIX##_##BITS##_##SUB##_##OFF##_2(const MatmulTask *t, long g, int h, long r0, int p)     \
    {                                                                                                              \
        BODY(t, g, h, r0, 2, BITS, SUB, OFF, p);                                                                   \
    }                                                                                                              \
    TARGET static void PREFIX##_##BITS##_##SUB##_##OFF##_4(const MatmulTask *t, long g, int h, long r0, int p)     \
    {                                                                                                              \
        BODY(t, g, h, r0, 4, BITS, SUB, OFF, p);                                                                   \
    }
#define AVX2_FNS(BITS, SUB, OFF) TILE256_FNS(t2, AVX2, tile_avx2, BITS, SUB, OFF)
#define AVXVNNI_FNS(BITS, SUB, OFF) TILE256_FNS(tv, AVXVNNI, tile_avxvnni, BITS, SUB, OFF)
SHAPES(AVX2_FNS)
SHAPES(AVXVNNI_FNS)

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
    AVX2 static void f2_##NAME##_1(const MatmulTask *t, long g, int h, long r0, int p)                             \
    {                                                                                                              \
        tile_float_avx2(t, g, h, r0, 1, BITS, BF16);                                                               \
    }                                                                                                              \
    AVX2 static void f2_##NAME##_2(const MatmulTask *t, long g, int h, long r0, int p)                             \
    {                                                                                                              \
        tile_float_avx2(t, g, h, r0, 2, BITS, BF16);                                                               \
    }                                                                                                              \
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

/* A path's tiles for one kind, largest last: fn[i] takes rows[i] rows (NULL past the path's largest). */
typedef struct {
    tile_fn fn[5];
    int rows[5];
    tile_fn pairs[3]; /* 512-bit tiles of two groups: 1, 2, 4 rows (NULL on other paths) */
} TileSet;

#define SET256(PREFIX, BITS, SUB, OFF)                                                                             \
    {                                                                                                              \
        {PREFIX##_##BITS##_##SUB##_##OFF##_1, PREFIX##_##BITS##_##SUB##_##OFF##_2, PREFIX##_##BITS##_##SUB##_##OFF##_4},   \
            {1, 2, 4}                                                                                              \
    }
#define SET512(BITS, SUB, OFF)                                                                                     \
    {                                                                                                              \
        {t5_##BITS##_##SUB##_##OFF##_1, t5_##BITS##_##SUB##_##OFF##_2, t5_##BITS##_##SUB##_##OFF##_4,              \
         t5_##BITS##_##SUB##_##OFF##_8},                                                                           \
            {1, 2, 4, 8},                                                                                          \
            {p5_##BITS##_##SUB##_##OFF##_1, p5_##BITS##_##SUB##_##OFF##_2, p5_##BITS##_##SUB##_##OFF##_4}          \
    }

static int shape_index(const KindInfo *info)
{
    static const int shapes[7][3] = {{4, 32, 1}, {4, 32, 0}, {8, 32, 0}, {8, 32, 1}, {8, 16, 0}, {4, 16, 0}, {4, 16, 1}};
    for (int i = 0; i < 7; i++)
        if (shapes[i][0] == info->bits && shapes[i][1] == info->sub && shapes[i][2] == info->offsets)
            return i;
    return -1;
}

static const TileSet tiles_avx2[7] = {SET256(t2, 4, 32, 1), SET256(t2, 4, 32, 0), SET256(t2, 8, 32, 0),
                                      SET256(t2, 8, 32, 1), SET256(t2, 8, 16, 0), SET256(t2, 4, 16, 0),
                                      SET256(t2, 4, 16, 1)};
static const TileSet tiles_avxvnni[7] = {SET256(tv, 4, 32, 1), SET256(tv, 4, 32, 0), SET256(tv, 8, 32, 0),
                                         SET256(tv, 8, 32, 1), SET256(tv, 8, 16, 0), SET256(tv, 4, 16, 0),
                                         SET256(tv, 4, 16, 1)};
static const TileSet tiles_512[7] = {SET512(4, 32, 1), SET512(4, 32, 0), SET512(8, 32, 0), SET512(8, 32, 1),
                                     SET512(8, 16, 0), SET512(4, 16, 0), SET512(4, 16, 1)};
static const TileSet floats_avx2[3] = {{{f2_f32_1, f2_f32_2}, {1, 2}}, {{f2_f16_1, f2_f16_2}, {1, 2}},
                                       {{f2_bf16_1, f2_bf16_2}, {1, 2}}};
static const TileSet floats_512[3] = {{{f5_f32_1, f5_f32_2, f5_f32_4}, {1, 2, 4}},
                                      {{f5_f16_1, f5_f16_2, f5_f16_4}, {1, 2, 4}},
                                      {{f5_bf16_1, f5_bf16_2, f5_bf16_4}, {1, 2, 4}}};

static const TileSet *tile_set(const KindInfo *info, int path)
{
    if (info->bits >= 16) {
        int index = info->bits == 32 ? 0 : info->bf16 ? 2 : 1;
        return path == ISA_AVX512VNNI ? &floats_512[index] : &floats_avx2[index];
    }
    int index = shape_index(info);
    return path == ISA_AVX512VNNI ? &tiles_512[index] : path == ISA_AVXVNNI ? &tiles_avxvnni[index] : &tiles_avx2[index];
}

typedef struct {
    const MatmulTask *task;
    const TileSet *tiles;
    int halves; /* 1: a tile spans the group's 16 columns; 2: two tiles of 8 */
} TiledTask;

/* A thread's groups: each group's record is read from memory once (and prefetched a group ahead), then every row
 * tile after the first finds it in L1; rows go in tiles of the largest size the path has, then the smaller ones
 * (any split computes every row alike). */
static void matmul_groups_tiled(const void *arg, long start, long stop)
{
    const TiledTask *tiled = arg;
    const MatmulTask *t = tiled->task;
    int largest = 4;
    while (tiled->tiles->fn[largest] == NULL)
        largest--;
    long g = start;
    if (tiled->tiles->pairs[0] != NULL && t->info.bits == 4 && t->rows >= 2 && t->rows <= PAIR_ROWS)
        for (; g + 2 <= stop && (g + 2) * GROUP <= t->n + GROUP - 1; g += 2) {
            int prefetch = g + 3 < stop;
            long r0 = 0;
            for (int size = 2; size >= 0; size--)
                while (t->rows - r0 >= (1L << size)) {
                    tiled->tiles->pairs[size](t, g, 0, r0, prefetch);
                    prefetch = 0;
                    r0 += 1L << size;
                }
        }
    for (; g < stop; g++) {
        int prefetch = g + 1 < stop;
        for (int h = 0; h < tiled->halves; h++) {
            if (h * 8 >= t->n - g * GROUP)
                break;
            long r0 = 0;
            for (int size = largest; size >= 0; size--) {
                long rows = tiled->tiles->rows[size];
                while (t->rows - r0 >= rows) {
                    tiled->tiles->fn[size](t, g, h, r0, prefetch);
                    prefetch = 0;
                    r0 += rows;
                }
            }
        }
    }
}
#endif

/* ----------------------------------------------------- elementwise functions: one formula on every path */

/* e^x, tanh and the two steps built on them (GeLU-tanh gating, soft-capping) give every element the same bits
 * wherever it sits and on every path: the scalar functions (the portable path) and the 8-lane AVX2 ones (every
 * x86 vector path) run the same IEEE operations in the same order (fmaf is the fused multiply-add vfmadd computes,
 * rintf the round-to-nearest-even of _mm256_round_ps, min/max written as minps/maxps compare), and the vector
 * loops take their tail through the same code on a masked load. Accuracy is that of Cephes' expf and tanhf
 * (about 1 ulp; 2-3 ulp after the steps around them). NaN stays NaN. */

#define EXP_HI 88.0f
#define EXP_LO -87.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f /* ln 2 = C1 - C2, C1 with few bits so that n * C1 is exact */
#define EXP_C2 -2.12194440e-4f
#define TANH_SMALL 0.625f /* below: tanh(a) = a + a^3 P(a^2); above: 1 - 2 / (e^(2a) + 1) */
/* GeLU-tanh: 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3); torch's float constants */
#define GELU_KAPPA 0.044715f
#define GELU_MINUS_2BETA (-2.0f * (float)(M_SQRT2 * M_2_SQRTPI * 0.5))

static inline float exp_scalar(float x)
{
    x = EXP_HI < x ? EXP_HI : x; /* minps(88, x): a NaN passes */
    x = EXP_LO > x ? EXP_LO : x;
    float n = rintf(x * EXP_LOG2E);
    float r = fmaf(-n, EXP_C1, x);
    r = fmaf(-n, EXP_C2, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((n == n ? (int32_t)n : 0) + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

static inline float tanh_scalar(float y)
{
    float a = fabsf(y), z = a * a;
    float p = -5.70498872745e-3f;
    p = fmaf(p, z, 2.06390887954e-2f);
    p = fmaf(p, z, -5.37397155531e-2f);
    p = fmaf(p, z, 1.33314422036e-1f);
    p = fmaf(p, z, -3.33332819422e-1f);
    float small = fmaf(p * z, a, a);
    float big = 1.0f - 2.0f / (exp_scalar(a + a) + 1.0f);
    return copysignf(a < TANH_SMALL ? small : big, y);
}

static inline float gelu_tanh_scalar(float x)
{
    float cube = x * x * x;
    return x / (1.0f + exp_scalar(GELU_MINUS_2BETA * (x + GELU_KAPPA * cube)));
}

/* out[i] = GeLU-tanh(gate[i]) * up[i] for i < count. */
static void gelu_tanh_mul_portable(const float *gate, const float *up, long count, float *out)
{
    for (long i = 0; i < count; i++)
        out[i] = gelu_tanh_scalar(gate[i]) * up[i];
}

/* x = cap * tanh(x / cap) in place. */
static void soft_cap_portable(float *x, long count, float cap)
{
    for (long i = 0; i < count; i++)
        x[i] = tanh_scalar(x[i] / cap) * cap;
}

#if HAVE_X86
AVX2 static inline __m256 exp8_exact(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), x);
    x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C2), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i n32 = _mm256_cvtps_epi32(n); /* a NaN's lanes: any exponent, y is NaN there */
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(n32, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

AVX2 static inline __m256 tanh8(__m256 y)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, y), z = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), a, a);
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8_exact(_mm256_add_ps(a, a));
    __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(TANH_SMALL), _CMP_LT_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(sign, y)); /* t >= 0 or NaN: copysign */
}

AVX2 static inline __m256 gelu_tanh8(__m256 x)
{
    __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(GELU_KAPPA), cube));
    __m256 e = exp8_exact(_mm256_mul_ps(_mm256_set1_ps(GELU_MINUS_2BETA), inner));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* Lanes 0 .. count-1 (count < 8) on, the rest off: the tail of a loop, loaded and stored through the same code. */
AVX2 static inline __m256i tail_mask(long count)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AVX2 static void gelu_tanh_mul_avx2(const float *gate, const float *up, long count, float *out)
{
    long i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    if (i < count) {
        __m256i mask = tail_mask(count - i);
        __m256 value = _mm256_mul_ps(gelu_tanh8(_mm256_maskload_ps(gate + i, mask)), _mm256_maskload_ps(up + i, mask));
        _mm256_maskstore_ps(out + i, mask, value);
    }
}

AVX2 static void soft_cap_avx2(float *x, long count, float cap)
{
    const __m256 c = _mm256_set1_ps(cap);
    long i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(tanh8(_mm256_div_ps(_mm256_loadu_ps(x + i), c)), c));
    if (i < count) {
        __m256i mask = tail_mask(count - i);
        _mm256_maskstore_ps(x + i, mask, _mm256_mul_ps(tanh8(_mm256_div_ps(_mm256_maskload_ps(x + i, mask), c)), c));
    }
}
#endif

/* Soft-capping a block's logits (rows x a vocabulary) on the pool, in pieces of SOFT_CAP_ITEM elements: each
 * element is computed alone, so the split changes nothing. (GeLU-tanh runs on the calling thread: a layer's few
 * thousand elements a row cost less than waking the pool.) */
#define SOFT_CAP_ITEM 16384

typedef struct {
    float *x;
    long count;
    float cap;
    int avx2;
} SoftCapTask;

static void soft_cap_items(const void *arg, long start, long stop)
{
    const SoftCapTask *t = arg;
    long i0 = start * SOFT_CAP_ITEM, i1 = stop * SOFT_CAP_ITEM < t->count ? stop * SOFT_CAP_ITEM : t->count;
#if HAVE_X86
    if (t->avx2)
        soft_cap_avx2(t->x + i0, i1 - i0, t->cap);
    else
#endif
        soft_cap_portable(t->x + i0, i1 - i0, t->cap);
}

/* ---------------------------------------------------------------------------------- row-invariant attention */

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
    long row_tile; /* AVX2 work units: 0 = one (row, head) each; else a key/value head's query heads x row_tile rows */
    int wide; /* the 512-bit score and value steps (the avx512vnni path) */
    float cap; /* > 0: scores soft-capped before the softmax, cap * tanh(score / cap) (gemma2); 0: none */
} AttentionTask;

static inline long key_count(const AttentionTask *t, long row)
{
    return t->run_stop[row] - t->run_start[row] + t->extra_start[row + 1] - t->extra_start[row];
}

static inline long key_position(const AttentionTask *t, long row, long j)
{
    long run = t->run_stop[row] - t->run_start[row];
    return j < run ? t->run_start[row] + j : t->extra_pos[t->extra_start[row] + j - run];
}

static inline float load_scalar(const char *base, int bf16, long index)
{
    if (bf16) {
        uint32_t bits = (uint32_t)((const uint16_t *)base)[index] << 16;
        float value;
        memcpy(&value, &bits, sizeof value);
        return value;
    }
    return ((const float *)base)[index];
}

/* Out of memory for the scratch rows: the outputs say so (NaN), the caller raises. */
static void fill_nan(const AttentionTask *t, long start, long stop)
{
    for (long item = start; item < stop; item++)
        for (long d = 0; d < t->dim; d++)
            t->out[(item / t->heads) * t->o_row + (item % t->heads) * t->o_head + d] = NAN;
}

static void attention_items_portable(const void *arg, long start, long stop)
{
    const AttentionTask *t = arg;
    long group = t->heads / t->kv_heads, most = 0;
    for (long item = start; item < stop; item++)
        most = key_count(t, item / t->heads) > most ? key_count(t, item / t->heads) : most;
    float *scores = malloc(sizeof(float) * (size_t)(most > 0 ? most : 1));
    float *acc = malloc(sizeof(float) * (size_t)t->dim);
    if (scores == NULL || acc == NULL) {
        free(scores);
        free(acc);
        fill_nan(t, start, stop);
        return;
    }
    for (long item = start; item < stop; item++) {
        long row = item / t->heads, head = item % t->heads, kv = head / group, keys = key_count(t, row);
        const float *q = t->q + row * t->q_row + head * t->q_head;
        float best = -INFINITY;
        for (long j = 0; j < keys; j++) {
            long pos = key_position(t, row, j);
            float dot = 0.0f;
            for (long d = 0; d < t->dim; d++)
                dot += q[d] * load_scalar(t->k, t->kv_bf16, kv * t->k_head + pos * t->k_pos + d);
            scores[j] = dot * t->scale;
            if (t->cap > 0.0f)
                soft_cap_portable(scores + j, 1, t->cap);
            best = fmaxf(best, scores[j]);
        }
        float total = 0.0f;
        for (long d = 0; d < t->dim; d++)
            acc[d] = 0.0f;
        for (long j = 0; j < keys; j++) {
            float p = expf(scores[j] - best);
            long pos = key_position(t, row, j);
            total += p;
            for (long d = 0; d < t->dim; d++)
                acc[d] += p * load_scalar(t->v, t->kv_bf16, kv * t->v_head + pos * t->v_pos + d);
        }
        float *out = t->out + row * t->o_row + head * t->o_head;
        for (long d = 0; d < t->dim; d++)
            out[d] = acc[d] / total;
    }
    free(scores);
    free(acc);
}

#if HAVE_X86
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

/* The softmax weights of `keys` scores in place (the tail past `keys` padded with -inf, whose weight is 0), and
 * their sum: max over all, then exp(score - max) in groups of 8, summed lane-wise. */
AVX2 static inline float softmax_weights(float *scores, long keys)
{
    __m256 best8 = _mm256_set1_ps(-INFINITY);
    for (long j = keys; j < keys + 8; j++)
        scores[j] = -INFINITY;
    for (long j = 0; j < keys; j += 8)
        best8 = _mm256_max_ps(best8, _mm256_loadu_ps(scores + j));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(best8), _mm256_extractf128_ps(best8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    __m256 best = _mm256_set1_ps(_mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))));
    __m256 total8 = _mm256_setzero_ps(), minus_infinity = _mm256_set1_ps(-INFINITY);
    for (long j = 0; j < keys; j += 8) {
        __m256 score = _mm256_loadu_ps(scores + j);
        __m256 p = _mm256_blendv_ps(exp8(_mm256_sub_ps(score, best)), _mm256_setzero_ps(),
                                    _mm256_cmp_ps(score, minus_infinity, _CMP_EQ_OQ));
        _mm256_storeu_ps(scores + j, p);
        total8 = _mm256_add_ps(total8, p);
    }
    return hsum8(total8);
}

AVX2 static inline __m256 load8_f32(const char *base, long index)
{
    return _mm256_loadu_ps((const float *)base + index);
}

AVX2 static inline __m256 load8_bf16(const char *base, long index)
{
    __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + index));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* Attention for head_dim = 8 * CHUNKS and keys/values of type TYPE (f32 or bf16), in two steps over key blocks,
 * so that the items of a unit (the query heads that share a key/value head, for a few rows) read each block of
 * the cache once from memory and then from the L1 cache:
 *   score_block:  scores[j] = (q . key_j) * scale for j in [j0, j1), four keys at a time;
 *   value_block:  acc += weight_j * value_j for j in [j0, j1), acc kept in `acc_mem` between blocks.
 * Key j of a row is at cache position run_start + j for j < run, then extra[j - run]. Each score and each
 * accumulator lane sees the same operations in the same order whatever the blocks, the unit or the rows. */
#define DEFINE_ATTENTION(CHUNKS, TYPE)                                                                             \
    AVX2 static void score_block_##CHUNKS##_##TYPE(const AttentionTask *t, long row, long head, float *scores,     \
                                                   long j0, long j1)                                               \
    {                                                                                                              \
        const long kv = head / (t->heads / t->kv_heads);                                                           \
        const long run_start = t->run_start[row], run = t->run_stop[row] - run_start;                              \
        const int32_t *extra = t->extra_pos + t->extra_start[row];                                                 \
        const long k_pos = t->k_pos, k_head = kv * t->k_head;                                                      \
        const char *k = t->k;                                                                                      \
        const float *query = t->q + row * t->q_row + head * t->q_head;                                             \
        __m256 q[CHUNKS], scale = _mm256_set1_ps(t->scale);                                                        \
        _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) q[c] = _mm256_loadu_ps(query + 8 * c);          \
        for (long j = j0; j < j1; j += 4) {                                                                        \
            __m256 dots[4];                                                                                        \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                                                  \
                dots[i] = _mm256_setzero_ps();                                                                     \
                long key = j + i;                                                                                  \
                if (key < j1) {                                                                                    \
                    long base = k_head + (key < run ? run_start + key : (long)extra[key - run]) * k_pos;           \
                    dots[i] = _mm256_mul_ps(q[0], load8_##TYPE(k, base));                                          \
                    _Pragma("GCC unroll 16") for (int c = 1; c < CHUNKS; c++)                                      \
                        dots[i] = _mm256_fmadd_ps(q[c], load8_##TYPE(k, base + 8 * c), dots[i]);                   \
                }                                                                                                  \
            }                                                                                                      \
            _mm_storeu_ps(scores + j, _mm_mul_ps(four_scores(dots[0], dots[1], dots[2], dots[3]),                  \
                                                 _mm256_castps256_ps128(scale)));                                  \
        }                                                                                                          \
    }                                                                                                              \
    AVX2 static void value_block_##CHUNKS##_##TYPE(const AttentionTask *t, long row, long head,                    \
                                                   const float *weights, float *acc_mem, long j0, long j1)         \
    {                                                                                                              \
        const long kv = head / (t->heads / t->kv_heads);                                                           \
        const long run_start = t->run_start[row], run = t->run_stop[row] - run_start;                              \
        const int32_t *extra = t->extra_pos + t->extra_start[row];                                                 \
        const long v_pos = t->v_pos, v_head = kv * t->v_head;                                                      \
        const char *v = t->v;                                                                                      \
        __m256 acc[CHUNKS];                                                                                        \
        _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) acc[c] = _mm256_loadu_ps(acc_mem + 8 * c);      \
        for (long key = j0; key < j1; key++) {                                                                     \
            long base = v_head + (key < run ? run_start + key : (long)extra[key - run]) * v_pos;                   \
            __m256 p = _mm256_broadcast_ss(weights + key);                                                         \
            _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++)                                              \
                acc[c] = _mm256_fmadd_ps(p, load8_##TYPE(v, base + 8 * c), acc[c]);                                \
        }                                                                                                          \
        _Pragma("GCC unroll 16") for (int c = 0; c < CHUNKS; c++) _mm256_storeu_ps(acc_mem + 8 * c, acc[c]);      \
    }
DEFINE_ATTENTION(2, f32)
DEFINE_ATTENTION(4, f32)
DEFINE_ATTENTION(8, f32)
DEFINE_ATTENTION(12, f32)
DEFINE_ATTENTION(16, f32)
DEFINE_ATTENTION(32, f32)
DEFINE_ATTENTION(2, bf16)
DEFINE_ATTENTION(4, bf16)
DEFINE_ATTENTION(8, bf16)
DEFINE_ATTENTION(12, bf16)
DEFINE_ATTENTION(16, bf16)
DEFINE_ATTENTION(32, bf16)

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
VNNI512 static float softmax_weights_wide(float *scores, long keys)
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

typedef void (*score_fn)(const AttentionTask *, long, long, float *, long, long);
typedef void (*value_fn)(const AttentionTask *, long, long, const float *, float *, long, long);

#define VARIANT(CHUNKS)                                                                                            \
    if (bf16) {                                                                                                    \
        *score = score_block_##CHUNKS##_bf16;                                                                      \
        *value = value_block_##CHUNKS##_bf16;                                                                      \
    } else {                                                                                                       \
        *score = score_block_##CHUNKS##_f32;                                                                       \
        *value = value_block_##CHUNKS##_f32;                                                                       \
    }

#define WIDE_VARIANT(CHUNKS)                                                                                       \
    if (bf16) {                                                                                                    \
        *score = score_wide_##CHUNKS##_bf16;                                                                       \
        *value = value_wide_##CHUNKS##_bf16;                                                                       \
    } else {                                                                                                       \
        *score = score_wide_##CHUNKS##_f32;                                                                        \
        *value = value_wide_##CHUNKS##_f32;                                                                        \
    }

static void attention_variant(long dim, int bf16, int wide, score_fn *score, value_fn *value)
{
    if (wide) {
        switch (dim) {
        case 16: WIDE_VARIANT(1) break;
        case 32: WIDE_VARIANT(2) break;
        case 64: WIDE_VARIANT(4) break;
        case 96: WIDE_VARIANT(6) break;
        case 256: WIDE_VARIANT(16) break;
        default: WIDE_VARIANT(8) break;
        }
        return;
    }
    switch (dim) {
    case 16: VARIANT(2) break;
    case 32: VARIANT(4) break;
    case 64: VARIANT(8) break;
    case 96: VARIANT(12) break;
    case 256: VARIANT(32) break;
    default: VARIANT(16) break;
    }
}
#undef VARIANT
#undef WIDE_VARIANT

typedef void (*score_group_fn)(const AttentionTask *, long, long, float *, long, long, long);
typedef void (*value_group_fn)(const AttentionTask *, long, long, const float *, long, float *, long, long, long);
#define MAX_GROUP 4

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
static void group_variant(long dim, int bf16, int wide, score_group_fn *score, value_group_fn *value,
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

#define KEY_BLOCK 64 /* keys per block: 64 keys x 128 dims x 4 bytes = 32 KB of keys, an L1 cache's worth */
#define MAX_UNIT_ITEMS 64

/* The items of work unit `unit`: with t->row_tile = 0 one (row, head) pair; otherwise the query heads sharing
 * one key/value head, for a tile of t->row_tile rows. Returns the count, rows and heads in `rows`, `heads`. */
static long unit_items(const AttentionTask *t, long unit, long *rows, long *heads)
{
    if (t->row_tile == 0) {
        rows[0] = unit / t->heads;
        heads[0] = unit % t->heads;
        return 1;
    }
    long group = t->heads / t->kv_heads, tiles = (t->rows + t->row_tile - 1) / t->row_tile;
    long kv = unit / tiles, first_row = (unit % tiles) * t->row_tile, count = 0;
    for (long row = first_row; row < t->rows && row < first_row + t->row_tile; row++)
        for (long head = kv * group; head < (kv + 1) * group && count < MAX_UNIT_ITEMS; head++) {
            rows[count] = row;
            heads[count++] = head;
        }
    return count;
}

/* How many of items i, i+1, .. (at most `most`) are consecutive query heads of the same row: they read the same
 * keys and values, and the grouped steps take them together. */
static inline long same_row_heads(const long *rows, const long *heads, long i, long count, long most)
{
    long n = 1;
    while (n < most && i + n < count && rows[i + n] == rows[i] && heads[i + n] == heads[i] + n)
        n++;
    return n;
}

AVX2 static void attention_units_avx2(const void *arg, long start, long stop)
{
    const AttentionTask *t = arg;
    long rows[MAX_UNIT_ITEMS], heads[MAX_UNIT_ITEMS], most = 0;
    for (long row = 0; row < t->rows; row++)
        most = key_count(t, row) > most ? key_count(t, row) : most;
    long stride = most + 16; /* scores of one item, padded for the four-key groups and the softmax's tail */
    float *scores = malloc(sizeof(float) * (size_t)(stride + t->dim) * MAX_UNIT_ITEMS);
    if (scores == NULL) {
        for (long unit = start; unit < stop; unit++) {
            long count = unit_items(t, unit, rows, heads);
            for (long i = 0; i < count; i++)
                fill_nan(t, rows[i] * t->heads + heads[i], rows[i] * t->heads + heads[i] + 1);
        }
        return;
    }
    float *acc = scores + stride * MAX_UNIT_ITEMS; /* [items][dim] */
    score_fn score;
    value_fn value;
    attention_variant(t->dim, t->kv_bf16, t->wide, &score, &value);
    score_group_fn score_group[MAX_GROUP + 1] = {0};
    value_group_fn value_group[MAX_GROUP + 1] = {0};
    long score_most, value_most;
    group_variant(t->dim, t->kv_bf16, t->wide, score_group, value_group, &score_most, &value_most);
    for (long unit = start; unit < stop; unit++) {
        long count = unit_items(t, unit, rows, heads), longest = 0;
        float totals[MAX_UNIT_ITEMS];
        for (long i = 0; i < count; i++)
            longest = key_count(t, rows[i]) > longest ? key_count(t, rows[i]) : longest;
        for (long j0 = 0; j0 < longest; j0 += KEY_BLOCK)
            for (long i = 0, n; i < count; i += n) {
                long keys = key_count(t, rows[i]), j1 = j0 + KEY_BLOCK < keys ? j0 + KEY_BLOCK : keys;
                n = same_row_heads(rows, heads, i, count, score_most);
                if (j0 >= keys)
                    continue;
                if (n > 1)
                    score_group[n](t, rows[i], heads[i], scores + i * stride, stride, j0, j1);
                else
                    score(t, rows[i], heads[i], scores + i * stride, j0, j1);
            }
        for (long i = 0; i < count; i++) {
            if (t->cap > 0.0f)
                soft_cap_avx2(scores + i * stride, key_count(t, rows[i]), t->cap);
            totals[i] = t->wide ? softmax_weights_wide(scores + i * stride, key_count(t, rows[i]))
                                : softmax_weights(scores + i * stride, key_count(t, rows[i]));
            memset(acc + i * t->dim, 0, sizeof(float) * (size_t)t->dim);
        }
        for (long j0 = 0; j0 < longest; j0 += KEY_BLOCK)
            for (long i = 0, n; i < count; i += n) {
                long keys = key_count(t, rows[i]), j1 = j0 + KEY_BLOCK < keys ? j0 + KEY_BLOCK : keys;
                n = same_row_heads(rows, heads, i, count, value_most);
                if (j0 >= keys)
                    continue;
                if (n > 1)
                    value_group[n](t, rows[i], heads[i], scores + i * stride, stride, acc + i * t->dim, t->dim, j0, j1);
                else
                    value(t, rows[i], heads[i], scores + i * stride, acc + i * t->dim, j0, j1);
            }
        for (long i = 0; i < count; i++) {
            float inverse = 1.0f / totals[i], *out = t->out + rows[i] * t->o_row + heads[i] * t->o_head;
            for (long d = 0; d < t->dim; d++)
                out[d] = acc[i * t->dim + d] * inverse;
        }
    }
    free(scores);
}

static int avx2_attention_dim(long dim)
{
    return dim == 16 || dim == 32 || dim == 64 || dim == 96 || dim == 128 || dim == 256; /* Gemma's 256 */
}
#endif

/* ------------------------------------------------------------------------- the decoder's per-row steps */

/* out = weight * (x / sqrt(mean(x^2) + eps)) per row (Hugging Face's RMSNorm in float32). */
static void rms_norm_rows(const float *x, long rows, long dim, long x_stride, const float *weight, float eps, float *out,
                          long out_stride)
{
    for (long r = 0; r < rows; r++) {
        const float *v = x + r * x_stride;
        float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0.0f;
        long i = 0;
        for (; i + 8 <= dim; i += 8)
            for (int j = 0; j < 8; j++)
                lanes[j] += v[i + j] * v[i + j];
        for (; i < dim; i++)
            tail += v[i] * v[i];
        float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        float inverse = 1.0f / sqrtf((sum + tail) / (float)dim + eps);
        float *o = out + r * out_stride;
        for (i = 0; i < dim; i++)
            o[i] = weight[i] * (v[i] * inverse);
    }
}

/* In place, for `heads` heads of head_dim at base + r * row_stride: x[i] = a cos - b sin, x[i + half] = b cos + a sin
 * with a = x[i], b = x[i + half] for i < half (rotate-half; half < head_dim / 2 leaves the rest of each head as it is:
 * a partial rotary), cos/sin rows [positions][half] at each row's position. */
static void rope_rows(float *base, long rows, long row_stride, long heads, long head_dim, long half,
                      const int32_t *positions, const float *cos_table, const float *sin_table)
{
    for (long r = 0; r < rows; r++) {
        const float *c = cos_table + (long)positions[r] * half, *s = sin_table + (long)positions[r] * half;
        for (long h = 0; h < heads; h++) {
            float *x = base + r * row_stride + h * head_dim;
            for (long i = 0; i < half; i++) {
                float a = x[i], b = x[i + half];
                x[i] = a * c[i] + (-b) * s[i];
                x[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/* Rows of `heads` x dim (at src + r * row_stride) into a cache laid out [head][position][dim] from `start`. */
static void store_rows_into(const float *src, long rows, long row_stride, long heads, long dim, float *dst,
                            long head_stride, long pos_stride, long start)
{
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < heads; h++)
            memcpy(dst + h * head_stride + (start + r) * pos_stride, src + r * row_stride + h * dim,
                   sizeof(float) * (size_t)dim);
}

static void silu_mul_portable(const float *gate_up, long rows, long ffn, float *out)
{
    for (long r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * ffn, *up = gate + ffn;
        for (long i = 0; i < ffn; i++)
            out[r * ffn + i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

#if HAVE_X86
/* e^x for any x (clamped to [-87, 88], where float32 neither overflows nor goes subnormal). */
AVX2 static inline __m256 exp8_any(__m256 x)
{
    return exp8(_mm256_min_ps(x, _mm256_set1_ps(88.0f)));
}

AVX2 static void silu_mul_avx2(const float *gate_up, long rows, long ffn, float *out)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (long r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * ffn, *up = gate + ffn;
        long i = 0;
        for (; i + 8 <= ffn; i += 8) {
            __m256 g = _mm256_loadu_ps(gate + i);
            __m256 denominator = _mm256_add_ps(one, exp8_any(_mm256_sub_ps(zero, g)));
            _mm256_storeu_ps(out + r * ffn + i, _mm256_mul_ps(_mm256_div_ps(g, denominator), _mm256_loadu_ps(up + i)));
        }
        for (; i < ffn; i++)
            out[r * ffn + i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}
#endif

static PyObject *py_rms_norm(PyObject *self, PyObject *args)
{
    Py_ssize_t x, rows, dim, x_stride, weight, out, out_stride;
    double eps;
    if (!PyArg_ParseTuple(args, "nnnnndnn", &x, &rows, &dim, &x_stride, &weight, &eps, &out, &out_stride))
        return NULL;
    rms_norm_rows((const float *)x, rows, dim, x_stride, (const float *)weight, (float)eps, (float *)out, out_stride);
    Py_RETURN_NONE;
}

static PyObject *py_rope(PyObject *self, PyObject *args)
{
    Py_ssize_t base, rows, row_stride, heads, head_dim, positions, cos_table, sin_table, half = -1;
    if (!PyArg_ParseTuple(args, "nnnnnnnn|n", &base, &rows, &row_stride, &heads, &head_dim, &positions, &cos_table,
                          &sin_table, &half))
        return NULL;
    if (half < 0)
        half = head_dim / 2;
    if (2 * half > head_dim) {
        PyErr_SetString(PyExc_ValueError, "rope: half must be at most head_dim / 2");
        return NULL;
    }
    rope_rows((float *)base, rows, row_stride, heads, head_dim, half, (const int32_t *)positions,
              (const float *)cos_table, (const float *)sin_table);
    Py_RETURN_NONE;
}

/* In place: RMSNorm of each of `heads` heads of head_dim at x + r * row_stride (QK-norm), every row in one call;
 * each head as rms_norm computes it. */
static PyObject *py_rms_norm_heads(PyObject *self, PyObject *args)
{
    Py_ssize_t x, rows, row_stride, heads, head_dim, weight;
    double eps;
    if (!PyArg_ParseTuple(args, "nnnnnnd", &x, &rows, &row_stride, &heads, &head_dim, &weight, &eps))
        return NULL;
    for (long r = 0; r < rows; r++) {
        float *row = (float *)x + r * row_stride;
        rms_norm_rows(row, heads, head_dim, head_dim, (const float *)weight, (float)eps, row, head_dim);
    }
    Py_RETURN_NONE;
}

static PyObject *py_store_rows(PyObject *self, PyObject *args)
{
    Py_ssize_t src, rows, row_stride, heads, dim, dst, head_stride, pos_stride, start;
    if (!PyArg_ParseTuple(args, "nnnnnnnnn", &src, &rows, &row_stride, &heads, &dim, &dst, &head_stride, &pos_stride,
                          &start))
        return NULL;
    store_rows_into((const float *)src, rows, row_stride, heads, dim, (float *)dst, head_stride, pos_stride, start);
    Py_RETURN_NONE;
}

static PyObject *py_silu_mul(PyObject *self, PyObject *args)
{
    Py_ssize_t gate_up, rows, ffn, out;
    if (!PyArg_ParseTuple(args, "nnnn", &gate_up, &rows, &ffn, &out))
        return NULL;
#if HAVE_X86
    if (use_avx2)
        silu_mul_avx2((const float *)gate_up, rows, ffn, (float *)out);
    else
#endif
        silu_mul_portable((const float *)gate_up, rows, ffn, (float *)out);
    Py_RETURN_NONE;
}

static PyObject *py_gelu_tanh_mul(PyObject *self, PyObject *args)
{
    Py_ssize_t gate_up, rows, ffn, out;
    if (!PyArg_ParseTuple(args, "nnnn", &gate_up, &rows, &ffn, &out))
        return NULL;
    for (long r = 0; r < rows; r++) {
        const float *gate = (const float *)gate_up + r * 2 * ffn;
#if HAVE_X86
        if (use_avx2)
            gelu_tanh_mul_avx2(gate, gate + ffn, ffn, (float *)out + r * ffn);
        else
#endif
            gelu_tanh_mul_portable(gate, gate + ffn, ffn, (float *)out + r * ffn);
    }
    Py_RETURN_NONE;
}

static PyObject *py_soft_cap(PyObject *self, PyObject *args)
{
    Py_ssize_t x, count;
    double cap;
    if (!PyArg_ParseTuple(args, "nnd", &x, &count, &cap))
        return NULL;
    if (!(cap > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "soft_cap: cap must be > 0");
        return NULL;
    }
    if (count < 1)
        Py_RETURN_NONE;
    SoftCapTask t = {(float *)x, count, (float)cap, use_avx2};
    Py_BEGIN_ALLOW_THREADS
    run_parallel(soft_cap_items, &t, (count + SOFT_CAP_ITEM - 1) / SOFT_CAP_ITEM);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------- the paths' arithmetic peak */

/* Multiply-adds a second of one thread running only the path's multiplying instruction on registers, in
 * independent chains: vpdpbusd on 512 or 256 bits (64 or 32 multiply-adds), or AVX2's vpmaddubsw (32). The
 * benchmark's efficiency divides by this. */
#if HAVE_X86
#define PEAK_ACCUMULATORS 12
VNNI512 static double peak_512(long rounds)
{
    __m512i acc[PEAK_ACCUMULATORS], a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    for (int i = 0; i < PEAK_ACCUMULATORS; i++)
        acc[i] = _mm512_set1_epi32(i);
    for (long n = 0; n < rounds; n++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < PEAK_ACCUMULATORS; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512i sum = acc[0];
    for (int i = 1; i < PEAK_ACCUMULATORS; i++)
        sum = _mm512_add_epi32(sum, acc[i]);
    return (double)_mm512_reduce_add_epi32(sum) * 0 + 64.0 * PEAK_ACCUMULATORS * (double)rounds;
}

AVXVNNI static double peak_avxvnni(long rounds)
{
    __m256i acc[PEAK_ACCUMULATORS], a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(2);
    for (int i = 0; i < PEAK_ACCUMULATORS; i++)
        acc[i] = _mm256_set1_epi32(i);
    for (long n = 0; n < rounds; n++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < PEAK_ACCUMULATORS; i++) acc[i] =
            _mm256_dpbusd_avx_epi32(acc[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    volatile int sink = hsum8i(acc[0]);
    (void)sink;
    return 32.0 * PEAK_ACCUMULATORS * (double)rounds;
}

AVX2 static double peak_avx2(long rounds)
{
    /* vpmaddubsw alone (32 multiply-adds), its pairs summed in 16 bits: eight chains, each its own operand */
    __m256i b = _mm256_set1_epi8(2);
    __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3), a3 = _mm256_set1_epi8(4),
            a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6), a6 = _mm256_set1_epi8(7), a7 = _mm256_set1_epi8(8);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
#define PEAK_STEP(A, C) C = _mm256_add_epi16(C, _mm256_maddubs_epi16(A, b))
    for (long n = 0; n < rounds; n++) {
        PEAK_STEP(a0, c0);
        PEAK_STEP(a1, c1);
        PEAK_STEP(a2, c2);
        PEAK_STEP(a3, c3);
        PEAK_STEP(a4, c4);
        PEAK_STEP(a5, c5);
        PEAK_STEP(a6, c6);
        PEAK_STEP(a7, c7);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7));
    }
#undef PEAK_STEP
    __m256i sum = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(c0, c1), _mm256_add_epi16(c2, c3)),
                                   _mm256_add_epi16(_mm256_add_epi16(c4, c5), _mm256_add_epi16(c6, c7)));
    volatile int sink = hsum8i(sum);
    (void)sink;
    return 32.0 * 8 * (double)rounds;
}
#endif

static PyObject *py_peak(PyObject *self, PyObject *args)
{
    const char *name;
    double seconds = 0.05;
    if (!PyArg_ParseTuple(args, "s|d", &name, &seconds))
        return NULL;
    int path = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(name, isa_names[i]) == 0 && cpu_has[i])
            path = i;
    if (path <= ISA_PORTABLE) {
        PyErr_Format(PyExc_ValueError, "no arithmetic peak for %s here", name);
        return NULL;
    }
    double best = 0.0;
#if HAVE_X86
    Py_BEGIN_ALLOW_THREADS
    double stop = now_seconds() + seconds;
    while (now_seconds() < stop) {
        double start = now_seconds(), macs;
        long rounds = 20000;
        macs = path == ISA_AVX512VNNI ? peak_512(rounds) : path == ISA_AVXVNNI ? peak_avxvnni(rounds) : peak_avx2(rounds);
        double rate = macs / (now_seconds() - start);
        best = rate > best ? rate : best;
    }
    Py_END_ALLOW_THREADS
#endif
    return PyFloat_FromDouble(best);
}


/* -------------------------------------------------------------------------------------- Python bindings */

static PyObject *py_matmul(PyObject *self, PyObject *args)
{
    int kind, accumulate = 0;
    Py_ssize_t x, rows, k, n, weights, out, out_stride = -1;
    if (!PyArg_ParseTuple(args, "innnnnn|np", &kind, &x, &rows, &k, &n, &weights, &out, &out_stride, &accumulate))
        return NULL;
    if (out_stride < 0)
        out_stride = n;
    KindInfo info;
    if (!kind_info(kind, &info) || rows < 1 || k < BLOCK || k % BLOCK != 0 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "matmul: an unknown kind, or rows and n < 1, or k not a multiple of 32");
        return NULL;
    }
    long blocks = k / BLOCK, groups = (n + GROUP - 1) / GROUP, subs = info.bits < 16 ? k / info.sub : 0;
    int8_t *qx = NULL;
    float *dx = NULL, *sx = NULL;
    int32_t *sums = NULL, *init = NULL;
    if (info.bits < 16) {
        qx = malloc((size_t)(rows * k));
        dx = malloc(sizeof(float) * (size_t)(rows * blocks));
        sx = malloc(sizeof(float) * (size_t)(rows * subs));
        sums = malloc(sizeof(int32_t) * (size_t)(rows * 2 * blocks));
        init = malloc(sizeof(int32_t) * (size_t)(rows * subs));
        if (qx == NULL || dx == NULL || sx == NULL || sums == NULL || init == NULL) {
            free(qx);
            free(dx);
            free(sx);
            free(sums);
            free(init);
            return PyErr_NoMemory();
        }
    }
    int path = isa_path;
    MatmulTask task = {info, rows, k, n, (const float *)x, qx, dx, init, sx, (const char *)weights,
                       group_bytes(&info, k), info.bits < 16 ? block_bytes(&info) : 0, (float *)out, out_stride,
                       accumulate};
    Py_BEGIN_ALLOW_THREADS
    if (info.bits < 16) {
        quantize_rows((const float *)x, rows, k, qx, dx, sums);
        /* AVX2 multiplies the bytes of zero point 128 as the signed values they encode: no zero point there */
        int zero = path == ISA_AVX2 && info.bits == 8 && info.zero == 128 ? 0 : info.zero;
        for (long j = 0; j < subs; j++)
            for (long r = 0; r < rows; r++) {
                int32_t sum = info.sub == 32 ? sums[2 * j * rows + r] + sums[(2 * j + 1) * rows + r] : sums[j * rows + r];
                init[j * rows + r] = -zero * sum;
                sx[j * rows + r] = dx[(j * info.sub / BLOCK) * rows + r] * (float)sum;
            }
    }
#if HAVE_X86
    if (path != ISA_PORTABLE) {
        TiledTask tiled = {&task, tile_set(&info, path), path == ISA_AVX512VNNI ? 1 : 2};
        run_parallel(matmul_groups_tiled, &tiled, groups);
    } else
#endif
        run_parallel(matmul_groups_portable, &task, groups);
    Py_END_ALLOW_THREADS
    free(qx);
    free(dx);
    free(sx);
    free(sums);
    free(init);
    Py_RETURN_NONE;
}

static PyObject *py_record_bytes(PyObject *self, PyObject *args)
{
    int kind;
    Py_ssize_t k;
    KindInfo info;
    if (!PyArg_ParseTuple(args, "in", &kind, &k))
        return NULL;
    if (!kind_info(kind, &info) || k < BLOCK || k % BLOCK != 0) {
        PyErr_SetString(PyExc_ValueError, "record_bytes: an unknown kind, or k not a multiple of 32");
        return NULL;
    }
    return PyLong_FromLong(group_bytes(&info, k));
}

static PyObject *py_attention(PyObject *self, PyObject *args)
{
    AttentionTask t;
    Py_ssize_t rows, heads, kv_heads, dim, q, q_row, q_head, k, v, k_head, k_pos, v_head, v_pos, run_start, run_stop,
        extra_start, extra_pos, out, o_row, o_head;
    int kv_bf16;
    double scale, cap = 0.0;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnpnnnnnnnndnnn|d", &rows, &heads, &kv_heads, &dim, &q, &q_row, &q_head, &k,
                          &v, &kv_bf16, &k_head, &k_pos, &v_head, &v_pos, &run_start, &run_stop, &extra_start,
                          &extra_pos, &scale, &out, &o_row, &o_head, &cap))
        return NULL;
    if (rows < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || dim < 1 || !(cap >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "attention: rows, heads and dim >= 1, heads a multiple of kv_heads, cap >= 0");
        return NULL;
    }
    t = (AttentionTask){rows, heads, kv_heads, dim, (const float *)q, q_row, q_head, (const char *)k,
                        (const char *)v, kv_bf16, k_head, k_pos, v_head, v_pos, (const int32_t *)run_start,
                        (const int32_t *)run_stop, (const int32_t *)extra_start, (const int32_t *)extra_pos, (float)scale, (float *)out, o_row,
                        o_head, 0, isa_path == ISA_AVX512VNNI, (float)cap};
    Py_BEGIN_ALLOW_THREADS
#if HAVE_X86
    if (use_avx2 && avx2_attention_dim(dim)) {
        /* One row: its heads as units, for the threads' balance. Several rows: a unit is one key/value head's
         * query heads for a tile of rows (at least two units per kv head), which then share each key block. */
        long group = heads / kv_heads;
        t.row_tile = rows == 1 || group > MAX_UNIT_ITEMS ? 0 : rows / 2 < 1 ? 1 : rows / 2;
        while (t.row_tile > 1 && (t.row_tile > 4 || t.row_tile * group > MAX_UNIT_ITEMS))
            t.row_tile--;
        long units = t.row_tile == 0 ? rows * heads : kv_heads * ((rows + t.row_tile - 1) / t.row_tile);
        run_parallel(attention_units_avx2, &t, units);
    } else
#endif
        run_parallel(attention_items_portable, &t, rows * heads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_set_threads(PyObject *self, PyObject *args)
{
    int count;
    if (!PyArg_ParseTuple(args, "i", &count))
        return NULL;
    if (count < 1 || count > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be between 1 and %d", MAX_THREADS);
        return NULL;
    }
    if (count == pool.count)
        Py_RETURN_NONE;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&pool.job_lock);
    stop_workers();
    failed = start_workers(count);
    pthread_mutex_unlock(&pool.job_lock);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_OSError, "could not start the kernels' worker threads");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_threads(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(pool.count);
}

static PyObject *py_isa(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(isa_names[isa_path]);
}

static PyObject *py_isas(PyObject *self, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    for (int i = 0; list != NULL && i < 4; i++)
        if (cpu_has[i]) {
            PyObject *name = PyUnicode_FromString(isa_names[i]);
            if (name == NULL || PyList_Append(list, name) < 0) {
                Py_XDECREF(name);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(name);
        }
    return list;
}

static PyObject *py_set_isa(PyObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    if (strcmp(name, "best") == 0) {
        isa_path = isa_best;
        Py_RETURN_NONE;
    }
    for (int i = 0; i < 4; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            if (!cpu_has[i]) {
                PyErr_Format(PyExc_ValueError, "this CPU cannot run the %s path", name);
                return NULL;
            }
            isa_path = i;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "unknown instruction set %s (portable, avx2, avxvnni, avx512vnni or best)", name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"matmul", py_matmul, METH_VARARGS, "matmul(kind, x, rows, k, n, weights, out[, out_stride, accumulate])"},
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, rows, dim, x_stride, weight, eps, out, out_stride)"},
    {"rope", py_rope, METH_VARARGS, "rope(base, rows, row_stride, heads, head_dim, positions, cos, sin[, half])"},
    {"store_rows", py_store_rows, METH_VARARGS, "store_rows(src, rows, row_stride, heads, dim, dst, head_stride, pos_stride, start)"},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu_mul(gate_up, rows, ffn, out)"},
    {"gelu_tanh_mul", py_gelu_tanh_mul, METH_VARARGS, "gelu_tanh_mul(gate_up, rows, ffn, out): GeLU-tanh(gate) * up"},
    {"soft_cap", py_soft_cap, METH_VARARGS, "soft_cap(x, count, cap): x = cap * tanh(x / cap) in place"},
    {"rms_norm_heads", py_rms_norm_heads, METH_VARARGS,
     "rms_norm_heads(x, rows, row_stride, heads, head_dim, weight, eps): each head of every row, in place"},
    {"attention", py_attention, METH_VARARGS, "row-invariant attention over each row's own keys (pointers as ints)"},
    {"set_threads", py_set_threads, METH_VARARGS, "set_threads(n): the pool's threads, the caller included"},
    {"threads", py_threads, METH_NOARGS, "threads(): the pool's threads, the caller included"},
    {"isa", py_isa, METH_NOARGS, "isa(): the path in use: 'avx512vnni', 'avxvnni', 'avx2' or 'portable'"},
    {"isas", py_isas, METH_NOARGS, "isas(): the paths this CPU can run, best last"},
    {"set_isa", py_set_isa, METH_VARARGS, "set_isa(name): run on that path ('best': the best the CPU has)"},
    {"peak", py_peak, METH_VARARGS, "peak(isa[, seconds]): one thread's multiply-adds a second on that path's dot products"},
    {"record_bytes", py_record_bytes, METH_VARARGS, "record_bytes(kind, k): bytes of one group's record"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu", "specdec's CPU kernels (see kernels/__init__.py)",
                                    -1, methods};

PyMODINIT_FUNC PyInit__cpu(void)
{
#if HAVE_X86
    __builtin_cpu_init();
    cpu_has[ISA_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    cpu_has[ISA_AVXVNNI] = cpu_has[ISA_AVX2] && __builtin_cpu_supports("avxvnni");
    cpu_has[ISA_AVX512VNNI] = cpu_has[ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                              __builtin_cpu_supports("avx512vnni");
    for (int i = 0; i < 4; i++)
        if (cpu_has[i])
            isa_best = i;
    isa_path = isa_best;
#endif
    pthread_atfork(NULL, NULL, after_fork_in_child);
    return PyModule_Create(&module);
}
