/* gpu_bench: optc's compiled step on a GPU, for bench/gpu_check.sh.
 *
 *   gpu_bench [--params N] [--layout fp32|bf16|bf16-fp32states] [--no-clip]
 *             [--reps N] [--json FILE] [--threads N] [--red-threads N] [--red-lanes N]
 *             [--min-blocks N]
 *
 * Scale_grads, clip_grad_norm (max_norm 1.0) and AdamW over N parameters
 * (default 2^30) in the tensor mix gpu_torch.py uses, the buffers filled
 * with its formula. Prints, and appends to FILE as JSON lines: the cold
 * compile (emit + NVRTC) and a disk-cache hit, each kernel's registers,
 * the median wall time of a step (host step values, launches, partials
 * back, folded, synchronized) and of its kernels alone (events), the
 * traffic model's bytes per element, each kernel's own time and GB/s,
 * and the device-to-device copy bandwidth measured in the same run, the
 * ceiling a streaming step can reach. --threads, --red-threads,
 * --red-lanes and --min-blocks set the emitter's launch shape
 * (CudaTarget), to compare shapes on one device (bench/gpu_shapes.sh). */
#include "exec.h"
#include "passes.h"
#include "group.h"

#include "args.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The tensor mix: these sizes in turn until n elements, the last cut.
 * gpu_torch.py has the same list. */
static const int64_t mix[] = {16777216, 4194304, 4194304, 4096, 58720256, 58720256, 4096, 1048576};

static int tensor_sizes(int64_t n, int64_t **out) {
  int cap = 16, k = 0;
  int64_t *s = malloc(sizeof(int64_t) * (size_t)cap);
  for (int64_t left = n; left > 0; k++) {
    if (k == cap)
      s = realloc(s, sizeof(int64_t) * (size_t)(cap *= 2));
    s[k] = MIN(left, mix[k % (int)ARRAY_LEN(mix)]);
    left -= s[k];
  }
  *out = s;
  return k;
}

/* gpu_torch.py's values: u(i) = ((i * 2654435761) mod 2^32) / 2^32 * 2 - 1,
 * i the element's index in its buffer, params u, grads u * 1e-3 (times
 * num_tokens, which scale_grads divides out), states 0. */
static double value(int64_t i) { return (double)((uint64_t)i * 2654435761ull % 4294967296ull) / 4294967296.0 * 2 - 1; }

static int fill(CudaExec *x, const Graph *g, const GroupLayout *l, double grad_scale) {
  const int64_t piece = (int64_t)1 << 24;
  void *host = malloc((size_t)piece * 8);
  ASSERT(host);
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind == BUF_STATE)
      continue; /* zeroed by the executor, as torch's first step finds them */
    Type t = (Type)g->bufs[b].type;
    size_t es = (size_t)type_size(t);
    double scale = g->bufs[b].kind == BUF_GRAD ? grad_scale : 1.0;
    for (int tn = 0; tn < l->ntensors; tn++)
      for (int64_t at = 0; at < l->numel[tn]; at += piece) {
        int64_t n = MIN(piece, l->numel[tn] - at);
        for (int64_t i = 0; i < n; i++) {
          float v = (float)(value(at + i) * scale);
          if (t == TY_F32)
            ((float *)host)[i] = v;
          else
            ((uint16_t *)host)[i] = optc_f32_to_bf16(v);
        }
        CudaPtr dst = cuda_exec_buffer(x, b) + (CudaPtr)(l->offset[tn] + at) * es;
        if (!cuda_exec_buffer(x, b) || cuda_memcpy_htod(dst, host, (size_t)n * es) != 0) {
          free(host);
          return -1;
        }
      }
  }
  free(host);
  return 0;
}

