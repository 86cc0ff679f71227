/* eager.c: the step graph run the way torch eager runs an optimizer.
 *
 * One op at a time, over one whole tensor at a time, every intermediate
 * materialised in memory, as torch's for-loop (foreach=False) path does:
 * `exp_avg.lerp_(grad, 1 - beta1)` reads two tensors and writes one. This is
 * the baseline the compiled step is measured against, so it does what
 * torch's CPU kernels do and no more:
 * - each op is one vectorized pass (eager_loops.h) over the tensor, split
 *   across the threads when the tensor has at least 32768 elements
 *   (at::parallel_for's grain);
 * - an op writes straight into the buffer its value is stored in (torch's
 *   in-place ops: exp_avg.lerp_) when no later op reads the buffer's old
 *   value, and a temporary dies with its last use, its memory reused by
 *   the next temporary (torch's allocator);
 * - a bf16 or f16 tensor is read widened to f32 and written rounded, inside
 *   the op (torch's kernels compute in f32): `cvt` to f32 of a half value
 *   is not a pass of its own, an f32 op whose one use is its rounding
 *   writes the half tensor, and a half value widened and rounded again is
 *   that value (exact: the rounding of an f32 that came from a rounding).
 * It runs the unoptimized graph, and its results are the interpreter's,
 * bit for bit.
 *
 * The threads split a tensor once for all its ops (on chunk boundaries),
 * not once per op: the elements each thread touches are the same for every
 * op, so torch's barrier between ops orders nothing here; the memory
 * traffic is the same.
 *
 * Reductions see every tensor before any value that reads them is made: as
 * in torch, clip_grad_norm finishes its norms over all grads before it
 * scales any. Values are staged as in the interpreter; all stores happen in
 * the last stage, so a skipped step (non-finite grads) stores nothing.
 *
 * Quantized states, as torchao's eager code runs them: a block-scope value
 * (a scale, a block's absmax) is a tensor too, materialized here per
 * element (each element holds its block's value, as scale[:, None] would
 * broadcast); a per-block buffer is read into one (K_BLOAD) and written
 * from one (K_BSTORE), and a block reduction (K_BREDUCE) is a pass that
 * writes each block's max over it. Codes are u8, or u4 nibbles. */
#include "eager_loops.h"

#include <pthread.h>

/* ---- the program: what runs, and where each value lives --------------------------- */

typedef enum { K_NONE, K_OP, K_COPY, K_FILL, K_REDUCE, K_BLOAD, K_BREDUCE, K_BSTORE } TaskKind;

/* One pass over a tensor's elements. */
typedef struct {
  TaskKind kind;
  Ref ins;   /* K_OP: the instruction whose arithmetic runs; K_REDUCE: the
                reduction; K_COPY, K_FILL: the store */
  Ref dst;   /* K_OP: the value written: ins, or the rounding cvt it feeds */
  int stage;
} Task;

typedef enum { AT_NONE, AT_LOAD, AT_BUF, AT_GROUP, AT_SLOT } Where;

typedef struct {
  const Graph *g;
  int n;
  int *stage;
  int last;       /* the last stage: stores happen in it */
  Ref *root;      /* (nins) the value whose memory holds value i: itself, or
                     the half value it is a widening (or exact round trip) of */
  Task *tasks;
  int ntasks;
  int *made;      /* (nins) the task writing root i, or -1 */
  int *last_read; /* (nins) the last task reading root i, or -1 */
  Where *where;   /* (nins) of each root */
  int *buf;       /* (nins) AT_LOAD, AT_BUF: the buffer */
  int *slot;      /* (nins) AT_SLOT: the temporary; AT_GROUP: the group-wide array */
  int nslots, ngroups;
  int *slot_size; /* (nslots) bytes per element */
  int *group_size; /* (ngroups) */
} Prog;

static bool is_half(Type t) { return t == TY_BF16 || t == TY_F16; }

/* A value eager keeps per element: elem scope, and block scope
 * (materialized, each element its block's value). */
static bool per_elem(const Ins *x) { return x->scope == SCOPE_ELEM || x->scope == SCOPE_BLOCK; }

static bool is_arith(const Ins *x) {
  return x->op != OP_LOAD && x->op != OP_STORE && x->op != OP_REDUCE && per_elem(x);
}

static bool is_block_reduce(const Ins *x) { return x->op == OP_REDUCE && x->to == SCOPE_BLOCK; }

/* A load of a per-block buffer: expanded per element. */
static bool is_block_load(const Graph *g, const Ins *x) { return x->op == OP_LOAD && g->bufs[x->buf].per_block; }

/* `cvt` of a half tensor value to f32: read in place, widened. */
static bool is_widen(const Graph *g, const Ins *x) {
  return x->op == OP_CVT && x->scope == SCOPE_ELEM && x->type == TY_F32 && g->ins[x->args[0]].scope == SCOPE_ELEM &&
         is_half((Type)g->ins[x->args[0]].type);
}

/* `cvt` of an f32 tensor value to bf16 or f16, rounding to nearest even. */
static bool is_round(const Graph *g, const Ins *x) {
  return x->op == OP_CVT && x->scope == SCOPE_ELEM && is_half((Type)x->type) && g->ins[x->args[0]].type == TY_F32;
}

