/* api/optc.c: the public C API (include/optc.h), on top of the compiler
 * and the runtime. A step is a recipe, built and planned once, compiled for
 * its target, and run over the caller's tensors through a tensor table; the
 * diagnostics the layers below print are captured into optc_error. */
#include "optc.h"

#include "codegen.h"
#include "frontend.h"
#include "gpu.h"
#include "passes.h"
#include "plan.h"
#include "exec.h"

#include <math.h>
#include <string.h>

struct optc_step {
  Arena *arena;
  Recipe *r;
  Graph *g; /* after the passes, planned */
  optc_target target;
  CpuProgram *cpu;
  CudaProgram *cuda;
  CudaExec *cx;      /* for `layout`, made on the first CUDA run */
  ThreadPool *pool;  /* the CPU's, for pool_threads threads */
  int pool_threads;
  ThreadPool *shared; /* the caller's (optc_step_set_pool), used instead; not freed here */
  int param_buf, grad_buf;
  int nstates;
  int *state_buf;    /* (nstates) graph buffer of each state */
  int nscalars;
  Ref *scalar;       /* (nscalars) the graph's inputs */
  const char *ir, *plan;
  GroupLayout layout; /* of the last run's tensors: the whole group, or the shard's chunks */
  GroupLayout full;   /* a shard's whole group (the reducer's global chunks) */
  bool have_layout, sharded;
  int64_t *ranges;    /* (2 * nranges) a shard's ranges, as the layout was cut */
  int nranges;
  void **table;      /* (ntensors * nbufs) the last run's tensor table */
  double *vals;      /* (nins) input values */
};

const char *optc_version(void) { return OPTC_VERSION_STRING; }

/* ---- errors: what the layers below print, captured ------------------------------------ */

typedef struct {
  Buf msg;
} Capture;

static void capture_begin(Capture *c) {
  memset(c, 0, sizeof *c);
  diag_capture(&c->msg);
}


/* Ends the capture; fills err with code, why (when not NULL) and what the
 * layers below printed. */
static optc_status finish(Capture *c, optc_error *err, optc_status code, const char *why) {
  diag_capture(NULL);
  if (err) {
    err->code = code;
    err->message[0] = 0;
    if (code != OPTC_OK) {
      Buf m = {0};
      if (why)
        buf_puts(&m, why);
      if (c->msg.len) {
        if (m.len)
          buf_putc(&m, '\n');
        buf_put(&m, c->msg.data, c->msg.len);
      }
      while (m.len && m.data[m.len - 1] == '\n')
        m.data[--m.len] = 0;
      snprintf(err->message, sizeof err->message, "%s", m.len ? m.data : "optc: failed");
      buf_free(&m);
    }
  }
  buf_free(&c->msg);
  return code;
}

PRINTF(4, 5) static optc_status fail(Capture *c, optc_error *err, optc_status code, const char *fmt, ...) {
  char why[1024] = "";
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
  }
  return finish(c, err, code, fmt ? why : NULL);
}

static optc_status capture_end(Capture *c, optc_error *err) { return finish(c, err, OPTC_OK, NULL); }

/* ---- building ------------------------------------------------------------------------------- */

optc_spec optc_spec_default(const char *optimizer) {
  return (optc_spec){.optimizer = optimizer, .param_dtype = OPTC_F32, .grad_dtype = OPTC_F32, .state_dtype = OPTC_F32,
                     .nonfinite = OPTC_NONFINITE_PROPAGATE, .target = OPTC_TARGET_CPU};
}

static const char *dtype_key(optc_dtype d) {
  switch (d) {
  case OPTC_F32: return "fp32";
  case OPTC_BF16: return "bf16";
  case OPTC_F16: return "fp16";
  case OPTC_U8: return "int8";
  case OPTC_U4: return "int4";
  }
  return NULL;
}

static Type dtype_type(optc_dtype d) { return d == OPTC_BF16 ? TY_BF16 : d == OPTC_F16 ? TY_F16 : TY_F32; }

static optc_dtype type_dtype(Type t) {
  return t == TY_BF16 ? OPTC_BF16 : t == TY_F16 ? OPTC_F16 : t == TY_U8 ? OPTC_U8 : t == TY_U4 ? OPTC_U4 : OPTC_F32;
}

/* The options that are bools in the recipe (the rest are numbers). */
static bool is_bool_option(const char *name) {
  static const char *const names[] = {"amsgrad", "maximize", "nesterov", "centered", "decoupled_weight_decay",
                                      "foreach", "capturable", "differentiable", "bf16_stochastic_round"};
  for (size_t i = 0; i < ARRAY_LEN(names); i++)
    if (strcmp(names[i], name) == 0)
      return true;
  return false;
}

