/* fsdp_run.c: a model's units over a sharded group, as FSDP2 runs them.
 *
 * The model (llama4.h) calls a hook before and after each unit's use. Here
 * they do what torchtune's FSDP2 does around a wrapped module:
 *
 *   forward begin    all-gather the unit's params into a span (16-bit: and
 *                    widen them to f32, what the model reads)
 *   forward end      free them (fsdp_reshard_after_forward: True), or keep
 *                    them for the backward (False)
 *   backward begin   all-gather them again if freed; a zeroed f32 span for
 *                    the unit's grads
 *   backward end     on the last micro-batch of a step: round the grads to
 *                    their dtype and reduce-scatter them into the shard;
 *                    free both spans
 *
 * With gradient accumulation a unit's grads stay whole until the step's
 * last micro-batch, so that they are summed in the order an unsharded run
 * sums them (micro-batches, then ranks): the bits do not change. Spans come
 * from a free list, so a step allocates nothing once the first has run. On
 * one rank an f32 unit is its own span: the params are read, and the grads
 * written, in place in the shard. */
#include "coll.h"
#include "rt.h"

#include <math.h>
#include <string.h>

/* A free list of span buffers of one size. */
typedef struct {
  size_t bytes;
  void **free;
  int nfree, cap;
  int out, most_out; /* held now, and at most */
} Spans;

struct FsdpRun {
  Fsdp *f;
  FsdpRunOptions o;
  Type pt, gt;
  int ntensors;
  float **params, **grads; /* (ntensors) the pointers the model runs with */
  void **pspan;            /* (nunits) a gathered unit's params in their dtype, or NULL */
  float **pf32;            /* (nunits) ... as f32: the model's; pspan itself when f32 */
  float **gspan;           /* (nunits) a unit's f32 grads while it accumulates, or NULL */
  Spans wide, narrow;      /* f32 spans, and 16-bit ones */
  int micro, nmicro;       /* this micro-batch of the step's */
  bool failed;
  FsdpRunStats st;
};

static void *spans_get(FsdpRun *r, Spans *s) {
  void *p = s->nfree ? s->free[--s->nfree] : coll_mem_alloc(r->f->coll, s->bytes);
  if (p)
    s->out++, s->most_out = MAX(s->most_out, s->out);
  return p;
}

static void spans_put(Spans *s, void *p) {
  if (!p)
    return;
  if (s->nfree == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 8;
    s->free = realloc(s->free, sizeof(void *) * (size_t)s->cap);
    ASSERT(s->free);
  }
  s->free[s->nfree++] = p;
  s->out--;
}

static void spans_free(FsdpRun *r, Spans *s) {
  for (int i = 0; i < s->nfree; i++)
    coll_mem_free(r->f->coll, s->free[i]);
  free(s->free);
  memset(s, 0, sizeof *s);
}

/* Whether unit u's f32 span is the shard's part itself: one rank, f32. */
static bool in_place(const FsdpRun *r, Type t) { return r->f->world == 1 && t == TY_F32; }

/* Points the model's params[t] (or grads[t]) of unit u's tensors into span, or at nothing. */
static void point(FsdpRun *r, float **ptrs, int u, float *span) {
  const FsdpUnit *x = &r->f->units[u];
  for (int t = x->t0; t < x->t1; t++)
    ptrs[t] = span ? span + (r->f->full.offset[t] - x->base) : NULL;
}