static Type mem_type(const Prog *p, Ref r) { return (Type)p->g->ins[p->root[r]].type; }

static void add_read(Prog *p, Ref a, int t) {
  if (per_elem(&p->g->ins[a]))
    p->last_read[p->root[a]] = t;
}

/* Decides what runs and where each value lives: the same decisions drive
 * the run and the traffic model. */
static void prog_init(Prog *p, const Graph *g, bool foreach) {
  int n = g->nins;
  size_t m = (size_t)n + 1;
  *p = (Prog){.g = g, .n = n};
  p->stage = calloc(m, sizeof(int));
  p->root = malloc(m * sizeof(Ref));
  p->tasks = calloc(m, sizeof(Task));
  p->made = malloc(m * sizeof(int));
  p->last_read = malloc(m * sizeof(int));
  p->where = calloc(m, sizeof(Where));
  p->buf = calloc(m, sizeof(int));
  p->slot = calloc(m, sizeof(int));
  p->slot_size = calloc(m, sizeof(int));
  p->group_size = calloc(m, sizeof(int));
  int *uses = calloc(m, sizeof(int));
  Ref *user = malloc(m * sizeof(Ref));
  Ref *fused_from = malloc(m * sizeof(Ref));
  bool *canon = calloc(m, sizeof(bool));
  int *stores = calloc((size_t)g->nbufs + 1, sizeof(int));
  int *load_read = malloc(((size_t)g->nbufs + 1) * sizeof(int));
  ASSERT(p->stage && p->root && p->tasks && p->made && p->last_read && p->where && p->buf && p->slot &&
         p->slot_size && p->group_size && uses && user && fused_from && canon && stores &&
         load_read);
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    int st = 0;
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      st = MAX(st, p->stage[x->args[k]]);
      uses[x->args[k]]++;
      user[x->args[k]] = i;
    }
    bool phase_red = x->op == OP_REDUCE && !is_block_reduce(x);
    p->stage[i] = phase_red ? st + 1 : st;
    if (x->op == OP_STORE || phase_red)
      p->last = MAX(p->last, st);
    if (x->op == OP_STORE)
      stores[x->buf]++;
    p->made[i] = p->last_read[i] = -1;
    fused_from[i] = NOREF;
  }
  /* Memory: a widening reads its half value's; a rounding of a widening of
   * a rounded value is that value (round(widen(h)) == h for every h that a
   * rounding made, NaNs included). */
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    p->root[i] = i;
    if (is_widen(g, x)) {
      p->root[i] = p->root[x->args[0]];
    } else if (is_round(g, x)) {
      const Ins *w = &g->ins[x->args[0]];
      if (is_widen(g, w) && g->ins[w->args[0]].type == x->type && canon[w->args[0]])
        p->root[i] = p->root[w->args[0]];
      canon[i] = true;
    }
  }
  /* An f32 op whose one use is its rounding writes the rounded tensor. */
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    if (x->type == TY_F32 && is_arith(x) && !is_widen(g, x) && uses[i] == 1 && is_round(g, &g->ins[user[i]]) &&
        p->root[user[i]] == user[i])
      fused_from[user[i]] = i;
  }
  /* The passes, in the graph's order. */
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    Task t = {.kind = K_NONE, .ins = i, .dst = i, .stage = p->stage[i]};
    if (x->op == OP_STORE && g->bufs[x->buf].per_block) {
      t.kind = per_elem(&g->ins[x->args[0]]) ? K_BSTORE : K_FILL;
      t.stage = p->last;
    } else if (x->op == OP_STORE) {
      t.kind = per_elem(&g->ins[x->args[0]]) ? K_COPY : K_FILL;
      t.stage = p->last;
    } else if (is_block_load(g, x)) {
      t.kind = K_BLOAD;
    } else if (is_block_reduce(x)) {
      t.kind = K_BREDUCE;
    } else if (x->op == OP_REDUCE) {
      if (per_elem(&g->ins[x->args[0]]))
        t.kind = K_REDUCE;
      t.stage = p->stage[i] - 1;
    } else if (is_arith(x) && p->root[i] == i && !(uses[i] == 1 && fused_from[user[i]] == i)) {
      t.kind = K_OP;
      if (fused_from[i] != NOREF)
        t.ins = fused_from[i];
    }
    if (t.kind != K_NONE)
      p->tasks[p->ntasks++] = t;
  }
  /* They run stage by stage: sorted by stage, in the graph's order within
   * one (a topological order, since a value's stage is at least its
   * operands'). */
  Task *sorted = malloc(m * sizeof(Task));
  ASSERT(sorted);
  int ns = 0;
  for (int s = 0; s <= p->last; s++)
    for (int ti = 0; ti < p->ntasks; ti++)
      if (p->tasks[ti].stage == s)
        sorted[ns++] = p->tasks[ti];
  ASSERT(ns == p->ntasks);
  free(p->tasks);
  p->tasks = sorted;
  for (int ti = 0; ti < p->ntasks; ti++) {
    const Task *t = &p->tasks[ti];
    const Ins *y = &g->ins[t->ins];
    for (int k = 0; k < op_info[y->op].nargs; k++)
      add_read(p, y->args[k], ti);
    if (t->kind == K_OP || t->kind == K_BLOAD || t->kind == K_BREDUCE)
      p->made[t->dst] = ti;
  }
  for (int i = 0; i < n; i++)
    if (g->ins[i].op == OP_LOAD && !is_block_load(g, &g->ins[i])) {
      p->where[i] = AT_LOAD;
      p->buf[i] = g->ins[i].buf;
    }
  /* In place: a value stored into a buffer of its memory's type, made in
   * the last stage, after every read of the buffer's old value. */
  for (int b = 0; b < g->nbufs; b++)
    load_read[b] = -1;
  for (int i = 0; i < n; i++)
    if (g->ins[i].op == OP_LOAD)
      load_read[g->ins[i].buf] = MAX(load_read[g->ins[i].buf], p->last_read[i]);
  for (int ti = 0; ti < p->ntasks; ti++) {
    Task *t = &p->tasks[ti];
    if (t->kind != K_COPY)
      continue;
    const Ins *s = &g->ins[t->ins];
    Ref r = p->root[s->args[0]];
    int mt = p->made[r];
    if (mt < 0 || p->where[r] != AT_NONE || g->ins[r].type != g->bufs[s->buf].type || stores[s->buf] != 1 ||
        p->tasks[mt].stage != p->last || load_read[s->buf] > mt)
      continue;
    p->where[r] = AT_BUF;
    p->buf[r] = s->buf;
    t->kind = K_NONE;
  }
  /* The rest: group-wide arrays for values read in a later stage than
   * they are made (torch keeps them as tensors: p.grad after scale_grads)
   * and, with foreach, for every value; else a temporary, reused once it
   * dies by a later one of the same element size (so that a thread's
   * elements of the two never overlap another thread's). */
  bool *cross = calloc(m, sizeof(bool));
  ASSERT(cross);
  for (int ti = 0; ti < p->ntasks; ti++) {
    const Ins *y = &g->ins[p->tasks[ti].ins];
    for (int k = 0; k < op_info[y->op].nargs; k++) {
      Ref a = y->args[k];
      if (!per_elem(&g->ins[a]))
        continue;
      Ref r = p->root[a];
      if (p->made[r] >= 0 && p->tasks[p->made[r]].stage < p->tasks[ti].stage)
        cross[r] = true;
    }
  }
  int *free_slots = calloc(m, sizeof(int)), nfree = 0;
  int *free_groups = calloc(m, sizeof(int)), nfreeg = 0;
  ASSERT(free_slots && free_groups);
  int cur_stage = -1;
  for (int ti = 0; ti < p->ntasks; ti++) {
    const Task *t = &p->tasks[ti];
    if (t->stage != cur_stage) { /* a stage's temporaries die with it */
      cur_stage = t->stage;
      nfree = 0;
      for (int s = 0; s < p->nslots; s++)
        free_slots[nfree++] = s;
    }
    const Ins *y = &g->ins[t->ins];
    for (int k = 0; k < op_info[y->op].nargs; k++) {
      Ref a = y->args[k];
      if (!per_elem(&g->ins[a]))
        continue;
      Ref r = p->root[a];
      if (p->last_read[r] != ti)
        continue;
      bool dup = false;
      for (int j = 0; j < k; j++)
        dup |= y->args[j] == a || (per_elem(&g->ins[y->args[j]]) && p->root[y->args[j]] == r);
      if (dup)
        continue;
      if (p->where[r] == AT_SLOT)
        free_slots[nfree++] = p->slot[r];
      else if (p->where[r] == AT_GROUP && foreach)
        free_groups[nfreeg++] = p->slot[r];
    }
    if ((t->kind != K_OP && t->kind != K_BLOAD && t->kind != K_BREDUCE) || p->where[t->dst] != AT_NONE)
      continue;
    Ref r = t->dst;
    int size = type_size((Type)g->ins[r].type);
    if (cross[r] || foreach) {
      p->where[r] = AT_GROUP;
      int gi = -1;
      for (int j = 0; j < nfreeg && gi < 0; j++)
        if (p->group_size[free_groups[j]] == size) {
          gi = free_groups[j];
          free_groups[j] = free_groups[--nfreeg];
        }
      if (gi < 0) {
        gi = p->ngroups++;
        p->group_size[gi] = size;
      }
      p->slot[r] = gi;
      if (foreach && p->last_read[r] < 0) /* never read */
        free_groups[nfreeg++] = gi;
    } else {
      p->where[r] = AT_SLOT;
      int si = -1;
      for (int j = 0; j < nfree && si < 0; j++)
        if (p->slot_size[free_slots[j]] == size) {
          si = free_slots[j];
          free_slots[j] = free_slots[--nfree];
        }
      if (si < 0) {
        si = p->nslots++;
        p->slot_size[si] = size;
      }
      p->slot[r] = si;
      if (p->last_read[r] < 0) /* never read */
        free_slots[nfree++] = si;
    }
  }
  free(free_slots);
  free(free_groups);
  free(cross);
  free(uses);
  free(user);
  free(fused_from);
  free(canon);
  free(stores);
  free(load_read);
}

