/* group.c: parameter groups in flat buffers, read from and written to
 * tensor files with torch's state_dict names, and the values of their
 * step inputs. */
#include "group.h"

#include <math.h>
#include <string.h>

const char *const backend_names[NUM_BACKENDS] = {"interp", "eager", "cpu", "cuda"};

bool backend_from_name(const char *s, Backend *out) {
  for (int i = 0; i < NUM_BACKENDS; i++)
    if (strcmp(backend_names[i], s) == 0)
      return *out = (Backend)i, true;
  return false;
}

/* A 64-byte aligned, zeroed buffer of n bytes. */
static void *flat_alloc(int64_t n) {
  size_t bytes = ((size_t)n + 63) / 64 * 64;
  void *p = aligned_alloc(64, bytes ? bytes : 64);
  if (p)
    memset(p, 0, bytes ? bytes : 64);
  return p;
}

static char *joined(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *s = malloc(n);
  ASSERT(s);
  snprintf(s, n, "%s.%s", a, b);
  return s;
}

static bool same_shape(const Tensor *a, const Tensor *b) {
  if (a->ndim != b->ndim)
    return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i])
      return false;
  return true;
}

static void shape_str(char *out, size_t n, const Tensor *t) {
  size_t k = (size_t)snprintf(out, n, "[");
  for (int i = 0; i < t->ndim && k < n; i++)
    k += (size_t)snprintf(out + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k < n)
    snprintf(out + k, n - k, "]");
}

/* Converts n elements between float types, through the same rounding the
 * interpreter uses. */
static void convert_elems(void *dst, Type dt, const void *src, Type st, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double v;
    switch (st) {
    case TY_F64: v = ((const double *)src)[i]; break;
    case TY_F32: v = ((const float *)src)[i]; break;
    case TY_BF16: v = optc_bf16_to_f32(((const uint16_t *)src)[i]); break;
    case TY_F16: v = optc_f16_to_f32(((const uint16_t *)src)[i]); break;
    default: unreachable();
    }
    switch (dt) {
    case TY_F64: ((double *)dst)[i] = v; break;
    case TY_F32: ((float *)dst)[i] = (float)v; break;
    case TY_BF16: ((uint16_t *)dst)[i] = optc_f32_to_bf16((float)v); break;
    case TY_F16: ((uint16_t *)dst)[i] = optc_f32_to_f16((float)v); break;
    default: unreachable();
    }
  }
}

/* n elements of value v; n bytes of codes for a code type (two u4 codes a byte) */
static void fill_const(void *dst, Type t, double v, int64_t n) {
  if (type_is_code(t)) {
    memset(dst, t == TY_U4 ? (int)v * 17 : (int)v, (size_t)n);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    convert_elems((char *)dst + i * type_size(t), t, &v, TY_F64, 1);
}

/* How a tensor file holds state buffer b of a param shaped p (as torchao's
 * state_dict does): its shape, its codes as U8, a u4 state flat (two a
 * byte), a per-block one flat (one a block). */
static void state_shape(const Graph *g, int b, const Tensor *p, Tensor *out) {
  const Buffer *buf = &g->bufs[b];
  *out = *p;
  out->dtype = buf->type == TY_U4 ? TY_U8 : (Type)buf->type;
  if (buf->per_block || buf->type == TY_U4) {
    out->ndim = 1;
    out->shape[0] = out->numel = buffer_bytes(g, b, p->numel) / type_size(out->dtype);
  }
}

static bool all_finite(const void *p, Type t, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double v;
    convert_elems(&v, TY_F64, (const char *)p + i * type_size(t), t, 1);
    if (!isfinite(v))
      return false;
  }
  return true;
}

/* The step count stored as a one-element tensor (torch keeps an f32). */
static bool read_scalar(const Tensor *t, double *out) {
  if (t->numel != 1 || !type_is_float(t->dtype)) {
    if (t->numel == 1 && type_is_int(t->dtype)) {
      *out = t->dtype == TY_I64 ? (double)*(const int64_t *)t->data : (double)*(const int32_t *)t->data;
      return true;
    }
    return false;
  }
  convert_elems(out, TY_F64, t->data, t->dtype, 1);
  return true;
}

