/* fsdp.c: a parameter group sharded over ranks as FSDP2 shards a model, and
 * its step.
 *
 * The group's tensors lie one after another in flat order
 * (optc_flat_layout), cut into chunks: a tensor's part inside one
 * OPTC_REDUCE_BLOCK block, where a step's sums are taken. The tensors form
 * units (what torchtune wraps in FSDP: each decoder layer, the embedding,
 * the head; optc exec: the whole group), each sharded on its own. Unit u's
 * span starts at the block of its first element, base_u, and rank r owns
 * the span's part
 *
 *   [base_u + r S_u, base_u + (r + 1) S_u)        S_u a multiple of the block
 *
 * of which the unit's own elements are its piece. Parts end on block
 * boundaries, so every chunk is one rank's and the norm's partials, folded
 * in global chunk order, have the bits of one rank's: no number depends on
 * the world size or on the units.
 *
 * At rest a rank holds, of every buffer (params, reduced grads, each
 * state), its part of each unit, S_u elements each, one after another: the
 * shard. A unit's params are all-gathered into a span of world * S_u
 * elements (flat index x at x - base_u) when the model needs them; its
 * grads, in such a span, are reduce-scattered (summed in rank order) into
 * the shard. A step runs over the shard's chunks, on every rank at once,
 * the step-scope reductions folded from every rank's partials. When any
 * rank's grads are non-finite, every rank skips together. */
#include "dist.h"

#include <math.h>
#include <string.h>

/* The collective type that sums t; COLL_NTYPES when none does (f16). */
static CollType sum_type(Type t) {
  switch (t) {
  case TY_F32: return COLL_F32;
  case TY_F64: return COLL_F64;
  case TY_BF16: return COLL_BF16;
  default: return COLL_NTYPES;
  }
}

/* The collective type that moves t's bytes unchanged (an all-gather adds nothing). */
static CollType move_type(Type t) { return type_size(t) == 2 ? COLL_BF16 : type_size(t) == 8 ? COLL_F64 : COLL_F32; }

static Type buf_type(const Fsdp *f, int b) { return (Type)f->g->bufs[b].type; }

/* Buffer b's bytes before flat element i (a block's start: every shard,
 * unit and tensor starts on one), negative i too: a tensor that starts in
 * an earlier rank's part. */
static int64_t buf_offset(const Fsdp *f, int b, int64_t i) {
  const Graph *g = f->g;
  const Buffer *x = &g->bufs[b];
  /* elements a unit of storage holds (a scale: a block; a byte of u4 codes: 2) */
  int64_t per = x->per_block ? g->block : x->type == TY_U4 ? 2 : 1;
  ASSERT(i % per == 0);
  return i / per * (x->type == TY_U4 ? 1 : type_size((Type)x->type));
}

static void *buf_at(const Fsdp *f, int b, void *p, int64_t i) { return (char *)p + buf_offset(f, b, i); }

/* Moves n bytes (a multiple of 2) from every rank into span, rank after
 * rank: an all-gather of a type of their size, which adds nothing. */
static int gather_bytes(Coll *c, const void *part, void *span, int64_t n) {
  ASSERT(n % 2 == 0);
  return n % 4 == 0 ? coll_all_gather(c, part, span, n / 4, COLL_F32) : coll_all_gather(c, part, span, n / 2, COLL_BF16);
}

/* Rank r's part of unit u, clipped to the unit's elements: its piece. */
static void unit_piece(const FsdpUnit *u, int r, int64_t *lo, int64_t *hi) {
  int64_t a = fsdp_part_start(u, r), b = a + u->S;
  *lo = MIN(MAX(a, u->flo), u->fhi);
  *hi = MAX(MIN(b, u->fhi), *lo);
}


/* ---- the reducer: every rank's chunk partials, in global order ----------------------- */

/* Rank r's chunks: its piece of each unit, in unit order. Fills the
 * global index of each (when idx is not NULL) and returns their count. */
