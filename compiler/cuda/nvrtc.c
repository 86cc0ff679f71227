/* nvrtc.c: the GPU backend's driver. The CUDA C of emit_cuda.c goes
 * through NVRTC to PTX and, for a real arch (sm_XX) that NVRTC knows, to a
 * cubin; the cubin, the PTX and ptxas's report are cached on disk (kind
 * "cuda", keyed by the source, the arch, NVRTC's version and optc's).
 *
 * The arch is the target's, else the visible device's, else sm_90. For a
 * device newer than this NVRTC, the program is PTX for the newest arch it
 * knows below it, which the driver compiles when it loads it; compute_XX
 * asks for PTX alone. (NVRTC answers a compute_XX compile with success and
 * an empty cubin: an empty cubin means PTX only.)
 *
 * The options make the kernels IEEE: --fmad=false (no contraction),
 * --prec-div=true and --prec-sqrt=true (correctly rounded / and sqrt),
 * --ftz=false (subnormals kept), as the interpreter computes.
 *
 * NVRTC itself is opened with dlopen the first time a CUDA program is
 * compiled (nvrtc_load: where it looks is in gpu.h), never linked, so that
 * liboptc loads and runs its CPU steps where there is none; then every
 * entry point says in one line why there is no CUDA backend. Built with
 * -Dcuda=disabled, they say that instead: this file is the one place that
 * knows (OPTC_HAVE_NVRTC). */
#include "gpu.h"

#include "driver.h"

#include <string.h>

static int ncompiles;

int cuda_compile_count(void) { return ncompiles; }

void cuda_program_free(CudaProgram *p) {
  if (!p)
    return;
  free(p->source);
  free(p->ptx);
  free(p->cubin);
  free(p->log);
  free(p->kernels);
  free(p);
}

void cuda_program_report(const CudaProgram *p, Buf *out) {
  buf_printf(out, "cuda program for %s (%s, NVRTC %d.%d):\n", p->arch, p->cubin ? "cubin" : "PTX only",
             p->nvrtc_major, p->nvrtc_minor);
  for (int k = 0; k < p->nkernels; k++) {
    const CudaKernel *c = &p->kernels[k];
    buf_printf(out, "  %-15s block %4d, %5d bytes shared", c->name, c->threads, c->smem);
    if (c->regs >= 0)
      buf_printf(out, ", %3d registers, %d bytes spill stores, %d bytes spill loads, %d bytes stack", c->regs,
                 c->spill_stores, c->spill_loads, c->stack);
    else
      buf_puts(out, p->cubin ? ", registers unknown (not in NVRTC's log)" : ", registers unknown (PTX is compiled by the driver)");
    buf_putc(out, '\n');
  }
  /* a cubin whose ptxas lines were not found: show what the log holds */
  bool unknown = false;
  for (int k = 0; k < p->nkernels; k++)
    unknown |= p->kernels[k].regs < 0;
  if (p->cubin && unknown) {
    size_t len = p->log ? strlen(p->log) : 0;
    buf_printf(out, "  NVRTC's log, %zu bytes%s\n%.*s%s", len, len > 2000 ? " (the first 2000)" : "",
               (int)MIN(len, 2000), len ? p->log : "", len && p->log[MIN(len, 2000) - 1] != '\n' ? "\n" : "");
  }
}

int cuda_emit_source(const Graph *g, const CudaTarget *t, Buf *out) { return cuda_emit(g, t, out, NULL); }

#ifdef OPTC_HAVE_NVRTC
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

/* ---- finding NVRTC ----------------------------------------------------------------------- */

CudaNvrtc nvrtc;

/* The sonames, newest first: a future major goes in front. */
static const char *const nvrtc_sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12"};

static struct {
  pthread_mutex_t lock; /* dirs and searched */
  pthread_once_t once;
  bool searched, loaded;
  char *dirs;           /* nvrtc_search_dirs' list, ':'-separated; NULL: none */
  char where[512];      /* the file NVRTC was opened from */
  char why[2048];       /* why it was not, one line */
} ld = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_ONCE_INIT};

bool nvrtc_search_dirs(const char *dirs) {
  pthread_mutex_lock(&ld.lock);
  bool ok = !ld.searched;
  if (ok) {
    free(ld.dirs);
    ld.dirs = dirs && *dirs ? xstrdup(dirs) : NULL;
  }
  pthread_mutex_unlock(&ld.lock);
  return ok;
}

/* Opens path and reads NVRTC's entry points from it. A file that is there
 * but does not open (or lacks a symbol) is noted in bad; one that is not
 * there is not. */