/* A name the recipe text can hold as a key: letters, digits, '_' and '.'. */
static bool is_key(const char *s) {
  if (!s || !*s)
    return false;
  for (; *s; s++)
    if (!(*s == '_' || *s == '.' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
      return false;
  return true;
}

/* The last run's layouts, freed. */
static void drop_layout(optc_step *s) {
  if (s->have_layout) {
    layout_free(&s->layout);
    if (s->sharded)
      layout_free(&s->full);
  }
  free(s->ranges);
  s->ranges = NULL;
  s->nranges = 0;
  s->have_layout = s->sharded = false;
}

static void step_free(optc_step *s) {
  if (!s)
    return;
  if (s->cx)
    cuda_exec_free(s->cx);
  if (s->cuda)
    cuda_program_free(s->cuda);
  if (s->cpu)
    cpu_program_free(s->cpu);
  pool_free(s->pool);
  drop_layout(s);
  free(s->table);
  free(s->vals);
  arena_free(s->arena);
  free(s);
}

void optc_step_free(optc_step *s) { step_free(s); }

/* The recipe r (in arena a, which the step takes) built, planned and
 * compiled for target. NULL with the reason printed. */
static optc_step *step_build(Arena *a, Recipe *r, optc_target target, optc_status *code) {
  optc_step *s = calloc(1, sizeof *s);
  ASSERT(s);
  s->arena = a;
  s->r = r;
  s->target = target;
  *code = OPTC_ERR_SPEC;
  s->g = frontend_build(r);
  if (!s->g || !pipeline_run(s->g, &(PipelineOptions){0}))
    goto fail;
  Graph *g = s->g;
  s->param_buf = s->grad_buf = -1;
  s->state_buf = arena_alloc(a, sizeof(int) * (size_t)(g->nbufs + 1));
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind == BUF_PARAM)
      s->param_buf = b;
    else if (g->bufs[b].kind == BUF_GRAD)
      s->grad_buf = b;
    else
      s->state_buf[s->nstates++] = b;
  }
  if (s->param_buf < 0 || s->grad_buf < 0) {
    error("the step has no %s buffer", s->param_buf < 0 ? "param" : "grad");
    goto fail;
  }
  s->scalar = arena_alloc(a, sizeof(Ref) * (size_t)(g->nins + 1));
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].op == OP_INPUT)
      s->scalar[s->nscalars++] = i;
  s->vals = calloc((size_t)g->nins + 1, sizeof(double));
  ASSERT(s->vals);
  Buf ir = {0}, plan = {0};
  ir_print(g, &ir);
  plan_print(g->plan, -1, &plan);
  s->ir = arena_strdup(a, ir.data ? ir.data : "");
  s->plan = arena_strdup(a, plan.data ? plan.data : "");
  buf_free(&ir);
  buf_free(&plan);
  *code = OPTC_ERR_COMPILE;
  if (target == OPTC_TARGET_CPU) {
    if (!cpu_backend_available()) {
      error("this liboptc was built without the CPU backend (LLVM)");
      goto fail;
    }
    s->cpu = cpu_compile(g, NULL, NULL);
    if (!s->cpu)
      goto fail;
  } else if (target == OPTC_TARGET_CUDA) {
    char why[2048];
    if (!cuda_nvrtc_available(why, sizeof why)) {
      error("CUDA: %s", why);
      goto fail;
    }
    s->cuda = cuda_compile(g, NULL, NULL);
    if (!s->cuda)
      goto fail;
  } else {
    *code = OPTC_ERR_INVALID;
    error("unknown target %d", (int)target);
    goto fail;
  }
  *code = OPTC_OK;
  return s;
fail:
  s->arena = NULL; /* the caller frees the arena */
  step_free(s);
  return NULL;
}

