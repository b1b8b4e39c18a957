/*
 * matmul.c: out[rows, n] (+)= x[rows, k] @ W^T for W held as records (../_cpu.c's header comment gives the layout
 * and the order of operations every path reproduces). cpu_matmul rounds the rows to 8-bit blocks (blocks.c), then
 * splits the record groups across the pool: on the portable path to the reference loop here, one column at a time;
 * on the vector paths to the tiled driver here, which runs each group's rows through the path's tiles.
 * Not here: the tiles themselves (matmul_avx2.c: avx2 and avxvnni; matmul_avx512.c: avx512vnni), the record
 * layout's sizes (blocks.c) and argument checks (../_cpu.c).
 */
#include "kernels.h"

#ifndef PAIR_ROWS
#define PAIR_ROWS 32 /* calls of up to this many rows take two-group tiles (avx512vnni, nibble kinds) */
#endif

/* Row r, columns col .. col+GROUP-1 of a group's results in `values` (only the columns below n are written). */
void cpu_store_values(const MatmulTask *t, long row, long col, const float *values)
{
    float *at = t->out + row * t->out_stride + col;
    long count = t->n - col < GROUP ? t->n - col : GROUP;
    for (long c = 0; c < count; c++)
        at[c] = t->accumulate ? at[c] + values[c] : values[c];
}

/* Groups start .. stop-1 of every row set to NaN: what a loop that could not allocate its scratch leaves. */
void cpu_store_nan(const MatmulTask *t, long start, long stop)
{
    float nan[GROUP];
    for (int c = 0; c < GROUP; c++)
        nan[c] = NAN;
    for (long g = start; g < stop; g++)
        for (long r = 0; r < t->rows; r++)
            cpu_store_values(t, r, g * GROUP, nan);
}

/* The 32 codes of column c in a block's codes (the layout in ../_cpu.c's header comment), less the zero point. */
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

float cpu_half_to_float(uint16_t h)
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
        cpu_store_nan(t, start, stop);
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
                                column[i] = cpu_half_to_float(h);
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
                cpu_store_values(t, r0 + r, g * GROUP, values[r]);
        }
    }
    free(column);
    free(codes);
}

#if HAVE_X86
/* -------------------------------------------------------------------------- the vector paths: tiles of rows */

int cpu_avxvnni_encoding = VNNI_VEX;

static int shape_index(const KindInfo *info)
{
#define SHAPE_ROW(BITS, SUB, OFF) {BITS, SUB, OFF},
    static const int shapes[SHAPE_COUNT][3] = {SHAPES(SHAPE_ROW)};
#undef SHAPE_ROW
    for (int i = 0; i < SHAPE_COUNT; i++)
        if (shapes[i][0] == info->bits && shapes[i][1] == info->sub && shapes[i][2] == info->offsets)
            return i;
    return -1;
}

static const TileSet *tile_set(const KindInfo *info, int path)
{
    if (info->form != FORM_RECORDS) {
        int legacy = info->table ? 8 : info->bits == 4 ? info->offsets : info->bits == 5 ? 2 + info->offsets : 4;
        int index = info->form == FORM_LEGACY ? legacy
                    : info->form == FORM_K    ? (info->bits == 4 ? 5 : 6)
                    : info->form == FORM_Q6K  ? 7
                                              : 9;
        if (path == ISA_AVXVNNI)
            return cpu_avxvnni_encoding == VNNI_EVEX ? &cpu_tiles_packed_vnni_evex[index]
                                                     : &cpu_tiles_packed_vnni[index];
        return path == ISA_AVX512VNNI ? &cpu_tiles_packed_512[index] : &cpu_tiles_packed[index];
    }
    if (info->bits >= 16) {
        int index = info->bits == 32 ? 0 : info->bf16 ? 2 : 1;
        return path == ISA_AVX512VNNI ? &cpu_floats_512[index] : &cpu_floats_avx2[index];
    }
    int index = shape_index(info);
    if (path == ISA_AVX512VNNI)
        return &cpu_tiles_512[index];
    if (path == ISA_AVXVNNI)
        return cpu_avxvnni_encoding == VNNI_EVEX ? &cpu_tiles_vnni_evex[index] : &cpu_tiles_avxvnni[index];
    return &cpu_tiles_avx2[index];
}

typedef struct {
    const MatmulTask *task;
    const TileSet *tiles;
    int halves; /* 1: a tile spans the group's 16 columns; 2: two tiles of 8 */
} TiledTask;

/* A thread's groups: each group's record is read from memory once (prefetched PREFETCH_AHEAD bytes ahead), then
 * every row tile after the first finds it in L1; rows go in tiles of the largest size the path has, then what is
 * left in one tile of its own size where the path has one (`rest`), else in the smaller ones (any split computes
 * every row alike). */
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
    if (tiled->halves == 2 && tiled->tiles->whole != NULL && t->rows == 1) /* one row: each record in one pass */
        for (; g < stop; g++)
            tiled->tiles->whole(t, g, 0, 0, g + 1 < stop);
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
                long left = t->rows - r0; /* 3, 5, 6 or 7 rows in one pass where the path has such a tile */
                if (left > 0 && left < 8 && tiled->tiles->rest[left] != NULL) {
                    tiled->tiles->rest[left](t, g, h, r0, prefetch);
                    prefetch = 0;
                    r0 = t->rows;
                }
            }
        }
    }
}