static bool open_nvrtc(const char *path, Buf *bad) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    if (strchr(path, '/') && access(path, F_OK) == 0)
      buf_printf(bad, "; %s", e ? e : path);
    return false;
  }
  CudaNvrtc f;
#define LOAD(field, sym, ret, params) \
  if (!(*(void **)&f.field = dlsym(h, sym))) { \
    buf_printf(bad, "; %s has no %s", path, sym); \
    dlclose(h); \
    return false; \
  }
  NVRTC_API(LOAD)
#undef LOAD
  nvrtc = f;
  Dl_info info;
  const char *file = dladdr(*(void **)&f.Version, &info) && info.dli_fname ? info.dli_fname : path;
  snprintf(ld.where, sizeof ld.where, "%s", file);
  return true;
}

/* dir/libnvrtc.so.13, then .12, unless dir was looked in already; dir
 * goes on the list of places looked in (", "-separated). */
static bool open_in(const char *dir, size_t len, Buf *looked, Buf *bad) {
  for (const char *p = looked->data; p && *p;) {
    const char *end = strstr(p, ", ");
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len && !memcmp(p, dir, len))
      return false;
    p = end ? end + 2 : p + n;
  }
  buf_printf(looked, "%s%.*s", looked->len ? ", " : "", (int)len, dir);
  for (size_t i = 0; i < ARRAY_LEN(nvrtc_sonames); i++) {
    char path[4096];
    snprintf(path, sizeof path, "%.*s/%s", (int)len, dir, nvrtc_sonames[i]);
    if (open_nvrtc(path, bad))
      return true;
  }
  return false;
}

static void search(void) {
  pthread_mutex_lock(&ld.lock);
  ld.searched = true;
  pthread_mutex_unlock(&ld.lock);
  Buf looked = {0}, bad = {0};
  const char *env = getenv("OPTC_NVRTC");
  if (env && *env) {
    ld.loaded = open_nvrtc(env, &bad);
    if (!ld.loaded)
      snprintf(ld.why, sizeof ld.why, "NVRTC not found: cannot open $OPTC_NVRTC=%s%s", env,
               bad.len ? "" : " (no such file)");
    if (!ld.loaded && bad.len)
      snprintf(ld.why + strlen(ld.why), sizeof ld.why - strlen(ld.why), " (%s)", bad.data + 2);
    buf_free(&bad);
    return;
  }
  for (const char *d = ld.dirs; d && *d && !ld.loaded;) {
    const char *end = strchr(d, ':');
    size_t len = end ? (size_t)(end - d) : strlen(d);
    if (len)
      ld.loaded = open_in(d, len, &looked, &bad);
    d = end ? end + 1 : d + len;
  }
  const char *home = getenv("CUDA_HOME");
  char dir[4096];
  if (!ld.loaded && home && *home) {
    size_t len = strlen(home);
    while (len > 1 && home[len - 1] == '/')
      len--;
    snprintf(dir, sizeof dir, "%.*s/lib64", (int)len, home);
    ld.loaded = open_in(dir, strlen(dir), &looked, &bad);
  }
  if (!ld.loaded)
    ld.loaded = open_in("/usr/local/cuda/lib64", strlen("/usr/local/cuda/lib64"), &looked, &bad);
  for (size_t i = 0; i < ARRAY_LEN(nvrtc_sonames) && !ld.loaded; i++)
    ld.loaded = open_nvrtc(nvrtc_sonames[i], &bad);
  if (!ld.loaded)
    snprintf(ld.why, sizeof ld.why,
             "NVRTC not found: no libnvrtc.so.13 or .12 in %s or on the loader's path%s; install torch's CUDA "
             "build (its nvidia wheels carry NVRTC) or the CUDA toolkit, or set OPTC_NVRTC to a libnvrtc.so",
             looked.data, bad.len ? bad.data : "");
  buf_free(&looked);
  buf_free(&bad);
}

bool nvrtc_load(char *why, size_t n) {
  pthread_once(&ld.once, search);
  if (!ld.loaded && why && n)
    snprintf(why, n, "%s", ld.why);
  return ld.loaded;
}

bool cuda_nvrtc_available(char *why, size_t n) {
  if (!nvrtc_load(why, n))
    return false;
  int major, minor;
  if (nvrtc.Version(&major, &minor) != NVRTC_SUCCESS) {
    snprintf(why, n, "NVRTC (%s) does not answer: nvrtcVersion failed", ld.where);
    return false;
  }
  snprintf(why, n, "NVRTC %d.%d (%s)", major, minor, ld.where);
  return true;
}

/* Every NVRTC call: on failure, file:line, the call and NVRTC's word for it. */
#define NVRTC_CHECK(call) nvrtc_check((call), #call, __FILE__, __LINE__)

