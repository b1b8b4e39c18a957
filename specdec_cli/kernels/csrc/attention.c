/*
 * attention.c: row-invariant attention, softmax(q . k * scale) v per query row and head, each row over its own
 * keys (a contiguous run of cache positions, then a list of further positions: a tree node's ancestors), keys and
 * values float32 or bfloat16 read in place through strides; cap > 0 soft-caps the scores first (gemma2).
 * cpu_attention splits the work across the pool: on the portable path (and for head sizes the vector steps do not
 * take) one (row, head) item at a time, in scalar C; on the vector paths in units (a key/value head's query heads
 * for a tile of rows) that read each block of keys once, through the AVX2 steps here or the 512-bit steps of
 * attention_avx512.c (avx512vnni). Each path rounds in its own order, each row-invariant.
 * Not here: the 512-bit steps (attention_avx512.c), soft-capping (elementwise.c), argument checks (../_cpu.c).
 */
#include "kernels.h"

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
                cpu_soft_cap_portable(scores + j, 1, t->cap);
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
/* ------------------------------------------------------------------------- the vector paths: units of items */

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

#define VARIANT(CHUNKS)                                                                                            \
    if (bf16) {                                                                                                    \
        *score = score_block_##CHUNKS##_bf16;                                                                      \
        *value = value_block_##CHUNKS##_bf16;                                                                      \
    } else {                                                                                                       \
        *score = score_block_##CHUNKS##_f32;                                                                       \
        *value = value_block_##CHUNKS##_f32;                                                                       \
    }

static void attention_variant(long dim, int bf16, int wide, score_fn *score, value_fn *value)
{
    if (wide) {
        cpu_attention_wide_steps(dim, bf16, score, value);
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

#define KEY_BLOCK 64 /* keys per block: 64 keys x 128 dims x 4 bytes = 32 KB of keys, an L1 cache's worth */
#define MAX_UNIT_ITEMS 64

/* The items of work unit `unit`: with t->row_tile = 0 one (row, head) pair; otherwise t->head_tile of the query
 * heads sharing one key/value head (all of them, or a part), for a tile of t->row_tile rows. Returns the count,
 * rows and heads in `rows`, `heads`. */
static long unit_items(const AttentionTask *t, long unit, long *rows, long *heads)
{
    if (t->row_tile == 0) {
        rows[0] = unit / t->heads;
        heads[0] = unit % t->heads;
        return 1;
    }
    long group = t->heads / t->kv_heads, tiles = (t->rows + t->row_tile - 1) / t->row_tile;
    long parts = (group + t->head_tile - 1) / t->head_tile, place = unit / tiles;
    long kv = place / parts, first_head = kv * group + (place % parts) * t->head_tile;
    long stop_head = first_head + t->head_tile < (kv + 1) * group ? first_head + t->head_tile : (kv + 1) * group;
    long first_row = (unit % tiles) * t->row_tile, count = 0;
    for (long row = first_row; row < t->rows && row < first_row + t->row_tile; row++)
        for (long head = first_head; head < stop_head && count < MAX_UNIT_ITEMS; head++) {
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
    cpu_attention_group_steps(t->dim, t->kv_bf16, t->wide, score_group, value_group, &score_most, &value_most);
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
                cpu_soft_cap_avx2(scores + i * stride, key_count(t, rows[i]), t->cap);
            totals[i] = t->wide ? cpu_softmax_weights_wide(scores + i * stride, key_count(t, rows[i]))
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

/* The AVX2 or 512-bit steps' units of `t` (its row_tile and head_tile set here). A unit is a key/value head's
 * query heads for a tile of rows, which read each block of keys and values once from memory and then from the L1
 * cache: a decoding step's cache outgrows the caches and streams from memory, and units of single heads read a
 * long context's keys once per query head. One row: the group is cut in parts only where there are fewer
 * key/value heads than threads (the threads' balance); several rows: tiles of up to 4 rows, at least two per
 * key/value head. Groups too large for a unit (more than MAX_UNIT_ITEMS heads) take one (row, head) a unit. */
static long plan_units(AttentionTask *t)
{
    long group = t->heads / t->kv_heads, parts = 1;
    t->head_tile = group;
    if (group > MAX_UNIT_ITEMS) {
        t->row_tile = 0;
        return t->rows * t->heads;
    }
    if (t->rows == 1) {
        t->row_tile = 1;
        if (t->kv_heads < cpu_threads()) {
            parts = (cpu_threads() + t->kv_heads - 1) / t->kv_heads;
            parts = parts < group ? parts : group;
            t->head_tile = (group + parts - 1) / parts;
            parts = (group + t->head_tile - 1) / t->head_tile;
        }
        return t->kv_heads * parts;
    }
    t->row_tile = t->rows / 2;
    while (t->row_tile > 1 && (t->row_tile > 4 || t->row_tile * group > MAX_UNIT_ITEMS))
        t->row_tile--;
    return t->kv_heads * ((t->rows + t->row_tile - 1) / t->row_tile);
}

static void run_units(AttentionTask *t)
{
    cpu_run_parallel(attention_units_avx2, t, plan_units(t));
}

/* Several tasks' units as one list (task i's units follow task i-1's): one call of the pool for all of them. */
typedef struct {
    AttentionTask *tasks;
    const long *first; /* [count + 1]: task i's units are first[i] .. first[i+1]-1 of the list */
    long count;
} ManyTasks;

static void many_units(const void *arg, long start, long stop)
{
    const ManyTasks *m = arg;
    for (long i = 0; i < m->count && start < stop; i++) {
        long from = start > m->first[i] ? start : m->first[i], to = stop < m->first[i + 1] ? stop : m->first[i + 1];
        if (from < to)
            attention_units_avx2(&m->tasks[i], from - m->first[i], to - m->first[i]);
    }
}
#else /* no vector path on this CPU: the path is always ISA_PORTABLE (run_units stands for the portable loop) */
#define avx2_attention_dim(dim) 0
#define run_units(t) cpu_run_parallel(attention_items_portable, t, (t)->rows * (t)->heads)
#endif

/* Attention of every (row, head) of `t` on `path` (t's row_tile and wide are set here). */
void cpu_attention(AttentionTask *t, int path)
{
    t->row_tile = 0;
    t->wide = path == ISA_AVX512VNNI;
    if (path >= ISA_AVX2 && avx2_attention_dim(t->dim))
        run_units(t);
    else
        cpu_run_parallel(attention_items_portable, t, t->rows * t->heads);
}

/* Each of `count` tasks (the sequences of a batched step, each over its own cache) as cpu_attention computes it
 * alone, the same units in the same steps, so the same bits; on the vector paths their units go to the pool in one
 * call (a sequence's one-row attention is a few microseconds of work, of which a call of the pool was half). */
void cpu_attention_many(AttentionTask *tasks, long count, int path)
{
#if HAVE_X86
    long first[MAX_MANY_TASKS + 1];
    int together = count <= MAX_MANY_TASKS && path >= ISA_AVX2;
    for (long i = 0; i < count && together; i++)
        together = avx2_attention_dim(tasks[i].dim);
    if (together) {
        first[0] = 0;
        for (long i = 0; i < count; i++) {
            tasks[i].wide = path == ISA_AVX512VNNI;
            first[i + 1] = first[i] + plan_units(&tasks[i]);
        }
        ManyTasks many = {tasks, first, count};
        cpu_run_parallel(many_units, &many, first[count]);
        return;
    }
#endif
    for (long i = 0; i < count; i++)
        cpu_attention(&tasks[i], path);
}