/* Unit u's params, gathered and widened, for the model. */
static int params_in(FsdpRun *r, int u) {
  if (r->pf32[u])
    return 0;
  Fsdp *f = r->f;
  const FsdpUnit *x = &f->units[u];
  int64_t n = x->S * f->world;
  double t0 = now_seconds();
  if (in_place(r, r->pt)) {
    r->pspan[u] = fsdp_part(f, f->pbuf, u);
    r->pf32[u] = r->pspan[u];
  } else {
    /* 16-bit on one rank: widened straight from the part */
    void *src = f->world == 1 ? fsdp_part(f, f->pbuf, u) : NULL;
    if (!src) {
      src = r->pspan[u] = spans_get(r, r->pt == TY_F32 ? &r->wide : &r->narrow);
      if (!src || fsdp_gather(f, u, f->pbuf, src) != 0)
        return -1;
      r->st.gathered_bytes += (double)n * type_size(r->pt);
    }
    if (r->pt == TY_F32) {
      r->pf32[u] = src;
    } else {
      r->pf32[u] = spans_get(r, &r->wide);
      if (!r->pf32[u])
        return -1;
      const uint16_t *h = src;
      bool bf = r->pt == TY_BF16;
      for (int64_t i = 0; i < n; i++)
        r->pf32[u][i] = bf ? optc_bf16_to_f32(h[i]) : optc_f16_to_f32(h[i]);
    }
  }
  r->st.gathers++;
  r->st.gather_s += now_seconds() - t0;
  point(r, r->params, u, r->pf32[u]);
  return 0;
}

static void params_out(FsdpRun *r, int u) {
  if (!r->pf32[u])
    return;
  if (!in_place(r, r->pt)) {
    if (r->pf32[u] != r->pspan[u])
      spans_put(&r->wide, r->pf32[u]);
    if (r->pspan[u] && r->pspan[u] != fsdp_part(r->f, r->f->pbuf, u))
      spans_put(r->pt == TY_F32 ? &r->wide : &r->narrow, r->pspan[u]);
  }
  r->pspan[u] = NULL;
  r->pf32[u] = NULL;
  point(r, r->params, u, NULL);
}

/* Unit u's f32 grads span, zeroed on the step's first micro-batch. */
static int grads_in(FsdpRun *r, int u) {
  Fsdp *f = r->f;
  const FsdpUnit *x = &f->units[u];
  if (!r->gspan[u]) {
    ASSERT(r->micro == 0); /* a unit's grads live from the first micro-batch to the last */
    r->gspan[u] = in_place(r, r->gt) ? fsdp_part(f, f->gbuf, u) : spans_get(r, &r->wide);
    if (!r->gspan[u])
      return -1;
    memset(r->gspan[u], 0, sizeof(float) * (size_t)(x->S * f->world));
  }
  point(r, r->grads, u, r->gspan[u]);
  return 0;
}

/* On the step's last micro-batch: unit u's grads in their dtype, summed
 * over the ranks into the shard (on one rank in place, where a NaN still
 * becomes the canonical one). */
static int grads_out(FsdpRun *r, int u) {
  point(r, r->grads, u, NULL);
  if (r->micro + 1 < r->nmicro)
    return 0;
  Fsdp *f = r->f;
  int64_t n = f->units[u].S * f->world;
  double t0 = now_seconds();
  float *g = r->gspan[u];
  void *send = g;
  if (r->gt != TY_F32) {
    send = f->world == 1 ? fsdp_part(f, f->gbuf, u) : spans_get(r, &r->narrow);
    if (!send)
      return -1;
    uint16_t *h = send;
    bool bf = r->gt == TY_BF16;
    for (int64_t i = 0; i < n; i++)
      h[i] = bf ? optc_f32_to_bf16(g[i]) : optc_f32_to_f16(g[i]);
  }
  int rc = fsdp_reduce(f, u, send);
  r->st.reduces++;
  r->st.reduced_bytes += (double)n * type_size(r->gt);
  r->st.reduce_s += now_seconds() - t0;
  if (send != g && send != fsdp_part(f, f->gbuf, u))
    spans_put(&r->narrow, send);
  if (!in_place(r, r->gt))
    spans_put(&r->wide, g);
  r->gspan[u] = NULL;
  return rc;
}

static int hook_begin(void *ctx, int u, L4Pass pass) {
  FsdpRun *r = ctx;
  if (r->failed || params_in(r, u) != 0 || (pass == L4_BACKWARD && grads_in(r, u) != 0))
    r->failed = true;
  return r->failed ? -1 : 0;
}