optc_status optc_step_new(const optc_spec *spec, optc_step **out, optc_error *err) {
  Capture c;
  capture_begin(&c);
  if (!spec || !out)
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_new: %s is NULL", spec ? "out" : "spec");
  *out = NULL;
  if (!spec->optimizer || !*spec->optimizer)
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_new: no optimizer named");
  if (!dtype_key(spec->param_dtype) || !dtype_key(spec->grad_dtype) || !dtype_key(spec->state_dtype) ||
      spec->param_dtype > OPTC_F16 || spec->grad_dtype > OPTC_F16)
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_new: a dtype is not OPTC_F32, OPTC_BF16 or OPTC_F16 (or, "
                                           "for the states, OPTC_U8, OPTC_U4)");
  if (spec->noptions < 0 || (spec->noptions > 0 && !spec->options))
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_new: %d options but no array", spec->noptions);
  if ((int)spec->clip < 0 || spec->clip > OPTC_CLIP_GIVEN || (int)spec->nonfinite < 0 ||
      spec->nonfinite > OPTC_NONFINITE_ERROR)
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_new: clip or nonfinite out of range");
  if (spec->torch_cpu && strcmp(spec->torch_cpu, "avx512") && strcmp(spec->torch_cpu, "avx2") &&
      strcmp(spec->torch_cpu, "amd") && strcmp(spec->torch_cpu, "auto"))
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_new: torch_cpu '%s': expected avx512, avx2, amd or auto",
                spec->torch_cpu);
  /* The spec as a recipe: the front end checks every name and range. */
  Buf y = {0};
  if (!is_key(spec->optimizer)) {
    buf_free(&y);
    return fail(&c, err, OPTC_ERR_SPEC, "unknown optimizer '%s'", spec->optimizer);
  }
  static const struct { const char *name, *component; } short_names[] = {
      {"adamw", "torch.optim.AdamW"}, {"adam", "torch.optim.Adam"}, {"sgd", "torch.optim.SGD"},
      {"adagrad", "torch.optim.Adagrad"}, {"rmsprop", "torch.optim.RMSprop"}, {"lion", "optc.Lion"},
      {"grad_norm", "optc.grad_norm"}, {"adamw8bit", "torchao.optim.AdamW8bit"},
      {"adamw4bit", "torchao.optim.AdamW4bit"}};
  Buf top = {0}; /* the recipe's own keys among the options */
  const char *component = spec->optimizer;
  for (size_t i = 0; i < ARRAY_LEN(short_names); i++)
    if (strcmp(short_names[i].name, component) == 0)
      component = short_names[i].component;
  buf_printf(&y, "optimizer:\n  _component_: %s\n", component);
  for (int i = 0; i < spec->noptions; i++) {
    const optc_scalar *o = &spec->options[i];
    if (!is_key(o->name)) {
      buf_free(&y);
      buf_free(&top);
      return fail(&c, err, OPTC_ERR_INVALID, "optc_step_new: option %d has no valid name", i);
    }
    if (strcmp(o->name, "fused") == 0)
      continue;
    if (strcmp(o->name, "stochastic_rounding") == 0 || strcmp(o->name, "kahan") == 0) {
      if (strcmp(o->name, "kahan") == 0)
        buf_printf(&top, "compensation: %s\n", o->value != 0 ? "kahan" : "none");
      else
        buf_printf(&top, "stochastic_rounding: %s\n", o->value != 0 ? "true" : "false");
      continue;
    }
    if (strcmp(o->name, "seed") == 0) {
      char num[40];
      fmt_double(num, o->value, false);
      buf_printf(&top, "seed: %s\n", num);
      continue;
    }
    char num[40];
    fmt_double(num, o->value, false);
    if (strcmp(o->name, "block_size") == 0 && o->value == (double)(long long)o->value)
      snprintf(num, sizeof num, "%lld", (long long)o->value); /* an integer key */
    if (is_bool_option(o->name))
      buf_printf(&y, "  %s: %s\n", o->name, o->value != 0 ? "true" : "false");
    else
      buf_printf(&y, "  %s: %s\n", o->name, isfinite(o->value) ? num : (isnan(o->value) ? ".nan" : o->value > 0 ? ".inf" : "-.inf"));
  }
  if (spec->fused)
    buf_puts(&y, "  fused: true\n");
  buf_printf(&y, "dtype: %s\noptimizer_state_dtype: %s\n", dtype_key(spec->param_dtype), dtype_key(spec->state_dtype));
  if (spec->clip != OPTC_CLIP_NONE)
    buf_printf(&y, "clip_grad_norm: 1.0\n%s", spec->clip == OPTC_CLIP_GIVEN ? "clip_norm_given: true\n" : "");
  static const char *const nonfinite[] = {"propagate", "skip", "error"};
  buf_printf(&y, "nonfinite_grads: %s\nwrite_back_grads: %s\n", nonfinite[spec->nonfinite],
             spec->write_back_grads ? "true" : "false");
  if (spec->torch_cpu)
    buf_printf(&y, "torch_cpu: %s\n", spec->torch_cpu);
  if (top.len)
    buf_puts(&y, top.data);
  buf_free(&top);
  Arena *a = arena_new();
  Recipe *r = recipe_from_text("<optc_spec>", y.data, NULL, 0, a);
  buf_free(&y);
  if (!r) {
    arena_free(a);
    return fail(&c, err, OPTC_ERR_SPEC, "%s", "");
  }
  r->grad_dtype = dtype_type(spec->grad_dtype);
  optc_status code;
  optc_step *s = step_build(a, r, spec->target, &code);
  if (!s) {
    arena_free(a);
    return fail(&c, err, code, "%s", "");
  }
  *out = s;
  return capture_end(&c, err);
}

optc_status optc_step_from_recipe(const char *name, const char *yaml, const char *const *overrides, int noverrides,
                                  optc_target target, optc_step **out, optc_error *err) {
  Capture c;
  capture_begin(&c);
  if (!yaml || !out || noverrides < 0 || (noverrides > 0 && !overrides))
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_from_recipe: %s", !yaml ? "no recipe text" : !out ? "out is NULL"
                                                                                                   : "bad overrides");
  *out = NULL;
  Arena *a = arena_new();
  Recipe *r = recipe_from_text(name ? name : "<recipe>", yaml, overrides, noverrides, a);
  if (!r) {
    arena_free(a);
    return fail(&c, err, OPTC_ERR_SPEC, "%s", "");
  }
  optc_status code;
  optc_step *s = step_build(a, r, target, &code);
  if (!s) {
    arena_free(a);
    return fail(&c, err, code, "%s", "");
  }
  *out = s;
  return capture_end(&c, err);
}