static int64_t rank_chunks(const Fsdp *f, int r, int64_t *idx) {
  int64_t n = 0;
  for (int u = 0; u < f->nunits; u++) {
    int64_t lo, hi;
    unit_piece(&f->units[u], r, &lo, &hi);
    for (int64_t c = layout_chunk_at(&f->full, lo), e = layout_chunk_at(&f->full, hi); c < e; c++, n++)
      if (idx)
        idx[n] = c;
  }
  return n;
}

static int gather_partials(void *ctx, const double *local, int64_t nlocal, int width, double *global) {
  Fsdp *f = ctx;
  int64_t most = 0;
  for (int r = 0; r < f->world; r++)
    most = MAX(most, f->nchunks_of[r]);
  ASSERT(nlocal == f->nchunks_of[f->rank]);
  int64_t block = most * width;
  double *send = calloc((size_t)block + 1, sizeof(double));
  double *all = calloc((size_t)(block * f->world) + 1, sizeof(double));
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)(most + 1));
  ASSERT(send && all && idx);
  memcpy(send, local, sizeof(double) * (size_t)(nlocal * width));
  int rc = coll_all_gather(f->coll, send, all, block, COLL_F64);
  for (int r = 0; rc == 0 && r < f->world; r++) {
    int64_t n = rank_chunks(f, r, idx);
    for (int64_t k = 0; k < n; k++)
      memcpy(global + idx[k] * width, all + (int64_t)r * block + k * width, sizeof(double) * (size_t)width);
  }
  free(send);
  free(all);
  free(idx);
  return rc;
}

/* The same, as include/optc.h's optc_shard.gather (the ranges are this layout's own). */
static int api_gather(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                      double *global) {
  Fsdp *f = ctx;
  ASSERT(nglobal == f->full.nchunks && (nlocal == 0 || first == layout_chunk_at(&f->full, f->ranges[0])));
  return gather_partials(ctx, local, nlocal, width, global);
}

static int all_ranks(void *ctx, int local) {
  Fsdp *f = ctx;
  int64_t bad = local ? 0 : 1;
  if (coll_all_reduce_max(f->coll, &bad, 1, COLL_I64) != 0)
    return 0;
  return bad == 0;
}

/* ---- setup ------------------------------------------------------------------------------ */

/* Unit u's span: from the block of its first element, world parts of S. */
static void unit_span(FsdpUnit *u, const GroupLayout *full, int t0, int t1, int world) {
  int n = full->ntensors;
  u->t0 = t0, u->t1 = t1;
  u->flo = t0 < n ? full->offset[t0] : full->total;
  u->fhi = t1 > t0 ? full->offset[t1 - 1] + full->numel[t1 - 1] : u->flo;
  u->base = u->flo / OPTC_REDUCE_BLOCK * OPTC_REDUCE_BLOCK;
  int64_t per = (u->fhi - u->base + world - 1) / world;
  u->S = MAX(1, (per + OPTC_REDUCE_BLOCK - 1) / OPTC_REDUCE_BLOCK) * OPTC_REDUCE_BLOCK;
}

int64_t fsdp_plan(int n, const int64_t *numel, int nunits, const int *first, int world, int64_t align,
                  int64_t *most) {
  GroupLayout full;
  layout_init_a(&full, n, numel, align);
  int64_t total = 0;
  *most = 0;
  for (int k = 0; k < nunits; k++) {
    FsdpUnit u;
    unit_span(&u, &full, first[k], first[k + 1], world);
    total += u.S;
    *most = MAX(*most, u.S * world);
  }
  layout_free(&full);
  return total;
}

