/* blas.c: OpenBLAS's kernels from the CPU's features, single-threaded BLAS
 * calls, and the task runner the model's phases use on optc's pool.
 *
 * OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels once, in
 * its constructor, from the CPU's vendor, family and model. A model number
 * newer than the library (family 6 model 207 for Debian 12's 0.3.21) falls
 * back to the generic Prescott kernels, 4-6x slower than SkylakeX's on the
 * model's shapes. OPENBLAS_CORETYPE would choose, but the constructor has
 * read the environment before main runs. The library exports the two
 * functions its constructor and destructor use, gotoblas_dynamic_init and
 * _quit; quit, setenv, init picks the kernels again, with the block sizes
 * (the core's init) that go with them. They are weak here, so a BLAS
 * without them (no DYNAMIC_ARCH) links and keeps its kernels. */
#include "blas.h"

#include "exec.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

char *openblas_get_config(void);
char *openblas_get_corename(void);
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char detected[32], how[96];

/* 2: AVX-512 kernels, 1: AVX2 + FMA, 0: older. */
static int core_tier(const char *core) {
  static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  static const char *const avx2[] = {"Haswell", "Zen"};
  for (size_t i = 0; i < ARRAY_LEN(avx512); i++)
    if (!strcasecmp(core, avx512[i]))
      return 2;
  for (size_t i = 0; i < ARRAY_LEN(avx2); i++)
    if (!strcasecmp(core, avx2[i]))
      return 1;
  return 0;
}

static void init_once(void) {
  __builtin_cpu_init();
  /* __builtin_cpu_supports checks that the OS saves the vector state too */
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  int want = avx512 ? 2 : avx2 ? 1 : 0;
  snprintf(detected, sizeof detected, "%s", openblas_get_corename());
  const char *forced = getenv("OPENBLAS_CORETYPE");
  if (forced && *forced) {
    snprintf(how, sizeof how, "from OPENBLAS_CORETYPE");
  } else if (core_tier(detected) < want && gotoblas_dynamic_init && gotoblas_dynamic_quit) {
    const char *core = want == 2 ? "SkylakeX" : __builtin_cpu_is("amd") ? "Zen" : "Haswell";
    gotoblas_dynamic_quit();
    setenv("OPENBLAS_CORETYPE", core, 1);
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    snprintf(how, sizeof how, "from %s; OpenBLAS detected %s", want == 2 ? "avx512f/bw/vl/dq" : "avx2/fma",
             detected);
  } else {
    snprintf(how, sizeof how, "OpenBLAS's detection; %s", avx512 ? "avx512f/bw/vl/dq" : avx2 ? "avx2/fma" : "no avx2");
  }
  openblas_set_num_threads(1);
}

void blas_init(void) { pthread_once(&once, init_once); }

const char *blas_describe(int threads) {
  static char line[256];
  blas_init();
  char version[64] = "";
  /* "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the first two words */
  const char *cfg = openblas_get_config();
  const char *sp = strchr(cfg, ' ');
  sp = sp ? strchr(sp + 1, ' ') : NULL;
  snprintf(version, sizeof version, "%.*s", sp ? (int)(sp - cfg) : (int)strlen(cfg), cfg);
  snprintf(line, sizeof line, "matmul: %s, core %s (%s), %d thread%s", version, openblas_get_corename(), how,
           threads, threads == 1 ? "" : "s");
  return line;
}

int blas_pool_threads(const ThreadPool *pool) { return pool ? pool_size(pool) : 1; }

/* ---- tasks on the pool ------------------------------------------------------------------ */

typedef struct {
  void (*fn)(void *ctx, int task, int slot);
  void *ctx;
  int ntasks;
  atomic_int next;
} Tasks;

/* pool_run gives each thread one index of [0, threads): its slot */
static void tasks_thread(void *arg, int64_t lo, int64_t hi) {
  Tasks *t = arg;
  for (int64_t slot = lo; slot < hi; slot++)
    for (int k; (k = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed)) < t->ntasks;)
      t->fn(t->ctx, k, (int)slot);
}

void blas_tasks(ThreadPool *pool, int ntasks, void (*fn)(void *ctx, int task, int slot), void *ctx) {
  int threads = MIN(blas_pool_threads(pool), ntasks);
  if (threads <= 1) {
    for (int k = 0; k < ntasks; k++)
      fn(ctx, k, 0);
    return;
  }
  /* the pool's threads call the BLAS at once: each call on its own thread */
  if (openblas_get_num_threads() != 1)
    openblas_set_num_threads(1);
  Tasks t = {fn, ctx, ntasks, 0};
  pool_run(pool, tasks_thread, &t, threads);
}