/* ---- what a step keeps ------------------------------------------------------------------------ */

int optc_step_num_states(const optc_step *s) { return s ? s->nstates : 0; }

const char *optc_step_state_name(const optc_step *s, int k) {
  return s && k >= 0 && k < s->nstates ? s->g->bufs[s->state_buf[k]].name : NULL;
}

optc_dtype optc_step_state_dtype(const optc_step *s, int k) {
  return s && k >= 0 && k < s->nstates ? type_dtype((Type)s->g->bufs[s->state_buf[k]].type) : OPTC_F32;
}

optc_init optc_step_state_init(const optc_step *s, int k, double *value) {
  double v = 0;
  optc_init kind = OPTC_INIT_ZERO;
  if (s && k >= 0 && k < s->nstates) {
    const Buffer *b = &s->g->bufs[s->state_buf[k]];
    if (b->init == INIT_PARAM) {
      kind = OPTC_INIT_PARAM;
    } else if (b->init == INIT_INPUT) {
      Ref r = graph_find_input(s->g, b->init_input);
      v = r != NOREF ? s->g->ins[r].imm : 0;
      kind = v != 0 ? OPTC_INIT_VALUE : OPTC_INIT_ZERO;
    } else {
      v = b->init_value;
      kind = v != 0 ? OPTC_INIT_VALUE : OPTC_INIT_ZERO;
    }
  }
  if (value)
    *value = v;
  return kind;
}

int optc_step_state_block(const optc_step *s, int k) {
  return s && k >= 0 && k < s->nstates && s->g->bufs[s->state_buf[k]].per_block ? s->g->block : 0;
}

int64_t optc_step_state_bytes(const optc_step *s, int k, int64_t numel) {
  return s && k >= 0 && k < s->nstates && numel >= 0 ? buffer_bytes(s->g, s->state_buf[k], numel) : 0;
}

int optc_code_book(const char *name, float *values) {
  Book b;
  if (!name || !book_from_name(name, strlen(name), &b))
    return 0;
  const CodeBook *cb = codebook(b);
  if (values)
    memcpy(values, cb->q, sizeof(float) * (size_t)cb->n);
  return cb->n;
}

int optc_step_num_scalars(const optc_step *s) { return s ? s->nscalars : 0; }

const char *optc_step_scalar_name(const optc_step *s, int i, double *dflt) {
  if (!s || i < 0 || i >= s->nscalars)
    return NULL;
  const Ins *x = &s->g->ins[s->scalar[i]];
  if (dflt)
    *dflt = x->has_imm ? x->imm : NAN;
  return x->name;
}

int optc_step_bytes_per_element(const optc_step *s) { return s ? (int)ceil(s->g->plan->bytes_per_element) : 0; }
double optc_step_traffic(const optc_step *s) { return s ? s->g->plan->bytes_per_element : 0; }
const char *optc_step_ir(const optc_step *s) { return s ? s->ir : ""; }
const char *optc_step_plan(const optc_step *s) { return s ? s->plan : ""; }

/* ---- NVRTC ------------------------------------------------------------------------------------ */

optc_status optc_nvrtc_dirs(const char *dirs, optc_error *err) {
  Capture c;
  capture_begin(&c);
  if (!nvrtc_search_dirs(dirs))
    return fail(&c, err, OPTC_ERR_INVALID, "optc_nvrtc_dirs: NVRTC has been looked for already; give the "
                "directories before the first CUDA step");
  return capture_end(&c, err);
}

int optc_nvrtc_info(char *buf, size_t n) {
  char why[2048];
  bool ok = cuda_nvrtc_available(why, sizeof why);
  if (buf && n)
    snprintf(buf, n, "%s", why);
  return ok;
}

/* ---- threads ---------------------------------------------------------------------------------- */

optc_pool *optc_pool_new(int threads) { return threads > 1024 ? NULL : (optc_pool *)pool_create(threads); }
int optc_pool_threads(const optc_pool *p) { return p ? pool_size((const ThreadPool *)p) : 0; }
void optc_pool_free(optc_pool *p) { pool_free((ThreadPool *)p); }

optc_status optc_step_set_pool(optc_step *s, optc_pool *p, optc_error *err) {
  Capture c;
  capture_begin(&c);
  if (!s)
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_set_pool: step is NULL");
  if (p && s->target != OPTC_TARGET_CPU)
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_set_pool: a pool runs CPU steps; this one is CUDA's");
  s->shared = (ThreadPool *)p;
  if (p) { /* its own threads are not needed while it has the caller's */
    pool_free(s->pool);
    s->pool = NULL;
    s->pool_threads = 0;
  }
  return capture_end(&c, err);
}