/* One zeroed flat buffer per graph buffer, for pg->layout. */
static int alloc_bufs(ParamGroup *pg) {
  const Graph *g = pg->g;
  pg->bufs = calloc((size_t)g->nbufs + 1, sizeof(void *));
  ASSERT(pg->bufs);
  for (int b = 0; b < g->nbufs; b++) {
    pg->bufs[b] = flat_alloc(buffer_bytes(g, b, pg->layout.total));
    if (!pg->bufs[b]) {
      error("out of memory for buffer '@%s' (%lld elements)", g->bufs[b].name, (long long)pg->layout.total);
      return -1;
    }
  }
  return 0;
}

int group_alloc(ParamGroup *pg, const Graph *g, int n, const int64_t *numel) {
  memset(pg, 0, sizeof *pg);
  pg->g = g;
  pg->ntensors = n;
  pg->names = calloc((size_t)n + 1, sizeof(char *));
  pg->shapes = calloc((size_t)n + 1, sizeof(Tensor));
  ASSERT(pg->names && pg->shapes);
  for (int i = 0; i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "t%d", i);
    pg->names[i] = strdup(name);
    pg->shapes[i] = (Tensor){.name = pg->names[i], .dtype = (Type)g->bufs[0].type, .ndim = 1,
                             .shape = {numel[i]}, .numel = numel[i]};
  }
  layout_init_a(&pg->layout, n, numel, graph_align(g));
  if (alloc_bufs(pg) != 0) {
    group_free(pg);
    return -1;
  }
  return 0;
}

