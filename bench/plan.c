/* plan.c: `optc plan CONFIG --nproc N`: what a recipe asks of each rank
 * before anything runs. The parameter inventory (torchtune's layout, which
 * its FSDP shards, and HF's), the per-rank memory for params, grads and
 * optimizer states under the recipe's dtypes, the bytes one optimizer step
 * moves per rank (the traffic model), the time that takes at a given
 * memory bandwidth, and the measured compile time of the step. */
#include "../compiler/passes.h"
#include "../runtime/rt.h"
#include "fused_ref.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static const char usage[] =
    "usage: optc plan CONFIG [--nproc N] [--bandwidth GB/s] [--json] [KEY=VALUE ...]\n"
    "\n"
    "Plans a recipe's optimizer step for N ranks (FSDP: params, grads and\n"
    "states sharded 1/N per rank) without running it:\n"
    "  - tensors and parameters of the model (torchtune's layout and HF's);\n"
    "  - per-rank memory for params, grads and optimizer states, in the\n"
    "    recipe's dtypes (on the host with fsdp_cpu_offload);\n"
    "  - bytes one optimizer step moves per rank (the phase plan's traffic);\n"
    "  - the predicted optimizer time at --bandwidth GB/s (default: the\n"
    "    in-place bandwidth `optc bench optimizer` last measured here, else a\n"
    "    quick measurement now);\n"
    "  - the measured compile time of the step.\n";

static double human(double bytes, const char **unit) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4)
    bytes /= 1024, u++;
  *unit = units[u];
  return bytes;
}

/* A quick in-place bandwidth measurement: the ceiling the step can reach. */
typedef struct {
  double *a, *b;
} Quick;

static void quick_range(void *ctx, int64_t lo, int64_t hi) {
  Quick *q = ctx;
  stream_update(q->a, q->b, 1e-9, lo, hi);
}

static double measure_bandwidth(void) {
  int64_t n = (int64_t)32 << 20; /* 2 x 256 MiB */
  Quick q = {calloc((size_t)n, 8), calloc((size_t)n, 8)};
  if (!q.a || !q.b) {
    free(q.a);
    free(q.b);
    return 10;
  }
  ThreadPool *pool = pool_create(0);
  double best = 0;
  for (int r = 0; r < 4; r++) {
    double t0 = now_seconds();
    pool_run(pool, quick_range, &q, n);
    double dt = now_seconds() - t0;
    if (r > 0)
      best = MAX(best, (double)n * 24 / dt / 1e9);
  }
  pool_free(pool);
  free(q.a);
  free(q.b);
  return best;
}

