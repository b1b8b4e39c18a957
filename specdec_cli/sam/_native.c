/*
 * Static suffix-automaton builder (one of specdec's two C extensions; the other is kernels/_cpu.c).
 *
 * `build(tokens, vocab_size, link, length, min_endpos, count, trans_offsets, trans_tokens, trans_targets)`
 * builds the suffix automaton of a token sequence (int32 ids in [0, vocab_size)) with the classic online
 * construction and fills caller-preallocated int32 arrays through the buffer protocol (no numpy C API):
 *
 *   link[s], length[s], min_endpos[s], count[s]      one entry per state (capacity >= 2n, at least 1)
 *   trans_offsets[s] .. trans_offsets[s + 1]          CSR slice of state s (capacity >= states + 1)
 *   trans_tokens[k], trans_targets[k]                 transitions, tokens sorted within each state
 *
 * and returns (num_states, num_transitions). State 0 is the root. A state made for text position i gets
 * min_endpos = i and count 1; a clone copies min_endpos from the state it splits and gets count 0; counts
 * are then summed up the suffix links in decreasing length order (a counting sort by length), so count[s]
 * is the number of occurrences of the state's strings. The root has min_endpos -1.
 *
 * Memory during the build: the root's transitions are a dense array over the vocabulary (the root is
 * visited at almost every step and has the most transitions); every other transition lives in one
 * open-addressing hash table keyed by (state, token), plus a per-state singly linked list of tokens that
 * is only read when a state is cloned. The CSR arrays are produced at the end by one sequential pass
 * over the hash table (a counting sort by state) and a small sort per state.
 *
 * The GIL is released while building. This file does not read, write or validate index files, and knows
 * nothing about tokenizers; see automaton.py and index.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NO_STATE (-1)

/* ---------------------------------------------------------------- transitions of non-root states */

typedef struct {
    int32_t state; /* NO_STATE marks an empty slot */
    int32_t token;
    int32_t target;
} EdgeSlot;

typedef struct {
    EdgeSlot *slots;
    uint64_t capacity;
    uint64_t used;
    uint64_t grow_at; /* grow when used reaches this */
} EdgeTable;

static inline uint64_t edge_hash(int32_t state, int32_t token)
{
    uint64_t key = ((uint64_t)(uint32_t)state << 32) | (uint32_t)token;
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ULL;
    key ^= key >> 29;
    return key;
}

/* Map a 64-bit hash onto [0, capacity) without a power-of-two capacity (multiply-high). */
static inline uint64_t slot_index(uint64_t hash, uint64_t capacity)
{
    return (uint64_t)(((unsigned __int128)hash * capacity) >> 64);
}

static int edge_table_init(EdgeTable *table, uint64_t capacity)
{
    if (capacity < 1024)
        capacity = 1024;
    table->slots = (EdgeSlot *)malloc(capacity * sizeof(EdgeSlot));
    if (table->slots == NULL)
        return -1;
    memset(table->slots, 0xff, capacity * sizeof(EdgeSlot));
    table->capacity = capacity;
    table->used = 0;
    table->grow_at = capacity / 10 * 7;
    return 0;
}

/* The slot holding (state, token), or the empty slot where it would go. */
static inline EdgeSlot *edge_probe(const EdgeTable *table, int32_t state, int32_t token)
{
    uint64_t index = slot_index(edge_hash(state, token), table->capacity);
    for (;;) {
        EdgeSlot *slot = &table->slots[index];
        if (slot->state == NO_STATE || (slot->state == state && slot->token == token))
            return slot;
        if (++index == table->capacity)
            index = 0;
    }
}

static int edge_table_grow(EdgeTable *table)
{
    EdgeSlot *old_slots = table->slots;
    uint64_t old_capacity = table->capacity;
    if (edge_table_init(table, old_capacity + old_capacity / 2) != 0) {
        table->slots = old_slots;
        table->capacity = old_capacity;
        return -1;
    }
    for (uint64_t i = 0; i < old_capacity; i++) {
        if (old_slots[i].state != NO_STATE) {
            *edge_probe(table, old_slots[i].state, old_slots[i].token) = old_slots[i];
            table->used++;
        }
    }
    free(old_slots);
    return 0;
}

/* ---------------------------------------------------------------- the build */