static void prog_free(Prog *p) {
  free(p->stage);
  free(p->root);
  free(p->tasks);
  free(p->made);
  free(p->last_read);
  free(p->where);
  free(p->buf);
  free(p->slot);
  free(p->slot_size);
  free(p->group_size);
}

/* The eager executor's traffic per element: each pass reads each of its
 * tensor operands' memory once and writes its result's; a store that is
 * not done in place copies (reads and writes); a reduction reads its
 * operand. A per-block buffer moves its element over the block, a u4
 * value half a byte; a block-scope value is a tensor per element here. */
static double value_bytes(const Prog *p, Ref r) { return type_bits(mem_type(p, r)) / 8.0; }

double eager_traffic(const Graph *g) {
  Prog p;
  prog_init(&p, g, false);
  double bytes = 0;
  for (int ti = 0; ti < p.ntasks; ti++) {
    const Task *t = &p.tasks[ti];
    const Ins *y = &g->ins[t->ins];
    if (t->kind == K_NONE)
      continue;
    if (t->kind == K_FILL || t->kind == K_COPY || t->kind == K_BSTORE || t->kind == K_BLOAD)
      bytes += buffer_elem_bytes(g, y->buf);
    if (t->kind == K_OP || t->kind == K_BLOAD || t->kind == K_BREDUCE)
      bytes += value_bytes(&p, t->dst);
    if (t->kind == K_FILL || t->kind == K_BLOAD)
      continue;
    Ref seen[3] = {NOREF, NOREF, NOREF};
    for (int k = 0; k < op_info[y->op].nargs; k++) {
      Ref a = y->args[k];
      if (!per_elem(&g->ins[a]))
        continue;
      Ref r = p.root[a];
      if (r == seen[0] || r == seen[1])
        continue;
      seen[k] = r;
      bytes += value_bytes(&p, r);
    }
  }
  prog_free(&p);
  return bytes;
}