int cmd_plan(int argc, char **argv) {
  const char *config = NULL;
  int nproc = 1;
  double bandwidth = 0;
  bool json = false;
  const char **ov = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(usage, stdout);
      free(ov);
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = true;
    } else if (v && !strcmp(a, "--nproc")) {
      nproc = atoi(v), i++;
      if (nproc < 1) {
        error("--nproc needs a positive number");
        free(ov);
        return 2;
      }
    } else if (v && !strcmp(a, "--bandwidth")) {
      bandwidth = atof(v), i++;
      if (!(bandwidth > 0)) {
        error("--bandwidth needs a positive number of GB/s");
        free(ov);
        return 2;
      }
    } else if (a[0] == '-') {
      error("unknown option '%s' (see optc plan --help)", a);
      free(ov);
      return 2;
    } else if (!config) {
      config = a;
    } else {
      ov[nov++] = a;
    }
  }
  if (!config) {
    error("plan needs a CONFIG (see optc plan --help)");
    free(ov);
    return 2;
  }
  Arena *arena = arena_new();
  int rc = 1;
  double t0 = now_seconds();
  Recipe *r = recipe_load(config, ov, nov, arena);
  if (r)
    recipe_note_unused(r);
  Graph *g = r ? frontend_build(r) : NULL;
  double frontend_ms = (now_seconds() - t0) * 1e3;
  if (!g)
    goto out;
  if (!r->has_model) {
    error("%s has no model section: nothing to plan", config);
    goto out;
  }
  t0 = now_seconds();
  if (!pipeline_run(g, &(PipelineOptions){0}))
    goto out;
  double passes_ms = (now_seconds() - t0) * 1e3;
  CompileTimes ct = {0};
  double compile_ms = -1;
  if (cpu_backend_available()) {
    CpuProgram *p = cpu_compile(g, &(CpuTarget){.no_cache = true}, &ct);
    if (p)
      compile_ms = frontend_ms + passes_ms + ct.build + ct.opt + ct.codegen + ct.link;
    cpu_program_free(p);
  }
  InvTensor *tt, *hf;
  int ntt = inventory_tensors(&r->model, true, &tt), nhf = inventory_tensors(&r->model, false, &hf);
  double params = 0;
  for (int i = 0; i < ntt; i++)
    params += (double)tt[i].numel;
  double params_hf = 0;
  for (int i = 0; i < nhf; i++)
    params_hf += (double)hf[i].numel;
  ASSERT(params == params_hf);
  free(tt);
  free(hf);
  /* FSDP: each rank holds 1/N of every buffer, padded to whole blocks */
  double per_rank = ceil(params / nproc / OPTC_REDUCE_BLOCK) * OPTC_REDUCE_BLOCK;
  double pbytes = per_rank * type_size(r->param_dtype), gbytes = per_rank * type_size(r->grad_dtype);
  double sbytes = 0;
  int nstates = 0;
  for (int b = 0; b < g->nbufs; b++)
    if (g->bufs[b].kind == BUF_STATE) {
      sbytes += per_rank * type_size(g->bufs[b].type);
      nstates++;
    }
  /* what optc run holds per rank today: params and grads whole, at the
   * recipe's batch and the model's sequence length (as train.c sizes it) */
  L4Config cfg = inventory_l4_config(&r->model);
  int seq = (int)MIN(r->model.max_seq_len, 2048);
  const YamlNode *tn = yaml_get(r->root, "tokenizer"), *ms = tn ? yaml_get(tn, "max_seq_len") : NULL;
  char *end = NULL;
  long tok_seq = ms && ms->kind == YAML_SCALAR ? strtol(ms->str, &end, 10) : 0;
  if (end && !*end && tok_seq > 0) /* train.c refuses any other max_seq_len, before it runs */
    seq = (int)MIN(seq, tok_seq);
  int threads = MAX(1, pool_default_threads() / nproc);
  RankMemory run;
  rank_memory(r, &cfg, g, nproc, (int)r->batch_size, seq, threads, &run);
  double step_bytes = per_rank * g->plan->bytes_per_element;
  const char *bw_from = "--bandwidth";
  if (!bandwidth) {
    /* what optc bench measured here last, else a quick measurement */
    char *path = cache_path("bench", "bandwidth");
    size_t len;
    char *text = file_read_quiet(path, &len);
    free(path);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (j && json_is_number(json_object_get(j, "update_gbps"))) {
      bandwidth = json_number_value(json_object_get(j, "update_gbps"));
      bw_from = "optc bench optimizer's in-place update, measured earlier on this machine";
    } else {
      bandwidth = measure_bandwidth();
      bw_from = "an in-place update measured now";
    }
    json_decref(j);
  }
  double step_s = step_bytes / (bandwidth * 1e9);
  const char *where = r->fsdp_cpu_offload ? "host (fsdp_cpu_offload)" : "device";
  if (json) {
    json_t *o = json_pack(
        "{s:s, s:i, s:{s:i, s:i}, s:f, s:{s:f, s:f, s:f, s:f, s:s}, s:{s:i, s:f}, s:{s:f, s:s, s:f}, s:f}", "config",
        config, "nproc", nproc, "tensors", "torchtune", ntt, "hf", nhf, "parameters", params, "memory_per_rank_bytes",
        "params", pbytes, "grads", gbytes, "optimizer_states", sbytes, "total", pbytes + gbytes + sbytes, "where", where,
        "traffic", "phases", g->plan->nphases, "bytes_per_element", (double)g->plan->bytes_per_element,
        "optimizer_step", "bytes_per_rank", step_bytes, "bandwidth_from", bw_from, "predicted_ms", step_s * 1e3,
        "bandwidth_gbps", bandwidth);
    json_object_set_new(o, "run_memory_per_rank_bytes",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:i}", "params", run.params, "grads",
                                  run.grads, "f32_working_copies", run.work, "reduced_grads_slice", run.grad_slice,
                                  "optimizer_states", run.states, "process", run.process,
                                  "activations", run.acts, "total", run.total, "batch_size", (int)r->batch_size,
                                  "seq_len", seq, "threads", threads));
    json_object_set_new(o, "compile_ms", compile_ms >= 0 ? json_real(compile_ms) : json_null());
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    puts(s);
    free(s);
    json_decref(o);
  } else {
    const char *u1, *u2, *u3, *u4, *u5;
    printf("plan: %s on %d rank%s\n", config, nproc, nproc == 1 ? "" : "s");
    printf("  model        %s\n", r->model.component);
    printf("  tensors      %d (torchtune's layout; %d in HF's, whose experts fuse gate and up)\n", ntt, nhf);
    printf("  parameters   %.0f\n", params);
    printf("  optimizer    %s, params %s, grads %s, %d state%s of %s\n", r->component, type_names[r->param_dtype],
           type_names[r->grad_dtype], nstates, nstates == 1 ? "" : "s", type_names[r->state_dtype]);
    printf("  per rank     %.0f elements of each buffer (1/%d, padded to %d-element blocks)\n", per_rank, nproc,
           OPTC_REDUCE_BLOCK);
    double a = human(pbytes, &u1), b = human(gbytes, &u2), c = human(sbytes, &u3), d = human(pbytes + gbytes + sbytes, &u4);
    printf("  memory/rank  params %.2f %s + grads %.2f %s + states %.2f %s = %.2f %s, on the %s, fully sharded (FSDP)\n",
           a, u1, b, u2, c, u3, d, u4, where);
    const char *v1, *v2, *v3, *v4, *v5, *v6, *v7, *v8;
    double w1 = human(run.params, &v1), w2 = human(run.grads, &v2), w3 = human(run.work, &v3),
           w4 = human(run.grad_slice, &v4), w5 = human(run.states, &v5), w6 = human(run.acts, &v6),
           w7 = human(run.process, &v7), w8 = human(run.total, &v8);
    printf("  optc run     params %.2f %s + grads %.2f %s (whole on each rank) + f32 copies %.2f %s + reduced grads "
           "%.2f %s + states %.2f %s (slices) + activations %.2f %s (batch %d x %d tokens, %d thread%s) + the "
           "process %.2f %s = %.2f %s per rank\n",
           w1, v1, w2, v2, w3, v3, w4, v4, w5, v5, w6, v6, (int)r->batch_size, seq, threads, threads == 1 ? "" : "s",
           w7, v7, w8, v8);
    double e = human(step_bytes, &u5);
    printf("  step traffic %d bytes/element in %d phase%s: %.2f %s per rank per step\n", g->plan->bytes_per_element,
           g->plan->nphases, g->plan->nphases == 1 ? "" : "s", e, u5);
    printf("  step time    %.1f ms at %.1f GB/s (%s)\n", step_s * 1e3, bandwidth, bw_from);
    if (compile_ms >= 0)
      printf("  compile      %.1f ms (front end %.2f, passes %.2f, LLVM build %.2f, O3 %.2f, codegen %.2f, link %.2f)\n",
             compile_ms, frontend_ms, passes_ms, ct.build, ct.opt, ct.codegen, ct.link);
  }
  rc = 0;
out:
  arena_free(arena);
  free(ov);
  return rc;
}