int group_from_file(ParamGroup *pg, const Graph *g, const TensorFile *tf, const double *inputs,
                    int *grads_finite) {
  memset(pg, 0, sizeof *pg);
  pg->g = g;
  int bp = -1, bg = -1;
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind == BUF_PARAM)
      bp = b;
    if (g->bufs[b].kind == BUF_GRAD)
      bg = b;
  }
  if (bp < 0 || bg < 0) {
    error("the step graph needs a param and a grad buffer");
    return -1;
  }
  /* Params are the tensors with a NAME.grad; a grad without its param is a mistake. */
  const Tensor **params = calloc((size_t)tf->n + 1, sizeof(Tensor *));
  const Tensor **grads = calloc((size_t)tf->n + 1, sizeof(Tensor *));
  ASSERT(params && grads);
  int n = 0, rc = -1;
  for (int i = 0; i < tf->n; i++) {
    const Tensor *t = &tf->tensors[i];
    if (ends_with(t->name, ".grad")) {
      char *base = strndup(t->name, strlen(t->name) - 5);
      bool has = tf_find(tf, base) != NULL;
      if (!has)
        error("gradient '%s' has no parameter '%s'", t->name, base);
      free(base);
      if (!has)
        goto out;
      continue;
    }
    char *gname = joined(t->name, "grad");
    const Tensor *gt = tf_find(tf, gname);
    free(gname);
    if (!gt)
      continue;
    params[n] = t;
    grads[n++] = gt;
  }
  if (n == 0) {
    error("no parameters: the file needs NAME and NAME.grad for each parameter");
    goto out;
  }
  pg->ntensors = n;
  pg->names = calloc((size_t)n, sizeof(char *));
  pg->shapes = calloc((size_t)n, sizeof(Tensor));
  int64_t *numel = calloc((size_t)n, sizeof(int64_t));
  ASSERT(pg->names && pg->shapes && numel);
  for (int i = 0; i < n; i++) {
    const Tensor *p = params[i], *gr = grads[i];
    char sp[128], sg[128];
    if (p->dtype != g->bufs[bp].type) {
      error("param '%s' is %s, but the step graph's params are %s (the recipe's dtype)", p->name,
            st_dtype_name(p->dtype), type_names[g->bufs[bp].type]);
      free(numel);
      goto out;
    }
    if (gr->dtype != g->bufs[bg].type) {
      error("grad '%s' is %s, but the step graph's grads are %s", gr->name, st_dtype_name(gr->dtype),
            type_names[g->bufs[bg].type]);
      free(numel);
      goto out;
    }
    if (!same_shape(p, gr)) {
      shape_str(sp, sizeof sp, p);
      shape_str(sg, sizeof sg, gr);
      error("grad '%s' has shape %s, but its param has %s", gr->name, sg, sp);
      free(numel);
      goto out;
    }
    pg->names[i] = strdup(p->name);
    pg->shapes[i] = *p;
    pg->shapes[i].name = pg->names[i];
    pg->shapes[i].data = NULL;
    numel[i] = p->numel;
  }
  layout_init_a(&pg->layout, n, numel, graph_align(g));
  free(numel);
  if (alloc_bufs(pg) != 0)
    goto out;
  bool finite = true, any_state = false;
  for (int i = 0; i < n; i++) {
    int64_t off = pg->layout.offset[i];
    size_t pes = (size_t)type_size(g->bufs[bp].type);
    memcpy((char *)pg->bufs[bp] + (size_t)off * pes, params[i]->data, (size_t)params[i]->numel * pes);
    size_t ges = (size_t)type_size(g->bufs[bg].type); /* the grad may be narrower than the param */
    memcpy((char *)pg->bufs[bg] + (size_t)off * ges, grads[i]->data, (size_t)grads[i]->numel * ges);
    /* The copy already reads every grad: the finite check rides on it. */
    finite = finite && all_finite(grads[i]->data, grads[i]->dtype, grads[i]->numel);
    for (int b = 0; b < g->nbufs; b++) {
      const Buffer *buf = &g->bufs[b];
      if (buf->kind != BUF_STATE)
        continue;
      Type t = (Type)buf->type;
      void *dst = (char *)pg->bufs[b] + buffer_offset(g, b, off);
      int64_t nelem = buf->per_block ? (params[i]->numel + g->block - 1) / g->block : params[i]->numel;
      char *sname = joined(params[i]->name, buf->name);
      const Tensor *st = tf_find(tf, sname);
      if (st) {
        Tensor want;
        state_shape(g, b, params[i], &want);
        bool ok = st->dtype == want.dtype && same_shape(st, &want);
        if (!ok) {
          char ss[128], sp[128];
          shape_str(ss, sizeof ss, st);
          shape_str(sp, sizeof sp, &want);
          error("state '%s' is %s %s, but the step graph keeps it as %s %s", sname, st_dtype_name(st->dtype), ss,
                st_dtype_name(want.dtype), sp);
          free(sname);
          goto out;
        }
        memcpy(dst, st->data, (size_t)buffer_bytes(g, b, params[i]->numel));
        any_state = true;
      } else if (buf->init == INIT_PARAM) {
        convert_elems(dst, t, params[i]->data, params[i]->dtype, params[i]->numel);
      } else if (buf->init == INIT_INPUT) {
        Ref r = graph_find_input(g, buf->init_input);
        fill_const(dst, t, inputs && r != NOREF ? inputs[r] : g->ins[r].imm, nelem);
      } else {
        fill_const(dst, t, buf->init_value, type_is_code(t) ? buffer_bytes(g, b, params[i]->numel) : nelem);
      }
      free(sname);
    }
  }
  /* The step count: NAME.step for each param (torch's), or one `step`. */
  const Tensor *gstep = tf_find(tf, "step");
  for (int i = 0; i < n; i++) {
    char *sname = joined(params[i]->name, "step");
    const Tensor *st = tf_find(tf, sname);
    double v;
    if (!st && gstep)
      st = gstep;
    if (st) {
      if (!read_scalar(st, &v) || v < 0 || v != floor(v)) {
        error("'%s' must hold one non-negative whole number", st->name);
        free(sname);
        goto out;
      }
      if (pg->have_step && v != pg->step) {
        error("params have different step counts ('%s' is %g, others %g); optc steps a group together", st->name,
              v, pg->step);
        free(sname);
        goto out;
      }
      pg->step = v;
      pg->have_step = true;
    }
    free(sname);
  }
  /* torch keeps no step for SGD: saved state means at least one step ran. */
  if (!pg->have_step && any_state)
    pg->step = 1;
  *grads_finite = finite ? 1 : 0;
  rc = 0;
out:
  free(params);
  free(grads);
  if (rc != 0)
    group_free(pg);
  return rc;
}