/* ---- running ------------------------------------------------------------------- */

/* A run of one tensor's elements, as the chunk table has them: the whole
 * tensor, or (on a shard) the part of it the shard holds. */
typedef struct {
  int tensor;      /* index in the group: the stochastic-rounding hash reads it */
  int64_t flat;    /* first element in the flat buffers */
  int64_t start;   /* first element, counted within the tensor */
  int64_t n;
  int64_t c0, c1;  /* its chunks */
  int64_t at;      /* its first element among the layout's, pieces end to end (group-wide arrays) */
} Piece;

typedef struct {
  Prog p;
  const Graph *g;
  const GroupLayout *l;
  void *const *tbufs; /* (ntensors x nbufs) tensor table (layout_tensor_bufs) */
  const double *inputs;
  const Reducer *reducer;
  ThreadPool *pool; /* NULL: one thread */
  Scalar *step;     /* (nins) step values */
  void **base;      /* (nins) the current piece's first element of each root */
  void **slot_mem;  /* (nslots) temporaries, for the largest piece */
  void **group_mem; /* (ngroups) group-wide arrays: the pieces' elements end to end (Piece.at) */
  double *part;     /* (nchunks) reduction partials */
  Piece *pieces;
  int npieces;
  int64_t max_piece;
  int64_t nelems;   /* the pieces' elements */
} Eager;

/* Elements per block: a pass runs block by block so that a widened
 * operand or an unrounded result lives in a buffer on the stack. */
enum { BLOCK = 1024 };

/* Element i of memory of type t; for u4 (two a byte) i is even: a piece
 * and a pass start on a chunk, and chunks on even elements. */
static void *elem_ptr(void *base, Type t, int64_t i) {
  if (t == TY_U4) {
    ASSERT(i % 2 == 0);
    return (char *)base + i / 2;
  }
  return (char *)base + i * type_size(t);
}

/* The piece's first element in graph buffer b. */
static void *piece_ptr(const Eager *e, int b, const Piece *pc) {
  void *base = e->tbufs[(size_t)pc->tensor * (size_t)e->g->nbufs + (size_t)b];
  return elem_ptr(base, (Type)e->g->bufs[b].type, pc->start);
}

/* Temporaries outlive a step. A large model's step allocates the same few
 * arrays every time, and an array of fresh pages is a page fault per 4 KiB
 * (at Llama 4's vocabulary 52 MB arrays, and as much time in the kernel as
 * in the step). So a freed array is kept, a few of them, and the next one
 * that fits is taken from there. Each carries its size 64 bytes before it. */
enum { KEPT = 8, HEAD = 64 };
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static char *kept[KEPT];

static size_t arr_bytes(const char *p) { return *(const size_t *)(p - HEAD); }