typedef struct {
    const int32_t *tokens;
    int64_t num_tokens;
    int32_t vocab_size;
    int32_t *link, *length, *min_endpos, *count;
    int32_t *trans_offsets, *trans_tokens, *trans_targets;
    int64_t state_capacity, offsets_capacity, trans_capacity;
    /* results */
    int64_t num_states, num_transitions;
    const char *error; /* static message, NULL on success */
} BuildJob;

/*
 * Where transitions live during the build. Most states (about 85% on source code) end up with exactly
 * one transition, so each state's first transition is stored inline, at index s of the output arrays
 * trans_tokens / trans_targets (they hold >= 2n entries, the state bound, and are rearranged into CSR
 * in place at the end). Only the second and later transitions go to the hash table, and only those are
 * chained in the per-state lists used for cloning.
 */
typedef struct {
    int32_t *root;        /* root: target per token, NO_STATE when absent */
    int64_t root_edges;
    int32_t *first_token; /* per state: its first transition's token (NO_STATE: none) ... */
    int32_t *first_target; /* ... and target */
    int32_t *more_head;  /* per state: newest entry of its list of further tokens, -1 when none */
    int32_t *more_token; /* list entries */
    int32_t *more_next;
    int64_t more_used;
    EdgeTable more;      /* (state, token) -> target for the further transitions */
} Workspace;

static void workspace_free(Workspace *ws)
{
    free(ws->root);
    free(ws->more_head);
    free(ws->more_token);
    free(ws->more_next);
    free(ws->more.slots);
    memset(ws, 0, sizeof(*ws));
}

static inline void init_state(Workspace *ws, int32_t state)
{
    ws->first_token[state] = NO_STATE;
    ws->more_head[state] = -1;
}

/* Add a transition known to be absent from a state whose inline slot is taken. -1: out of memory. */
static inline int add_more(Workspace *ws, int32_t state, int32_t token, int32_t target)
{
    if (ws->more.used >= ws->more.grow_at && edge_table_grow(&ws->more) != 0)
        return -1;
    EdgeSlot *slot = edge_probe(&ws->more, state, token);
    slot->state = state;
    slot->token = token;
    slot->target = target;
    ws->more.used++;
    const int32_t entry = (int32_t)ws->more_used++;
    ws->more_token[entry] = token;
    ws->more_next[entry] = ws->more_head[state];
    ws->more_head[state] = entry;
    return 0;
}