static bool is_group_tensor(const ParamGroup *pg, const char *name) {
  if (strcmp(name, "step") == 0)
    return true;
  for (int i = 0; i < pg->ntensors; i++) {
    const char *p = pg->names[i];
    size_t n = strlen(p);
    if (strcmp(name, p) == 0)
      return true;
    if (strncmp(name, p, n) != 0 || name[n] != '.')
      continue;
    const char *suffix = name + n + 1;
    if (strcmp(suffix, "step") == 0)
      return true;
    for (int b = 0; b < pg->g->nbufs; b++)
      if (pg->g->bufs[b].kind == BUF_STATE && strcmp(suffix, pg->g->bufs[b].name) == 0)
        return true;
  }
  return false;
}

int group_to_file(const ParamGroup *pg, const TensorFile *in, TensorFile *out) {
  const Graph *g = pg->g;
  for (int i = 0; i < pg->ntensors; i++) {
    const Tensor *shape = &pg->shapes[i];
    for (int b = 0; b < g->nbufs; b++) {
      const Buffer *buf = &g->bufs[b];
      if (buf->kind == BUF_GRAD)
        continue;
      char *name = buf->kind == BUF_PARAM ? strdup(pg->names[i]) : joined(pg->names[i], buf->name);
      Tensor want;
      state_shape(g, b, shape, &want);
      Tensor *t = tf_add(out, name, want.dtype, want.ndim, want.shape);
      free(name);
      if (!t)
        return -1;
      memcpy(t->data, (char *)pg->bufs[b] + buffer_offset(g, b, pg->layout.offset[i]),
             (size_t)buffer_bytes(g, b, shape->numel));
    }
    char *sname = joined(pg->names[i], "step");
    Tensor *st = tf_add(out, sname, TY_F32, 0, NULL);
    free(sname);
    if (!st)
      return -1;
    *(float *)st->data = (float)pg->step;
  }
  /* Everything else passes through, grads included, so that the output can
   * be the input of the next run. */
  for (int i = 0; in && i < in->n; i++) {
    const Tensor *t = &in->tensors[i];
    if (is_group_tensor(pg, t->name))
      continue;
    Tensor *c = tf_add(out, t->name, t->dtype, t->ndim, t->shape);
    if (!c)
      return -1;
    memcpy(c->data, t->data, (size_t)t->numel * (size_t)type_size(t->dtype));
  }
  return 0;
}

void group_free(ParamGroup *pg) {
  if (pg->bufs)
    for (int b = 0; b < pg->g->nbufs; b++)
      free(pg->bufs[b]);
  free(pg->bufs);
  for (int i = 0; pg->names && i < pg->ntensors; i++)
    free(pg->names[i]);
  free(pg->names);
  free(pg->shapes);
  layout_free(&pg->layout);
  memset(pg, 0, sizeof *pg);
}

int executor_init(Executor *x, Backend b, const Graph *optimized, const Graph *unoptimized, int threads,
                  const CpuTarget *target) {
  memset(x, 0, sizeof *x);
  x->backend = b;
  x->g = b == BACKEND_EAGER ? unoptimized : optimized;
  switch (b) {
  case BACKEND_INTERP:
  case BACKEND_EAGER: return 0;
  case BACKEND_CPU:
    x->cpu = cpu_compile(optimized, target, &x->times);
    if (!x->cpu)
      return -1;
    x->pool = pool_create(threads);
    return 0;
  case BACKEND_CUDA: {
    char why[2048]; /* NVRTC first, as the public API asks: the one line that names where it looked */
    if (!cuda_nvrtc_available(why, sizeof why) || !cuda_device_available(why, sizeof why)) {
      error("--backend cuda: %s", why);
      return -1;
    }
    x->cuda = cuda_compile(optimized, NULL, &x->times);
    return x->cuda ? 0 : -1;
  }
  default: unreachable();
  }
}

void executor_share_pool(Executor *x, ThreadPool *pool) {
  ASSERT(x->backend == BACKEND_EAGER && !x->pool);
  x->pool = pool;
  x->pool_shared = true;
}

void executor_init_api(Executor *x, optc_step *api, const Graph *g, int threads, ThreadPool *pool) {
  memset(x, 0, sizeof *x);
  x->backend = BACKEND_CPU;
  x->g = g;
  x->api = api;
  x->api_threads = threads;
  if (pool)
    optc_step_set_pool(api, (optc_pool *)pool, NULL);
}