static void *alloc_arr(int64_t n, int size) {
  size_t bytes = ((size_t)(n ? n : 1) * (size_t)size + 63) / 64 * 64;
  char *p = NULL;
  pthread_mutex_lock(&kept_mu);
  int best = -1; /* the smallest that fits */
  for (int i = 0; i < KEPT; i++)
    if (kept[i] && arr_bytes(kept[i]) >= bytes && (best < 0 || arr_bytes(kept[i]) < arr_bytes(kept[best])))
      best = i;
  if (best >= 0)
    p = kept[best], kept[best] = NULL;
  pthread_mutex_unlock(&kept_mu);
  if (p)
    return p;
  p = aligned_alloc(64, bytes + HEAD);
  ASSERT(p);
  *(size_t *)p = bytes;
  return p + HEAD;
}

/* Keeps p for the next alloc_arr, in place of the smallest kept one when all are taken. */
static void free_arr(void *arr) {
  char *p = arr;
  if (!p)
    return;
  pthread_mutex_lock(&kept_mu);
  int slot = -1;
  for (int i = 0; i < KEPT && slot < 0; i++)
    if (!kept[i])
      slot = i;
  for (int i = 0; i < KEPT && slot < 0; i++)
    if (arr_bytes(kept[i]) < arr_bytes(p) && (slot < 0 || arr_bytes(kept[i]) < arr_bytes(kept[slot])))
      slot = i;
  char *drop = p;
  if (slot >= 0)
    drop = kept[slot], kept[slot] = p;
  pthread_mutex_unlock(&kept_mu);
  if (drop)
    free(drop - HEAD);
}

static Scalar at(Operand o, int64_t i) {
  if (!o.p)
    return o.s;
  Scalar v = {0};
  switch (o.t) {
  case TY_F64: v.d = ((const double *)o.p)[i]; break;
  case TY_F32: v.f = ((const float *)o.p)[i]; break;
  case TY_BF16: case TY_F16: v.h = ((const uint16_t *)o.p)[i]; break;
  case TY_BOOL: v.i = ((const uint8_t *)o.p)[i]; break;
  case TY_I32: v.i = ((const int32_t *)o.p)[i]; break;
  case TY_I64: v.i = ((const int64_t *)o.p)[i]; break;
  case TY_U8: v.i = ((const uint8_t *)o.p)[i]; break;
  case TY_U4: v.i = (((const uint8_t *)o.p)[i / 2] >> (i % 2 ? 0 : 4)) & 15; break;
  default: unreachable();
  }
  return v;
}

static void put(void *o, Type t, int64_t i, Scalar v) {
  switch (t) {
  case TY_F64: ((double *)o)[i] = v.d; break;
  case TY_F32: ((float *)o)[i] = v.f; break;
  case TY_BF16: case TY_F16: ((uint16_t *)o)[i] = v.h; break;
  case TY_BOOL: ((uint8_t *)o)[i] = (uint8_t)v.i; break;
  case TY_I32: ((int32_t *)o)[i] = (int32_t)v.i; break;
  case TY_I64: ((int64_t *)o)[i] = v.i; break;
  case TY_U8: ((uint8_t *)o)[i] = (uint8_t)v.i; break;
  case TY_U4: { /* element 2k in byte k's high nibble */
    uint8_t *q = (uint8_t *)o + i / 2;
    *q = (uint8_t)(i % 2 ? (*q & 0xf0) | (v.i & 15) : (*q & 0x0f) | (v.i & 15) << 4);
    break;
  }
  default: unreachable();
  }
}

/* Value a's elements [lo, lo + n) of the piece, in a's own type: its
 * memory, or that widened into w. */
static Operand operand(const Eager *e, Ref a, int64_t lo, int64_t n, float *w) {
  const Ins *x = &e->g->ins[a];
  Operand o = {.t = (Type)x->type};
  if (!per_elem(x)) {
    o.s = e->step[a];
    return o;
  }
  Type mt = mem_type(&e->p, a);
  const void *p = elem_ptr(e->base[e->p.root[a]], mt, lo);
  if (mt == o.t) {
    o.p = p;
  } else {
    bool ok = eager_cvt(w, o.t, p, mt, n);
    ASSERT(ok);
    o.p = w;
  }
  return o;
}

/* Elements [lo, lo + n) of an op pass, n <= BLOCK. */
static void op_block(const Eager *e, const Task *t, const Piece *pc, int64_t lo, int64_t n) {
  const Ins *x = &e->g->ins[t->ins];
  Type ty = (Type)x->type, dt = mem_type(&e->p, t->dst);
  float w[3][BLOCK], ob[BLOCK];
  Operand a[3] = {{0}};
  for (int k = 0; k < op_info[x->op].nargs; k++)
    a[k] = operand(e, x->args[k], lo, n, w[k]);
  void *dst = elem_ptr(e->base[t->dst], dt, lo);
  void *out = dt == ty ? dst : (void *)ob; /* an f32 result rounded on the way out */
  bool done = ty == TY_F32 && eager_f32((Op)x->op, out, a[0], a[1], a[2], n);
  if (!done && x->op == OP_CVT && a[0].p)
    done = eager_cvt(out, ty, a[0].p, a[0].t, n);
  if (!done) {
    Scalar args[3];
    for (int64_t k = 0; k < n; k++) {
      for (int j = 0; j < op_info[x->op].nargs; j++)
        args[j] = at(a[j], k);
      put(out, ty, k, interp_apply(e->g, t->ins, args, pc->tensor, pc->start + lo + k, e->l->numel[pc->tensor]));
    }
  }
  if (out != dst) {
    bool ok = eager_cvt(dst, dt, ob, ty, n);
    ASSERT(ok);
  }
}

