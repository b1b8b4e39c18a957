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
 *          4    nibble  32   0    yes    int4 made on load
 *          5    nibble  32   8    no     (none now: Q4_0 is packed)
 *          8    byte    32  128   no     int8 made on load (none from a GGUF now: IQ4_NL, IQ4_XS are packed)
 *          9    byte    32   0    yes    (none now: Q5_1, Q5_K are packed)
 *         16    byte    16   32   no     (none now: Q6_K is packed)
 *         17    nibble  16   4    no     Q3_K (codes 0..7)
 *         18    nibble  16   0    yes    Q2_K (codes 0..3)
 *       The packed kinds 40-49 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) keep a GGUF
 *       type's own fields at the file's size instead of float32 scales: f16 d (and m or dmin) per super-block of
 *       32 or 256 weights, 6-bit or int8 sub-scales, nibbles with a fifth-bit or 2-bit plane (IQ4's an index into
 *       its table of 16 int8 values), or int8 codes (csrc/matmul_packed.c has the layout). The legacy types and
 *       IQ4 compute the order below with the same values, and the same bits, as the float32-scale kind the same
 *       weights would repack into; the K-quants and Q6_K have orders of their own over a super-block of 256
 *       (csrc/matmul_packed.c's header). The avx512vnni path runs their 512-bit tiles
 *       (csrc/matmul_packed_512.c), the avx2 and avxvnni paths their 256-bit tiles (csrc/matmul_packed.c).
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
 *       vpdpbusd), "avxvnni" (256-bit vpdpbusd, 8 columns x up to 4 rows, 8 for the packed kinds; on a CPU with
 *       AVX512-VNNI but not AVX-VNNI, the same instruction in its AVX512 encoding), "avx2" (maddubs + madd, 8 x 4;
 *       8 rows for the K-quants) and
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
 *       same bits on every path and wherever it sits (see "elementwise functions" in csrc/elementwise.c).
 *   top_tokens(logits, rows, vocab, k, out)
 *       each row's k (<= 16) largest logits' ids, largest first, ties to the lower id (column 0: torch.argmax's).
 *   repack_gguf(kind, rows, n, row_bytes, k, records)
 *       a GGUF tensor's rows (ggml's blocks as in the file) into a packed kind's records, byte for byte.
 *   set_threads(n), threads(), isa(), isas(), set_isa(name), record_bytes(kind, k), peak(isa)
 *
 * Pointers arrive as integers (the Python side, kernels/__init__.py, checks dtypes, shapes and contiguity).
 * The GIL is released while a kernel runs; a second caller arriving while the pool is busy runs on its own
 * thread. x86-64 CPUs take the best vectorised path they have (AVX512-VNNI, AVX-VNNI, AVX2 with FMA and F16C),
 * chosen at import; every other CPU takes the portable C loops (the same matmul results, slower; attention's
 * portable, AVX2 and 512-bit steps each round in their own order, each row-invariant). These files know nothing
 * of models or GGUF files.
 *
 * The files, one concern each, sharing one internal header (csrc/kernels.h):
 *   _cpu.c (this file)        the Python module: argument parsing and checks, the GIL, the instruction-set state
 *                             (detected at import, set_isa), the method table. No kernel code.
 *   csrc/pool.c               the thread pool
 *   csrc/blocks.c             the weights' kinds and record sizes; activations rounded to 8-bit blocks
 *   csrc/matmul.c             the matmul's driver and its portable reference loop
 *   csrc/matmul_avx2.c        the avx2 and avxvnni tiles
 *   csrc/matmul_avx512.c      the avx512vnni tiles
 *   csrc/matmul_packed.c      the packed kinds (a GGUF type's own fields): their layout and 256-bit tiles
 *   csrc/matmul_packed_portable.c  the packed kinds' portable reference loop
 *   csrc/matmul_packed_512.c  the packed kinds' avx512vnni tiles
 *   csrc/repack.c             a GGUF tensor's rows into a packed kind's records (byte shuffling, at load)
 *   csrc/attention.c          attention's driver, its portable and AVX2 steps
 *   csrc/attention_avx512.c   attention's 512-bit steps (avx512vnni)
 *   csrc/elementwise.c        the per-row steps: norms, rotary, cache rows, SiLU/GeLU gating, soft-capping
 *   csrc/peak.c               the vector paths' arithmetic peak (a benchmark's yardstick)
 *   csrc/top_tokens.c         each row's largest logits' ids (a verify step's argmax and top 8)
 * Not here (this file): any kernel's arithmetic.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "csrc/kernels.h"

/* The instruction sets' names (indexed by ISA_*), which of them this CPU has, the best of those, and the one in
 * use (the best, unless set_isa chose another it has): each kernel is handed `isa_path` as its path. */
static const char *const isa_names[] = {"portable", "avx2", "avxvnni", "avx512vnni"};
static int isa_path = ISA_PORTABLE, isa_best = ISA_PORTABLE;
static int cpu_has[4] = {1, 0, 0, 0};

static PyObject *py_matmul(PyObject *self, PyObject *args)
{
    int kind, accumulate = 0;
    Py_ssize_t x, rows, k, n, weights, out, out_stride = -1;
    if (!PyArg_ParseTuple(args, "innnnnn|np", &kind, &x, &rows, &k, &n, &weights, &out, &out_stride, &accumulate))
        return NULL;
    if (out_stride < 0)
        out_stride = n;
    KindInfo info;
    if (!cpu_kind_info(kind, &info) || rows < 1 || k < BLOCK || k % BLOCK != 0 || n < 1 ||
        (info.form != FORM_RECORDS && k % info.sb != 0)) {
        PyErr_SetString(PyExc_ValueError, "matmul: an unknown kind, or rows and n < 1, or k not a multiple of 32 "
                                          "(of the super-block for packed kinds)");
        return NULL;
    }
    int path = isa_path, failed;
    Py_BEGIN_ALLOW_THREADS
    failed = cpu_matmul(&info, (const float *)x, rows, k, n, (const char *)weights, (float *)out, out_stride,
                        accumulate, path);
    Py_END_ALLOW_THREADS
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_record_bytes(PyObject *self, PyObject *args)
{
    int kind;
    Py_ssize_t k;
    KindInfo info;
    if (!PyArg_ParseTuple(args, "in", &kind, &k))
        return NULL;
    if (!cpu_kind_info(kind, &info) || k < BLOCK || k % BLOCK != 0 || (info.form != FORM_RECORDS && k % info.sb)) {
        PyErr_SetString(PyExc_ValueError, "record_bytes: an unknown kind, or k not a multiple of 32 (of the "
                                          "super-block for packed kinds)");
        return NULL;
    }
    return PyLong_FromLong(cpu_group_bytes(&info, k));
}

static PyObject *py_repack_gguf(PyObject *self, PyObject *args)
{
    int kind, failed;
    Py_ssize_t rows, n, row_bytes, k, records;
    if (!PyArg_ParseTuple(args, "innnnn", &kind, &rows, &n, &row_bytes, &k, &records))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "repack_gguf: n < 0");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    failed = cpu_repack_gguf(kind, (const uint8_t *)rows, n, row_bytes, k, (uint8_t *)records);
    Py_END_ALLOW_THREADS
    if (failed <= -2) {
        PyErr_Format(PyExc_ArithmeticError, "row %d holds a NaN or infinite scale", -2 - failed);
        return NULL;
    }
    if (failed) {
        PyErr_SetString(PyExc_ValueError, "repack_gguf: not a packed kind, or rows of another size for k");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* An attention call's arguments (pointers as ints) into a task; 0 with a Python error set when they are wrong. */
static int attention_task(PyObject *args, AttentionTask *t)
{
    Py_ssize_t rows, heads, kv_heads, dim, q, q_row, q_head, k, v, k_head, k_pos, v_head, v_pos, run_start, run_stop,
        extra_start, extra_pos, out, o_row, o_head;
    int kv_bf16;
    double scale, cap = 0.0;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnpnnnnnnnndnnn|d", &rows, &heads, &kv_heads, &dim, &q, &q_row, &q_head, &k,
                          &v, &kv_bf16, &k_head, &k_pos, &v_head, &v_pos, &run_start, &run_stop, &extra_start,
                          &extra_pos, &scale, &out, &o_row, &o_head, &cap))
        return 0;
    if (rows < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || dim < 1 || !(cap >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "attention: rows, heads and dim >= 1, heads a multiple of kv_heads, cap >= 0");
        return 0;
    }
    *t = (AttentionTask){.rows = rows, .heads = heads, .kv_heads = kv_heads, .dim = dim, .q = (const float *)q,
                         .q_row = q_row, .q_head = q_head, .k = (const char *)k, .v = (const char *)v,
                         .kv_bf16 = kv_bf16, .k_head = k_head, .k_pos = k_pos, .v_head = v_head, .v_pos = v_pos,
                         .run_start = (const int32_t *)run_start, .run_stop = (const int32_t *)run_stop,
                         .extra_start = (const int32_t *)extra_start, .extra_pos = (const int32_t *)extra_pos,
                         .scale = (float)scale, .out = (float *)out, .o_row = o_row, .o_head = o_head,
                         .cap = (float)cap}; /* cpu_attention sets the units' fields (row_tile, head_tile, wide) */
    return 1;
}

static PyObject *py_attention(PyObject *self, PyObject *args)
{
    AttentionTask t;
    if (!attention_task(args, &t))
        return NULL;
    int path = isa_path;
    Py_BEGIN_ALLOW_THREADS
    cpu_attention(&t, path);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* attention_many(calls): a tuple of attention's argument tuples (each as `attention` takes them), computed as each
 * alone, their work in one call of the pool. */
static PyObject *py_attention_many(PyObject *self, PyObject *args)
{
    PyObject *calls;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &calls))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(calls);
    if (count > MAX_MANY_TASKS) {
        PyErr_Format(PyExc_ValueError, "attention_many: at most %d calls", MAX_MANY_TASKS);
        return NULL;
    }
    AttentionTask tasks[MAX_MANY_TASKS];
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *call = PyTuple_GET_ITEM(calls, i);
        if (!PyTuple_Check(call)) {
            PyErr_SetString(PyExc_TypeError, "attention_many: each call is a tuple of attention's arguments");
            return NULL;
        }
        if (!attention_task(call, &tasks[i]))
            return NULL;
    }
    int path = isa_path;
    Py_BEGIN_ALLOW_THREADS
    cpu_attention_many(tasks, count, path);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_rms_norm(PyObject *self, PyObject *args)
{
    Py_ssize_t x, rows, dim, x_stride, weight, out, out_stride;
    double eps;
    if (!PyArg_ParseTuple(args, "nnnnndnn", &x, &rows, &dim, &x_stride, &weight, &eps, &out, &out_stride))
        return NULL;
    cpu_rms_norm((const float *)x, rows, dim, x_stride, (const float *)weight, (float)eps, (float *)out, out_stride);
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
    cpu_rope((float *)base, rows, row_stride, heads, head_dim, half, (const int32_t *)positions,
             (const float *)cos_table, (const float *)sin_table);
    Py_RETURN_NONE;
}

