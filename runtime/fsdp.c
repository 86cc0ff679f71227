/* fsdp.c: FSDP-style sharding of a parameter group, and the step driver.
 *
 * The group's tensors lie in one flat buffer per buffer kind. Each of the
 * N ranks owns a contiguous slice of S elements, S a multiple of
 * OPTC_REDUCE_BLOCK (and so of the vector width), the whole padded to N*S:
 *
 *   flat:  | rank 0: [0, S) | rank 1: [S, 2S) | ... | rank N-1 | padding |
 *
 * Every rank holds the full params (forward and backward read them) and
 * full grads (backward writes them); the optimizer states exist only for
 * the owned slice. A step, per group:
 *   1. reduce-scatter (sum, in rank order) the grads into the owned slice;
 *   2. (the caller has all-reduced num_tokens into the step's inputs);
 *   3. each phase of the compiled step over the owned slice's chunks, the
 *      step-scope reductions folded from every rank's chunk partials in
 *      global chunk order, so that the bits do not depend on N;
 *   4. all-gather the params.
 * When any rank's grads are non-finite, every rank skips together. */
#include "coll.h"
#include "rt.h"

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

static void *elem_at(void *p, Type t, int64_t i) { return (char *)p + i * type_size(t); }

/* ---- the reducer: every rank's chunk partials, in global order ----------------------- */

static int gather_partials(void *ctx, const double *local, int64_t nlocal, int width, double *global) {
  Fsdp *f = ctx;
  int64_t most = 0;
  for (int r = 0; r < f->world; r++)
    most = MAX(most, f->rank_c0[r + 1] - f->rank_c0[r]);
  ASSERT(nlocal == f->rank_c0[f->rank + 1] - f->rank_c0[f->rank]);
  int64_t block = most * width;
  double *send = calloc((size_t)block + 1, sizeof(double));
  double *all = calloc((size_t)(block * f->world) + 1, sizeof(double));
  ASSERT(send && all);
  memcpy(send, local, sizeof(double) * (size_t)(nlocal * width));
  int rc = coll_all_gather(f->coll, send, all, block, COLL_F64);
  for (int r = 0; rc == 0 && r < f->world; r++) {
    int64_t n = (f->rank_c0[r + 1] - f->rank_c0[r]) * width;
    memcpy(global + f->rank_c0[r] * width, all + (int64_t)r * block, sizeof(double) * (size_t)n);
  }
  free(send);
  free(all);
  return rc;
}

