/*
 * top_tokens.c: each row's highest logits: the ids of its `k` largest values (k <= TOP_MAX), largest first, a tie going to the
 * lower id; a NaN counts as larger than any number, as torch.argmax counts it. So column 0 is torch.argmax's
 * answer, the first maximum, bit for bit, on every path. A verify step reads the target's choice (and, for a
 * drafter that asks, its top 8) at every row of a block; torch's argmax and topk over a 152k vocabulary cost
 * 0.3-0.5 ms a row on two threads, this a few hundredths.
 *
 * A row is cut into pieces of TOP_PIECE logits, one work item each on the pool (rows x pieces items): each piece
 * keeps its own top k in one pass, where a vector of 8 logits none of which beats the piece's current k-th is
 * skipped after one compare (almost every vector, once the first k are in); the pieces' lists are then merged per
 * row on the calling thread. Pieces cover increasing ids, so within a piece a later equal value never displaces an
 * earlier one, and the merge breaks ties by id.
 *
 * Not here: sampling (the engine's), any other reduction.
 */
#include "kernels.h"

#define TOP_MAX 16
#define TOP_PIECE 16384

typedef struct {
    const float *logits;
    long vocab, k, pieces;
    float *values;   /* [rows * pieces][k] each piece's top values, largest first (-inf where fewer) */
    int32_t *ids;    /* [rows * pieces][k] their ids (-1 where fewer) */
    int avx2;
} TopTask;

/* Whether (value a, id ia) ranks above (b, ib): larger first, NaN largest, ties to the lower id. */
static inline int ranks_above(float a, int32_t ia, float b, int32_t ib)
{
    if (ib < 0)
        return ia >= 0;
    int nan_a = a != a, nan_b = b != b;
    if (nan_a || nan_b)
        return nan_a && (!nan_b || ia < ib);
    return a > b || (a == b && ia < ib);
}

/* Put (value, id) into a list of k kept largest first, if it ranks above the last; ids arrive increasing. */
static inline void keep_top(float *values, int32_t *ids, long k, float value, int32_t id)
{
    if (!ranks_above(value, id, values[k - 1], ids[k - 1]))
        return;
    long at = k - 1;
    while (at > 0 && ranks_above(value, id, values[at - 1], ids[at - 1])) {
        values[at] = values[at - 1];
        ids[at] = ids[at - 1];
        at--;
    }
    values[at] = value;
    ids[at] = id;
}

static void top_piece_portable(const float *row, long start, long stop, long k, float *values, int32_t *ids)
{
    for (long i = start; i < stop; i++)
        keep_top(values, ids, k, row[i], (int32_t)i);
}

#if HAVE_X86
AVX2 static void top_piece_avx2(const float *row, long start, long stop, long k, float *values, int32_t *ids)
{
    long i = start;
    for (; i < stop && ids[k - 1] < 0; i++) /* the first k fill the list */
        keep_top(values, ids, k, row[i], (int32_t)i);
    for (; i + 8 <= stop; i += 8) {
        __m256 v = _mm256_loadu_ps(row + i);
        __m256 last = _mm256_set1_ps(values[k - 1]);
        /* lanes above the k-th, or NaN (unordered): only those can enter; equal ones cannot (a higher id) */
        if (values[k - 1] != values[k - 1])
            break; /* k NaN kept: nothing later ranks above them (the tail loop below agrees) */
        int hits = _mm256_movemask_ps(_mm256_cmp_ps(v, last, _CMP_NLE_UQ));
        while (hits) {
            int lane = __builtin_ctz((unsigned)hits);
            hits &= hits - 1;
            keep_top(values, ids, k, row[i + lane], (int32_t)(i + lane));
        }
    }
    for (; i < stop; i++)
        keep_top(values, ids, k, row[i], (int32_t)i);
}
#endif

static void top_items(const void *arg, long first, long last)
{
    const TopTask *t = arg;
    for (long item = first; item < last; item++) {
        long row = item / t->pieces, piece = item % t->pieces;
        long start = piece * TOP_PIECE, stop = start + TOP_PIECE < t->vocab ? start + TOP_PIECE : t->vocab;
        float *values = t->values + item * t->k;
        int32_t *ids = t->ids + item * t->k;
        for (long j = 0; j < t->k; j++) {
            values[j] = -INFINITY;
            ids[j] = -1;
        }
        const float *logits = t->logits + row * t->vocab;
#if HAVE_X86
        if (t->avx2) {
            top_piece_avx2(logits, start, stop, t->k, values, ids);
            continue;
        }
#endif
        top_piece_portable(logits, start, stop, t->k, values, ids);
    }
}

int cpu_top_tokens(int path, const float *logits, long rows, long vocab, long k, int32_t *out)
{
    if (k < 1 || k > TOP_MAX || k > vocab || rows < 1)
        return -1;
    long pieces = (vocab + TOP_PIECE - 1) / TOP_PIECE;
    float *values = malloc(sizeof(float) * rows * pieces * k);
    int32_t *ids = malloc(sizeof(int32_t) * rows * pieces * k);
    if (!values || !ids) {
        free(values);
        free(ids);
        return -2;
    }
    TopTask t = {logits, vocab, k, pieces, values, ids, path >= ISA_AVX2};
    cpu_run_parallel(top_items, &t, rows * pieces);
    for (long row = 0; row < rows; row++) { /* the pieces' lists merged: insertion keeps the ranking's order */
        float merged_values[TOP_MAX];
        int32_t merged_ids[TOP_MAX];
        for (long j = 0; j < k; j++) {
            merged_values[j] = -INFINITY;
            merged_ids[j] = -1;
        }
        for (long piece = 0; piece < pieces; piece++) {
            const float *piece_values = values + (row * pieces + piece) * k;
            const int32_t *piece_ids = ids + (row * pieces + piece) * k;
            for (long j = 0; j < k && piece_ids[j] >= 0; j++)
                keep_top(merged_values, merged_ids, k, piece_values[j], piece_ids[j]);
        }
        for (long j = 0; j < k; j++)
            out[row * k + j] = merged_ids[j];
    }
    free(values);
    free(ids);
    return 0;
}
