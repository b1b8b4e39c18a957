/*
 * repack.c: a GGUF tensor's rows (ggml's row-major blocks, as they lie in the file) into a packed kind's records
 * (matmul_packed.c has the layout), for the eight packed types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
 * Each row's super-block is read into its fields (the f16 d and m or dmin as stored, sub-scales, minimums, one
 * code a byte), then written interleaved, 16 rows a record; rows past the last are zeros. Byte shuffling only:
 * no value is computed, so the records hold exactly the file's bits. kernels/packed.py does the same in torch
 * (pack_fields over target_model/quant.py's gguf_fields); the tests hold the two equal. This runs at memory speed,
 * which is what makes a model's first load fast.
 * Not here: which types map to which kind (kernels/packed.py), reading the file (target_model/gguf_file.py).
 */
#include "kernels.h"

typedef struct {
    uint16_t d, m;
    int scales[16];
    int minimums[8];
    uint8_t codes[256];
} SuperFields;

static inline uint16_t read16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Q4_K/Q5_K's 12 bytes: scales 0-3 (low 6 bits of bytes 0-3), minimums 0-3 (bytes 4-7), and for 4-7 the low 4
 * bits in bytes 8-11 (scale low nibble, minimum high nibble) and the top 2 bits in the top of bytes 0-3 / 4-7. */
static void k_scales(const uint8_t *p, SuperFields *f)
{
    for (int j = 0; j < 4; j++) {
        f->scales[j] = p[j] & 63;
        f->minimums[j] = p[4 + j] & 63;
        f->scales[4 + j] = (p[8 + j] & 15) | ((p[j] >> 6) << 4);
        f->minimums[4 + j] = (p[8 + j] >> 4) | ((p[4 + j] >> 6) << 4);
    }
}

/* One row's super-block (`block`, in the GGUF's layout) as fields. */
static void gguf_super(int kind, const uint8_t *block, SuperFields *f)
{
    switch (kind) {
    case KIND_PQ4_0:
    case KIND_PQ4_1:
    case KIND_PQ5_0:
    case KIND_PQ5_1: {
        int offsets = kind == KIND_PQ4_1 || kind == KIND_PQ5_1, five = kind == KIND_PQ5_0 || kind == KIND_PQ5_1;
        f->d = read16(block);
        f->m = offsets ? read16(block + 2) : 0;
        const uint8_t *high = block + 2 + 2 * offsets, *qs = high + 4 * five;
        uint32_t bits = five ? (uint32_t)high[0] | (uint32_t)high[1] << 8 | (uint32_t)high[2] << 16 |
                                   (uint32_t)high[3] << 24
                             : 0;
        for (int i = 0; i < 16; i++) {
            f->codes[i] = (uint8_t)((qs[i] & 15) | (((bits >> i) & 1) << 4));
            f->codes[i + 16] = (uint8_t)((qs[i] >> 4) | (((bits >> (i + 16)) & 1) << 4));
        }
        return;
    }
    case KIND_PQ8_0:
        f->d = read16(block);
        memcpy(f->codes, block + 2, 32);
        return;
    case KIND_PQ4_K:
    case KIND_PQ5_K: {
        f->d = read16(block);
        f->m = read16(block + 2);
        k_scales(block + 4, f);
        const uint8_t *high = block + 16, *qs = kind == KIND_PQ5_K ? block + 48 : block + 16;
        for (int quarter = 0; quarter < 4; quarter++)
            for (int l = 0; l < 32; l++) {
                uint8_t byte = qs[32 * quarter + l];
                f->codes[64 * quarter + l] = byte & 15;
                f->codes[64 * quarter + 32 + l] = byte >> 4;
            }
        if (kind == KIND_PQ5_K)
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++)
                    f->codes[32 * j + l] |= (uint8_t)(((high[l] >> j) & 1) << 4);
        return;
    }
    default: { /* KIND_PQ6_K: ql [128], qh [64], int8 scales [16], f16 d */
        const uint8_t *ql = block, *qh = block + 128;
        for (int w = 0; w < 256; w++) {
            int half = w / 128, r = w % 128;
            int low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 15;
            int top = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
            f->codes[w] = (uint8_t)(low | (top << 4));
        }
        for (int j = 0; j < 16; j++)
            f->scales[j] = (int8_t)block[192 + j];
        f->d = read16(block + 208);
        return;
    }
    }
}