/* A store that is not done in place, elements [lo, lo + n). */
static void store_block(const Eager *e, const Task *t, const Piece *pc, int64_t lo, int64_t n) {
  const Ins *x = &e->g->ins[t->ins];
  Type bt = (Type)e->g->bufs[x->buf].type;
  void *dst = elem_ptr(piece_ptr(e, x->buf, pc), bt, lo);
  Ref v = x->args[0];
  if (t->kind == K_FILL) {
    for (int64_t k = 0; k < n; k++)
      put(dst, bt, k, e->step[v]);
    return;
  }
  Type mt = mem_type(&e->p, v);
  const void *src = elem_ptr(e->base[e->p.root[v]], mt, lo);
  if (mt == bt && bt == TY_U4) {
    Operand o = {.p = src, .t = TY_U4};
    for (int64_t k = 0; k < n; k++)
      put(dst, bt, k, at(o, k));
  } else if (mt == bt) {
    memcpy(dst, src, (size_t)n * (size_t)type_size(bt));
  } else {
    bool ok = eager_cvt(dst, bt, src, mt, n);
    ASSERT(ok);
  }
}

/* The partial of chunk c, whose elements start at lo within the piece. */
static void reduce_chunk(Eager *e, const Task *t, int64_t c, int64_t lo) {
  const Ins *x = &e->g->ins[t->ins];
  RedKind k = (RedKind)x->red;
  Ref a = x->args[0];
  int64_t len = e->l->chunks[c].len;
  bool is_max = k == RED_MAX || k == RED_ABSMAX;
  double lanes[OPTC_REDUCE_LANES];
  for (int j = 0; j < OPTC_REDUCE_LANES; j++)
    lanes[j] = is_max ? -INFINITY : 0.0;
  float w[BLOCK];
  for (int64_t b = 0; b < len; b += BLOCK) {
    int64_t n = MIN(BLOCK, len - b);
    Operand o = operand(e, a, lo + b, n, w);
    if (o.t == TY_F32) {
      eager_reduce_f32(k, lanes, o.p, n);
      continue;
    }
    for (int64_t j = 0; j < n; j++) {
      double v = interp_scalar_to_double(at(o, j), o.t);
      double *acc = &lanes[j % OPTC_REDUCE_LANES];
      switch (k) {
      case RED_SUM: *acc += v; break;
      case RED_SUMSQ: *acc += v * v; break;
      case RED_MAX: *acc = optc_max_nan(*acc, v); break;
      case RED_ABSMAX: *acc = optc_max_nan(*acc, fabs(v)); break;
      default: unreachable();
      }
    }
  }
  e->part[c] = optc_lanes_combine(lanes, is_max);
}

/* Quant blocks of the piece's elements [lo, hi) (a thread's chunks: they
 * start on a block). */
static int64_t block_of(const Eager *e) { return e->g->block; }

/* K_BLOAD: each element its block's value of a per-block buffer. */
static void bload_range(const Eager *e, const Task *t, const Piece *pc, int64_t lo, int64_t hi) {
  const Ins *x = &e->g->ins[t->ins];
  Type ty = (Type)x->type;
  int64_t B = block_of(e);
  Operand src = {.p = e->tbufs[(size_t)pc->tensor * (size_t)e->g->nbufs + (size_t)x->buf], .t = ty};
  void *dst = e->base[t->dst];
  for (int64_t i = lo; i < hi; i++)
    put(dst, ty, i, at(src, (pc->start + i) / B));
}

/* K_BREDUCE: each block's max (of |x| for absmax) over its elements, in f64,
 * the default NaN where it has a NaN (interp.c), put at each of them. */
static void breduce_range(const Eager *e, const Task *t, const Piece *pc, int64_t lo, int64_t hi) {
  const Ins *x = &e->g->ins[t->ins];
  int64_t B = block_of(e);
  Ref a = x->args[0];
  Type at_ = (Type)e->g->ins[a].type;
  void *dst = e->base[t->dst];
  for (int64_t b0 = lo; b0 < hi; b0 += B) {
    int64_t b1 = MIN(b0 + B, hi);
    double m = -INFINITY;
    bool nan = false;
    for (int64_t i = b0; i < b1; i++) {
      float w;
      double v = interp_scalar_to_double(at(operand(e, a, i, 1, &w), 0), at_);
      if (x->red == RED_ABSMAX)
        v = fabs(v);
      nan |= v != v;
      m = v > m ? v : m;
    }
    Scalar r = {.d = nan ? NAN : m};
    for (int64_t i = b0; i < b1; i++)
      put(dst, TY_F64, i, r);
  }
  (void)pc;
}

