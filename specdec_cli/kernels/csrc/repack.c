/*
 * repack.c: a GGUF tensor's rows (ggml's row-major blocks, as they lie in the file) into a packed kind's records
 * (matmul_packed.c has the layout), for the ten packed types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
 * IQ4_NL (Q4_0's bytes), IQ4_XS.
 * Each row's super-block is written straight into its column of the group's record, 16 rows a record, four
 * bytes at a time where the layouts allow (the legacy types' nibbles are already in the records' order; the
 * K-quants' quarters and Q6_K's planes are regrouped with word masks and shifts); rows past the last are zeros.
 * Byte shuffling only: no value is computed, so the records hold exactly the file's bits. kernels/packed.py does
 * the same in torch (pack_fields over target_model/quant.py's gguf_fields); the tests hold the two equal. The
 * groups are split across the kernels' thread pool.
 * Not here: which types map to which kind (kernels/packed.py), reading the file (target_model/gguf_file.py).
 */
#include "kernels.h"

static inline uint16_t read16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t read32(const uint8_t *p)
{
    uint32_t word;
    memcpy(&word, p, 4);
    return word;
}

static inline void write32(uint8_t *p, uint32_t word)
{
    memcpy(p, &word, 4);
}

#define LOW_NIBBLES 0x0F0F0F0Fu
#define HIGH_NIBBLES 0xF0F0F0F0u

/* A block of 32 nibbles of column c, given as the bytes whose low nibbles are weights 0..15 (`low`) and those
 * whose low nibbles are weights 16..31 (`high`): vector q, bytes e of the column, hold weight 4q+e in the low
 * nibble and 16+4q+e in the high one. `shift` 4 takes the bytes' high nibbles instead. Four bytes at a time. */
static inline void write_nibbles(uint8_t *p, const uint8_t *low, const uint8_t *high, int shift)
{
    for (int q = 0; q < 4; q++) {
        uint32_t a = (read32(low + 4 * q) >> shift) & LOW_NIBBLES, b = (read32(high + 4 * q) >> shift) & LOW_NIBBLES;
        write32(p + q * 64, a | (b << 4));
    }
}

/* The fifth-bit plane of a block of column c: byte e, bit i = the fifth bit of weight 4i+e, where bit(w) says it. */
static inline void write_fifth_bits(uint8_t *p, uint32_t bits)
{
    for (int e = 0; e < 4; e++) {
        uint8_t plane = 0;
        for (int i = 0; i < 8; i++)
            plane |= (uint8_t)(((bits >> (4 * i + e)) & 1) << i);
        p[256 + e] = plane;
    }
}

/* Eight 6-bit values of column c as the nibble rows (at `low`: byte (p, c) = value 2p's low 4 bits | value 2p+1's
 * << 4) and top-bit rows (at `high`: byte (p, c), bits 2t..2t+1 = value 4p+t's top 2) of a packed header. */
static void write_six(const int values[8], int c, uint8_t *out, int low, int high)
{
    for (int p = 0; p < 4; p++)
        out[low + p * GROUP + c] = (uint8_t)((values[2 * p] & 15) | ((values[2 * p + 1] & 15) << 4));
    for (int p = 0; p < 2; p++) {
        uint8_t tops = 0;
        for (int t = 0; t < 4; t++)
            tops |= (uint8_t)(((values[4 * p + t] >> 4) & 3) << (2 * t));
        out[high + p * GROUP + c] = tops;
    }
}

/* Q4_K/Q5_K's 12 bytes of 6-bit scales and minimums (bytes 0-3: scales 0-3 and the top 2 bits of scales 4-7;
 * 4-7 the same for minimums; 8-11: the low 4 bits of scales 4-7 (low nibble) and minimums 4-7 (high nibble)), as
 * column c's rows of a FORM_K header (matmul_packed.c). */
static void write_k_scales(const uint8_t *packed, int c, uint8_t *out)
{
    int scales[8], minimums[8];
    for (int j = 0; j < 4; j++) {
        scales[j] = packed[j] & 63;
        minimums[j] = packed[4 + j] & 63;
        scales[4 + j] = (packed[8 + j] & 15) | ((packed[j] >> 6) << 4);
        minimums[4 + j] = (packed[8 + j] >> 4) | ((packed[4 + j] >> 6) << 4);
    }
    write_six(scales, c, out, K_SCALE_LOW, K_SCALE_HIGH);
    write_six(minimums, c, out, K_MIN_LOW, K_MIN_HIGH);
}