/* ---- running ----------------------------------------------------------------------------------- */

static bool in_range(const Range *rg, double v) {
  if (!rg->set)
    return true;
  return (rg->lo_open ? v > rg->lo : v >= rg->lo) && (rg->hi_open ? v < rg->hi : v <= rg->hi);
}

/* A value that would have changed the build (momentum made zero or
 * nonzero: an option of the body depends on it) is refused. */
static optc_status check_build_choice(const optc_step *s, const optc_scalar *x) {
  const Graph *body = s->r->body;
  Ref in = graph_find_input(body, x->name);
  if (in == NOREF || body->ins[in].op != OP_INPUT)
    return OPTC_OK;
  for (int i = 0; i < body->nins; i++) {
    const Ins *o = &body->ins[i];
    if (o->op != OP_OPTION || o->dep != in)
      continue;
    double built = body->ins[in].imm;
    for (int k = 0; k < s->r->nbindings; k++)
      if (strcmp(s->r->bindings[k].name, x->name) == 0)
        built = s->r->bindings[k].value;
    if ((built != 0) != (x->value != 0)) {
      error("%s = %g: this step was built with %s %s 0, which decides its graph; build another step", x->name,
            x->value, x->name, built != 0 ? "!=" : "==");
      return OPTC_ERR_INVALID;
    }
  }
  return OPTC_OK;
}

/* The names the step accepts without reading them: what the optimizer
 * body or the prelude declares, dropped by this build. */
static optc_status check_unread(const optc_step *s, const optc_scalar *x) {
  static const char *const prelude[] = {"num_tokens", "world_size", "grad_scale", "max_norm", "grad_norm_given",
                                        "torch_threads"};
  for (size_t i = 0; i < ARRAY_LEN(prelude); i++)
    if (strcmp(prelude[i], x->name) == 0)
      return OPTC_OK;
  Ref in = graph_find_input(s->r->body, x->name);
  if (in == NOREF || s->r->body->ins[in].op != OP_INPUT) {
    error("unknown scalar '%s' for %s", x->name, s->r->component);
    return OPTC_ERR_INVALID;
  }
  return check_build_choice(s, x);
}

static bool same_numel(const GroupLayout *l, int n, const int64_t *numel) {
  if (l->ntensors != n)
    return false;
  for (int t = 0; t < n; t++)
    if (l->numel[t] != numel[t])
      return false;
  return true;
}

optc_status optc_torch_sqrt(const char *torch_cpu, const float *x, float *y, int64_t n, optc_error *err) {
  Capture c;
  capture_begin(&c);
  if (n < 0 || (n > 0 && (!x || !y)))
    return fail(&c, err, OPTC_ERR_INVALID, "optc_torch_sqrt: %s", n < 0 ? "n < 0" : "x or y is NULL");
  TorchCpu cpu;
  if (!torch_cpu || !strcmp(torch_cpu, "auto"))
    cpu = torch_cpu_host();
  else if (!strcmp(torch_cpu, "avx512"))
    cpu = TORCH_CPU_AVX512;
  else if (!strcmp(torch_cpu, "avx2"))
    cpu = TORCH_CPU_AVX2;
  else if (!strcmp(torch_cpu, "amd"))
    cpu = TORCH_CPU_AMD;
  else
    return fail(&c, err, OPTC_ERR_INVALID, "optc_torch_sqrt: torch_cpu '%s': expected avx512, avx2, amd or auto",
                torch_cpu);
  for (int64_t i = 0; i < n; i++)
    y[i] = cpu == TORCH_CPU_AVX512 ? optc_sqrt_mkl_f32(x[i])
           : cpu == TORCH_CPU_AMD  ? optc_sqrt_mkl_ex_f32(x[i])
                                   : sqrtf(x[i]);
  return capture_end(&c, err);
}

int64_t optc_flat_layout(int ntensors, const int64_t *numel, int64_t *offset) {
  return numel && ntensors > 0 ? layout_offsets(ntensors, numel, offset) : 0;
}

int64_t optc_chunk_index(int ntensors, const int64_t *numel, int64_t flat) {
  if (!numel || ntensors <= 0)
    return 0;
  GroupLayout l;
  layout_init(&l, ntensors, numel);
  int64_t k = layout_chunk_at(&l, flat);
  layout_free(&l);
  return k;
}

/* The tensors' start: OPTC_TENSOR_ALIGN, or a quantized step's block. */
static int64_t step_align(const optc_step *s) { return graph_align(s->g); }

int optc_step_align(const optc_step *s) { return s ? (int)step_align(s) : OPTC_TENSOR_ALIGN; }