int executor_api_step(Executor *x, const GroupLayout *full, void *const *flat, const double *inputs,
                      const optc_shard *shard, StepResult *res) {
  void **t = layout_tensor_bufs(full, x->g, flat);
  int rc = executor_api_step_t(x, full, t, inputs, shard, res);
  free(t);
  return rc;
}

/* The API's buffers and scalars for x's graph, from a tensor table and inputs. */
typedef struct {
  void **param, **grad, **state;
  optc_scalar *sc;
  int nsc;
  optc_buffers b;
} ApiArgs;

static void api_args(Executor *x, const GroupLayout *full, void *const *tbufs, const double *inputs, ApiArgs *a);
static void api_args_free(ApiArgs *a) {
  free(a->param);
  free(a->grad);
  free(a->state);
  free(a->sc);
}

int executor_api_partials_t(Executor *x, const GroupLayout *full, void *const *tbufs, const double *inputs,
                            const optc_shard *shard, double *partials) {
  ApiArgs a;
  api_args(x, full, tbufs, inputs, &a);
  optc_error err;
  optc_status st = optc_step_partials(x->api, &a.b, shard, a.sc, a.nsc, x->api_threads, partials, &err);
  api_args_free(&a);
  if (st != OPTC_OK) {
    fprintf(stderr, "%s\n", err.message);
    return -1;
  }
  return 0;
}

int executor_api_step_t(Executor *x, const GroupLayout *full, void *const *tbufs, const double *inputs,
                        const optc_shard *shard, StepResult *res) {
  ApiArgs a;
  api_args(x, full, tbufs, inputs, &a);
  optc_result r;
  optc_error err;
  optc_status st = shard ? optc_step_run_shard(x->api, &a.b, shard, a.sc, a.nsc, x->api_threads, &r, &err)
                         : optc_step_run(x->api, &a.b, a.sc, a.nsc, x->api_threads, &r, &err);
  api_args_free(&a);
  memset(res, 0, sizeof *res);
  if (st != OPTC_OK && st != OPTC_ERR_NONFINITE) { /* NONFINITE: skipped, the caller says so */
    fprintf(stderr, "%s\n", err.message);
    return -1;
  }
  res->skipped = r.skipped;
  if (!isnan(r.grad_sumsq))
    res->red[res->nred++] = r.grad_sumsq;
  return 0;
}

static void api_args(Executor *x, const GroupLayout *full, void *const *tbufs, const double *inputs, ApiArgs *a) {
  const Graph *g = x->g;
  optc_step *s = x->api;
  int n = full->ntensors, ns = optc_step_num_states(s);
  void **param = calloc((size_t)n + 1, sizeof(void *)), **grad = calloc((size_t)n + 1, sizeof(void *));
  void **state = calloc((size_t)ns * (size_t)n + 1, sizeof(void *));
  optc_scalar *sc = calloc((size_t)g->nins + 1, sizeof(optc_scalar));
  ASSERT(param && grad && state && sc);
  int matched = 0;
  for (int b = 0; b < g->nbufs; b++) {
    const Buffer *buf = &g->bufs[b];
    int k = -1;
    for (int j = 0; j < ns && k < 0; j++)
      if (buf->kind == BUF_STATE && !strcmp(optc_step_state_name(s, j), buf->name))
        k = j;
    matched += k >= 0;
    for (int t = 0; t < n; t++) {
      void *p = tbufs[(size_t)t * (size_t)g->nbufs + (size_t)b];
      if (buf->kind == BUF_PARAM)
        param[t] = p;
      else if (buf->kind == BUF_GRAD)
        grad[t] = p;
      else if (k >= 0)
        state[(size_t)k * (size_t)n + (size_t)t] = p;
    }
  }
  ASSERT(matched == ns); /* the same recipe: the same states */
  int nsc = 0;
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].op == OP_INPUT)
      sc[nsc++] = (optc_scalar){g->ins[i].name, inputs[i]};
  *a = (ApiArgs){param, grad, state, sc, nsc,
                 {.ntensors = n, .numel = full->numel, .param = param, .grad = grad, .state = state}};
}