static bool nvrtc_check(nvrtcResult r, const char *call, const char *file, int line) {
  if (r == NVRTC_SUCCESS)
    return true;
  diag_printf("%s:%d: NVRTC error: %s: %s\n", file, line, nvrtc.GetErrorString(r), call);
  return false;
}

/* The number in sm_90, sm_90a, compute_90; 0 if s is none of these. */
static int arch_number(const char *s, bool *virt) {
  const char *d = !strncmp(s, "sm_", 3) ? s + 3 : !strncmp(s, "compute_", 8) ? s + 8 : NULL;
  if (!d || *d < '0' || *d > '9')
    return 0;
  *virt = s[0] == 'c';
  return atoi(d);
}

int nvrtc_newest_arch(int want) {
  char why[2048];
  if (!nvrtc_load(why, sizeof why)) {
    error("cuda backend: %s", why);
    return -1;
  }
  int count = 0;
  if (!NVRTC_CHECK(nvrtc.GetNumSupportedArchs(&count)))
    return -1;
  int *archs = calloc((size_t)count + 1, sizeof(int));
  ASSERT(archs);
  if (!NVRTC_CHECK(nvrtc.GetSupportedArchs(archs))) {
    free(archs);
    return -1;
  }
  int best = 0;
  for (int i = 0; i < count; i++)
    if (archs[i] <= want && archs[i] > best)
      best = archs[i];
  free(archs);
  return best;
}

/* What NVRTC compiles for: the arch asked for when NVRTC can make a cubin
 * of it, else PTX (compute_NN) for the newest arch it knows at or below. */
static bool choose_arch(const char *want, char *arch, size_t n) {
  bool virt = false;
  int num = arch_number(want, &virt);
  if (!num) {
    error("cuda backend: unknown arch '%s'; expected sm_NN or compute_NN (e.g. sm_90)", want);
    return false;
  }
  int best = nvrtc_newest_arch(num);
  if (best < 0)
    return false;
  if (best == num) {
    snprintf(arch, n, "%s", want);
    return true;
  }
  if (!best) {
    error("cuda backend: NVRTC cannot compile for %s or any older arch it supports", want);
    return false;
  }
  snprintf(arch, n, "compute_%d", best);
  if (!virt)
    diag_printf("optc: NVRTC cannot make a cubin for %s; compiling PTX for %s, which the driver compiles\n",
            want, arch);
  return true;
}

/* The source with line numbers, for a compile that failed. */
static void print_numbered(const char *src) {
  int line = 1;
  diag_printf("%5d  ", line);
  for (const char *p = src; *p; p++) {
    fputc(*p, stderr);
    if (*p == '\n' && p[1])
      diag_printf("%5d  ", ++line);
  }
  fputc('\n', stderr);
}

static int parse_int_before(const char *line, const char *word) {
  const char *w = strstr(line, word);
  if (!w)
    return -1;
  const char *p = w;
  while (p > line && p[-1] == ' ')
    p--;
  while (p > line && p[-1] >= '0' && p[-1] <= '9')
    p--;
  return atoi(p);
}

/* ptxas -v, per entry function:
 *   ptxas info    : Function properties for optc_phase0
 *   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 40 registers, used 1 barriers, 16448 bytes smem */
static void parse_ptxas(const char *log, CudaKernel *ks, int n) {
  CudaKernel *cur = NULL;
  for (const char *line = log; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[512];
    snprintf(buf, sizeof buf, "%.*s", (int)MIN(len, sizeof buf - 1), line);
    const char *f = strstr(buf, "Function properties for ");
    const char *c = strstr(buf, "Compiling entry function '");
    if (f || c) {
      const char *name = f ? f + strlen("Function properties for ") : c + strlen("Compiling entry function '");
      cur = NULL;
      for (int k = 0; k < n; k++) {
        size_t m = strlen(ks[k].name);
        if (!strncmp(name, ks[k].name, m) && (name[m] == 0 || name[m] == '\'' || name[m] == ' '))
          cur = &ks[k];
      }
    } else if (cur && strstr(buf, "bytes stack frame")) {
      cur->stack = parse_int_before(buf, "bytes stack frame");
      cur->spill_stores = parse_int_before(buf, "bytes spill stores");
      cur->spill_loads = parse_int_before(buf, "bytes spill loads");
    } else if (cur && strstr(buf, "Used ") && strstr(buf, " registers")) {
      cur->regs = atoi(strstr(buf, "Used ") + 5);
    }
    line = end ? end + 1 : NULL;
  }
}