int64_t optc_step_flat_layout(const optc_step *s, int ntensors, const int64_t *numel, int64_t *offset) {
  return s && numel && ntensors > 0 ? layout_offsets_a(ntensors, numel, step_align(s), offset) : 0;
}

int64_t optc_step_chunk_index(const optc_step *s, int ntensors, const int64_t *numel, int64_t flat) {
  if (!s || !numel || ntensors <= 0)
    return 0;
  GroupLayout l;
  layout_init_a(&l, ntensors, numel, step_align(s));
  int64_t k = layout_chunk_at(&l, flat);
  layout_free(&l);
  return k;
}

/* A shard's ranges: its own, or [lo, hi) as one. */
static int shard_ranges(const optc_shard *sh, const int64_t **r, int64_t one[2]) {
  if (sh->nranges > 0) {
    *r = sh->ranges;
    return sh->nranges;
  }
  one[0] = sh->lo, one[1] = sh->hi;
  *r = one;
  return 1;
}

static bool same_ranges(const optc_step *s, const optc_shard *sh) {
  const int64_t *r;
  int64_t one[2];
  int n = shard_ranges(sh, &r, one);
  if (n != s->nranges)
    return false;
  return memcmp(r, s->ranges, sizeof(int64_t) * 2 * (size_t)n) == 0;
}

/* The run's layout: kept while the tensors keep their sizes (and a shard its ranges). */
static void use_layout(optc_step *s, int n, const int64_t *numel, const optc_shard *sh) {
  bool same = s->have_layout && s->sharded == (sh != NULL) && same_numel(&s->layout, n, numel) &&
              (!sh || same_ranges(s, sh));
  if (same)
    return;
  drop_layout(s);
  layout_init_a(&s->layout, n, numel, step_align(s));
  s->sharded = sh != NULL;
  if (sh) {
    const int64_t *r;
    int64_t one[2];
    int nr = shard_ranges(sh, &r, one);
    layout_init_a(&s->full, n, numel, step_align(s));
    layout_select(&s->layout, nr, r);
    s->ranges = malloc(sizeof(int64_t) * 2 * (size_t)nr);
    ASSERT(s->ranges);
    memcpy(s->ranges, r, sizeof(int64_t) * 2 * (size_t)nr);
    s->nranges = nr;
  }
  s->have_layout = true;
  free(s->table);
  s->table = malloc(sizeof(void *) * ((size_t)n * (size_t)s->g->nbufs + 1));
  ASSERT(s->table);
  if (s->cx) {
    cuda_exec_free(s->cx);
    s->cx = NULL;
  }
}

static optc_status run(optc_step *s, const optc_buffers *b, const optc_shard *sh, const optc_scalar *scalars,
                       int nscalars, int threads, optc_result *res, double *first_out, optc_error *err);

/* The reducer's collectives, on the caller's: where this slice's chunks sit among the group's. */
typedef struct {
  const optc_shard *sh;
  int64_t first, nglobal;
} ShardGather;


static int shard_gather(void *ctx, const double *local, int64_t nlocal, int width, double *global) {
  const ShardGather *g = ctx;
  return g->sh->gather(g->sh->ctx, local, g->first, nlocal, g->nglobal, width, global);
}

static int shard_all(void *ctx, int local) {
  const ShardGather *g = ctx;
  return g->sh->all(g->sh->ctx, local);
}

optc_status optc_step_run(optc_step *s, const optc_buffers *b, const optc_scalar *scalars, int nscalars, int threads,
                          optc_result *res, optc_error *err) {
  return run(s, b, NULL, scalars, nscalars, threads, res, NULL, err);
}

optc_status optc_step_run_shard(optc_step *s, const optc_buffers *b, const optc_shard *shard,
                                const optc_scalar *scalars, int nscalars, int threads, optc_result *res,
                                optc_error *err) {
  if (!shard) {
    Capture c;
    capture_begin(&c);
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_run_shard: shard is NULL");
  }
  return run(s, b, shard, scalars, nscalars, threads, res, NULL, err);
}

int optc_step_partials_width(const optc_step *s) {
  int width = 0;
  return s && s->target == OPTC_TARGET_CPU && cpu_first_phase_reduces(s->g, &width) ? width : 0;
}

optc_status optc_step_partials(optc_step *s, const optc_buffers *b, const optc_shard *shard,
                               const optc_scalar *scalars, int nscalars, int threads, double *partials,
                               optc_error *err) {
  if (!shard || !partials || optc_step_partials_width(s) == 0) {
    Capture c;
    capture_begin(&c);
    return fail(&c, err, OPTC_ERR_INVALID, "optc_step_partials: %s",
                !shard ? "shard is NULL" : !partials ? "partials is NULL"
                                         : "the step's first phase does not only sum over the grads (no clipping, "
                                           "or not the CPU target)");
  }
  return run(s, b, shard, scalars, nscalars, threads, NULL, partials, err);
}