static PyObject *py_rms_norm_heads(PyObject *self, PyObject *args)
{
    Py_ssize_t x, rows, row_stride, heads, head_dim, weight;
    double eps;
    if (!PyArg_ParseTuple(args, "nnnnnnd", &x, &rows, &row_stride, &heads, &head_dim, &weight, &eps))
        return NULL;
    cpu_rms_norm_heads((float *)x, rows, row_stride, heads, head_dim, (const float *)weight, (float)eps);
    Py_RETURN_NONE;
}

static PyObject *py_store_rows(PyObject *self, PyObject *args)
{
    Py_ssize_t src, rows, row_stride, heads, dim, dst, head_stride, pos_stride, start;
    int bf16 = 0;
    if (!PyArg_ParseTuple(args, "nnnnnnnnn|p", &src, &rows, &start, &row_stride, &heads, &dim, &dst, &head_stride,
                          &pos_stride, &bf16))
        return NULL;
    cpu_store_rows((const float *)src, rows, row_stride, heads, dim, (void *)dst, head_stride, pos_stride, start, bf16);
    Py_RETURN_NONE;
}

static PyObject *py_silu_mul(PyObject *self, PyObject *args)
{
    Py_ssize_t gate_up, rows, ffn, out;
    if (!PyArg_ParseTuple(args, "nnnn", &gate_up, &rows, &ffn, &out))
        return NULL;
    cpu_silu_mul(isa_path, (const float *)gate_up, rows, ffn, (float *)out);
    Py_RETURN_NONE;
}

