/* plan.c: `optc plan CONFIG --nproc N`: what a recipe asks of each rank
 * before anything runs. The parameter inventory (torchtune's layout, which
 * its FSDP shards, and HF's), the per-rank memory for params, grads and
 * optimizer states under the recipe's dtypes, the bytes one optimizer step
 * moves per rank (the traffic model), the time that takes at a given
 * memory bandwidth, and the measured compile time of the step. */
#include "passes.h"
#include "blas.h"
#include "tools.h"

#include "args.h"
#include "fused_ref.h"

#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

static const char usage[] =
    "usage: optc plan CONFIG [--nproc N] [--bandwidth GB/s] [--net-bandwidth GB/s] [--gflops G] [--json]\n"
    "                 [KEY=VALUE ...]\n"
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
    "  - the measured compile time of the step;\n"
    "  - FSDP's units as torchtune wraps them (each decoder layer; the\n"
    "    embeddings; the final norm and output projection) and a step-time\n"
    "    model with overlap: per unit the all-gather and reduce-scatter\n"
    "    bytes per rank and the optimizer's bytes, per step the compute, and\n"
    "    the critical path when the next unit's collectives and the last\n"
    "    unit's optimizer step run under this unit's compute. The rates:\n"
    "    --net-bandwidth GB/s per rank (default 12.5, a 100 Gb/s link: an\n"
    "    assumption, give yours), --gflops per rank (default: one sgemm\n"
    "    measured now on this rank's threads), and --bandwidth.\n";

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

/* sgemm GFLOP/s on `threads` threads: one 1024^3 product per thread, each
 * single-threaded as the model calls the BLAS, best of 3. */
typedef struct {
  float *a, *b, *c;
} Gemm;

static void gemm_task(void *ctx, int64_t lo, int64_t hi) {
  Gemm *g = ctx;
  for (int64_t t = lo; t < hi; t++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1024, 1024, 1024, 1.0f, g->a, 1024, g->b, 1024, 0.0f,
                g->c + (size_t)t * 1024 * 1024, 1024);
}

static double measure_gflops(int threads) {
  Gemm g = {calloc(1024 * 1024, 4), calloc(1024 * 1024, 4), calloc((size_t)threads * 1024 * 1024, 4)};
  double best = 0;
  if (g.a && g.b && g.c) {
    blas_init();
    ThreadPool *pool = pool_create(threads);
    for (int r = 0; r < 3; r++) {
      double t0 = now_seconds();
      pool_run(pool, gemm_task, &g, threads);
      best = MAX(best, 2.0 * 1024 * 1024 * 1024 * threads / (now_seconds() - t0) / 1e9);
    }
    pool_free(pool);
  }
  free(g.a);
  free(g.b);
  free(g.c);
  return best > 0 ? best : 10;
}

/* An FSDP unit as torchtune's recipe wraps the model: each decoder layer,
 * the token embeddings, and the root (the final norm and the output
 * projection). */
typedef struct {
  char name[32];
  double params, active; /* elements; active: what one token's forward multiplies (top-k of the experts) */
  double flops_f;        /* forward FLOPs of the batch */
} Unit;

static int unit_of(const char *name, Unit *units, int *n, int max) {
  char key[32];
  int layer;
  if (sscanf(name, "layers.%d.", &layer) == 1)
    snprintf(key, sizeof key, "layers.%d", layer);
  else if (strncmp(name, "tok_embeddings", 14) == 0)
    snprintf(key, sizeof key, "tok_embeddings");
  else
    snprintf(key, sizeof key, "norm+output");
  for (int i = 0; i < *n; i++)
    if (strcmp(units[i].name, key) == 0)
      return i;
  ASSERT(*n < max);
  memset(&units[*n], 0, sizeof(Unit));
  snprintf(units[*n].name, sizeof units[*n].name, "%s", key);
  return (*n)++;
}

typedef struct {
  int nunits;
  double ag, rs, opt_bytes;              /* per rank per step */
  double flops, t_fwd, t_bwd, t_opt;     /* seconds, without overlap */
  double t_step, t_serial, opt_hidden;   /* with overlap, without, optimizer time hidden */
  double unit_max_params;                /* the largest unit: what a rank gathers at once */
  const char *bound;                     /* what bounds the backward */
  bool reshard, clip;
} UnitModel;