/* The cache payload: three length-prefixed blobs, cubin, PTX and log. */
static void pack(Buf *b, const void *p, size_t n) {
  uint64_t len = n;
  buf_put(b, &len, sizeof len);
  if (n)
    buf_put(b, p, n);
}

static bool unpack(const char **at, const char *end, void **out, size_t *n) {
  uint64_t len;
  if ((size_t)(end - *at) < sizeof len)
    return false;
  memcpy(&len, *at, sizeof len);
  *at += sizeof len;
  if (len > (uint64_t)(end - *at))
    return false;
  *out = NULL;
  if (len) {
    *out = malloc(len + 1);
    ASSERT(*out);
    memcpy(*out, *at, len);
    ((char *)*out)[len] = 0;
  }
  *n = len;
  *at += len;
  return true;
}

/* IEEE arithmetic as the interpreter's; line info for profilers; no
 * "declared but never referenced" for the numerics.h functions a program
 * does not use. */
static const char *const nvrtc_options[] = {"--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false",
                                            "-lineinfo", "--diag-suppress=177"};

/* NVRTC itself: source -> PTX, cubin and log in p. */
static bool run_nvrtc(CudaProgram *p) {
  nvrtcProgram prog;
  if (!NVRTC_CHECK(nvrtc.CreateProgram(&prog, p->source, "optc_step.cu", 0, NULL, NULL)))
    return false;
  char arch_opt[48];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", p->arch);
  const char *opts[16];
  int nopts = 0;
  opts[nopts++] = arch_opt;
  for (size_t i = 0; i < ARRAY_LEN(nvrtc_options); i++)
    opts[nopts++] = nvrtc_options[i];
  bool real = !strncmp(p->arch, "sm_", 3);
  if (real)
    opts[nopts++] = "--ptxas-options=-v"; /* registers, spills and stack, in the log */
  nvrtcResult rc = nvrtc.CompileProgram(prog, nopts, opts);
  size_t loglen = 0;
  bool ok = NVRTC_CHECK(nvrtc.GetProgramLogSize(prog, &loglen));
  p->log = calloc(loglen + 1, 1);
  ASSERT(p->log);
  if (ok && loglen)
    ok = NVRTC_CHECK(nvrtc.GetProgramLog(prog, p->log));
  if (rc != NVRTC_SUCCESS) {
    diag_printf("%s:%d: NVRTC error: %s: nvrtcCompileProgram for %s\n--- NVRTC log ---\n%s\n"
                    "--- the generated source ---\n",
            __FILE__, __LINE__, nvrtc.GetErrorString(rc), p->arch, p->log);
    print_numbered(p->source);
    ok = false;
  }
  if (ok)
    ok = NVRTC_CHECK(nvrtc.GetPTXSize(prog, &p->ptx_len));
  if (ok) {
    p->ptx = calloc(p->ptx_len + 1, 1);
    ASSERT(p->ptx);
    ok = NVRTC_CHECK(nvrtc.GetPTX(prog, p->ptx));
    p->ptx_len = strlen(p->ptx);
  }
  if (ok && real) {
    size_t n = 0;
    ok = NVRTC_CHECK(nvrtc.GetCUBINSize(prog, &n));
    if (ok && n > 0) {
      p->cubin = malloc(n);
      ASSERT(p->cubin);
      ok = NVRTC_CHECK(nvrtc.GetCUBIN(prog, p->cubin));
      p->cubin_len = n;
    }
  }
  NVRTC_CHECK(nvrtc.DestroyProgram(&prog));
  return ok;
}

