/* lower.c: the phase plan of a partitioned step graph.
 *
 * Per phase: the buffers it reads and writes (each once per element, in the
 * buffer's element type), the reductions it accumulates, its instruction
 * range, and the bytes it moves per element. The sum over phases is the
 * traffic model: for fp32 AdamW, 16 bytes read (p, g, m, v) and 12 written
 * (p, m, v) = 28; with clipping, phase 0 reads g once more = 32. A u4
 * buffer moves half a byte per element, a per-block one its element over
 * the block: bf16 AdamW with 8-bit states, 4 + 2 + 2 x (1 + 1) + 2 x 8 / 256
 * = 10.0625. */
#include "plan.h"

#include <jansson.h>
#include <string.h>

static void add_buf(const Graph *g, PlanBuf **list, int *n, int b) {
  for (int i = 0; i < *n; i++)
    if ((*list)[i].buf == b)
      return;
  (*list)[(*n)++] = (PlanBuf){b, (Type)g->bufs[b].type, buffer_elem_bytes(g, b)};
}

static bool is_block_reduce(const Ins *x) { return x->op == OP_REDUCE && x->to == SCOPE_BLOCK; }

Plan *plan_build(const Graph *g) {
  if (g->nphases == 0) {
    error("the graph has no phases yet: run the partition pass first");
    return NULL;
  }
  Plan *p = arena_alloc(g->arena, sizeof(Plan));
  p->g = g;
  p->nphases = g->nphases;
  p->phases = arena_alloc(g->arena, sizeof(PlanPhase) * (size_t)g->nphases);
  p->bstage = arena_alloc(g->arena, (size_t)g->nins + 1);
  for (int k = 0; k < g->nphases; k++) {
    PlanPhase *ph = &p->phases[k];
    ph->index = k;
    ph->step_lo = ph->step_hi = ph->lo = ph->hi = NOREF;
    ph->reads = arena_alloc(g->arena, sizeof(PlanBuf) * (size_t)(g->nbufs + 1));
    ph->writes = arena_alloc(g->arena, sizeof(PlanBuf) * (size_t)(g->nbufs + 1));
    ph->reds = arena_alloc(g->arena, sizeof(Ref) * (size_t)(g->nins + 1));
    ph->breds = arena_alloc(g->arena, sizeof(Ref) * (size_t)(g->nins + 1));
    ph->nbstages = 1;
  }
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    PlanPhase *ph = &p->phases[x->seg / 2];
    if (x->seg % 2 == 0) {
      if (ph->step_lo == NOREF)
        ph->step_lo = i;
      ph->step_hi = i + 1;
      continue;
    }
    if (ph->lo == NOREF)
      ph->lo = i;
    ph->hi = i + 1;
    /* block stages: the block reductions on the longest path from the loads */
    int bs = 0;
    for (int a = 0; a < op_info[x->op].nargs; a++) {
      const Ins *y = &g->ins[x->args[a]];
      if (y->seg == x->seg && y->scope != SCOPE_STEP)
        bs = MAX(bs, p->bstage[x->args[a]]);
    }
    if (is_block_reduce(x))
      bs++;
    if (bs > 250) {
      error_at(x->pos, "a chain of %d block reductions; a phase has at most 250", bs);
      return NULL;
    }
    p->bstage[i] = (uint8_t)bs;
    ph->nbstages = MAX(ph->nbstages, bs + 1);
    if (x->op == OP_LOAD)
      add_buf(g, &ph->reads, &ph->nreads, x->buf);
    else if (x->op == OP_STORE)
      add_buf(g, &ph->writes, &ph->nwrites, x->buf);
    else if (is_block_reduce(x))
      ph->breds[ph->nbreds++] = i;
    else if (x->op == OP_REDUCE)
      ph->reds[ph->nreds++] = i;
    else if (x->scope != SCOPE_STEP)
      ph->nops++;
  }
  for (int k = 0; k < p->nphases; k++) {
    PlanPhase *ph = &p->phases[k];
    if (ph->lo == NOREF)
      ph->lo = ph->hi = ph->step_hi != NOREF ? ph->step_hi : 0;
    if (ph->step_lo == NOREF)
      ph->step_lo = ph->step_hi = ph->lo;
    for (int i = 0; i < ph->nreads; i++)
      ph->bytes_per_element += ph->reads[i].bytes;
    for (int i = 0; i < ph->nwrites; i++)
      ph->bytes_per_element += ph->writes[i].bytes;
    p->bytes_per_element += ph->bytes_per_element;
  }
  return p;
}