/* The step with FSDP's overlap, unit by unit: forward prefetches unit
 * u+1's all-gather under u's compute; backward gathers again (reshard
 * after forward), reduce-scatters u under u-1's compute, and steps u's
 * shard on the host as its grads arrive, unless clip_grad_norm needs the
 * global norm first. Three resources each work their items in order: the
 * compute, the network, the host's memory (the optimizer); a pipeline's
 * time is the busiest resource's total plus filling it and draining it. */
static void unit_model(const InvTensor *tt, int ntt, const TrainConfig *tc, const L4Config *c, const Graph *g, int nproc,
                       int seq, double net_gbps, double gflops, double mem_gbps, Unit **out_units, UnitModel *m) {
  int max = c->num_layers + 3, n = 0;
  Unit *u = calloc((size_t)max, sizeof(Unit));
  ASSERT(u);
  for (int i = 0; i < ntt; i++) {
    Unit *x = &u[unit_of(tt[i].name, u, &n, max)];
    x->params += (double)tt[i].numel;
    bool expert = strstr(tt[i].name, ".experts.") != NULL;
    bool embed = strncmp(tt[i].name, "tok_embeddings", 14) == 0;
    /* a token multiplies by top-1 of the experts; the embedding is a lookup */
    x->active += embed ? 0 : expert ? (double)tt[i].numel / c->num_experts : (double)tt[i].numel;
  }
  const Recipe *r = tc->r;
  double tokens = (double)tc->batch_size * seq;
  double ctx = MIN((double)seq, (double)c->attention_chunk_size) / 2; /* causal, chunked: the mean context */
  for (int i = 0; i < n; i++) {
    u[i].flops_f = 2 * tokens * u[i].active;
    if (strncmp(u[i].name, "layers.", 7) == 0) /* q k^T and p v */
      u[i].flops_f += 4 * tokens * ctx * (double)c->num_heads * c->head_dim;
  }
  memset(m, 0, sizeof *m);
  m->nunits = n;
  const YamlNode *ra = yaml_get(r->root, "fsdp_reshard_after_forward");
  m->reshard = true; /* torchtune's default; the front end has checked the key is a bool */
  if (ra && !yaml_is_null(ra) && !yaml_bool(ra, "fsdp_reshard_after_forward", &m->reshard))
    m->reshard = true;
  m->clip = r->has_clip;
  double pb = type_size(r->param_dtype), gb = type_size(r->grad_dtype), frac = (nproc - 1.0) / nproc;
  double net = net_gbps * 1e9, flop = gflops * 1e9, mem = mem_gbps * 1e9;
  double sc_f = 0, sc_b = 0, snet_f = 0, snet_b = 0, sopt = 0;
  double first_ag = 0, last_rs = 0, last_opt = 0;
  for (int i = 0; i < n; i++) {
    double ag = u[i].params * pb * frac, rs = u[i].params * gb * frac;
    double shard = ceil(u[i].params / nproc);
    double opt = shard * g->plan->bytes_per_element / mem;
    m->ag += ag * (m->reshard ? 2 : 1);
    m->rs += rs;
    m->opt_bytes += shard * g->plan->bytes_per_element;
    m->flops += 3 * u[i].flops_f;
    m->unit_max_params = MAX(m->unit_max_params, u[i].params);
    sc_f += u[i].flops_f / flop;
    sc_b += 2 * u[i].flops_f / flop;
    snet_f += ag / net;
    snet_b += (m->reshard ? ag : 0) / net + rs / net;
    sopt += opt;
    if (i == 0)
      first_ag = ag / net;
    if (i == n - 1 || n == 1)
      last_rs = rs / net, last_opt = opt;
  }
  m->t_fwd = sc_f, m->t_bwd = sc_b, m->t_opt = sopt;
  m->t_serial = sc_f + sc_b + snet_f + snet_b + sopt;
  double fwd = MAX(sc_f, snet_f) + first_ag;
  double bwd_busy = MAX(sc_b, snet_b);
  double bwd_plain = bwd_busy + last_rs; /* the backward, the optimizer aside */
  double bwd;
  if (m->clip) { /* the norm of every grad first: the step after the backward */
    bwd = bwd_plain + sopt;
    m->opt_hidden = 0;
  } else {
    bwd = MAX(bwd_busy, sopt) + last_rs + last_opt;
    m->opt_hidden = sopt - (bwd - bwd_plain);
  }
  m->bound = m->clip ? "the optimizer waits for clip_grad_norm's global norm"
             : sopt >= bwd_busy ? "the optimizer (host memory)"
             : sc_b >= snet_b   ? "compute"
                                : "the network";
  m->t_step = fwd + bwd;
  *out_units = u;
}

