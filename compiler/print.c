/* print.c: the textual form of a step graph.
 *
 *   file    = [ "block" N ] { buffer } { label | insn } ;
 *   buffer  = ("param" | "grad" | "state") "@" name ":" type [ "per" "block" ] [ "=" init ]
 *             [ "nonneg" ] [ "writeback" ] ;
 *   label   = "^step" N ":" | "^phase" N ":" ;            (after partition)
 *   insn    = [ "%" name "=" ] op operands [ ":" type ] ;
 *
 * Comments and blank lines that the parser saw before a line, and a comment
 * after it, are printed back verbatim, so a file written in this form reads
 * back and prints to the same bytes. */
#include "ir.h"

#include <string.h>

void ir_format_imm(char out[40], Type t, double v) {
  switch (t) {
  case TY_BOOL: strcpy(out, v != 0 ? "true" : "false"); break;
  case TY_I32:
  case TY_I64:
  case TY_U8:
  case TY_U4: snprintf(out, 40, "%lld", (long long)v); break;
  case TY_F64: fmt_double(out, v, false); break;
  default: fmt_double(out, v, true); break;
  }
}

static void format_bound(char out[40], double v) { fmt_double(out, v, false); }

/* Gives every unnamed value a number that no named value uses. */
static const char **value_names(const Graph *g) {
  const char **names = arena_alloc(g->arena, sizeof(char *) * (size_t)(g->nins + 1));
  NameMap taken;
  graph_value_map(g, &taken);
  int next = 0;
  for (int i = 0; i < g->nins; i++) {
    if (g->ins[i].name) {
      names[i] = g->ins[i].name;
      continue;
    }
    if (g->ins[i].op == OP_STORE)
      continue;
    char tmp[16];
    int n;
    do
      n = snprintf(tmp, sizeof tmp, "%d", next++);
    while (namemap_get(&taken, tmp, (size_t)n) >= 0);
    names[i] = arena_strdup(g->arena, tmp);
  }
  return names;
}

static void print_buffer(const Graph *g, const Buffer *b, Buf *out) {
  if (b->lead)
    buf_puts(out, b->lead);
  buf_printf(out, "%s @%s : %s", bufkind_names[b->kind], b->name, type_names[b->type]);
  if (b->per_block)
    buf_puts(out, " per block");
  if (b->kind == BUF_STATE) {
    char tmp[40];
    switch (b->init) {
    case INIT_CONST: ir_format_imm(tmp, b->type, b->init_value); buf_printf(out, " = %s", tmp); break;
    case INIT_PARAM: buf_puts(out, " = param"); break;
    case INIT_INPUT: buf_printf(out, " = %%%s", b->init_input); break;
    }
  }
  (void)g;
  if (b->nonneg)
    buf_puts(out, " nonneg");
  if (b->writeback)
    buf_puts(out, " writeback");
  if (b->trail)
    buf_puts(out, b->trail);
  buf_putc(out, '\n');
}

/* " %name", with sep in place of the space; the printer's inner loop, kept
 * to plain appends (a graph can have millions of operands). */
static void put_value(Buf *out, const char *sep, const char *name) {
  buf_puts(out, sep);
  buf_putc(out, '%');
  buf_puts(out, name);
}

static void print_ins(const Graph *g, const char **names, Ref i, Buf *out) {
  const Ins *x = &g->ins[i];
  const OpInfo *info = &op_info[x->op];
  char tmp[40];
  if (x->lead)
    buf_puts(out, x->lead);
  if (x->op != OP_STORE) {
    put_value(out, "", names[i]);
    buf_puts(out, " = ");
  }
  buf_puts(out, info->name);
  switch (x->op) {
  case OP_CONST:
    ir_format_imm(tmp, (Type)x->type, x->imm);
    buf_printf(out, " %s", tmp);
    break;
  case OP_INPUT:
    if (x->has_imm) {
      ir_format_imm(tmp, (Type)x->type, x->imm);
      buf_printf(out, " %s", tmp);
    }
    if (x->range.set) {
      char lo[40], hi[40];
      format_bound(lo, x->range.lo);
      format_bound(hi, x->range.hi);
      buf_printf(out, " in %c%s, %s%c", x->range.lo_open ? '(' : '[', lo, hi,
                 x->range.hi_open ? ')' : ']');
    }
    break;
  case OP_OPTION:
    if (x->dep != NOREF)
      buf_printf(out, " nonzero(%%%s)", names[x->dep]);
    else
      buf_printf(out, " %s", x->imm != 0 ? "true" : "false");
    break;
  case OP_LOAD: buf_printf(out, " @%s", g->bufs[x->buf].name); break;
  case OP_STORE: buf_printf(out, " @%s, %%%s", g->bufs[x->buf].name, names[x->args[0]]); break;
  case OP_HOLD: buf_printf(out, " %%%s, @%s", names[x->args[0]], g->bufs[x->buf].name); break;
  case OP_REDUCE:
    buf_printf(out, " %s %%%s to %s", red_names[x->red], names[x->args[0]], scope_names[x->to]);
    break;
  case OP_LOOKUP:
  case OP_SEARCH: buf_printf(out, " %s %%%s", codebook((Book)x->book)->name, names[x->args[0]]); break;
  default:
    for (int k = 0; k < info->nargs; k++)
      put_value(out, k ? ", " : " ", names[x->args[k]]);
    break;
  }
  if (x->op != OP_STORE) {
    buf_puts(out, " : ");
    buf_puts(out, type_names[x->type]);
  }
  if (x->trail)
    buf_puts(out, x->trail);
  buf_putc(out, '\n');
}

void ir_print(const Graph *g, Buf *out) {
  const char **names = value_names(g);
  if (g->block) {
    if (g->block_lead)
      buf_puts(out, g->block_lead);
    buf_printf(out, "block %d%s\n", g->block, g->block_trail ? g->block_trail : "");
  }
  for (int i = 0; i < g->nbufs; i++)
    print_buffer(g, &g->bufs[i], out);
  int seg = -1;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (g->nphases > 0 && x->seg != seg) {
      seg = x->seg;
      buf_printf(out, "^%s%d:\n", seg % 2 ? "phase" : "step", seg / 2);
    }
    print_ins(g, names, i, out);
  }
  if (g->tail)
    buf_puts(out, g->tail);
}

void ir_print_file(const Graph *g, FILE *f) {
  Buf b = {0};
  ir_print(g, &b);
  if (b.len)
    fwrite(b.data, 1, b.len, f);
  buf_free(&b);
}