static PyObject *py_gelu_tanh_mul(PyObject *self, PyObject *args)
{
    Py_ssize_t gate_up, rows, ffn, out;
    if (!PyArg_ParseTuple(args, "nnnn", &gate_up, &rows, &ffn, &out))
        return NULL;
    cpu_gelu_tanh_mul(isa_path, (const float *)gate_up, rows, ffn, (float *)out);
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
    int path = isa_path;
    Py_BEGIN_ALLOW_THREADS
    cpu_soft_cap(path, (float *)x, count, (float)cap);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_top_tokens(PyObject *self, PyObject *args)
{
    Py_ssize_t logits, rows, vocab, k, out;
    if (!PyArg_ParseTuple(args, "nnnnn", &logits, &rows, &vocab, &k, &out))
        return NULL;
    if (rows < 1 || vocab < 1 || k < 1 || k > 16 || k > vocab) {
        PyErr_SetString(PyExc_ValueError, "top_tokens: rows and vocab must be >= 1, k in 1..min(16, vocab)");
        return NULL;
    }
    int path = isa_path, status;
    Py_BEGIN_ALLOW_THREADS
    status = cpu_top_tokens(path, (const float *)logits, rows, vocab, k, (int32_t *)out);
    Py_END_ALLOW_THREADS
    if (status == -2)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

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
    double best;
    Py_BEGIN_ALLOW_THREADS
    best = cpu_peak(path, seconds);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(best);
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
    if (count == cpu_threads())
        Py_RETURN_NONE;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = cpu_set_threads(count);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_OSError, "could not start the kernels' worker threads");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_threads(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(cpu_threads());
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
    {"store_rows", py_store_rows, METH_VARARGS, "store_rows(src, rows, start, row_stride, heads, dim, dst, head_stride, pos_stride, bf16=False)"},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu_mul(gate_up, rows, ffn, out)"},
    {"gelu_tanh_mul", py_gelu_tanh_mul, METH_VARARGS, "gelu_tanh_mul(gate_up, rows, ffn, out): GeLU-tanh(gate) * up"},
    {"soft_cap", py_soft_cap, METH_VARARGS, "soft_cap(x, count, cap): x = cap * tanh(x / cap) in place"},
    {"top_tokens", py_top_tokens, METH_VARARGS,
     "top_tokens(logits, rows, vocab, k, out): each row's k largest ids, largest first (int32 out [rows, k])"},
    {"rms_norm_heads", py_rms_norm_heads, METH_VARARGS,
     "rms_norm_heads(x, rows, row_stride, heads, head_dim, weight, eps): each head of every row, in place"},
    {"attention", py_attention, METH_VARARGS, "row-invariant attention over each row's own keys (pointers as ints)"},
    {"attention_many", py_attention_many, METH_VARARGS, "attention_many(calls): several attention calls' work at once"},
    {"set_threads", py_set_threads, METH_VARARGS, "set_threads(n): the pool's threads, the caller included"},
    {"threads", py_threads, METH_NOARGS, "threads(): the pool's threads, the caller included"},
    {"isa", py_isa, METH_NOARGS, "isa(): the path in use: 'avx512vnni', 'avxvnni', 'avx2' or 'portable'"},
    {"isas", py_isas, METH_NOARGS, "isas(): the paths this CPU can run, best last"},
    {"set_isa", py_set_isa, METH_VARARGS, "set_isa(name): run on that path ('best': the best the CPU has)"},
    {"peak", py_peak, METH_VARARGS, "peak(isa[, seconds]): one thread's multiply-adds a second on that path's dot products"},
    {"record_bytes", py_record_bytes, METH_VARARGS, "record_bytes(kind, k): bytes of one group's record"},
    {"repack_gguf", py_repack_gguf, METH_VARARGS,
     "repack_gguf(kind, rows, n, row_bytes, k, records): a GGUF tensor's rows into a packed kind's records"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu", "specdec's CPU kernels (see kernels/__init__.py)",
                                    -1, methods};

PyMODINIT_FUNC PyInit__cpu(void)
{
#if HAVE_X86
    __builtin_cpu_init();
    cpu_has[ISA_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    cpu_has[ISA_AVX512VNNI] = cpu_has[ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                              __builtin_cpu_supports("avx512vnni");
    /* the 256-bit vpdpbusd path: AVX-VNNI's encoding, or AVX512-VNNI's where the CPU has that instead */
    cpu_has[ISA_AVXVNNI] = cpu_has[ISA_AVX2] && (__builtin_cpu_supports("avxvnni") || cpu_has[ISA_AVX512VNNI]);
    cpu_avxvnni_encoding = __builtin_cpu_supports("avxvnni") ? VNNI_VEX : VNNI_EVEX;
    for (int i = 0; i < 4; i++)
        if (cpu_has[i])
            isa_best = i;
    isa_path = isa_best;
#endif
    cpu_pool_init();
    return PyModule_Create(&module);
}