int cmd_plan(int argc, char **argv) {
  const char *config = NULL;
  int nproc = 1;
  double bandwidth = 0, net_gbps = 12.5, gflops = 0;
  bool json = false;
  const char **ov = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  Args p;
  args_init(&p, "optc plan", argc, argv);
  while (args_next(&p)) {
    if (args_help(&p)) {
      fputs(usage, stdout);
      free(ov);
      return 0;
    } else if (args_flag(&p, "--json")) {
      json = true;
    } else if (args_int(&p, "--nproc", 1, 1 << 20, &nproc) || args_positive(&p, "--bandwidth", &bandwidth) ||
               args_positive(&p, "--net-bandwidth", &net_gbps) || args_positive(&p, "--gflops", &gflops)) {
    } else if (args_option(&p)) {
      args_unknown(&p);
    } else if (!config) {
      config = p.a;
    } else {
      ov[nov++] = p.a;
    }
  }
  if (p.rc) {
    free(ov);
    return p.rc;
  }
  if (!config) {
    error("plan needs a CONFIG (see optc plan --help)");
    free(ov);
    return 2;
  }
  Arena *arena = arena_new();
  int rc = 1;
  double t0 = now_seconds();
  TrainConfig tc;
  Recipe *r = recipe_open(config, ov, nov, arena, &tc);
  if (r)
    recipe_note_unused(r);
  Graph *g = r ? frontend_build(r) : NULL;
  double frontend_ms = (now_seconds() - t0) * 1e3;
  if (!g)
    goto out;
  if (!tc.has_model) {
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
    CpuProgram *prog = cpu_compile(g, &(CpuTarget){.no_cache = true}, &ct);
    if (prog)
      compile_ms = frontend_ms + passes_ms + ct.build + ct.opt + ct.codegen + ct.link;
    cpu_program_free(prog);
  }
  InvTensor *tt, *hf;
  int ntt = inventory_tensors(&tc.model, true, &tt), nhf = inventory_tensors(&tc.model, false, &hf);
  double params = 0;
  for (int i = 0; i < ntt; i++)
    params += (double)tt[i].numel;
  double params_hf = 0;
  for (int i = 0; i < nhf; i++)
    params_hf += (double)hf[i].numel;
  ASSERT(params == params_hf);
  free(hf);
  /* FSDP: each rank holds 1/N of every buffer, padded to whole blocks */
  double per_rank = ceil(params / nproc / OPTC_REDUCE_BLOCK) * OPTC_REDUCE_BLOCK;
  double pbytes = per_rank * type_size(r->param_dtype), gbytes = per_rank * type_size(r->grad_dtype);
  double sbytes = 0;
  int nstates = 0;
  Buf states = {0}; /* "exp_avg u8 + exp_avg_scale f32 per 256 + ..." */
  for (int b = 0; b < g->nbufs; b++)
    if (g->bufs[b].kind == BUF_STATE) {
      const Buffer *x = &g->bufs[b];
      sbytes += per_rank * buffer_elem_bytes(g, b); /* a quantized state: codes, a scale per block */
      nstates++;
      buf_printf(&states, "%s%s %s", nstates > 1 ? ", " : "", x->name, type_names[x->type]);
      if (x->per_block && g->block > 0)
        buf_printf(&states, " per %d", g->block);
    }
  /* what optc run holds per rank, at the recipe's batch and the model's
   * sequence length (as train.c sizes it) */
  L4Config cfg = tc.model;
  int seq = (int)MIN(tc.model.max_seq_len, 2048);
  const YamlNode *tn = yaml_get(r->root, "tokenizer"), *ms = tn ? yaml_get(tn, "max_seq_len") : NULL;
  char *end = NULL;
  long tok_seq = ms && ms->kind == YAML_SCALAR ? strtol(ms->str, &end, 10) : 0;
  if (end && !*end && tok_seq > 0) /* train.c refuses any other max_seq_len, before it runs */
    seq = (int)MIN(seq, tok_seq);
  int threads = MAX(1, pool_default_threads() / nproc);
  RankMemory run;
  /* the units' collectives beside the compute when fsdp_overlap says so
   * (auto: on several machines; on paper, one) */
  const YamlNode *fo = yaml_get(r->root, "fsdp_overlap");
  bool overlap = fo && fo->kind == YAML_SCALAR && (!strcmp(fo->str, "true") || !strcmp(fo->str, "True"));
  rank_memory(&tc, &cfg, g, nproc, (int)tc.batch_size, seq, threads, overlap, &run);
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
  const char *gflops_from = "--gflops";
  if (!gflops)
    gflops = measure_gflops(threads), gflops_from = "one sgemm per thread, measured now";
  Unit *units;
  UnitModel um;
  unit_model(tt, ntt, &tc, &cfg, g, nproc, seq, net_gbps, gflops, bandwidth, &units, &um);
  free(tt);
  const char *where = tc.fsdp_cpu_offload ? "host (fsdp_cpu_offload)" : "device";
  if (json) {
    json_t *o = json_pack(
        "{s:s, s:i, s:{s:i, s:i}, s:f, s:{s:f, s:f, s:f, s:f, s:s}, s:{s:i, s:f}, s:{s:f, s:s, s:f}, s:f}", "config",
        config, "nproc", nproc, "tensors", "torchtune", ntt, "hf", nhf, "parameters", params, "memory_per_rank_bytes",
        "params", pbytes, "grads", gbytes, "optimizer_states", sbytes, "total", pbytes + gbytes + sbytes, "where", where,
        "traffic", "phases", g->plan->nphases, "bytes_per_element", (double)g->plan->bytes_per_element,
        "optimizer_step", "bytes_per_rank", step_bytes, "bandwidth_from", bw_from, "predicted_ms", step_s * 1e3,
        "bandwidth_gbps", bandwidth);
    json_object_set_new(o, "run_memory_per_rank_bytes",
                        json_pack("{s:f, s:f, s:f, s:f, s:i, s:i, s:f, s:f, s:f, s:f, s:i, s:i, s:i}", "params", run.params,
                                  "grads", run.grads, "optimizer_states", run.states, "unit_spans", run.spans,
                                  "spans_f32", run.wide, "spans_16bit", run.narrow, "span_elements", run.span_elems,
                                  "process", run.process, "activations", run.acts, "total", run.total, "batch_size",
                                  (int)tc.batch_size, "seq_len", seq, "threads", threads));
    json_t *ju = json_array();
    for (int i = 0; i < um.nunits; i++)
      json_array_append_new(ju, json_pack("{s:s, s:f, s:f, s:f}", "name", units[i].name, "params", units[i].params,
                                          "active_params", units[i].active, "forward_flops", units[i].flops_f));
    json_object_set_new(
        o, "fsdp",
        json_pack("{s:o, s:b, s:b, s:{s:f, s:f, s:f, s:f}, s:{s:f, s:f, s:f}, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:s}}",
                  "units", ju, "reshard_after_forward", um.reshard, "clip_grad_norm", um.clip, "per_step_per_rank",
                  "all_gather_bytes", um.ag, "reduce_scatter_bytes", um.rs, "optimizer_bytes", um.opt_bytes, "flops",
                  um.flops, "rates", "net_gbps", net_gbps, "gflops", gflops, "mem_gbps", bandwidth, "model_s",
                  "forward_compute", um.t_fwd, "backward_compute", um.t_bwd, "optimizer", um.t_opt, "step",
                  um.t_step, "serial", um.t_serial, "optimizer_hidden", um.opt_hidden, "backward_bound", um.bound));
    json_object_set_new(o, "compile_ms", compile_ms >= 0 ? json_real(compile_ms) : json_null());
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    puts(s);
    free(s);
    json_decref(o);
  } else {
    const char *u1, *u2, *u3, *u4, *u5;
    printf("plan: %s on %d rank%s\n", config, nproc, nproc == 1 ? "" : "s");
    printf("  model        %s\n", tc.model.component);
    printf("  tensors      %d (torchtune's layout; %d in HF's, whose experts fuse gate and up)\n", ntt, nhf);
    printf("  parameters   %.0f\n", params);
    printf("  optimizer    %s, params %s, grads %s, %d state%s: %s\n", r->component, type_names[r->param_dtype],
           type_names[r->grad_dtype], nstates, nstates == 1 ? "" : "s", nstates ? states.data : "none");
    printf("  per rank     %.0f elements of each buffer (1/%d, padded to %d-element blocks)\n", per_rank, nproc,
           OPTC_REDUCE_BLOCK);
    double a = human(pbytes, &u1), b = human(gbytes, &u2), c = human(sbytes, &u3), d = human(pbytes + gbytes + sbytes, &u4);
    printf("  memory/rank  params %.2f %s + grads %.2f %s + states %.2f %s = %.2f %s, on the %s, fully sharded (FSDP)\n",
           a, u1, b, u2, c, u3, d, u4, where);
    const char *v1, *v2, *v3, *v4, *v6, *v7, *v8;
    double w1 = human(run.params, &v1), w2 = human(run.grads, &v2), w3 = human(run.states, &v3),
           w4 = human(run.spans, &v4), w6 = human(run.acts, &v6), w7 = human(run.process, &v7),
           w8 = human(run.total, &v8);
    printf("  optc run     shards of params %.2f %s + grads %.2f %s + states %.2f %s, units in use %.2f %s (%d f32 "
           "and %d 16-bit spans of the largest unit, %.0f elements) + activations %.2f %s (batch %d x %d tokens, %d "
           "thread%s) + the process %.2f %s = %.2f %s per rank\n",
           w1, v1, w2, v2, w3, v3, w4, v4, run.wide, run.narrow, run.span_elems, w6, v6, (int)tc.batch_size, seq,
           threads, threads == 1 ? "" : "s", w7, v7, w8, v8);
    double e = human(step_bytes, &u5);
    printf("  step traffic %g bytes/element in %d phase%s: %.2f %s per rank per step\n", g->plan->bytes_per_element,
           g->plan->nphases, g->plan->nphases == 1 ? "" : "s", e, u5);
    printf("  step time    %.1f ms at %.1f GB/s (%s)\n", step_s * 1e3, bandwidth, bw_from);
    /* the units: consecutive ones of the same size on one line */
    printf("  FSDP units   %d, as torchtune's recipe wraps them (reshard after forward: %s):\n", um.nunits,
           um.reshard ? "yes" : "no");
    for (int i = 0; i < um.nunits;) {
      int j = i;
      while (j + 1 < um.nunits && units[j + 1].params == units[i].params && units[j + 1].active == units[i].active)
        j++;
      const char *q1, *q2, *q3;
      double frac = (nproc - 1.0) / nproc;
      double x1 = human(units[i].params * type_size(r->param_dtype) * frac, &q1),
             x2 = human(units[i].params * type_size(r->grad_dtype) * frac, &q2),
             x3 = human(ceil(units[i].params / nproc) * g->plan->bytes_per_element, &q3);
      char span[96];
      if (j > i)
        snprintf(span, sizeof span, "%s .. %s (%d)", units[i].name, units[j].name, j - i + 1);
      else
        snprintf(span, sizeof span, "%s", units[i].name);
      printf("    %-28s %.0f params (%.0f active): all-gather %.2f %s, reduce-scatter %.2f %s, optimizer %.2f %s per rank\n",
             span, units[i].params, units[i].active, x1, q1, x2, q2, x3, q3);
      i = j + 1;
    }
    const char *q4, *q5, *q6;
    double x4 = human(um.ag, &q4), x5 = human(um.rs, &q5), x6 = human(um.unit_max_params * type_size(r->param_dtype), &q6);
    printf("  per step     all-gather %.2f %s + reduce-scatter %.2f %s per rank; %.3g TFLOP per rank (batch %d x %d "
           "tokens); the largest unit gathered is %.2f %s\n",
           x4, q4, x5, q5, um.flops / 1e12, (int)tc.batch_size, seq, x6, q6);
    printf("  step model   compute %.2f s forward + %.2f s backward, optimizer %.2f s; overlapped %.2f s (the backward "
           "bound by %s; %.2f s of the optimizer hidden), serial %.2f s\n",
           um.t_fwd, um.t_bwd, um.t_opt, um.t_step, um.bound, um.opt_hidden, um.t_serial);
    printf("               at %.1f GB/s network per rank (%s), %.0f GFLOP/s per rank (%s), %.1f GB/s host memory\n",
           net_gbps, net_gbps == 12.5 ? "assumed: a 100 Gb/s link; --net-bandwidth" : "--net-bandwidth", gflops,
           gflops_from, bandwidth);
    if (compile_ms >= 0)
      printf("  compile      %.1f ms (front end %.2f, passes %.2f, LLVM build %.2f, O3 %.2f, codegen %.2f, link %.2f)\n",
             compile_ms, frontend_ms, passes_ms, ct.build, ct.opt, ct.codegen, ct.link);
  }
  rc = 0;
  free(units);
  buf_free(&states);
out:
  arena_free(arena);
  free(ov);
  return rc;
}