int fsdp_init(Fsdp *f, Coll *coll, const Graph *g, int n, const int64_t *numel, int nunits, const int *first) {
  memset(f, 0, sizeof *f);
  f->coll = coll;
  f->rank = coll_rank(coll);
  f->world = coll_size(coll);
  f->g = g;
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind == BUF_PARAM)
      f->pbuf = b;
    if (g->bufs[b].kind == BUF_GRAD)
      f->gbuf = b;
  }
  Type gt = buf_type(f, f->gbuf);
  if (sum_type(gt) == COLL_NTYPES) {
    error("sharded steps sum grads of f32, bf16 or f64, not %s", type_names[gt]);
    return -1;
  }
  /* tensors from multiples of the graph's alignment, as the group and the
   * API lay them out (a quantized state's blocks: whole in each tensor) */
  layout_init_a(&f->full, n, numel, graph_align(g));
  /* the units: the caller's, or the whole group as one */
  int whole[2] = {0, n};
  if (nunits <= 0)
    nunits = 1, first = whole;
  ASSERT(first[0] == 0 && first[nunits] == n);
  f->nunits = nunits;
  f->units = calloc((size_t)nunits, sizeof(FsdpUnit));
  f->ranges = calloc((size_t)(2 * nunits) + 1, sizeof(int64_t));
  ASSERT(f->units && f->ranges);
  for (int k = 0; k < nunits; k++) {
    FsdpUnit *u = &f->units[k];
    ASSERT(first[k] <= first[k + 1]);
    unit_span(u, &f->full, first[k], first[k + 1], f->world);
    u->at = f->nshard;
    f->nshard += u->S;
    f->most = MAX(f->most, u->S * f->world);
    int64_t lo, hi;
    unit_piece(u, f->rank, &lo, &hi);
    if (hi > lo)
      f->ranges[2 * f->nranges] = lo, f->ranges[2 * f->nranges + 1] = hi, f->nranges++;
  }
  f->shard = (GroupLayout){0};
  layout_init_a(&f->shard, n, numel, graph_align(g));
  if (f->nranges > 0) {
    layout_select(&f->shard, f->nranges, f->ranges);
  } else { /* owns nothing: no chunks */
    free(f->shard.chunks);
    f->shard.chunks = malloc(sizeof(Chunk));
    f->shard.nchunks = 0;
    f->shard.lo = f->shard.hi = 0;
  }
  f->nchunks_of = calloc((size_t)f->world + 1, sizeof(int64_t));
  f->unit_c0 = calloc((size_t)nunits + 1, sizeof(int64_t));
  f->first_done = calloc((size_t)nunits + 1, sizeof(bool));
  ASSERT(f->nchunks_of && f->unit_c0 && f->first_done);
  for (int r = 0; r < f->world; r++)
    f->nchunks_of[r] = rank_chunks(f, r, NULL);
  ASSERT(f->nchunks_of[f->rank] == f->shard.nchunks);
  for (int k = 0; k < nunits; k++) { /* the shard's chunks come unit by unit */
    int64_t lo, hi;
    unit_piece(&f->units[k], f->rank, &lo, &hi);
    f->unit_c0[k + 1] = f->unit_c0[k] + layout_chunk_at(&f->full, hi) - layout_chunk_at(&f->full, lo);
  }

  /* the shard of every buffer, and the tensor table that addresses it */
  f->mem = calloc((size_t)g->nbufs + 1, sizeof(void *));
  f->table = calloc((size_t)n * (size_t)g->nbufs + 1, sizeof(void *));
  ASSERT(f->mem && f->table);
  for (int b = 0; b < g->nbufs; b++) {
    f->mem[b] = coll_mem_alloc(coll, (size_t)buffer_bytes(f->g, b, f->nshard + OPTC_TENSOR_ALIGN));
    if (!f->mem[b]) {
      error("out of memory for the shard of '@%s' (%lld elements)", g->bufs[b].name, (long long)f->nshard);
      return -1;
    }
  }
  for (int k = 0; k < nunits; k++) {
    const FsdpUnit *u = &f->units[k];
    int64_t part = fsdp_part_start(u, f->rank);
    for (int t = u->t0; t < u->t1; t++)
      for (int b = 0; b < g->nbufs; b++)
        f->table[(size_t)t * (size_t)g->nbufs + (size_t)b] = buf_at(f, b, f->mem[b], u->at - part + f->full.offset[t]);
  }
  f->reducer = (Reducer){&f->full, gather_partials, all_ranks, f};
  return 0;
}