/* Pointer to the target of (state, token) for a non-root state, or NULL when absent. */
static inline int32_t *find_target(Workspace *ws, int32_t state, int32_t token)
{
    if (ws->first_token[state] == token)
        return &ws->first_target[state];
    if (ws->more_head[state] == -1)
        return NULL;
    EdgeSlot *slot = edge_probe(&ws->more, state, token);
    return slot->state == NO_STATE ? NULL : &slot->target;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sort one state's CSR slice by token (tokens are unique within a state). */
static void sort_slice(int32_t *tokens, int32_t *targets, int64_t n, uint64_t *scratch)
{
    if (n <= 24) {
        for (int64_t i = 1; i < n; i++) {
            int32_t token = tokens[i], target = targets[i];
            int64_t j = i - 1;
            while (j >= 0 && tokens[j] > token) {
                tokens[j + 1] = tokens[j];
                targets[j + 1] = targets[j];
                j--;
            }
            tokens[j + 1] = token;
            targets[j + 1] = target;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++)
        scratch[i] = ((uint64_t)(uint32_t)tokens[i] << 32) | (uint32_t)targets[i];
    qsort(scratch, (size_t)n, sizeof(uint64_t), cmp_u64);
    for (int64_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(scratch[i] >> 32);
        targets[i] = (int32_t)(scratch[i] & 0xffffffffu);
    }
}

/* Occurrence counts: sum up the suffix links in decreasing length order (a counting sort by length). */
static int propagate_counts(BuildJob *job, int32_t num_states)
{
    const int64_t n = job->num_tokens;
    int32_t *bucket = (int32_t *)calloc((size_t)n + 2, sizeof(int32_t));
    int32_t *order = (int32_t *)malloc((size_t)num_states * sizeof(int32_t));
    if (bucket == NULL || order == NULL) {
        free(bucket);
        free(order);
        return -1;
    }
    for (int32_t s = 0; s < num_states; s++)
        bucket[job->length[s] + 1]++;
    for (int64_t k = 1; k <= n + 1; k++)
        bucket[k] += bucket[k - 1];
    for (int32_t s = 0; s < num_states; s++)
        order[bucket[job->length[s]]++] = s;
    for (int64_t k = (int64_t)num_states - 1; k > 0; k--) {
        const int32_t s = order[k];
        job->count[job->link[s]] += job->count[s];
    }
    free(bucket);
    free(order);
    return 0;
}

/*
 * CSR in place: count per state, prefix sums, then fill. offsets[s + 1] first holds the start of s and
 * serves as its fill cursor, ending as the start of s + 1. The inline transitions sit at index s of the
 * transition arrays and move to start(s) >= s (every state but the last has a transition, and states
 * numbered after the last one are clones, which need two distinct tokens, so the root has >= 2), in
 * decreasing s, so no inline transition is overwritten before it has moved. The root's and the hash
 * table's transitions are written after that.
 */
static int emit_csr(BuildJob *job, Workspace *ws, int32_t num_states)
{
    int32_t *offsets = job->trans_offsets;
    int32_t *tokens = job->trans_tokens, *targets = job->trans_targets;
    offsets[0] = 0;
    offsets[1] = (int32_t)ws->root_edges;
    for (int32_t s = 1; s < num_states; s++)
        offsets[s + 1] = tokens[s] != NO_STATE;
    for (uint64_t k = 0; k < ws->more.capacity; k++)
        if (ws->more.slots[k].state != NO_STATE)
            offsets[ws->more.slots[k].state + 1]++;
    int64_t running = 0;
    for (int32_t s = 0; s < num_states; s++) {
        const int32_t width = offsets[s + 1];
        offsets[s + 1] = (int32_t)running;
        running += width;
    }
    for (int32_t s = num_states - 1; s >= 1; s--) {
        if (tokens[s] != NO_STATE) {
            const int32_t at = offsets[s + 1]++;
            if (at < s)
                return -2;
            tokens[at] = tokens[s];
            targets[at] = targets[s];
        }
    }
    for (int32_t token = 0; token < job->vocab_size; token++) { /* the root: already in token order */
        if (ws->root[token] != NO_STATE) {
            tokens[offsets[1]] = token;
            targets[offsets[1]++] = ws->root[token];
        }
    }
    for (uint64_t k = 0; k < ws->more.capacity; k++) {
        const EdgeSlot *slot = &ws->more.slots[k];
        if (slot->state != NO_STATE) {
            const int32_t at = offsets[slot->state + 1]++;
            tokens[at] = slot->token;
            targets[at] = slot->target;
        }
    }
    free(ws->more.slots);
    ws->more.slots = NULL;
    int64_t widest = 1;
    for (int32_t s = 1; s < num_states; s++)
        if (offsets[s + 1] - offsets[s] > widest)
            widest = offsets[s + 1] - offsets[s];
    uint64_t *scratch = (uint64_t *)malloc((size_t)widest * sizeof(uint64_t));
    if (scratch == NULL)
        return -1;
    for (int32_t s = 1; s < num_states; s++)
        sort_slice(tokens + offsets[s], targets + offsets[s], offsets[s + 1] - offsets[s], scratch);
    free(scratch);
    return 0;
}

static void run_build(BuildJob *job)
{
    Workspace ws;
    memset(&ws, 0, sizeof(ws));
    const int64_t n = job->num_tokens;
    int32_t *link = job->link, *length = job->length, *min_endpos = job->min_endpos, *count = job->count;

    for (int64_t i = 0; i < n; i++) {
        if (job->tokens[i] < 0 || job->tokens[i] >= job->vocab_size) {
            job->error = "token id out of range [0, vocab_size)";
            return;
        }
    }

    /* Worst-case sizes; pages that are never written cost no memory. */
    const int64_t max_states = n > 0 ? 2 * n : 1;
    const int64_t max_more = n > 0 ? 3 * n : 1; /* transitions are never removed: bounded by the final count */
    ws.root = (int32_t *)malloc((size_t)job->vocab_size * sizeof(int32_t));
    ws.first_token = job->trans_tokens;
    ws.first_target = job->trans_targets;
    ws.more_head = (int32_t *)malloc((size_t)max_states * sizeof(int32_t));
    ws.more_token = (int32_t *)malloc((size_t)max_more * sizeof(int32_t));
    ws.more_next = (int32_t *)malloc((size_t)max_more * sizeof(int32_t));
    /* About 0.75 further transitions per token on text; the table grows by half when 70% full. */
    if (ws.root == NULL || ws.more_head == NULL || ws.more_token == NULL ||
        ws.more_next == NULL || edge_table_init(&ws.more, (uint64_t)(n + n / 2)) != 0)
        goto out_of_memory;
    memset(ws.root, 0xff, (size_t)job->vocab_size * sizeof(int32_t));

    int32_t num_states = 1;
    link[0] = NO_STATE;
    length[0] = 0;
    min_endpos[0] = NO_STATE;
    count[0] = 0;
    init_state(&ws, 0);
    int32_t last = 0;

    for (int64_t i = 0; i < n; i++) {
        const int32_t token = job->tokens[i];
        const int32_t cur = num_states++;
        length[cur] = length[last] + 1;
        min_endpos[cur] = (int32_t)i;
        count[cur] = 1;
        init_state(&ws, cur);

        /* Walk the suffix links from `last`, adding `token` -> cur until a state already has it. */
        int32_t p = last;
        int32_t q = NO_STATE;
        while (p != NO_STATE) {
            if (p == 0) {
                if (ws.root[token] != NO_STATE) {
                    q = ws.root[token];
                    break;
                }
                ws.root[token] = cur;
                ws.root_edges++;
                p = NO_STATE;
                break;
            }
            if (ws.first_token[p] == token) {
                q = ws.first_target[p];
                break;
            }
            if (ws.first_token[p] == NO_STATE) {
                ws.first_token[p] = token;
                ws.first_target[p] = cur;
            } else if (ws.more_head[p] == -1) {
                if (add_more(&ws, p, token, cur) != 0)
                    goto out_of_memory;
            } else {
                if (ws.more.used >= ws.more.grow_at && edge_table_grow(&ws.more) != 0)
                    goto out_of_memory;
                EdgeSlot *slot = edge_probe(&ws.more, p, token);
                if (slot->state != NO_STATE) {
                    q = slot->target;
                    break;
                }
                if (add_more(&ws, p, token, cur) != 0)
                    goto out_of_memory;
            }
            p = link[p];
        }

        if (p == NO_STATE) {
            link[cur] = 0;
        } else if (length[p] + 1 == length[q]) {
            link[cur] = q;
        } else {
            /* Split q: the clone takes the strings of length <= length[p] + 1. */
            const int32_t clone = num_states++;
            length[clone] = length[p] + 1;
            link[clone] = link[q];
            min_endpos[clone] = min_endpos[q];
            count[clone] = 0;
            ws.first_token[clone] = ws.first_token[q];
            ws.first_target[clone] = ws.first_target[q];
            ws.more_head[clone] = -1;
            for (int32_t entry = ws.more_head[q]; entry != -1; entry = ws.more_next[entry]) {
                const int32_t edge_token = ws.more_token[entry];
                const int32_t target = edge_probe(&ws.more, q, edge_token)->target;
                if (add_more(&ws, clone, edge_token, target) != 0)
                    goto out_of_memory;
            }
            /* Redirect p and its suffix-link ancestors from q to the clone. */
            while (p != NO_STATE) {
                int32_t *target = p == 0 ? &ws.root[token] : find_target(&ws, p, token);
                if (target == NULL || *target != q)
                    break;
                *target = clone;
                p = link[p];
            }
            link[q] = clone;
            link[cur] = clone;
        }
        last = cur;
    }

    /* The lists of further tokens were only needed for cloning. */
    free(ws.more_head);
    free(ws.more_token);
    free(ws.more_next);
    ws.more_head = ws.more_token = ws.more_next = NULL;

    int64_t num_transitions = ws.root_edges + (int64_t)ws.more.used;
    for (int32_t s = 1; s < num_states; s++)
        num_transitions += ws.first_token[s] != NO_STATE;
    if (num_transitions > job->trans_capacity || num_states + 1 > job->offsets_capacity) {
        workspace_free(&ws);
        job->error = "transition arrays too small (internal error)";
        return;
    }
    if (propagate_counts(job, num_states) != 0)
        goto out_of_memory;
    const int emitted = emit_csr(job, &ws, num_states);
    if (emitted == -2) {
        workspace_free(&ws);
        job->error = "CSR layout invariant broken (internal error)";
        return;
    }
    if (emitted != 0)
        goto out_of_memory;

    workspace_free(&ws);
    job->num_states = num_states;
    job->num_transitions = num_transitions;
    return;

out_of_memory:
    workspace_free(&ws);
    job->error = "out of memory";
}

/* ---------------------------------------------------------------- Python glue */

static int get_int32_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0)
        return -1;
    const char *format = view->format ? view->format : "B";
    char code = format[strlen(format) - 1];
    if (view->itemsize != 4 || !(code == 'i' || code == 'l') ||
        (format[0] == '>' || format[0] == '!')) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous native int32 buffer (got format '%s', itemsize %zd)",
                     name, format, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *native_build(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *objects[9];
    long vocab_size;
    const char *names[9] = {"tokens",        "link",         "length",       "min_endpos", "count",
                            "trans_offsets", "trans_tokens", "trans_targets", NULL};
    if (!PyArg_ParseTuple(args, "OlOOOOOOO:build", &objects[0], &vocab_size, &objects[1], &objects[2],
                          &objects[3], &objects[4], &objects[5], &objects[6], &objects[7]))
        return NULL;
    if (vocab_size <= 0 || vocab_size > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "vocab_size must be in [1, 2**31)");
        return NULL;
    }

    Py_buffer views[8];
    int acquired = 0;
    for (; acquired < 8; acquired++) {
        if (get_int32_buffer(objects[acquired], &views[acquired], acquired > 0, names[acquired]) != 0)
            break;
    }
    if (acquired < 8) {
        for (int k = 0; k < acquired; k++)
            PyBuffer_Release(&views[k]);
        return NULL;
    }

    BuildJob job;
    memset(&job, 0, sizeof(job));
    job.tokens = (const int32_t *)views[0].buf;
    job.num_tokens = views[0].len / 4;
    job.vocab_size = (int32_t)vocab_size;
    job.link = (int32_t *)views[1].buf;
    job.length = (int32_t *)views[2].buf;
    job.min_endpos = (int32_t *)views[3].buf;
    job.count = (int32_t *)views[4].buf;
    job.trans_offsets = (int32_t *)views[5].buf;
    job.trans_tokens = (int32_t *)views[6].buf;
    job.trans_targets = (int32_t *)views[7].buf;
    job.state_capacity = views[1].len / 4;
    for (int k = 2; k <= 4; k++)
        if (views[k].len / 4 < job.state_capacity)
            job.state_capacity = views[k].len / 4;
    job.offsets_capacity = views[5].len / 4;
    job.trans_capacity = views[6].len / 4 < views[7].len / 4 ? views[6].len / 4 : views[7].len / 4;

    const int64_t n = job.num_tokens;
    if (n > (int64_t)INT32_MAX / 3) {
        job.error = "too many tokens for int32 arrays";
    } else if (job.state_capacity < (n > 0 ? 2 * n : 1) || job.offsets_capacity < 2 ||
               job.trans_capacity < (n > 0 ? 3 * n : 1)) {
        job.error = "state arrays must hold max(2n, 1) entries, transition arrays max(3n, 1)";
    } else {
        Py_BEGIN_ALLOW_THREADS
        run_build(&job);
        Py_END_ALLOW_THREADS
    }

    for (int k = 0; k < 8; k++)
        PyBuffer_Release(&views[k]);
    if (job.error != NULL) {
        if (strcmp(job.error, "out of memory") == 0)
            return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError, job.error);
        return NULL;
    }
    return Py_BuildValue("(LL)", (long long)job.num_states, (long long)job.num_transitions);
}

static PyMethodDef native_methods[] = {
    {"build", native_build, METH_VARARGS,
     "build(tokens, vocab_size, link, length, min_endpos, count, trans_offsets, trans_tokens, trans_targets)"
     " -> (num_states, num_transitions)\n\nBuild the suffix automaton of an int32 token buffer into "
     "preallocated int32 buffers (states: 2n, offsets: states + 1, transitions: 3n)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native", "Suffix-automaton builder (C).", -1, native_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&native_module);
}