/* A value's name for the plan: its SSA name, or #ref. */
static const char *vname(const Graph *g, Ref r, char tmp[16]) {
  if (g->ins[r].name)
    return g->ins[r].name;
  snprintf(tmp, 16, "#%d", r);
  return tmp;
}

static void print_bufs(const Graph *g, const PlanBuf *b, int n, Buf *out) {
  if (n == 0)
    buf_puts(out, " (none)");
  for (int i = 0; i < n; i++)
    buf_printf(out, "%s @%s %s", i ? "," : "", g->bufs[b[i].buf].name, type_names[b[i].type]);
  buf_putc(out, '\n');
}

void plan_print(const Plan *p, double eager, Buf *out) {
  const Graph *g = p->g;
  char t1[16], t2[16];
  buf_printf(out, "plan: %d phase%s, %g bytes/element", p->nphases, p->nphases == 1 ? "" : "s",
             p->bytes_per_element);
  if (eager >= 0)
    buf_printf(out, " (eager: %g bytes/element, %.2fx)", eager, eager / p->bytes_per_element);
  buf_putc(out, '\n');
  for (int k = 0; k < p->nphases; k++) {
    const PlanPhase *ph = &p->phases[k];
    buf_printf(out, "phase %d: %g bytes/element, %d ops/element, %d step values before it\n", k,
               ph->bytes_per_element, ph->nops, ph->step_hi - ph->step_lo);
    if (ph->nbstages > 1)
      buf_printf(out, "  blocks of %d elements in %d stages\n", g->block, ph->nbstages);
    buf_puts(out, "  reads: ");
    print_bufs(g, ph->reads, ph->nreads, out);
    buf_puts(out, "  writes:");
    print_bufs(g, ph->writes, ph->nwrites, out);
    for (int i = 0; i < ph->nreds; i++) {
      const Ins *x = &g->ins[ph->reds[i]];
      buf_printf(out, "  reduces: %%%s = %s of %%%s to %s\n", vname(g, ph->reds[i], t1), red_names[x->red],
                 vname(g, x->args[0], t2), scope_names[x->to]);
    }
    for (int i = 0; i < ph->nbreds; i++) {
      const Ins *x = &g->ins[ph->breds[i]];
      buf_printf(out, "  reduces: %%%s = %s of %%%s to block\n", vname(g, ph->breds[i], t1), red_names[x->red],
                 vname(g, x->args[0], t2));
    }
  }
}

/* A byte count as JSON: an integer where it is whole (every plan without
 * codes or scales), else a real. */
static json_t *json_bytes(double b) { return b == (double)(json_int_t)b ? json_integer((json_int_t)b) : json_real(b); }

static json_t *bufs_json(const Graph *g, const PlanBuf *b, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(a, json_pack("{s:s, s:s, s:o}", "buffer", g->bufs[b[i].buf].name, "type",
                                       type_names[b[i].type], "bytes", json_bytes(b[i].bytes)));
  return a;
}

void plan_print_json(const Plan *p, double eager, Buf *out) {
  const Graph *g = p->g;
  char tmp[16];
  json_t *phases = json_array();
  for (int k = 0; k < p->nphases; k++) {
    const PlanPhase *ph = &p->phases[k];
    json_t *reds = json_array();
    for (int i = 0; i < ph->nreds; i++) {
      const Ins *x = &g->ins[ph->reds[i]];
      json_array_append_new(reds, json_pack("{s:s, s:s, s:s}", "value", vname(g, ph->reds[i], tmp), "kind",
                                            red_names[x->red], "to", scope_names[x->to]));
    }
    for (int i = 0; i < ph->nbreds; i++) {
      const Ins *x = &g->ins[ph->breds[i]];
      json_array_append_new(reds, json_pack("{s:s, s:s, s:s}", "value", vname(g, ph->breds[i], tmp), "kind",
                                            red_names[x->red], "to", "block"));
    }
    json_array_append_new(phases, json_pack("{s:i, s:o, s:o, s:o, s:o, s:i}", "index", k, "reads",
                                            bufs_json(g, ph->reads, ph->nreads), "writes",
                                            bufs_json(g, ph->writes, ph->nwrites), "reductions", reds,
                                            "bytes_per_element", json_bytes(ph->bytes_per_element),
                                            "ops_per_element", ph->nops));
  }
  json_t *root = json_pack("{s:o, s:o}", "phases", phases, "bytes_per_element", json_bytes(p->bytes_per_element));
  if (eager >= 0)
    json_object_set_new(root, "eager_bytes_per_element", json_real(eager));
  char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  ASSERT(s);
  buf_puts(out, s);
  buf_putc(out, '\n');
  free(s);
  json_decref(root);
}