CudaProgram *cuda_compile(const Graph *g, const CudaTarget *t, CompileTimes *times) {
  if (!g->plan) {
    error("cuda backend: the graph has no plan (run the pass pipeline first)");
    return NULL;
  }
  char missing[2048];
  if (!nvrtc_load(missing, sizeof missing)) {
    error("cuda backend: %s", missing);
    return NULL;
  }
  double t0 = now_seconds();
  CudaProgram *p = calloc(1, sizeof *p);
  ASSERT(p);
  p->nkernels = g->plan->nphases + 1;
  p->kernels = calloc((size_t)p->nkernels, sizeof(CudaKernel));
  ASSERT(p->kernels);
  Buf src = {0};
  if (cuda_emit(g, t, &src, p->kernels) != 0) {
    buf_free(&src);
    cuda_program_free(p);
    return NULL;
  }
  p->source = src.data;
  if (!NVRTC_CHECK(nvrtc.Version(&p->nvrtc_major, &p->nvrtc_minor))) {
    cuda_program_free(p);
    return NULL;
  }
  char want[24], why[160];
  if (t && t->arch)
    snprintf(want, sizeof want, "%s", t->arch);
  else if (!cuda_device_arch(want, sizeof want, why, sizeof why))
    snprintf(want, sizeof want, "sm_90");
  if (!choose_arch(want, p->arch, sizeof p->arch)) {
    cuda_program_free(p);
    return NULL;
  }
  double t1 = now_seconds();
  p->times.build = (t1 - t0) * 1e3;

  Buf key = {0};
  buf_printf(&key, "optc %s cuda nvrtc %d.%d arch %s options", OPTC_VERSION, p->nvrtc_major, p->nvrtc_minor, p->arch);
  for (size_t i = 0; i < ARRAY_LEN(nvrtc_options); i++)
    buf_printf(&key, " %s", nvrtc_options[i]);
  buf_putc(&key, '\n');
  buf_puts(&key, p->source);
  bool use_cache = !(t && t->no_cache);
  void *data = NULL;
  size_t len = 0;
  bool hit = false;
  if (use_cache && cache_get("cuda", key.data, &data, &len)) {
    const char *at = data, *end = (const char *)data + len;
    size_t loglen;
    void *log = NULL;
    hit = unpack(&at, end, &p->cubin, &p->cubin_len) && unpack(&at, end, (void **)&p->ptx, &p->ptx_len) &&
          unpack(&at, end, &log, &loglen) && at == end;
    p->log = log ? log : calloc(1, 1);
    if (!hit) { /* unreadable: compile afresh */
      free(p->cubin), free(p->ptx), free(p->log);
      p->cubin = NULL, p->ptx = NULL, p->log = NULL;
      p->cubin_len = p->ptx_len = 0;
    }
    free(data);
  }
  if (!hit) {
    if (!run_nvrtc(p)) {
      buf_free(&key);
      cuda_program_free(p);
      return NULL;
    }
    ncompiles++;
    p->times.codegen = (now_seconds() - t1) * 1e3;
    if (use_cache) {
      Buf blob = {0};
      pack(&blob, p->cubin, p->cubin_len);
      pack(&blob, p->ptx, p->ptx_len);
      pack(&blob, p->log, strlen(p->log));
      cache_put("cuda", key.data, blob.data, blob.len);
      buf_free(&blob);
    }
  }
  buf_free(&key);
  parse_ptxas(p->log, p->kernels, p->nkernels);
  p->times.cache_hit = hit;
  if (times) {
    times->build += p->times.build;
    times->codegen += p->times.codegen;
    times->cache_hit = hit;
  }
  return p;
}

int cuda_emit_ptx(const Graph *g, const CudaTarget *t, Buf *out) {
  CudaProgram *p = cuda_compile(g, t, NULL);
  if (!p)
    return -1;
  int rc = 0;
  if (p->ptx)
    buf_put(out, p->ptx, p->ptx_len);
  else
    rc = -1, error("cuda backend: no PTX for %s", p->arch);
  cuda_program_free(p);
  return rc;
}

int cuda_emit_cubin(const Graph *g, const CudaTarget *t, Buf *out) {
  CudaProgram *p = cuda_compile(g, t, NULL);
  if (!p)
    return -1;
  int rc = 0;
  if (p->cubin)
    buf_put(out, p->cubin, p->cubin_len);
  else
    rc = -1, error("cuda backend: NVRTC made no cubin for %s (PTX only); ask for --emit=ptx, or a real sm_NN arch",
                   p->arch);
  cuda_program_free(p);
  return rc;
}

#else /* -Dcuda=disabled */

#define NO_CUDA "this optc was built without the CUDA backend (meson -Dcuda=disabled)"

bool nvrtc_search_dirs(const char *dirs) {
  (void)dirs;
  return true;
}

bool nvrtc_load(char *why, size_t n) {
  snprintf(why, n, NO_CUDA);
  return false;
}

bool cuda_nvrtc_available(char *why, size_t n) { return nvrtc_load(why, n); }

CudaProgram *cuda_compile(const Graph *g, const CudaTarget *t, CompileTimes *times) {
  (void)g, (void)t, (void)times;
  error(NO_CUDA);
  return NULL;
}

int cuda_emit_ptx(const Graph *g, const CudaTarget *t, Buf *out) {
  (void)out;
  return cuda_compile(g, t, NULL) ? 0 : -1;
}

int cuda_emit_cubin(const Graph *g, const CudaTarget *t, Buf *out) {
  (void)out;
  return cuda_compile(g, t, NULL) ? 0 : -1;
}

int nvrtc_newest_arch(int want) {
  (void)want;
  error(NO_CUDA);
  return -1;
}

#endif