void fsdp_free(Fsdp *f) {
  if (f->mem)
    for (int b = 0; b < f->g->nbufs; b++)
      coll_mem_free(f->coll, f->mem[b]);
  coll_mem_free(f->coll, f->grads_in);
  free(f->mem);
  free(f->table);
  free(f->units);
  free(f->ranges);
  free(f->nchunks_of);
  for (int u = 0; f->unit_shard && u < f->nunits; u++)
    if (f->unit_shard[u].numel)
      layout_free(&f->unit_shard[u]);
  free(f->unit_shard);
  free(f->unit_c0);
  free(f->first);
  free(f->first_done);
  layout_free(&f->full);
  layout_free(&f->shard);
  memset(f, 0, sizeof *f);
}

void *fsdp_part(Fsdp *f, int b, int u) { return buf_at(f, b, f->mem[b], f->units[u].at); }

int fsdp_unit_of(const Fsdp *f, int t) {
  int lo = 0, hi = f->nunits - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (f->units[mid].t0 <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void fsdp_piece(const Fsdp *f, int t, int64_t *lo, int64_t *hi) {
  int64_t a, b;
  unit_piece(&f->units[fsdp_unit_of(f, t)], f->rank, &a, &b);
  int64_t off = f->full.offset[t];
  *lo = MIN(MAX(a - off, 0), f->full.numel[t]);
  *hi = MAX(MIN(b - off, f->full.numel[t]), *lo);
}

/* ---- a unit's span -------------------------------------------------------------------------- */

int fsdp_gather(Fsdp *f, int u, int b, void *span) {
  const FsdpUnit *x = &f->units[u];
  Type t = buf_type(f, b);
  void *part = fsdp_part(f, b, u);
  if (f->world == 1) {
    if (span != part)
      memcpy(span, part, (size_t)buffer_bytes(f->g, b, x->S));
    return 0;
  }
  if (f->g->bufs[b].per_block || type_size(t) < 2) /* a quantized state's codes or scales */
    return gather_bytes(f->coll, part, span, buffer_bytes(f->g, b, x->S));
  return coll_all_gather(f->coll, part, span, x->S, move_type(t));
}

int fsdp_reduce(Fsdp *f, int u, void *span) {
  return coll_reduce_scatter_sum(f->coll, span, fsdp_part(f, f->gbuf, u), f->units[u].S,
                                 sum_type(buf_type(f, f->gbuf)));
}

/* ---- a full group in, a full group out (optc exec) ------------------------------------------- */

int fsdp_load(Fsdp *f, const ParamGroup *pg, bool contribute_grads) {
  const Graph *g = f->g;
  ASSERT(pg->layout.total == f->full.total);
  for (int b = 0; b < g->nbufs; b++) {
    Type t = buf_type(f, b);
    size_t es = (size_t)type_size(t);
    if (b == f->gbuf) {
      /* The file holds the global grads. Rank 0 contributes them to the
       * reduce-scatter; the others contribute -0.0, the additive identity,
       * so the sum is the file's grads bit for bit. The spans are laid out
       * unit after unit as the collectives take them. */
      int64_t n = 0;
      for (int k = 0; k < f->nunits; k++)
        n += f->units[k].S * f->world;
      coll_mem_free(f->coll, f->grads_in);
      f->grads_in = coll_mem_alloc(f->coll, (size_t)(n + 1) * es);
      if (!f->grads_in)
        return -1;
      char *at = f->grads_in;
      for (int k = 0; k < f->nunits; k++) {
        const FsdpUnit *u = &f->units[k];
        int64_t m = u->S * f->world;
        for (int64_t i = 0; i < m; i++) {
          int64_t x = u->base + i;
          bool mine = contribute_grads && x >= u->flo && x < u->fhi;
          if (mine)
            memcpy(at + (size_t)i * es, (char *)pg->bufs[b] + (size_t)x * es, es);
          else if (t == TY_F32)
            ((float *)at)[i] = -0.0f;
          else if (t == TY_F64)
            ((double *)at)[i] = -0.0;
          else
            ((uint16_t *)at)[i] = 0x8000;
        }
        at += (size_t)m * es;
      }
      continue;
    }
    for (int k = 0; k < f->nunits; k++) {
      int64_t lo, hi;
      unit_piece(&f->units[k], f->rank, &lo, &hi);
      const FsdpUnit *u = &f->units[k];
      if (hi > lo)
        memcpy(buf_at(f, b, fsdp_part(f, b, k), lo - fsdp_part_start(u, f->rank)), buf_at(f, b, pg->bufs[b], lo),
               (size_t)buffer_bytes(f->g, b, hi - lo));
    }
  }
  f->step = pg->step;
  return 0;
}

int fsdp_store(Fsdp *f, ParamGroup *pg) {
  const Graph *g = f->g;
  void *span = NULL;
  size_t most = 0;
  for (int b = 0; b < g->nbufs; b++)
    most = MAX(most, (size_t)buffer_bytes(f->g, b, f->most + 1));
  span = coll_mem_alloc(f->coll, most);
  if (!span)
    return -1;
  int rc = 0;
  for (int b = 0; b < g->nbufs && rc == 0; b++) {
    if (b == f->gbuf)
      continue;
    for (int k = 0; k < f->nunits && rc == 0; k++) {
      const FsdpUnit *u = &f->units[k];
      rc = fsdp_gather(f, k, b, span);
      if (rc == 0 && u->fhi > u->flo)
        memcpy(buf_at(f, b, pg->bufs[b], u->flo), buf_at(f, b, span, u->flo - u->base),
               (size_t)buffer_bytes(f->g, b, u->fhi - u->flo));
    }
  }
  coll_mem_free(f->coll, span);
  pg->step = f->step;
  return rc;
}

/* ---- the step ----------------------------------------------------------------------------- */

/* Runs x over layout l (this rank's chunks, all or one unit's) through the
 * shard's tensor table; shard is the API's view of the same. */
static int step_over(Fsdp *f, Executor *x, const GroupLayout *l, const optc_shard *shard, const StepArgs *args,
                     StepResult *res) {
  const Graph *g = f->g;
  switch (x->api ? NUM_BACKENDS : x->backend) {
  case NUM_BACKENDS: return executor_api_step_t(x, &f->full, f->table, args->inputs, shard, res);
  case BACKEND_INTERP: return interp_step_t(g, l, f->table, args, res);
  case BACKEND_EAGER: {
    /* eager runs the front end's graph: its buffers and inputs, by name */
    int n = f->full.ntensors;
    void **eb = calloc((size_t)n * (size_t)x->g->nbufs + 1, sizeof(void *));
    double *ein = calloc((size_t)x->g->nins + 1, sizeof(double));
    ASSERT(eb && ein);
    for (int b = 0; b < x->g->nbufs; b++) {
      int k = graph_find_buffer(g, x->g->bufs[b].name);
      ASSERT(k >= 0);
      for (int t = 0; t < n; t++)
        eb[(size_t)t * (size_t)x->g->nbufs + (size_t)b] = f->table[(size_t)t * (size_t)g->nbufs + (size_t)k];
    }
    for (int i = 0; i < x->g->nins; i++)
      if (x->g->ins[i].op == OP_INPUT) {
        Ref k = graph_find_input(g, x->g->ins[i].name);
        ein[i] = k != NOREF ? args->inputs[k] : x->g->ins[i].imm;
      }
    StepArgs eargs = *args;
    eargs.inputs = ein;
    int rc = eager_run_t(x->g, l, eb, &eargs, res, false, x->pool);
    free(eb);
    free(ein);
    return rc;
  }
  case BACKEND_CPU: return cpu_step_t(x->cpu, x->pool, g, l, f->table, args, res);
  default: error("backend '%s' cannot run a sharded step", backend_names[x->backend]); return -1;
  }
}

/* A unit's step alone: nothing to gather (no step-scope reduction) and no
 * skip to agree on (propagate). */
static int unit_gather(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                       double *global) {
  (void)ctx, (void)local, (void)first, (void)nlocal, (void)nglobal, (void)width, (void)global;
  unreachable();
}
static int unit_all(void *ctx, int local) { return (void)ctx, local; }

/* This rank's chunks of unit u alone, made once. */
static GroupLayout *unit_layout(Fsdp *f, int u, int64_t r[2]) {
  if (!f->unit_shard) {
    f->unit_shard = calloc((size_t)f->nunits, sizeof(GroupLayout));
    ASSERT(f->unit_shard);
  }
  unit_piece(&f->units[u], f->rank, &r[0], &r[1]);
  GroupLayout *l = &f->unit_shard[u];
  if (!l->numel) {
    layout_init_a(l, f->full.ntensors, f->full.numel, f->full.align);
    layout_select(l, 1, r);
  }
  return l;
}

bool fsdp_can_partials(const Fsdp *f, const Executor *x) {
  int width;
  return (x->api ? optc_step_partials_width(x->api) > 0 : x->backend == BACKEND_CPU) &&
         cpu_first_phase_reduces(f->g, &width);
}

int fsdp_unit_partials(Fsdp *f, Executor *x, int u, const double *inputs) {
  int width;
  ASSERT(fsdp_can_partials(f, x) && cpu_first_phase_reduces(f->g, &width));
  if (!f->first) {
    f->first = calloc((size_t)(f->shard.nchunks + 1) * (size_t)width, sizeof(double));
    ASSERT(f->first);
  }
  int64_t r[2];
  GroupLayout *l = unit_layout(f, u, r);
  double *out = f->first + f->unit_c0[u] * width;
  ASSERT(l->nchunks == f->unit_c0[u + 1] - f->unit_c0[u]);
  int rc;
  if (x->api) {
    optc_shard shard = {0, 0, unit_gather, unit_all, NULL, 1, r, NULL};
    rc = executor_api_partials_t(x, &f->full, f->table, inputs, &shard, out);
  } else {
    rc = cpu_step_partials_t(x->cpu, x->pool, f->g, l, f->table, inputs, out);
  }
  f->first_done[u] = rc == 0;
  return rc;
}

int fsdp_step_unit(Fsdp *f, Executor *x, int u, const double *inputs, StepResult *res) {
  const Graph *g = f->g;
  for (int i = 0; i < g->nins; i++)
    ASSERT(!(g->ins[i].op == OP_REDUCE && g->ins[i].to == SCOPE_STEP));
  int64_t r[2];
  GroupLayout *l = unit_layout(f, u, r);
  StepArgs args = {inputs, 1, NULL, true, NULL};
  optc_shard shard = {0, 0, unit_gather, unit_all, NULL, 1, r};
  return step_over(f, x, l, &shard, &args, res);
}

int fsdp_step(Fsdp *f, Executor *x, const double *inputs, StepResult *res) {
  const Graph *g = f->g;
  /* the grads fsdp_load took, summed into every rank's pieces */
  if (f->grads_in) {
    char *at = f->grads_in;
    size_t es = (size_t)type_size(buf_type(f, f->gbuf));
    for (int k = 0; k < f->nunits; k++) {
      if (fsdp_reduce(f, k, at) != 0)
        return -1;
      at += (size_t)(f->units[k].S * f->world) * es;
    }
  }
  /* the step over the shard. With a step-scope reduction of the grads
   * (clipping), a non-finite grad shows in it at no cost; without one,
   * the executor checks the pieces it just received. */
  bool has_step_reduction = false;
  for (int i = 0; i < g->nins; i++)
    has_step_reduction |= g->ins[i].op == OP_REDUCE && g->ins[i].to == SCOPE_STEP;
  StepArgs args = {inputs, has_step_reduction ? 1 : -1, &f->reducer, false, NULL};
  optc_shard shard = {0, 0, api_gather, all_ranks, f, f->nranges, f->ranges, NULL};
  /* the first phase's partials, when every unit's came in during the backward */
  bool all = f->first != NULL;
  for (int k = 0; all && k < f->nunits; k++)
    all = f->first_done[k];
  if (all && fsdp_can_partials(f, x))
    shard.partials = args.first_partials = f->first;
  memset(f->first_done, 0, sizeof(bool) * (size_t)f->nunits);
  static const int64_t none[2] = {0, 0};
  if (f->nranges == 0)
    shard.nranges = 1, shard.ranges = none;
  int rc = step_over(f, x, &f->shard, &shard, &args, res);
  if (rc != 0)
    return -1;
  if (!res->skipped)
    f->step += 1;
  return 0;
}