/* The groups on the path's tiles. */
static void run_tiles(const MatmulTask *task, int path, long groups)
{
    /* avx512vnni's tiles span a group's 16 columns; the 256-bit paths' tiles take 8 */
    TiledTask tiled = {task, tile_set(&task->info, path), path == ISA_AVX512VNNI ? 1 : 2};
    cpu_run_parallel(matmul_groups_tiled, &tiled, groups);
}
#else /* no vector path on this CPU: the path is always ISA_PORTABLE (run_tiles stands for the portable loop) */
#define run_tiles(task, path, groups)                                                                             \
    cpu_run_parallel((task)->info.form != FORM_RECORDS ? cpu_matmul_packed_portable : matmul_groups_portable, task, \
                     groups)
#endif

/* The zero point a path's tiles count a kind's codes from (their integer accumulator starts at -zero * the row's
 * code sum; the portable loops subtract the kind's own): the kind's own, except for int8 codes (Q8's, stored + 128;
 * Q8_0's, as they are; IQ4's table values), which maddubs takes as the signed values they encode (zero point 0: the
 * avx2 path) and vpdpbusd as unsigned bytes, the code + 128 (zero point 128: avxvnni, avx512vnni). */
static int accumulator_zero(const KindInfo *info, int path)
{
    int int8_codes = info->zero == 128 || (info->form == FORM_LEGACY && info->bits == 8) || info->table;
    if (!int8_codes)
        return info->zero;
    return path == ISA_AVX2 ? 0 : 128;
}

/* out[rows, n] (+)= x @ W^T on `path`; 0, or -1 (out of memory: nothing computed). */
int cpu_matmul(const KindInfo *info, const float *x, long rows, long k, long n, const char *weights, float *out,
               long out_stride, int accumulate, int path)
{
    long blocks = k / BLOCK, groups = (n + GROUP - 1) / GROUP, subs = info->bits < 16 ? k / info->sub : 0;
    int8_t *qx = NULL;
    float *dx = NULL, *sx = NULL;
    int32_t *sums = NULL, *init = NULL, *pairs = NULL;
    if (info->bits < 16) {
        qx = malloc((size_t)(rows * k));
        dx = malloc(sizeof(float) * (size_t)(rows * blocks));
        sx = malloc(sizeof(float) * (size_t)(rows * subs));
        sums = malloc(sizeof(int32_t) * (size_t)(rows * 2 * blocks));
        init = malloc(sizeof(int32_t) * (size_t)(rows * subs));
        pairs = malloc(sizeof(int32_t) * (size_t)(rows * (subs / 2 + 1)));
        if (qx == NULL || dx == NULL || sx == NULL || sums == NULL || init == NULL || pairs == NULL) {
            free(qx);
            free(dx);
            free(sx);
            free(sums);
            free(init);
            free(pairs);
            return -1;
        }
    }
    MatmulTask task = {*info, rows, k, n, x, qx, dx, init, sx, pairs, weights, cpu_group_bytes(info, k),
                       info->form != FORM_RECORDS ? cpu_packed_super_bytes(info)
                       : info->bits < 16          ? cpu_block_bytes(info)
                                                  : 0,
                       out, out_stride, accumulate};
    if (info->bits < 16) {
        /* the K-quants' and Q6_K's packed kinds: one activation scale per super-block of 256, so that their
         * sub-blocks' products add up before one product by it a super-block (matmul_packed.c) */
        int per_super = info->form == FORM_K || info->form == FORM_Q6K;
        cpu_quantize_rows(path, x, rows, k, per_super ? info->sb / BLOCK : 1, qx, dx, sums);
        int zero = accumulator_zero(info, path);
        for (long j = 0; j < subs && info->form != FORM_K; j++) /* (FORM_K reads its pairs below instead) */
            for (long r = 0; r < rows; r++) {
                int32_t sum = info->sub == 32 ? sums[2 * j * rows + r] + sums[(2 * j + 1) * rows + r] : sums[j * rows + r];
                init[j * rows + r] = -zero * sum;
                sx[j * rows + r] = dx[(j * info->sub / BLOCK) * rows + r] * (float)sum;
            }
        if (info->form == FORM_K) /* a sub-block's sum is at most 32 * 127 in magnitude: 16 bits hold it */
            for (long p = 0; p < subs / 2; p++)
                for (long r = 0; r < rows; r++) {
                    int32_t even = sums[4 * p * rows + r] + sums[(4 * p + 1) * rows + r];
                    int32_t odd = sums[(4 * p + 2) * rows + r] + sums[(4 * p + 3) * rows + r];
                    pairs[p * rows + r] = (int32_t)((uint32_t)(uint16_t)even | ((uint32_t)(uint16_t)odd << 16));
                }
    }
    if (path != ISA_PORTABLE)
        run_tiles(&task, path, groups);
    else
        cpu_run_parallel(info->form != FORM_RECORDS ? cpu_matmul_packed_portable : matmul_groups_portable, &task,
                         groups);
    free(qx);
    free(dx);
    free(sx);
    free(sums);
    free(init);
    free(pairs);
    return 0;
}
