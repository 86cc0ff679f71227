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
 * Built without NVRTC (meson -Dcuda=disabled, or no toolkit), every entry
 * point says so and the rest of optc is unchanged: this file is the one
 * place that knows (OPTC_HAVE_NVRTC). */
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
#include <nvrtc.h>

/* Every NVRTC call: on failure, file:line, the call and NVRTC's word for it. */
#define NVRTC_CHECK(call) nvrtc_check((call), #call, __FILE__, __LINE__)

static bool nvrtc_check(nvrtcResult r, const char *call, const char *file, int line) {
  if (r == NVRTC_SUCCESS)
    return true;
  diag_printf("%s:%d: NVRTC error: %s: %s\n", file, line, nvrtcGetErrorString(r), call);
  return false;
}

bool cuda_nvrtc_available(char *why, size_t n) {
  int major, minor;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) {
    snprintf(why, n, "NVRTC does not answer (nvrtcVersion failed)");
    return false;
  }
  snprintf(why, n, "NVRTC %d.%d", major, minor);
  return true;
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
  int count = 0;
  if (!NVRTC_CHECK(nvrtcGetNumSupportedArchs(&count)))
    return -1;
  int *archs = calloc((size_t)count + 1, sizeof(int));
  ASSERT(archs);
  if (!NVRTC_CHECK(nvrtcGetSupportedArchs(archs))) {
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
  if (!NVRTC_CHECK(nvrtcCreateProgram(&prog, p->source, "optc_step.cu", 0, NULL, NULL)))
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
  nvrtcResult rc = nvrtcCompileProgram(prog, nopts, opts);
  size_t loglen = 0;
  bool ok = NVRTC_CHECK(nvrtcGetProgramLogSize(prog, &loglen));
  p->log = calloc(loglen + 1, 1);
  ASSERT(p->log);
  if (ok && loglen)
    ok = NVRTC_CHECK(nvrtcGetProgramLog(prog, p->log));
  if (rc != NVRTC_SUCCESS) {
    diag_printf("%s:%d: NVRTC error: %s: nvrtcCompileProgram for %s\n--- NVRTC log ---\n%s\n"
                    "--- the generated source ---\n",
            __FILE__, __LINE__, nvrtcGetErrorString(rc), p->arch, p->log);
    print_numbered(p->source);
    ok = false;
  }
  if (ok)
    ok = NVRTC_CHECK(nvrtcGetPTXSize(prog, &p->ptx_len));
  if (ok) {
    p->ptx = calloc(p->ptx_len + 1, 1);
    ASSERT(p->ptx);
    ok = NVRTC_CHECK(nvrtcGetPTX(prog, p->ptx));
    p->ptx_len = strlen(p->ptx);
  }
  if (ok && real) {
    size_t n = 0;
    ok = NVRTC_CHECK(nvrtcGetCUBINSize(prog, &n));
    if (ok && n > 0) {
      p->cubin = malloc(n);
      ASSERT(p->cubin);
      ok = NVRTC_CHECK(nvrtcGetCUBIN(prog, p->cubin));
      p->cubin_len = n;
    }
  }
  NVRTC_CHECK(nvrtcDestroyProgram(&prog));
  return ok;
}

CudaProgram *cuda_compile(const Graph *g, const CudaTarget *t, CompileTimes *times) {
  if (!g->plan) {
    error("cuda backend: the graph has no plan (run the pass pipeline first)");
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
  if (!NVRTC_CHECK(nvrtcVersion(&p->nvrtc_major, &p->nvrtc_minor))) {
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

#else /* no NVRTC in this build */

bool cuda_nvrtc_available(char *why, size_t n) {
  snprintf(why, n, "this optc was built without NVRTC (meson -Dcuda=disabled, or no CUDA toolkit found)");
  return false;
}

CudaProgram *cuda_compile(const Graph *g, const CudaTarget *t, CompileTimes *times) {
  (void)g, (void)t, (void)times;
  error("this optc was built without NVRTC (meson -Dcuda=disabled, or no CUDA toolkit found): no cuda backend");
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
  return -1;
}

#endif