/* K_BSTORE: each block's value (its first element's) into a per-block buffer. */
static void bstore_range(const Eager *e, const Task *t, const Piece *pc, int64_t lo, int64_t hi) {
  const Ins *x = &e->g->ins[t->ins];
  Type bt = (Type)e->g->bufs[x->buf].type;
  int64_t B = block_of(e);
  void *dst = e->tbufs[(size_t)pc->tensor * (size_t)e->g->nbufs + (size_t)x->buf];
  for (int64_t b0 = lo; b0 < hi; b0 += B) {
    float w;
    put(dst, bt, (pc->start + b0) / B, at(operand(e, x->args[0], b0, 1, &w), 0));
  }
}

/* Passes [t0, t1) over chunks [c0, c1) of a piece (one thread's share),
 * each pass over all those elements before the next. */
static void run_passes(Eager *e, int t0, int t1, const Piece *pc, int64_t c0, int64_t c1) {
  const Chunk *ch = e->l->chunks;
  int64_t lo = ch[c0].flat - pc->flat, hi = ch[c1 - 1].flat + ch[c1 - 1].len - pc->flat;
  for (int ti = t0; ti < t1; ti++) {
    const Task *t = &e->p.tasks[ti];
    switch (t->kind) {
    case K_NONE: break;
    case K_OP:
      for (int64_t b = lo; b < hi; b += BLOCK)
        op_block(e, t, pc, b, MIN(BLOCK, hi - b));
      break;
    case K_COPY:
    case K_FILL:
      for (int64_t b = lo; b < hi; b += BLOCK)
        store_block(e, t, pc, b, MIN(BLOCK, hi - b));
      break;
    case K_REDUCE:
      for (int64_t c = c0; c < c1; c++)
        reduce_chunk(e, t, c, ch[c].flat - pc->flat);
      break;
    case K_BLOAD: bload_range(e, t, pc, lo, hi); break;
    case K_BREDUCE: breduce_range(e, t, pc, lo, hi); break;
    case K_BSTORE: bstore_range(e, t, pc, lo, hi); break;
    }
  }
}

typedef struct {
  Eager *e;
  int t0, t1;
  const Piece *pc;
} PassRun;

static void passes_range(void *ctx, int64_t lo, int64_t hi) {
  PassRun *r = ctx;
  run_passes(r->e, r->t0, r->t1, r->pc, r->pc->c0 + lo, r->pc->c0 + hi);
}

/* Points every root at the piece's elements. */
static void bind_piece(Eager *e, const Piece *pc) {
  const Prog *p = &e->p;
  for (int r = 0; r < p->n; r++) {
    Type t = (Type)e->g->ins[r].type;
    switch (p->where[r]) {
    case AT_NONE: e->base[r] = NULL; break;
    case AT_LOAD:
    case AT_BUF: e->base[r] = piece_ptr(e, p->buf[r], pc); break;
    case AT_SLOT:
      if (!e->slot_mem[p->slot[r]])
        e->slot_mem[p->slot[r]] = alloc_arr(e->max_piece, p->slot_size[p->slot[r]]);
      e->base[r] = e->slot_mem[p->slot[r]];
      break;
    case AT_GROUP:
      if (!e->group_mem[p->slot[r]])
        e->group_mem[p->slot[r]] = alloc_arr(e->nelems, p->group_size[p->slot[r]]);
      e->base[r] = elem_ptr(e->group_mem[p->slot[r]], t, pc->at);
      break;
    }
  }
}

/* Passes [t0, t1) over one piece: split across the threads, as torch's
 * at::parallel_for does (its grain is 32768 elements), on chunk
 * boundaries so that each chunk's partial is one thread's. */
static void run_piece(Eager *e, int t0, int t1, const Piece *pc) {
  if (t0 == t1 || pc->n == 0)
    return;
  bind_piece(e, pc);
  if (e->pool && pool_size(e->pool) > 1 && pc->n >= 32768) {
    PassRun r = {e, t0, t1, pc};
    pool_run(e->pool, passes_range, &r, pc->c1 - pc->c0);
  } else {
    run_passes(e, t0, t1, pc, pc->c0, pc->c1);
  }
}

/* The step-scope value of a reduction: this layout's chunk partials, or,
 * on a shard, every rank's in global order. */
static double fold_partials(const Eager *e, RedKind k) {
  bool is_max = k == RED_MAX || k == RED_ABSMAX;
  if (!e->reducer)
    return layout_fold(e->part, e->l->nchunks, 1, 0, is_max);
  const GroupLayout *gl = e->reducer->global;
  double *global = malloc(sizeof(double) * ((size_t)gl->nchunks + 1));
  ASSERT(global);
  e->reducer->gather(e->reducer->ctx, e->part, e->l->nchunks, 1, global);
  double v = layout_fold(global, gl->nchunks, 1, 0, is_max);
  free(global);
  return v;
}

static void eval_step_values(Eager *e, int stage) {
  const Graph *g = e->g;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope != SCOPE_STEP || e->p.stage[i] != stage || x->op == OP_REDUCE)
      continue;
    if (x->op == OP_CONST)
      e->step[i] = interp_scalar_from_double(x->imm, (Type)x->type);
    else if (x->op == OP_INPUT)
      e->step[i] = interp_scalar_from_double(e->inputs ? e->inputs[i] : x->imm, (Type)x->type);
    else {
      Scalar args[3];
      for (int k = 0; k < op_info[x->op].nargs; k++)
        args[k] = e->step[x->args[k]];
      e->step[i] = interp_apply(g, i, args, 0, 0, 0);
    }
  }
}