int main(int argc, char **argv) {
  int64_t params = (int64_t)1 << 30;
  const char *layout = "fp32", *json = NULL;
  bool clip = true;
  int reps = 10;
  CudaTarget shape = {.no_cache = true};
  Args p;
  args_init(&p, "gpu_bench", argc - 1, argv + 1);
  long nparams = params;
  while (args_next(&p)) {
    if (args_long(&p, "--params", 1, (long)1 << 40, &nparams) || args_value(&p, "--layout", &layout) ||
        args_int(&p, "--reps", 1, 1000000, &reps) || args_value(&p, "--json", &json) ||
        args_int(&p, "--threads", 0, 1024, &shape.threads) || args_int(&p, "--red-threads", 0, 1024, &shape.red_threads) ||
        args_int(&p, "--red-lanes", 0, 8, &shape.red_lanes) || args_int(&p, "--min-blocks", 0, 64, &shape.min_blocks)) {
    } else if (args_flag(&p, "--no-clip")) {
      clip = false;
    } else {
      fprintf(stderr, "usage: gpu_bench [--params N] [--layout fp32|bf16|bf16-fp32states] [--no-clip] [--reps N] "
                      "[--json FILE] [--threads N] [--red-threads N] [--red-lanes N] [--min-blocks N]\n");
      return 2;
    }
  }
  if (p.rc)
    return p.rc;
  params = nparams;
  char why[256], desc[256];
  if (!cuda_nvrtc_available(why, sizeof why) || !cuda_device_available(why, sizeof why)) {
    fprintf(stderr, "gpu_bench: %s\n", why);
    return 1;
  }
  cuda_device_describe(desc, sizeof desc);
  const char *dtype = !strcmp(layout, "fp32") ? "dtype: fp32\n"
                      : !strcmp(layout, "bf16") ? "dtype: bf16\n"
                      : !strcmp(layout, "bf16-fp32states") ? "dtype: bf16\noptimizer_state_dtype: fp32\n"
                                                           : NULL;
  if (!dtype || params < 1 || reps < 1) {
    fprintf(stderr, "gpu_bench: bad --layout, --params or --reps\n");
    return 2;
  }
  /* the recipe: torch's AdamW defaults but lr 1e-3, as gpu_torch.py */
  char yaml[512], path[] = "/tmp/gpu_benchXXXXXX.yaml";
  snprintf(yaml, sizeof yaml, "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 0.001\n%s%s", dtype,
           clip ? "clip_grad_norm: 1.0\n" : "");
  int fd = mkstemps(path, 5);
  ASSERT(fd >= 0 && write(fd, yaml, strlen(yaml)) == (ssize_t)strlen(yaml));
  close(fd);
  Arena *arena = arena_new();
  Recipe *r = recipe_load(path, NULL, 0, arena);
  unlink(path);
  Graph *g = r ? frontend_build(r) : NULL;
  if (!g || !pipeline_run(g, &(PipelineOptions){0}))
    return 1;

  /* compile: cold (no cache), then a cache hit */
  CompileTimes cold = {0}, warm = {0};
  CudaProgram *prog = cuda_compile(g, &shape, &cold);
  CudaTarget cached = shape;
  cached.no_cache = false;
  CudaProgram *again = prog ? cuda_compile(g, &cached, &warm) : NULL;
  if (!prog)
    return 1;
  cuda_program_free(again);
  Buf report = {0};
  cuda_program_report(prog, &report);

  int64_t *sizes;
  int n = tensor_sizes(params, &sizes);
  GroupLayout l;
  layout_init(&l, n, sizes);
  char err[512];
  CudaExec *x = cuda_exec_create(prog, g, &l, err, sizeof err);
  if (!x) {
    fprintf(stderr, "gpu_bench: %s\n", err);
    return 1;
  }
  double num_tokens = 1000;
  double *vals = calloc((size_t)g->nins + 1, sizeof(double));
  Binding sets[] = {{"num_tokens", num_tokens}};
  Binding first = {"step", 1};
  if (inputs_resolve(g, sets, 1, &first, 1, vals) != 0 || fill(x, g, &l, 1e-3 * num_tokens) != 0)
    return 1;
  Ref sref = graph_find_input(g, "step");
  int np = g->plan->nphases;
  double *wall = calloc((size_t)reps, sizeof(double)), *kern = calloc((size_t)reps, sizeof(double));
  double *phase = calloc((size_t)reps * (size_t)np, sizeof(double)); /* [k * reps + i] */
  cuda_exec_profile(x, true);
  double red = 0;
  bool skipped = false;
  for (int i = -2; i < reps; i++) { /* two warm-up steps */
    if (sref != NOREF)
      vals[sref] = i + 3;
    StepArgs args = {vals, 1};
    StepResult res;
    double t0 = now_seconds();
    if (cuda_step(x, &args, &res) != 0)
      return 1;
    double ms = (now_seconds() - t0) * 1e3;
    if (i >= 0) {
      wall[i] = ms, kern[i] = cuda_exec_kernel_ms(x);
      for (int k = 0; k < np; k++)
        phase[k * reps + i] = cuda_exec_phase_ms(x, k);
    }
    red = res.nred ? res.red[0] : 0;
    skipped |= res.skipped;
  }
  qsort(wall, (size_t)reps, sizeof(double), cmp_double);
  qsort(kern, (size_t)reps, sizeof(double), cmp_double);
  double wall_ms = wall[reps / 2], kern_ms = kern[reps / 2];
  for (int k = 0; k < np; k++)
    qsort(phase + k * reps, (size_t)reps, sizeof(double), cmp_double);

  /* the copy ceiling, on buffers as large as the largest flat buffer (at most 4 GiB) */
  size_t cbytes = MIN((size_t)l.total * 4, (size_t)4 << 30);
  CudaPtr a = cuda_malloc(cbytes), b = cuda_malloc(cbytes);
  double copy_ms = a && b ? cuda_copy_ms(b, a, cbytes, 10) : -1;
  double copy_gbs = copy_ms > 0 ? 2.0 * (double)cbytes / (copy_ms * 1e6) : 0;
  cuda_free(a);
  cuda_free(b);

  double bytes = (double)g->plan->bytes_per_element * (double)params;
  printf("device: %s\n", desc);
  printf("optc %s%s, %lld parameters in %d tensors, %g bytes/element over %d phase%s\n", layout, clip ? " clip" : "",
         (long long)params, n, g->plan->bytes_per_element, g->plan->nphases, g->plan->nphases == 1 ? "" : "s");
  printf("compile: emit %.2f ms + NVRTC %.1f ms cold; disk-cache hit %.2f ms\n%s", cold.build, cold.codegen,
         warm.build + warm.codegen, report.data);
  printf("step: %.3f ms wall (%.0f GB/s), kernels %.3f ms (%.0f GB/s); copy ceiling %.0f GB/s (%.0f%% wall, %.0f%% "
         "kernels)%s\n",
         wall_ms, bytes / (wall_ms * 1e6), kern_ms, bytes / (kern_ms * 1e6), copy_gbs,
         100 * bytes / (wall_ms * 1e6) / copy_gbs, 100 * bytes / (kern_ms * 1e6) / copy_gbs,
         skipped ? " (SKIPPED steps: non-finite)" : "");
  for (int k = 0; k < np; k++) {
    double ms = phase[k * reps + reps / 2], pb = (double)g->plan->phases[k].bytes_per_element * (double)params;
    printf("  phase %d: %.3f ms, %g bytes/element, %.0f GB/s (%.0f%% of copy)\n", k, ms,
           g->plan->phases[k].bytes_per_element, pb / (ms * 1e6), 100 * pb / (ms * 1e6) / copy_gbs);
  }
  if (json) {
    FILE *f = fopen(json, "a");
    if (!f) {
      fprintf(stderr, "gpu_bench: cannot append to %s\n", json);
      return 1;
    }
    fprintf(f,
            "{\"variant\": \"optc\", \"layout\": \"%s\", \"clip\": %s, \"params\": %lld, \"tensors\": %d, "
            "\"bytes_per_element\": %g, \"ms\": %.6f, \"kernel_ms\": %.6f, \"copy_GBps\": %.3f, "
            "\"compile_ms\": %.3f, \"cache_hit_ms\": %.3f, \"grad_sumsq\": %.17g, \"threads\": %d, "
            "\"red_threads\": %d, \"red_lanes\": %d, \"min_blocks\": %d, \"phase_ms\": [",
            layout, clip ? "true" : "false", (long long)params, n, g->plan->bytes_per_element, wall_ms, kern_ms,
            copy_gbs, cold.build + cold.codegen, warm.build + warm.codegen, red, shape.threads, shape.red_threads,
            shape.red_lanes, shape.min_blocks);
    for (int k = 0; k < np; k++)
      fprintf(f, "%s%.6f", k ? ", " : "", phase[k * reps + reps / 2]);
    fprintf(f, "], \"device\": \"%s\"}\n", desc);
    fclose(f);
  }
  cuda_exec_free(x);
  cuda_program_free(prog);
  layout_free(&l);
  buf_free(&report);
  free(sizes);
  free(vals);
  free(wall);
  free(kern);
  free(phase);
  arena_free(arena);
  return skipped ? 1 : 0;
}
