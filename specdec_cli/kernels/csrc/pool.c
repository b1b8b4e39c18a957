/*
 * pool.c: the kernels' thread pool. cpu_run_parallel(fn, ctx, items) splits items [0, items) across the pool's
 * workers and the calling thread and returns when every share is done; a second caller arriving while the pool is
 * busy runs its job alone on its own thread. Idle workers spin briefly (kernels come in quick succession), then
 * sleep. A forked child starts single-threaded.
 * Not here: any kernel, or how a kernel splits its work into items (each kernel's file decides; every item is
 * computed by the same operations whichever thread takes it, so results never depend on the threads).
 */
#include "kernels.h"

#define SPIN_SECONDS 5e-4 /* an idle worker spins this long before sleeping: kernels come in quick succession */

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

double cpu_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Take chunks of job `generation`'s items until none is left. Any thread may compute any item: every kernel
 * computes an item by the same operations whichever thread takes it, so results never depend on timing, and a
 * thread the OS preempts delays only the chunk it holds. A claim is valid only while the claim word still names
 * the job (cpu_run_parallel renews it before it writes the next job's fields). */
static void work_on(long generation)
{
    task_fn fn = pool.fn;
    const void *ctx = pool.ctx;
    long items = pool.items, chunk = pool.chunk;
    long long tag = (long long)(generation & 0xffffffffL) << 32;
    long finished = 0; /* this thread's items of the job, counted into pool.done once, as it leaves */
    for (;;) {
        long long word = atomic_load(&pool.claim);
        if ((word & ~0xffffffffLL) != tag)
            break;
        long start = (long)(word & 0xffffffffLL);
        if (start >= items)
            break;
        long stop = start + chunk < items ? start + chunk : items;
        if (!atomic_compare_exchange_weak(&pool.claim, &word, tag | stop))
            continue;
        fn(ctx, start, stop);
        finished += stop - start;
    }
    if (finished > 0)
        atomic_fetch_add(&pool.done, finished);
}

static void *worker_main(void *arg)
{
    (void)arg;
    long seen = pool.base_generation; /* not the current one: a job may already have been posted */
    for (;;) {
        double spin_until = cpu_now_seconds() + SPIN_SECONDS;
        long spins = 0, generation;
        while ((generation = atomic_load(&pool.generation)) == seen && !atomic_load(&pool.stopping)) {
            if ((++spins & 255) != 0 || cpu_now_seconds() < spin_until) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool.sleep_lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.generation) == seen && !atomic_load(&pool.stopping))
                pthread_cond_wait(&pool.wake, &pool.sleep_lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.sleep_lock);
            spin_until = cpu_now_seconds() + SPIN_SECONDS;
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
void cpu_run_parallel(task_fn fn, const void *ctx, long items)
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
    /* two chunks a thread: every claim and count moves a cache line between cores, which a small model's calls
     * (tens of microseconds) feel; on a 2-core Zen 4, against four chunks a thread and a count per chunk, the
     * default model decodes 1.03-1.17x the tokens a second, and larger models' block matmuls take 0.98-0.99x */
    pool.chunk = items / (2 * pool.count) > 1 ? items / (2 * pool.count) : 1;
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

int cpu_threads(void)
{
    return pool.count;
}

/* The pool's threads, the caller included (1 .. MAX_THREADS); waits for a job in progress. -1: a worker could not
 * be started (the pool keeps those that were). */
int cpu_set_threads(int count)
{
    pthread_mutex_lock(&pool.job_lock);
    stop_workers();
    int failed = start_workers(count);
    pthread_mutex_unlock(&pool.job_lock);
    return failed;
}

/* Called once, at import. */
void cpu_pool_init(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}