int eager_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res) {
  return eager_run(g, l, bufs, args, res, false, NULL);
}

int eager_run(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res,
              bool foreach, ThreadPool *pool) {
  void **t = layout_tensor_bufs(l, g, bufs);
  int rc = eager_run_t(g, l, t, args, res, foreach, pool);
  free(t);
  return rc;
}

int eager_run_t(const Graph *g, const GroupLayout *l, void *const *tbufs, const StepArgs *args, StepResult *res,
                bool foreach, ThreadPool *pool) {
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].op == OP_OPTION) {
      error("eager: option '%%%s' is unresolved", g->ins[i].name);
      return -1;
    }
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->op == OP_REDUCE && x->to == SCOPE_TENSOR) {
      error_at(x->pos, "eager: reductions to tensor scope are not supported; use --backend interp or cpu");
      return -1;
    }
    if (x->op == OP_REDUCE && x->to == SCOPE_STEP && g->ins[x->args[0]].scope == SCOPE_BLOCK) {
      error_at(x->pos, "eager: reductions of block-scope values are not supported; use --backend interp");
      return -1;
    }
  }
  if (g->block && l->align % g->block != 0) {
    error("eager: the group's tensors start on multiples of %lld, not of the graph's block %d", (long long)l->align,
          g->block);
    return -1;
  }
  Eager e = {.g = g, .l = l, .tbufs = tbufs, .inputs = args ? args->inputs : NULL, .pool = pool,
             .reducer = args ? args->reducer : NULL};
  prog_init(&e.p, g, foreach);
  size_t n = (size_t)g->nins + 1;
  e.step = calloc(n, sizeof(Scalar));
  e.base = calloc(n, sizeof(void *));
  e.slot_mem = calloc((size_t)e.p.nslots + 1, sizeof(void *));
  e.group_mem = calloc((size_t)e.p.ngroups + 1, sizeof(void *));
  e.part = calloc((size_t)l->nchunks + 1, sizeof(double));
  e.pieces = calloc((size_t)l->nchunks + 1, sizeof(Piece));
  ASSERT(e.step && e.base && e.slot_mem && e.group_mem && e.part && e.pieces);
  /* the pieces: runs of consecutive chunks of one tensor */
  for (int64_t c = 0; c < l->nchunks; c++) {
    const Chunk *ch = &l->chunks[c];
    Piece *last = e.npieces ? &e.pieces[e.npieces - 1] : NULL;
    if (last && last->tensor == ch->tensor && last->flat + last->n == ch->flat) {
      last->n += ch->len;
      last->c1 = c + 1;
    } else {
      e.pieces[e.npieces++] = (Piece){ch->tensor, ch->flat, ch->start, ch->len, c, c + 1, 0};
    }
  }
  for (int p = 0; p < e.npieces; p++) {
    e.max_piece = MAX(e.max_piece, e.pieces[p].n);
    e.pieces[p].at = e.nelems;
    e.nelems += e.pieces[p].n;
  }
  memset(res, 0, sizeof *res);
  bool ok = !args || args->propagate || args->grads_finite != 0;
  if (ok && (!args || (!args->propagate && args->grads_finite < 0)))
    ok = grads_all_finite(pool, g, l, tbufs);
  if (e.reducer)
    ok = e.reducer->all(e.reducer->ctx, ok);
  int t0 = 0;
  for (int s = 0; ok && s <= e.p.last; s++) {
    eval_step_values(&e, s);
    int t1 = t0;
    while (t1 < e.p.ntasks && e.p.tasks[t1].stage == s)
      t1++;
    if (foreach) { /* torch's foreach: each op over all tensors */
      for (int ti = t0; ti < t1; ti++)
        for (int p = 0; p < e.npieces; p++)
          run_piece(&e, ti, ti + 1, &e.pieces[p]);
    } else { /* torch's for-loop: each tensor, all its ops */
      for (int p = 0; p < e.npieces; p++)
        run_piece(&e, t0, t1, &e.pieces[p]);
    }
    t0 = t1;
    for (int r = 0; r < g->nins; r++) {
      if (g->ins[r].op != OP_REDUCE || is_block_reduce(&g->ins[r]) || e.p.stage[r] != s + 1)
        continue;
      e.step[r].d = fold_partials(&e, (RedKind)g->ins[r].red);
      if (res->nred < (int)ARRAY_LEN(res->red))
        res->red[res->nred++] = e.step[r].d;
      if (!isfinite(e.step[r].d) && !(args && args->propagate) && (e.reducer ? e.reducer->global : l)->nchunks > 0)
        ok = false;
    }
  }
  res->skipped = !ok;
  for (int i = 0; i < e.p.nslots; i++)
    free_arr(e.slot_mem[i]);
  for (int i = 0; i < e.p.ngroups; i++)
    free_arr(e.group_mem[i]);
  free(e.slot_mem);
  free(e.group_mem);
  free(e.step);
  free(e.base);
  free(e.part);
  free(e.pieces);
  prog_free(&e.p);
  return 0;
}