/* Column c's fields written into a group's super-block `out` (zeroed first by the caller). */
static void write_super(const KindInfo *info, const SuperFields *f, int c, uint8_t *out)
{
    out[2 * c] = (uint8_t)(f->d & 255);
    out[2 * c + 1] = (uint8_t)(f->d >> 8);
    if (info->offsets) {
        out[2 * GROUP + 2 * c] = (uint8_t)(f->m & 255);
        out[2 * GROUP + 2 * c + 1] = (uint8_t)(f->m >> 8);
    }
    if (info->form == FORM_K)
        for (int j = 0; j < 8; j++) {
            out[64 + (j >> 1) * GROUP + c] |= (uint8_t)((f->scales[j] & 15) << (4 * (j & 1)));
            out[128 + (j >> 1) * GROUP + c] |= (uint8_t)((f->minimums[j] & 15) << (4 * (j & 1)));
            out[192 + (j >> 2) * GROUP + c] |= (uint8_t)(((f->scales[j] >> 4) & 3) << (2 * (j & 3)));
            out[224 + (j >> 2) * GROUP + c] |= (uint8_t)(((f->minimums[j] >> 4) & 3) << (2 * (j & 3)));
        }
    else if (info->form == FORM_Q6K)
        for (int j = 0; j < 16; j++)
            out[32 + j * GROUP + c] = (uint8_t)(int8_t)f->scales[j];
    long header = cpu_packed_header_bytes(info), block_bytes = cpu_packed_block_bytes(info);
    for (int b = 0; b < info->sb / BLOCK; b++) {
        uint8_t *p = out + header + b * block_bytes + c * 4;
        const uint8_t *code = f->codes + b * BLOCK; /* chunk i: code[4i .. 4i+3] */
        for (int e = 0; e < 4; e++) {
            if (info->bits == 8) {
                for (int i = 0; i < 8; i++)
                    p[i * 64 + e] = code[4 * i + e];
            } else if (info->bits == 6) { /* sub-blocks of 16: vector 2j+q holds chunks 4j+q and 4j+q+2 */
                for (int j = 0; j < 2; j++) {
                    const uint8_t *sub = code + 16 * j;
                    uint8_t plane = 0;
                    for (int q = 0; q < 2; q++)
                        p[(2 * j + q) * 64 + e] = (uint8_t)((sub[4 * q + e] & 15) | ((sub[4 * (q + 2) + e] & 15) << 4));
                    for (int t = 0; t < 4; t++)
                        plane |= (uint8_t)(((sub[4 * t + e] >> 4) & 3) << (2 * t));
                    p[256 + j * 64 + e] = plane;
                }
            } else { /* vector q holds chunks q and q+4 */
                uint8_t plane = 0;
                for (int q = 0; q < 4; q++)
                    p[q * 64 + e] = (uint8_t)((code[4 * q + e] & 15) | ((code[4 * (q + 4) + e] & 15) << 4));
                for (int i = 0; i < 8; i++)
                    plane |= (uint8_t)(((code[4 * i + e] >> 4) & 1) << i);
                if (info->bits == 5)
                    p[256 + e] = plane;
            }
        }
    }
}

/* Whether an f16 is NaN or infinite (exponent all ones). */
static inline int not_finite(uint16_t half)
{
    return (half & 0x7C00) == 0x7C00;
}

/* rows [n][row_bytes] of a GGUF tensor of k weights a row -> records [groups(n)][group bytes]; 0, -1 when
 * row_bytes is not the type's size for k, or -2 - r when row r holds a NaN or infinite scale (d, m or dmin): such
 * a matrix can only answer garbage. */
int cpu_repack_gguf(int kind, const uint8_t *rows, long n, long row_bytes, long k, uint8_t *records)
{
    KindInfo info;
    static const int file_bytes[PACKED_COUNT] = {18, 20, 22, 24, 34, 144, 176, 210}; /* per super-block */
    if (!cpu_kind_info(kind, &info) || info.form == FORM_RECORDS || k % info.sb != 0 ||
        row_bytes != k / info.sb * file_bytes[kind - KIND_PQ4_0])
        return -1;
    long supers = k / info.sb, super_bytes = cpu_packed_super_bytes(&info), groups = (n + GROUP - 1) / GROUP;
    int source_bytes = file_bytes[kind - KIND_PQ4_0];
    SuperFields fields;
    for (long g = 0; g < groups; g++)
        for (long s = 0; s < supers; s++) {
            uint8_t *out = records + (g * supers + s) * super_bytes;
            memset(out, 0, (size_t)super_bytes);
            for (int c = 0; c < GROUP && g * GROUP + c < n; c++) {
                gguf_super(kind, rows + (g * GROUP + c) * row_bytes + s * source_bytes, &fields);
                if (not_finite(fields.d) || (info.offsets && not_finite(fields.m)))
                    return -2 - (int)(g * GROUP + c);
                write_super(&info, &fields, c, out);
            }
        }
    return 0;
}
