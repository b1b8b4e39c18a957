/*
 * matmul_packed_portable.c: the packed kinds' reference loop in portable C, one column at a time: each column's codes
 * unpacked from its group's record (the layout in matmul_packed.c's header comment), its scales and offsets, then
 * each row's integer dot products and float operations in the order every path's tiles reproduce (the same header
 * comment), so the vector paths are tested against it bit for bit.
 * Not here: the layout's description and the 256-bit tiles (matmul_packed.c), the 512-bit tiles
 * (matmul_packed_512.c), the driver (matmul.c).
 */
#include "kernels.h"

/* FORM_K's 6-bit value of sub-block j (0..7) of column c: a scale (low K_SCALE_LOW, high K_SCALE_HIGH) or a minimum
 * (K_MIN_LOW, K_MIN_HIGH). */
static int k_six(const uint8_t *head, int low, int high, int j, int c)
{
    return ((head[low + (j >> 1) * GROUP + c] >> (4 * (j & 1))) & 15) |
           (((head[high + (j >> 2) * GROUP + c] >> (2 * (j & 3))) & 3) << 4);
}

static const int8_t iq4_values[16] = {IQ4_TABLE};

/* Column c of a group's record: its codes less the zero point (IQ4_NL: its table's values) [k], its scales and
 * offsets [k / sub]. */
static void packed_column(const KindInfo *info, const uint8_t *record, long k, long super_bytes, int c,
                          int16_t *codes, float *scales, float *offsets)
{
    long supers = k / info->sb, header = cpu_packed_header_bytes(info), block_bytes = cpu_packed_block_bytes(info);
    int per_super = info->sb / info->sub, chunks = info->sub / 4, half = info->sub / 8;
    for (long s = 0; s < supers; s++) {
        const uint8_t *head = record + s * super_bytes;
        uint16_t bits;
        memcpy(&bits, head + 2 * c, 2);
        float d = cpu_half_to_float(bits), m = 0.0f;
        if (info->offsets) {
            memcpy(&bits, head + 2 * GROUP + 2 * c, 2);
            m = cpu_half_to_float(bits);
        }
        for (int j = 0; j < per_super; j++) {
            float scale = d, offset = m; /* (FORM_K's sub-scales are applied in integers: k_row) */
            if (info->form == FORM_Q6K)
                scale = d * (float)(int8_t)head[Q6K_SCALES + j * GROUP + c];
            if (info->form == FORM_IQ4XS)
                scale = d * (float)(k_six(head, IQ4XS_SCALE_LOW, IQ4XS_SCALE_HIGH, j, c) - IQ4XS_SCALE_ZERO);
            scales[s * per_super + j] = scale;
            offsets[s * per_super + j] = offset;
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
                    out[i * 4 + e] = (int16_t)(info->table ? iq4_values[code] : code - info->zero);
                }
        }
    }
}

/* FORM_K's integer order (see the top) for row r of the task and column c of group record `record`, whose codes
 * (packed_column's) are `codes`. */
static float k_row(const MatmulTask *t, const uint8_t *record, int c, const int16_t *codes, long r)
{
    const KindInfo *info = &t->info;
    long supers = t->k / info->sb;
    float acc = 0.0f;
    for (long s = 0; s < supers; s++) {
        const uint8_t *head = record + s * t->block;
        uint16_t bits;
        memcpy(&bits, head + 2 * c, 2);
        float d = cpu_half_to_float(bits);
        memcpy(&bits, head + 2 * GROUP + 2 * c, 2);
        float dmin = cpu_half_to_float(bits), dx = t->dx[(s * info->sb / BLOCK) * t->rows + r];
        int32_t isum = 0, imin = 0;
        for (int j = 0; j < info->sb / BLOCK; j++) {
            long b = s * (info->sb / BLOCK) + j; /* sub-block j is block b: 32 weights */
            const int8_t *x = t->qx + (b * t->rows + r) * BLOCK;
            int32_t dot = 0;
            for (int i = 0; i < BLOCK; i++)
                dot += codes[b * BLOCK + i] * x[i];
            int32_t pair = t->pairs[(b >> 1) * t->rows + r];
            isum += k_six(head, K_SCALE_LOW, K_SCALE_HIGH, j, c) * dot;
            imin += k_six(head, K_MIN_LOW, K_MIN_HIGH, j, c) * (int16_t)(uint16_t)((uint32_t)pair >> (16 * (b & 1)));
        }
        acc = fmaf((float)imin, -(dmin * dx), acc);
        acc = fmaf((float)isum, d * dx, acc);
    }
    return acc;
}

/* The reference: one column at a time, in the order above. */
void cpu_matmul_packed_portable(const void *arg, long start, long stop)
{
    const MatmulTask *t = arg;
    const KindInfo *info = &t->info;
    long k = t->k, subs = k / info->sub, per_block = BLOCK / info->sub;
    int16_t *codes = malloc(sizeof(int16_t) * (size_t)k);
    float *scales = malloc(sizeof(float) * (size_t)subs), *offsets = malloc(sizeof(float) * (size_t)subs);
    if (codes == NULL || scales == NULL || offsets == NULL) {
        free(codes);
        free(scales);
        free(offsets);
        cpu_store_nan(t, start, stop);
        return;
    }
    for (long g = start; g < stop; g++) {
        const uint8_t *record = (const uint8_t *)t->weights + g * t->record;
        float values[32][GROUP];
        for (long r0 = 0; r0 < t->rows; r0 += 32) {
            long rows = t->rows - r0 < 32 ? t->rows - r0 : 32;
            for (int c = 0; c < GROUP; c++) {
                packed_column(info, record, k, t->block, c, codes, scales, offsets);
                for (long r = 0; r < rows; r++) {
                    if (info->form == FORM_K) {
                        values[r][c] = k_row(t, record, c, codes, r0 + r);
                        continue;
                    }
                    float acc = 0.0f, part = 0.0f;
                    for (long j = 0; j < subs; j++) {
                        long b = j / per_block, first = (j % per_block) * info->sub;
                        const int8_t *x = t->qx + (b * t->rows + r0 + r) * BLOCK;
                        int dot = 0;
                        for (long i = first; i < first + info->sub; i++)
                            dot += codes[b * BLOCK + i] * x[i];
                        if (info->form == FORM_Q6K) { /* a super-block's 16 products, then one by its dx */
                            part = fmaf((float)dot, scales[j], part);
                            if ((j + 1) % (info->sb / info->sub) == 0) {
                                acc = fmaf(part, t->dx[b * t->rows + r0 + r], acc);
                                part = 0.0f;
                            }
                            continue;
                        }
                        acc = fmaf((float)dot, scales[j] * t->dx[b * t->rows + r0 + r], acc);
                        if (info->offsets)
                            acc = fmaf(offsets[j], t->sx[j * t->rows + r0 + r], acc);
                    }
                    values[r][c] = acc;
                }
            }
            for (long r = 0; r < rows; r++)
                cpu_store_values(t, r0 + r, g * GROUP, values[r]);
        }
    }
    free(codes);
    free(scales);
    free(offsets);
}