/* The same, as include/optc.h's optc_shard.gather (first and nglobal are this layout's own). */
static int api_gather(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                      double *global) {
  Fsdp *f = ctx;
  ASSERT(first == f->rank_c0[f->rank] && nglobal == f->full.nchunks);
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

int fsdp_init(Fsdp *f, Coll *coll, const Graph *g, int n, const int64_t *numel) {
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
  Type gt = (Type)g->bufs[f->gbuf].type, pt = (Type)g->bufs[f->pbuf].type;
  if (sum_type(gt) == COLL_NTYPES) {
    error("sharded steps sum grads of f32, bf16 or f64, not %s", type_names[gt]);
    return -1;
  }
  layout_init(&f->full, n, numel);
  int64_t per = (f->full.total + f->world - 1) / f->world;
  f->S = (per + OPTC_REDUCE_BLOCK - 1) / OPTC_REDUCE_BLOCK * OPTC_REDUCE_BLOCK;
  f->P = f->S * f->world;
  f->lo = f->S * f->rank;
  f->hi = MAX(f->lo, MIN(f->lo + f->S, f->full.total)); /* a trailing rank may own only padding */
  /* each rank's chunks are a contiguous run of the group's */
  f->rank_c0 = calloc((size_t)f->world + 1, sizeof(int64_t));
  ASSERT(f->rank_c0);
  for (int r = 0, c = 0; r <= f->world; r++) {
    int64_t start = MIN(f->S * r, f->full.total);
    while (c < f->full.nchunks && f->full.chunks[c].flat < start)
      c++;
    f->rank_c0[r] = c;
  }
  f->shard.ntensors = n;
  f->shard.numel = malloc(sizeof(int64_t) * (size_t)(n + 1));
  f->shard.offset = malloc(sizeof(int64_t) * (size_t)(n + 1));
  ASSERT(f->shard.numel && f->shard.offset);
  memcpy(f->shard.numel, f->full.numel, sizeof(int64_t) * (size_t)n);
  memcpy(f->shard.offset, f->full.offset, sizeof(int64_t) * (size_t)n);
  f->shard.total = f->full.total;
  layout_restrict(&f->shard, f->lo, f->hi);
  ASSERT(f->shard.nchunks == f->rank_c0[f->rank + 1] - f->rank_c0[f->rank]);

  /* memory: full params and grads, the owned slice of everything else (on
   * one rank, the grads are their own slice) */
  f->mem = calloc((size_t)g->nbufs + 1, sizeof(void *));
  f->bufs = calloc((size_t)g->nbufs + 1, sizeof(void *));
  ASSERT(f->mem && f->bufs);
  f->params = coll_mem_alloc(coll, (size_t)f->P * (size_t)type_size(pt));
  f->grads = coll_mem_alloc(coll, (size_t)f->P * (size_t)type_size(gt));
  if (!f->params || !f->grads) {
    error("out of memory for %lld params and grads", (long long)f->P);
    return -1;
  }
  for (int b = 0; b < g->nbufs; b++) {
    Type t = (Type)g->bufs[b].type;
    if (b == f->pbuf) {
      f->bufs[b] = f->params; /* flat-indexed as it is */
      continue;
    }
    if (b == f->gbuf && f->world == 1) {
      /* one rank's slice is all of it: the reduce-scatter runs in place,
       * where a slice would be a second copy of the grads */
      f->bufs[b] = f->grads;
      continue;
    }
    /* the slice, at a pointer that flat indices in [lo, hi) land in */
    f->mem[b] = coll_mem_alloc(coll, (size_t)(f->S + OPTC_TENSOR_ALIGN) * (size_t)type_size(t));
    if (!f->mem[b]) {
      error("out of memory for the slice of '@%s'", g->bufs[b].name);
      return -1;
    }
    f->bufs[b] = elem_at(f->mem[b], t, -f->lo);
  }
  f->reducer = (Reducer){&f->full, gather_partials, all_ranks, f};
  return 0;
}

void fsdp_free(Fsdp *f) {
  if (f->mem)
    for (int b = 0; b < f->g->nbufs; b++)
      coll_mem_free(f->coll, f->mem[b]);
  coll_mem_free(f->coll, f->params);
  coll_mem_free(f->coll, f->grads);
  free(f->mem);
  free(f->bufs);
  free(f->rank_c0);
  layout_free(&f->full);
  layout_free(&f->shard);
  memset(f, 0, sizeof *f);
}

/* ---- a full group in, a full group out ---------------------------------------------------- */

int fsdp_load(Fsdp *f, const ParamGroup *pg, bool contribute_grads) {
  const Graph *g = f->g;
  ASSERT(pg->layout.total == f->full.total);
  for (int b = 0; b < g->nbufs; b++) {
    Type t = (Type)g->bufs[b].type;
    size_t es = (size_t)type_size(t);
    if (b == f->pbuf) {
      memcpy(f->params, pg->bufs[b], (size_t)f->full.total * es);
    } else if (b == f->gbuf) {
      /* The file holds the global grads. Rank 0 contributes them to the
       * reduce-scatter; the others contribute -0.0, the additive identity,
       * so the sum is the file's grads bit for bit. */
      if (contribute_grads) {
        memcpy(f->grads, pg->bufs[b], (size_t)f->full.total * es);
      } else {
        for (int64_t i = 0; i < f->P; i++) {
          if (t == TY_F32)
            ((float *)f->grads)[i] = -0.0f;
          else if (t == TY_F64)
            ((double *)f->grads)[i] = -0.0;
          else
            ((uint16_t *)f->grads)[i] = 0x8000;
        }
      }
    } else if (f->hi > f->lo) {
      memcpy(elem_at(f->bufs[b], t, f->lo), elem_at(pg->bufs[b], t, f->lo), (size_t)(f->hi - f->lo) * es);
    }
  }
  f->step = pg->step;
  return 0;
}

int fsdp_store(Fsdp *f, ParamGroup *pg) {
  const Graph *g = f->g;
  for (int b = 0; b < g->nbufs; b++) {
    Type t = (Type)g->bufs[b].type;
    size_t es = (size_t)type_size(t);
    if (b == f->gbuf)
      continue;
    void *full = b == f->pbuf ? f->params : coll_mem_alloc(f->coll, (size_t)f->P * es);
    if (!full)
      return -1;
    /* gather the slices of this state */
    if (b != f->pbuf && coll_all_gather(f->coll, f->mem[b], full, f->S, move_type(t)) != 0) {
      coll_mem_free(f->coll, full);
      return -1;
    }
    memcpy(pg->bufs[b], full, (size_t)f->full.total * es);
    if (b != f->pbuf)
      coll_mem_free(f->coll, full);
  }
  pg->step = f->step;
  return 0;
}

/* ---- the step ----------------------------------------------------------------------------- */

int fsdp_step(Fsdp *f, Executor *x, const double *inputs, StepResult *res) {
  const Graph *g = f->g;
  Type gt = (Type)g->bufs[f->gbuf].type, pt = (Type)g->bufs[f->pbuf].type;
  /* 1. grads: the sum of every rank's, into the owned slice */
  if (coll_reduce_scatter_sum(f->coll, f->grads, f->mem[f->gbuf] ? f->mem[f->gbuf] : f->grads, f->S, sum_type(gt)) != 0)
    return -1;
  /* 3. the step over the owned slice. With a step-scope reduction of the
   * grads (clipping), a non-finite grad shows in it at no cost; without
   * one, the executor checks the slice it just received. */
  bool has_step_reduction = false;
  for (int i = 0; i < g->nins; i++)
    has_step_reduction |= g->ins[i].op == OP_REDUCE && g->ins[i].to == SCOPE_STEP;
  StepArgs args = {inputs, has_step_reduction ? 1 : -1, &f->reducer};
  int rc;
  optc_shard shard = {f->lo, f->hi, api_gather, all_ranks, f};
  switch (x->api ? NUM_BACKENDS : x->backend) {
  case NUM_BACKENDS: rc = executor_api_step(x, &f->full, f->bufs, inputs, &shard, res); break;
  case BACKEND_INTERP: rc = interp_step(g, &f->shard, f->bufs, &args, res); break;
  case BACKEND_EAGER: {
    /* eager runs the front end's graph: its buffers and inputs, by name */
    void **eb = calloc((size_t)x->g->nbufs + 1, sizeof(void *));
    double *ein = calloc((size_t)x->g->nins + 1, sizeof(double));
    ASSERT(eb && ein);
    for (int b = 0; b < x->g->nbufs; b++) {
      int k = graph_find_buffer(g, x->g->bufs[b].name);
      ASSERT(k >= 0);
      eb[b] = f->bufs[k];
    }
    for (int i = 0; i < x->g->nins; i++)
      if (x->g->ins[i].op == OP_INPUT) {
        Ref k = graph_find_input(g, x->g->ins[i].name);
        ein[i] = k != NOREF ? inputs[k] : x->g->ins[i].imm;
      }
    StepArgs eargs = args;
    eargs.inputs = ein;
    rc = eager_run(x->g, &f->shard, eb, &eargs, res, false, x->pool);
    free(eb);
    free(ein);
    break;
  }
  case BACKEND_CPU: rc = cpu_step(x->cpu, x->pool, g, &f->shard, f->bufs, &args, res); break;
  default: error("backend '%s' cannot run a sharded step", backend_names[x->backend]); return -1;
  }
  if (rc != 0)
    return -1;
  /* 4. params: every slice to every rank */
  if (!res->skipped && coll_all_gather(f->coll, elem_at(f->params, pt, f->lo), f->params, f->S, move_type(pt)) != 0)
    return -1;
  if (!res->skipped)
    f->step += 1;
  return 0;
}