/* One row's super-block (`block`, in the GGUF's layout) written as column c of a group's super-block `out`.
 * Returns 0, or -1 when d (or m, dmin) is NaN or infinite. */
static int write_column(const KindInfo *info, int kind, const uint8_t *block, int c, uint8_t *out)
{
    uint16_t d = kind == KIND_PQ6_K ? read16(block + 208) : read16(block);
    uint16_t m = info->offsets ? read16(block + 2) : 0;
    if ((d & 0x7C00) == 0x7C00 || (info->offsets && (m & 0x7C00) == 0x7C00))
        return -1;
    memcpy(out + 2 * c, &d, 2);
    if (info->offsets)
        memcpy(out + 2 * GROUP + 2 * c, &m, 2);
    uint8_t *codes = out + cpu_packed_header_bytes(info) + 4 * c;
    long block_bytes = cpu_packed_block_bytes(info);
    switch (kind) {
    case KIND_PIQ4_XS: { /* f16 d, u16 scales_h (bits 2i..2i+1: sub-block i's top 2), scales_l [4] (byte i / 2,
                          * nibble i % 2: its low 4), then 8 sub-blocks of 16 bytes as Q4_0's */
        int scales[8];
        for (int i = 0; i < 8; i++)
            scales[i] = ((block[4 + i / 2] >> (4 * (i % 2))) & 15) | (((read16(block + 2) >> (2 * i)) & 3) << 4);
        write_six(scales, c, out, IQ4XS_SCALE_LOW, IQ4XS_SCALE_HIGH);
        for (int b = 0; b < 8; b++)
            for (int q = 0; q < 4; q++)
                memcpy(codes + b * block_bytes + q * 64, block + 8 + 16 * b + 4 * q, 4);
        return 0;
    }
    case KIND_PQ4_0:
    case KIND_PIQ4_NL: /* Q4_0's bytes */
    case KIND_PQ4_1:
    case KIND_PQ5_0:
    case KIND_PQ5_1: { /* f16 d (, f16 m) (, 32 fifth bits), nibbles: weight i low, i + 16 high */
        int five = kind == KIND_PQ5_0 || kind == KIND_PQ5_1;
        const uint8_t *high = block + 2 + 2 * info->offsets, *qs = high + 4 * five;
        for (int q = 0; q < 4; q++) /* the file's byte 4q+e is already weight 4q+e | weight 16+4q+e << 4 */
            memcpy(codes + q * 64, qs + 4 * q, 4);
        if (five)
            write_fifth_bits(codes, read32(high));
        return 0;
    }
    case KIND_PQ8_0:
        for (int i = 0; i < 8; i++)
            memcpy(codes + i * 64, block + 2 + 4 * i, 4);
        return 0;
    case KIND_PQ4_K:
    case KIND_PQ5_K: { /* f16 d, dmin, 12 bytes of scales (, 32 bytes of fifth bits), 4 quarters of 32 bytes */
        write_k_scales(block + 4, c, out);
        const uint8_t *high = block + 16, *qs = kind == KIND_PQ5_K ? block + 48 : block + 16;
        for (int j = 0; j < 8; j++) { /* sub-block j: quarter j / 2's low (j even) or high nibbles */
            const uint8_t *quarter = qs + 32 * (j / 2);
            write_nibbles(codes + j * block_bytes, quarter, quarter + 16, 4 * (j & 1));
            if (kind == KIND_PQ5_K) { /* bit j of the file's byte w: weight w's fifth bit */
                uint32_t bits = 0;
                for (int w = 0; w < 32; w++)
                    bits |= (uint32_t)((high[w] >> j) & 1) << w;
                write_fifth_bits(codes + j * block_bytes, bits);
            }
        }
        return 0;
    }
    default: { /* KIND_PQ6_K: ql [128], qh [64], int8 scales [16], f16 d; weight w = 128 h + r (h the half) takes
                * ql[64 h + r % 64]'s low (r < 64) or high nibble and qh[32 h + r % 32]'s bits 2 (r / 32) */
        const uint8_t *ql = block, *qh = block + 128;
        for (int j = 0; j < 16; j++)
            out[32 + j * GROUP + c] = block[192 + j];
        for (int b = 0; b < 8; b++) {
            int half = b / 4, quarter = b % 4; /* weights 32 quarter .. of the half */
            const uint8_t *low = ql + 64 * half + 32 * (quarter & 1), *top = qh + 32 * half;
            int low_shift = 4 * (quarter >> 1), top_shift = 2 * quarter;
            uint8_t *p = codes + b * block_bytes;
            for (int j = 0; j < 2; j++) { /* sub-blocks of 16: vector 2j+q holds chunks 4j+q and 4j+q+2 */
                for (int q = 0; q < 2; q++) {
                    uint32_t a = (read32(low + 16 * j + 4 * q) >> low_shift) & LOW_NIBBLES;
                    uint32_t z = (read32(low + 16 * j + 4 * (q + 2)) >> low_shift) & LOW_NIBBLES;
                    write32(p + (2 * j + q) * 64, a | (z << 4));
                }
                uint32_t plane = 0;
                for (int t = 0; t < 4; t++)
                    plane |= ((read32(top + 16 * j + 4 * t) >> top_shift) & 0x03030303u) << (2 * t);
                write32(p + 256 + j * 64, plane);
            }
        }
        return 0;
    }
    }
}