static optc_status run(optc_step *s, const optc_buffers *b, const optc_shard *sh, const optc_scalar *scalars,
                       int nscalars, int threads, optc_result *res, double *first_out, optc_error *err) {
  Capture c;
  capture_begin(&c);
  const char *fn = first_out ? "optc_step_partials" : sh ? "optc_step_run_shard" : "optc_step_run";
  if (!s || !b)
    return fail(&c, err, OPTC_ERR_INVALID, "%s: %s is NULL", fn, s ? "buffers" : "step");
  if (res)
    *res = (optc_result){.grad_norm = NAN, .grad_sumsq = NAN};
  const Graph *g = s->g;
  int n = b->ntensors;
  if (n < 0 || (n > 0 && (!b->numel || !b->param || !b->grad || (s->nstates > 0 && !b->state))))
    return fail(&c, err, OPTC_ERR_INVALID, "%s: %d tensors but a NULL numel, param, grad or state table", fn, n);
  for (int t = 0; t < n; t++) {
    if (b->numel[t] < 0)
      return fail(&c, err, OPTC_ERR_INVALID, "%s: tensor %d has %lld elements", fn, t, (long long)b->numel[t]);
    if (b->numel[t] == 0)
      continue;
    if (!b->param[t] || !b->grad[t])
      return fail(&c, err, OPTC_ERR_INVALID, "%s: tensor %d: a NULL %s", fn, t, b->param[t] ? "grad" : "param");
    for (int k = 0; k < s->nstates; k++)
      if (!b->state[(size_t)k * (size_t)n + (size_t)t])
        return fail(&c, err, OPTC_ERR_INVALID, "%s: tensor %d: a NULL %s", fn, t,
                    g->bufs[s->state_buf[k]].name);
  }
  if (sh) {
    int64_t total = optc_step_flat_layout(s, n, b->numel, NULL);
    if (sh->nranges < 0 || (sh->nranges > 0 && !sh->ranges))
      return fail(&c, err, OPTC_ERR_INVALID, "%s: %d ranges but no array", fn, sh->nranges);
    if (sh->nranges == 0 && (sh->lo < 0 || sh->lo % OPTC_REDUCE_BLOCK != 0 || sh->hi < sh->lo || sh->hi > total))
      return fail(&c, err, OPTC_ERR_INVALID,
                  "%s: slice [%lld, %lld) is not inside the group's %lld flat elements from a multiple of %d", fn,
                  (long long)sh->lo, (long long)sh->hi, (long long)total, OPTC_REDUCE_BLOCK);
    if (sh->nranges > 0) {
      GroupLayout probe;
      layout_init_a(&probe, n, b->numel, step_align(s));
      int bad = -1;
      for (int k = 0; k < sh->nranges && bad < 0; k++) {
        int64_t lo = sh->ranges[2 * k], hi = sh->ranges[2 * k + 1];
        if (lo < (k ? sh->ranges[2 * k - 1] : 0) || hi < lo || hi > total || !layout_is_cut(&probe, lo) ||
            !layout_is_cut(&probe, hi))
          bad = k;
      }
      layout_free(&probe);
      if (bad >= 0)
        return fail(&c, err, OPTC_ERR_INVALID,
                    "%s: range %d [%lld, %lld) is not ascending inside the group's %lld flat elements, or an end "
                    "cuts a chunk (not a multiple of %d inside a tensor)",
                    fn, bad, (long long)sh->ranges[2 * bad], (long long)sh->ranges[2 * bad + 1], (long long)total,
                    OPTC_REDUCE_BLOCK);
    }
    if (!sh->gather || !sh->all)
      return fail(&c, err, OPTC_ERR_INVALID, "%s: the shard has no %s callback", fn, sh->gather ? "all" : "gather");
    if (s->target != OPTC_TARGET_CPU)
      return fail(&c, err, OPTC_ERR_INVALID, "%s: sharded steps run on the CPU target only", fn);
  }
  if (nscalars < 0 || (nscalars > 0 && !scalars))
    return fail(&c, err, OPTC_ERR_INVALID, "%s: %d scalars but no array", fn, nscalars);
  /* the inputs: defaults, then the caller's */
  for (int i = 0; i < s->nscalars; i++) {
    const Ins *x = &g->ins[s->scalar[i]];
    s->vals[s->scalar[i]] = x->has_imm ? x->imm : NAN;
  }
  for (int k = 0; k < nscalars; k++) {
    const optc_scalar *x = &scalars[k];
    if (!x->name)
      return fail(&c, err, OPTC_ERR_INVALID, "%s: scalar %d has no name", fn, k);
    Ref r = graph_find_input(g, x->name);
    if (r == NOREF || g->ins[r].op != OP_INPUT) {
      optc_status st = check_unread(s, x);
      if (st != OPTC_OK)
        return fail(&c, err, st, "%s", "");
      continue;
    }
    optc_status st = check_build_choice(s, x);
    if (st != OPTC_OK)
      return fail(&c, err, st, "%s", "");
    if (!in_range(&g->ins[r].range, x->value)) {
      char lo[40], hi[40];
      const Range *rg = &g->ins[r].range;
      fmt_double(lo, rg->lo, false);
      fmt_double(hi, rg->hi, false);
      return fail(&c, err, OPTC_ERR_INVALID, "scalar %s = %g is out of range %c%s, %s%c", x->name, x->value,
                  rg->lo_open ? '(' : '[', lo, hi, rg->hi_open ? ')' : ']');
    }
    s->vals[r] = x->value;
  }
  for (int i = 0; i < s->nscalars; i++)
    if (isnan(s->vals[s->scalar[i]]) && !g->ins[s->scalar[i]].has_imm)
      return fail(&c, err, OPTC_ERR_INVALID, "scalar %s has no value; give it", g->ins[s->scalar[i]].name);
  /* the layout of these tensors and the tensor table */
  use_layout(s, n, b->numel, sh);
  for (int t = 0; t < n; t++) {
    void **row = &s->table[(size_t)t * (size_t)g->nbufs];
    row[s->param_buf] = b->param[t];
    row[s->grad_buf] = b->grad[t];
    for (int k = 0; k < s->nstates; k++)
      row[s->state_buf[k]] = b->state[(size_t)k * (size_t)n + (size_t)t];
  }
  NonfiniteMode nf = s->r->nonfinite;
  StepArgs args = {.inputs = s->vals, .grads_finite = nf == NONFINITE_PROPAGATE ? 1 : -1,
                   .propagate = nf == NONFINITE_PROPAGATE};
  Reducer reducer;
  ShardGather sg;
  if (sh) {
    sg = (ShardGather){sh, s->layout.nchunks > 0 ? layout_chunk_at(&s->full, s->layout.chunks[0].flat) : 0,
                       s->full.nchunks};
    reducer = (Reducer){&s->full, shard_gather, shard_all, &sg};
    args.reducer = &reducer;
  }
  StepResult sr;
  int rc;
  if (s->target == OPTC_TARGET_CPU) {
    int want = threads > 0 ? threads : pool_default_threads();
    if (!s->shared && (!s->pool || s->pool_threads != want)) {
      pool_free(s->pool);
      s->pool = pool_create(want);
      s->pool_threads = want;
    }
    ThreadPool *pool = s->shared ? s->shared : s->pool;
    if (first_out)
      return cpu_step_partials_t(s->cpu, pool, g, &s->layout, s->table, s->vals, first_out) == 0
                 ? capture_end(&c, err)
                 : fail(&c, err, OPTC_ERR_INVALID, "%s", "");
    if (sh && sh->partials) {
      if (optc_step_partials_width(s) == 0)
        return fail(&c, err, OPTC_ERR_INVALID, "%s: the shard gives partials, but the step's first phase does not only "
                                               "sum over the grads", fn);
      args.first_partials = sh->partials;
    }
    rc = cpu_step_t(s->cpu, pool, g, &s->layout, s->table, &args, &sr);
  } else {
    if (!s->cx) {
      char why[512];
      s->cx = cuda_exec_create(s->cuda, g, &s->layout, why, sizeof why);
      if (!s->cx)
        return fail(&c, err, OPTC_ERR_DEVICE, "CUDA: %s", why);
    }
    CudaPtr *dt = malloc(sizeof(CudaPtr) * ((size_t)n * (size_t)g->nbufs + 1));
    ASSERT(dt);
    for (size_t i = 0; i < (size_t)n * (size_t)g->nbufs; i++)
      dt[i] = (CudaPtr)(uintptr_t)s->table[i];
    cuda_exec_set_stream(s->cx, b->stream);
    rc = cuda_exec_bind_tensors(s->cx, dt);
    free(dt);
    if (rc == 0)
      rc = cuda_step(s->cx, &args, &sr);
    if (rc != 0)
      return fail(&c, err, OPTC_ERR_DEVICE, "CUDA: the step failed");
  }
  if (rc != 0)
    return fail(&c, err, OPTC_ERR_INVALID, "%s", "");
  if (res) {
    res->skipped = sr.skipped;
    if (sr.nred > 0)
      res->grad_sumsq = sr.red[0];
    /* optc.grad_norm with clip GIVEN clips nothing: its graph has no grad_norm_given */
    Ref given = s->r->clip_norm_given ? graph_find_input(g, "grad_norm_given") : NOREF;
    if (s->r->has_clip)
      res->grad_norm = s->r->clip_norm_given ? (given != NOREF ? s->vals[given] : NAN)
                                             : (sr.nred > 0 ? sqrt(sr.red[0]) : NAN);
  }
  if (sr.skipped && nf == NONFINITE_ERROR)
    return fail(&c, err, OPTC_ERR_NONFINITE, "non-finite gradients (nonfinite: error); nothing was written");
  return capture_end(&c, err);
}