int executor_step(Executor *x, ParamGroup *pg, const StepArgs *args, StepResult *res) {
  ASSERT(pg->g == x->g);
  if (x->api)
    return executor_api_step(x, &pg->layout, pg->bufs, args->inputs, NULL, res);
  switch (x->backend) {
  case BACKEND_INTERP: return interp_step(pg->g, &pg->layout, pg->bufs, args, res);
  case BACKEND_EAGER: return eager_run(pg->g, &pg->layout, pg->bufs, args, res, false, x->pool);
  case BACKEND_CPU: return cpu_step(x->cpu, x->pool, pg->g, &pg->layout, pg->bufs, args, res);
  case BACKEND_CUDA: {
    /* The group lives in host memory here: up before the step, back after
     * it (a caller that keeps it on the device uses cuda_exec_* itself). */
    if (!x->cuda_exec) {
      char err[512];
      x->cuda_exec = cuda_exec_create(x->cuda, pg->g, &pg->layout, err, sizeof err);
      if (!x->cuda_exec) {
        error("--backend cuda: %s", err);
        return -1;
      }
    }
    if (cuda_exec_upload(x->cuda_exec, pg->bufs) != 0 || cuda_step(x->cuda_exec, args, res) != 0)
      return -1;
    return res->skipped ? 0 : cuda_exec_download(x->cuda_exec, pg->bufs);
  }
  default: unreachable();
  }
}

void executor_free(Executor *x) {
  optc_step_free(x->api);
  cuda_exec_free(x->cuda_exec);
  cuda_program_free(x->cuda);
  cpu_program_free(x->cpu);
  if (!x->pool_shared)
    pool_free(x->pool);
  memset(x, 0, sizeof *x);
}

/* ---- inputs ------------------------------------------------------------------- */

static bool in_range(const Range *r, double v) {
  if (!r->set)
    return !isnan(v);
  return (r->lo_open ? v > r->lo : v >= r->lo) && (r->hi_open ? v < r->hi : v <= r->hi);
}

int inputs_resolve(const Graph *g, const Binding *sets, int nsets, const Binding *provided,
                   int nprovided, double *vals) {
  for (int k = 0; k < nsets; k++) {
    Ref r = graph_find_input(g, sets[k].name);
    if (r == NOREF || g->ins[r].op != OP_INPUT) {
      Buf names = {0};
      for (int i = 0; i < g->nins; i++)
        if (g->ins[i].op == OP_INPUT)
          buf_printf(&names, "%s%s", names.len ? ", " : "", g->ins[i].name);
      error("--set %s: the step graph has no input '%s'; its inputs are: %s", sets[k].name, sets[k].name,
            names.data ? names.data : "(none)");
      buf_free(&names);
      return -1;
    }
  }
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->op != OP_INPUT)
      continue;
    bool found = false;
    for (int k = 0; k < nprovided && !found; k++)
      if (strcmp(provided[k].name, x->name) == 0)
        vals[i] = provided[k].value, found = true;
    for (int k = nsets - 1; k >= 0 && !found; k--)
      if (strcmp(sets[k].name, x->name) == 0) {
        vals[i] = sets[k].value, found = true;
        if (!in_range(&x->range, vals[i])) {
          char lo[40], hi[40];
          fmt_double(lo, x->range.lo, false);
          fmt_double(hi, x->range.hi, false);
          error("--set %s=%g is out of range %c%s, %s%c", x->name, vals[i], x->range.lo_open ? '(' : '[', lo, hi,
                x->range.hi_open ? ')' : ']');
          return -1;
        }
      }
    if (!found && x->has_imm)
      vals[i] = x->imm, found = true;
    if (!found) {
      error("input '%s' has no value; give one with --set %s=VALUE", x->name, x->name);
      return -1;
    }
  }
  return 0;
}

bool parse_set(const char *s, Binding *out) {
  const char *eq = strchr(s, '=');
  if (!eq || eq == s) {
    error("--set expects NAME=VALUE, not '%s'", s);
    return false;
  }
  const char *v = eq + 1;
  char *end;
  double d;
  if (!strcmp(v, "true") || !strcmp(v, "True"))
    d = 1, end = (char *)v + strlen(v);
  else if (!strcmp(v, "false") || !strcmp(v, "False"))
    d = 0, end = (char *)v + strlen(v);
  else
    d = strtod(v, &end);
  if (end == v || *end) {
    error("--set %s: '%s' is not a number", s, v);
    return false;
  }
  out->name = strndup(s, (size_t)(eq - s));
  out->value = d;
  return true;
}