static int hook_end(void *ctx, int u, L4Pass pass) {
  FsdpRun *r = ctx;
  if (r->failed)
    return -1;
  if (pass == L4_BACKWARD && grads_out(r, u) != 0)
    r->failed = true;
  /* forward: resharded unless the backward is to find them; backward: done */
  if (pass == L4_BACKWARD || r->o.reshard_after_forward || !r->o.training)
    params_out(r, u);
  return r->failed ? -1 : 0;
}

FsdpRun *fsdp_run_create(Fsdp *f, const FsdpRunOptions *o) {
  FsdpRun *r = calloc(1, sizeof *r);
  ASSERT(r);
  r->f = f;
  r->o = *o;
  r->pt = (Type)f->g->bufs[f->pbuf].type;
  r->gt = (Type)f->g->bufs[f->gbuf].type;
  r->ntensors = f->full.ntensors;
  r->params = calloc((size_t)r->ntensors + 1, sizeof(float *));
  r->grads = calloc((size_t)r->ntensors + 1, sizeof(float *));
  r->pspan = calloc((size_t)f->nunits + 1, sizeof(void *));
  r->pf32 = calloc((size_t)f->nunits + 1, sizeof(float *));
  r->gspan = calloc((size_t)f->nunits + 1, sizeof(float *));
  ASSERT(r->params && r->grads && r->pspan && r->pf32 && r->gspan);
  r->wide.bytes = (size_t)(f->most + 1) * sizeof(float);
  r->narrow.bytes = (size_t)(f->most + 1) * sizeof(uint16_t);
  r->nmicro = 1;
  return r;
}

void fsdp_run_free(FsdpRun *r) {
  if (!r)
    return;
  for (int u = 0; u < r->f->nunits; u++) {
    params_out(r, u);
    if (r->gspan[u] && !in_place(r, r->gt))
      spans_put(&r->wide, r->gspan[u]);
  }
  spans_free(r, &r->wide);
  spans_free(r, &r->narrow);
  free(r->params);
  free(r->grads);
  free(r->pspan);
  free(r->pf32);
  free(r->gspan);
  free(r);
}

L4Hooks fsdp_run_hooks(FsdpRun *r) { return (L4Hooks){hook_begin, hook_end, r}; }
float *const *fsdp_run_params(FsdpRun *r) { return r->params; }
float *const *fsdp_run_grads(FsdpRun *r) { return r->grads; }

void fsdp_run_micro(FsdpRun *r, int micro, int nmicro) {
  r->micro = micro;
  r->nmicro = nmicro;
}

void fsdp_run_set_training(FsdpRun *r, bool training) { r->o.training = training; }

bool fsdp_run_failed(const FsdpRun *r) { return r->failed; }

FsdpRunStats fsdp_run_stats(const FsdpRun *r) {
  FsdpRunStats s = r->st;
  s.spans_wide = r->wide.most_out, s.spans_narrow = r->narrow.most_out;
  s.span_bytes = (double)r->wide.most_out * (double)r->wide.bytes + (double)r->narrow.most_out * (double)r->narrow.bytes;
  return s;
}

void fsdp_run_plan_spans(const FsdpRunOptions *o, Type pt, Type gt, int world, int nunits, int accum, int *wide,
                         int *narrow) {
  /* per unit held: its params (one f32 span unless read in place; a 16-bit
   * gather besides on several ranks), its grads (one f32 span unless
   * written in place); and while one unit's 16-bit grads go out, their
   * rounding */
  int wp = pt == TY_F32 && world == 1 ? 0 : 1, np = pt != TY_F32 && world > 1 ? 1 : 0;
  int wg = gt == TY_F32 && world == 1 ? 0 : 1, ng = gt != TY_F32 && world > 1 ? 1 : 0;
  /* the most units held at once: their params one at a time, or, kept for
   * the backward, all at the head; their grads one at a time, or all while
   * a step accumulates */
  int params = o->reshard_after_forward ? 1 : nunits, grads = accum > 1 ? nunits : 1;
  *wide = params * wp + grads * wg;
  *narrow = params * np + ng;
}
