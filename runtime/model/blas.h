/* blas.h: what the model's matmuls and loops run on (blas.c).
 *
 * The BLAS is OpenBLAS, its kernels chosen from the CPU's features rather
 * than its model number, and every BLAS call single-threaded: the
 * parallelism is optc's own thread pool (exec_cpu.c's ThreadPool, the one
 * the compiled optimizer step runs on), which hands a phase's tasks to its
 * threads and sleeps between phases. Nothing spins. */
#pragma once

typedef struct ThreadPool ThreadPool;

/* Once per process (later calls return at once), before the first matmul:
 * where OpenBLAS's own detection picked kernels older than the CPU's
 * features allow (Debian's 0.3.21 runs its generic Prescott kernels on CPUs
 * it has no model number for), switches it to the best kernels the
 * features allow: SkylakeX with avx512f/bw/vl/dq, Haswell (Zen on AMD) with
 * avx2 and fma. OPENBLAS_CORETYPE in the environment is left as the user
 * set it. Makes BLAS calls single-threaded. */
void blas_init(void);
/* One line for the log, with no newline, e.g.
 *   matmul: OpenBLAS 0.3.21, core SkylakeX (from avx512f/bw/vl/dq; OpenBLAS
 *   detected Prescott), 2 threads
 * threads: the pool's size. The text is static; calls blas_init. */
const char *blas_describe(int threads);
/* The pool's thread count: 1 for NULL. */
int blas_pool_threads(const ThreadPool *pool);
/* Runs fn(ctx, task, slot) once for every task in [0, ntasks), on the
 * pool's threads (NULL: on the caller's, in order), and returns when all
 * are done. A free thread takes the next task, so uneven tasks balance;
 * slot in [0, blas_pool_threads(pool)) names the thread, for per-thread
 * scratch, and a task's result must not depend on it: then the results do
 * not depend on the thread count. */
void blas_tasks(ThreadPool *pool, int ntasks, void (*fn)(void *ctx, int task, int slot), void *ctx);