typedef struct {
    KindInfo info;
    int kind, source_bytes;
    const uint8_t *rows;
    long n, row_bytes, supers, super_bytes;
    uint8_t *records;
    atomic_long bad_row; /* the first row found with a NaN or infinite scale, or LONG_MAX */
} RepackTask;

/* Each group's record zeroed, then filled column by column: a column reads its row in the file from start to end
 * (one stream the prefetchers follow) and writes into the group's record, which stays in cache meanwhile. */
static void repack_groups(const void *arg, long start, long stop)
{
    RepackTask *t = (RepackTask *)arg;
    for (long g = start; g < stop; g++) {
        uint8_t *record = t->records + g * t->supers * t->super_bytes;
        memset(record, 0, (size_t)(t->supers * t->super_bytes));
        for (int c = 0; c < GROUP && g * GROUP + c < t->n; c++) {
            long row = g * GROUP + c;
            for (long s = 0; s < t->supers; s++)
                if (write_column(&t->info, t->kind, t->rows + row * t->row_bytes + s * t->source_bytes, c,
                                 record + s * t->super_bytes)) {
                    long seen = atomic_load(&t->bad_row);
                    while (row < seen && !atomic_compare_exchange_weak(&t->bad_row, &seen, row))
                        ;
                    break;
                }
        }
    }
}

/* rows [n][row_bytes] of a GGUF tensor of k weights a row -> records [groups(n)][group bytes], on the pool; 0, -1
 * when row_bytes is not the type's size for k, or -2 - r when row r holds a NaN or infinite scale (d, m or dmin):
 * such a matrix can only answer garbage. */
int cpu_repack_gguf(int kind, const uint8_t *rows, long n, long row_bytes, long k, uint8_t *records)
{
    static const int file_bytes[PACKED_COUNT] = {18, 20, 22, 24, 34, 144, 176, 210, 18, 136}; /* a super-block */
    RepackTask t = {.kind = kind, .rows = rows, .n = n, .row_bytes = row_bytes, .records = records};
    if (!cpu_kind_info(kind, &t.info) || t.info.form == FORM_RECORDS || k % t.info.sb != 0 ||
        row_bytes != k / t.info.sb * file_bytes[kind - KIND_PQ4_0])
        return -1;
    t.source_bytes = file_bytes[kind - KIND_PQ4_0];
    t.supers = k / t.info.sb;
    t.super_bytes = cpu_packed_super_bytes(&t.info);
    atomic_init(&t.bad_row, LONG_MAX);
    cpu_run_parallel(repack_groups, &t, (n + GROUP - 1) / GROUP);
    long bad = atomic_load(&t.bad_row);
    return bad == LONG_MAX ? 0 : -2 - (int)bad;
}
