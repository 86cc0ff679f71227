/* parse.c: reads the textual IR (see print.c for the grammar). The form is
 * line-oriented: one buffer, label or instruction per line. Comments start
 * with '#' or '//' and run to the end of the line. */
#include "ir.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>

typedef enum { T_EOL, T_IDENT, T_VALUE, T_BUFFER, T_LABEL, T_NUMBER, T_PUNCT } TokKind;

typedef struct {
  TokKind kind;
  const char *s; /* the token's text; for %x, @x and ^x without the sigil */
  size_t n;
  size_t off; /* byte offset of the token (of its sigil, if any) */
} Tok;

/* A use of a value name that was not yet defined when it was read. */
typedef struct {
  const char *name;
  SrcPos pos;
} Pending;

/* Uses of undefined values reported one by one; the rest are counted. */
enum { MAX_PENDING_ERRORS = 10 };

typedef struct {
  const SrcFile *src;
  const char *p;   /* cursor */
  const char *end;
  Tok tok;         /* current token */
  Graph *g;
  int seg;         /* current segment after a label, or -1 */
  bool failed;
  Pending *pending;
  int npending, cappending;
  /* The symbol tables: a name lookup is a hash probe, not a scan of the
   * graph, so that parsing stays linear in the file's size. */
  NameMap values;  /* value name -> Ref */
  NameMap bufs;    /* buffer name -> index into g->bufs */
  int kind_buf[NUM_BUFKINDS]; /* the param and the grad buffer, or -1 */
  int line;        /* the current line, 1-based */
  size_t line_off; /* byte offset where it starts */
} Parser;

/* Every token lies on the current line, whose number the parser keeps, so
 * a position costs nothing; srcpos_of (a scan from the file's start) is
 * only the fallback. */
static SrcPos pos_at(Parser *ps, size_t off) {
  if (off < ps->line_off)
    return srcpos_of(ps->src, off);
  return (SrcPos){ps->src, ps->line, (int)(off - ps->line_off) + 1};
}

PRINTF(3, 4) static void perr(Parser *ps, size_t off, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror_at(pos_at(ps, off), fmt, ap);
  va_end(ap);
  ps->failed = true;
}

/* '#' starts a comment; so does '//', so that dump headers read back. */
static bool is_comment(Parser *ps, const char *p) {
  return *p == '#' || (*p == '/' && p + 1 < ps->end && p[1] == '/');
}

static bool is_name_char(int c) { return isalnum(c) || c == '_' || c == '.'; }

/* Reads the next token on the current line; at '#', '\n' or the end it
 * yields T_EOL without consuming the newline. */
static void next(Parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r'))
    ps->p++;
  Tok t = {.off = (size_t)(ps->p - ps->src->text)};
  const char *p = ps->p;
  if (p >= ps->end || *p == '\n' || is_comment(ps, p)) {
    t.kind = T_EOL;
    ps->tok = t;
    return;
  }
  if (*p == '%' || *p == '@' || *p == '^') {
    t.kind = *p == '%' ? T_VALUE : *p == '@' ? T_BUFFER : T_LABEL;
    const char *q = p + 1;
    while (q < ps->end && is_name_char((unsigned char)*q))
      q++;
    t.s = p + 1;
    t.n = (size_t)(q - p - 1);
    ps->p = q;
  } else if (isdigit((unsigned char)*p) || ((*p == '-' || *p == '+') && p + 1 < ps->end &&
                                            (isdigit((unsigned char)p[1]) || p[1] == '.' || p[1] == 'i'))) {
    const char *q = p + 1;
    while (q < ps->end && (isalnum((unsigned char)*q) || *q == '.' ||
                           ((*q == '-' || *q == '+') && (q[-1] == 'e' || q[-1] == 'E'))))
      q++;
    t.kind = T_NUMBER;
    t.s = p;
    t.n = (size_t)(q - p);
    ps->p = q;
  } else if (isalpha((unsigned char)*p) || *p == '_') {
    const char *q = p;
    while (q < ps->end && is_name_char((unsigned char)*q))
      q++;
    t.kind = T_IDENT;
    t.s = p;
    t.n = (size_t)(q - p);
    ps->p = q;
  } else {
    t.kind = T_PUNCT;
    t.s = p;
    t.n = 1;
    ps->p = p + 1;
  }
  ps->tok = t;
}

static bool tok_is(Parser *ps, const char *s) {
  return (ps->tok.kind == T_PUNCT || ps->tok.kind == T_IDENT) && ps->tok.n == strlen(s) &&
         memcmp(ps->tok.s, s, ps->tok.n) == 0;
}

static const char *tok_desc(Parser *ps) {
  static char buf[64];
  if (ps->tok.kind == T_EOL)
    return "end of line";
  int n = (int)MIN(ps->tok.n, 40);
  const char *sigil = ps->tok.kind == T_VALUE ? "%" : ps->tok.kind == T_BUFFER ? "@"
                      : ps->tok.kind == T_LABEL ? "^" : "";
  snprintf(buf, sizeof buf, "'%s%.*s'", sigil, n, ps->tok.s);
  return buf;
}

static bool expect(Parser *ps, const char *s) {
  if (!tok_is(ps, s)) {
    perr(ps, ps->tok.off, "expected '%s', found %s", s, tok_desc(ps));
    return false;
  }
  next(ps);
  return true;
}

static char *tok_str(Parser *ps) { return arena_strndup(ps->g->arena, ps->tok.s, ps->tok.n); }

/* number = [-+] digits [ "." digits ] [ ("e"|"E") [-+] digits ] | [-] "inf" | "nan" ; */
static bool parse_number(Parser *ps, double *out) {
  if (ps->tok.kind == T_IDENT && (tok_is(ps, "inf") || tok_is(ps, "nan"))) {
    *out = tok_is(ps, "inf") ? INFINITY : NAN;
    next(ps);
    return true;
  }
  if (ps->tok.kind != T_NUMBER) {
    perr(ps, ps->tok.off, "expected a number, found %s", tok_desc(ps));
    return false;
  }
  char tmp[64];
  if (ps->tok.n >= sizeof tmp) {
    perr(ps, ps->tok.off, "number too long");
    return false;
  }
  memcpy(tmp, ps->tok.s, ps->tok.n);
  tmp[ps->tok.n] = 0;
  char *end;
  errno = 0;
  double v;
  if (strcmp(tmp, "-inf") == 0 || strcmp(tmp, "+inf") == 0) {
    v = tmp[0] == '-' ? -INFINITY : INFINITY;
    end = tmp + strlen(tmp);
  } else {
    v = strtod(tmp, &end);
  }
  if (*end || strchr(tmp, 'x') || strchr(tmp, 'X')) {
    perr(ps, ps->tok.off, "malformed number '%s'", tmp);
    return false;
  }
  if (errno == ERANGE && isinf(v)) {
    perr(ps, ps->tok.off, "number '%s' is out of range", tmp);
    return false;
  }
  *out = v;
  next(ps);
  return true;
}

/* A literal of type t: a number, or true/false for bool. */
static bool parse_literal(Parser *ps, Type t, double *out) {
  size_t off = ps->tok.off;
  if (t == TY_BOOL) {
    if (tok_is(ps, "true") || tok_is(ps, "false")) {
      *out = tok_is(ps, "true");
      next(ps);
      return true;
    }
    perr(ps, off, "expected true or false, found %s", tok_desc(ps));
    return false;
  }
  if (!parse_number(ps, out))
    return false;
  if (type_is_code(t) && (*out != floor(*out) || !(*out >= 0) || *out >= (t == TY_U4 ? 16 : 256))) {
    perr(ps, off, "a %s code is an integer from 0 to %d", type_names[t], t == TY_U4 ? 15 : 255);
    return false;
  }
  if (type_is_int(t) && (*out != floor(*out) || !isfinite(*out))) {
    perr(ps, off, "%s literal must be an integer", type_names[t]);
    return false;
  }
  if (t == TY_I32 && (*out < -2147483648.0 || *out > 2147483647.0)) {
    perr(ps, off, "literal does not fit in i32");
    return false;
  }
  /* literals are held as f64: an i64 one is exact up to 2^53 */
  if (t == TY_I64 && fabs(*out) > 9007199254740992.0) {
    perr(ps, off, "i64 literal beyond 2^53 (9007199254740992): optc holds literals as f64, exactly only up to there");
    return false;
  }
  if ((t == TY_F32 || t == TY_BF16 || t == TY_F16) && isfinite(*out) && !isfinite((float)*out)) {
    perr(ps, off, "literal overflows %s", type_names[t]);
    return false;
  }
  return true;
}

static bool parse_type(Parser *ps, Type *out) {
  if (ps->tok.kind != T_IDENT || !type_from_name(ps->tok.s, ps->tok.n, out)) {
    perr(ps, ps->tok.off, "expected a type (f64, f32, bf16, f16, i32, i64, bool, u8, u4), found %s",
         tok_desc(ps));
    return false;
  }
  next(ps);
  return true;
}

/* buffer = ("param" | "grad" | "state") "@" name ":" type [ "per" "block" ] [ "=" init ]
 *          [ "nonneg" ] [ "writeback" ] ;
 * init   = number | "param" | "%" input ; */
static bool parse_buffer(Parser *ps, BufKind kind, const char *lead) {
  size_t off = ps->tok.off;
  next(ps);
  if (ps->tok.kind != T_BUFFER || ps->tok.n == 0) {
    perr(ps, ps->tok.off, "expected a buffer name like @exp_avg, found %s", tok_desc(ps));
    return false;
  }
  Graph *g = ps->g;
  char *name = tok_str(ps);
  size_t name_off = ps->tok.off;
  int prev = namemap_get(&ps->bufs, ps->tok.s, ps->tok.n);
  if (prev >= 0) {
    perr(ps, name_off, "buffer '@%s' is declared twice", name);
    note_at(g->bufs[prev].pos, "first declared here");
    return false;
  }
  if (kind != BUF_STATE && ps->kind_buf[kind] >= 0) {
    perr(ps, off, "a step graph has one %s buffer; '@%s' is already it", bufkind_names[kind],
         g->bufs[ps->kind_buf[kind]].name);
    return false;
  }
  if (g->nins > 0) {
    perr(ps, off, "buffers must be declared before the first instruction");
    return false;
  }
  next(ps);
  Type t;
  if (!expect(ps, ":"))
    return false;
  size_t type_off = ps->tok.off;
  if (!parse_type(ps, &t))
    return false;
  if (!type_is_float(t) && !type_is_code(t)) {
    perr(ps, type_off, "buffer element type must be f64, f32, bf16, f16, u8 or u4, not %s", type_names[t]);
    return false;
  }
  if (type_is_code(t) && kind != BUF_STATE) {
    perr(ps, type_off, "only a state holds codes (%s); params and grads are floats", type_names[t]);
    return false;
  }
  int b = graph_add_buffer(g, name, kind, t);
  Buffer *buf = &g->bufs[b];
  if (tok_is(ps, "per")) {
    size_t per_off = ps->tok.off;
    next(ps);
    if (!expect(ps, "block"))
      return false;
    if (kind != BUF_STATE) {
      perr(ps, per_off, "only a state is kept per block (a quantized state's scales)");
      return false;
    }
    if (!ps->g->block) {
      perr(ps, per_off, "'per block' needs the graph's block size: a line 'block N' before the buffers");
      return false;
    }
    buf->per_block = true;
  }
  namemap_add(&ps->bufs, buf->name, strlen(buf->name), b);
  if (kind != BUF_STATE)
    ps->kind_buf[kind] = b;
  buf->pos = pos_at(ps, off);
  buf->lead = lead;
  if (tok_is(ps, "=")) {
    if (kind != BUF_STATE) {
      perr(ps, ps->tok.off, "only state buffers have an initial value");
      return false;
    }
    next(ps);
    if (tok_is(ps, "param")) {
      buf->init = INIT_PARAM;
      next(ps);
    } else if (ps->tok.kind == T_VALUE) {
      buf->init = INIT_INPUT;
      buf->init_input = tok_str(ps);
      next(ps);
    } else {
      buf->init = INIT_CONST;
      if (!parse_literal(ps, t, &buf->init_value))
        return false;
    }
  } else if (kind == BUF_STATE) {
    perr(ps, ps->tok.off, "state buffer '@%s' needs an initial value ('= 0.0', '= param' or '= %%input')",
         name);
    return false;
  }
  if (tok_is(ps, "nonneg")) {
    if (kind != BUF_STATE) {
      perr(ps, ps->tok.off, "only a state is declared 'nonneg' (its values are never negative)");
      return false;
    }
    buf->nonneg = true;
    next(ps);
  }
  if (tok_is(ps, "writeback")) {
    if (kind != BUF_GRAD) {
      perr(ps, ps->tok.off, "only the grad buffer takes 'writeback' (params and states are always stored)");
      return false;
    }
    buf->writeback = true;
    next(ps);
  }
  return true;
}

/* Resolves %name to a value defined on an earlier line. */
static bool parse_operand(Parser *ps, Ref *out) {
  if (ps->tok.kind != T_VALUE || ps->tok.n == 0) {
    perr(ps, ps->tok.off, "expected a value like %%x, found %s", tok_desc(ps));
    return false;
  }
  Ref r = namemap_get(&ps->values, ps->tok.s, ps->tok.n);
  if (r == NOREF) {
    arena_grow(ps->g->arena, (void **)&ps->pending, &ps->cappending, ps->npending + 1, sizeof(Pending));
    ps->pending[ps->npending++] = (Pending){tok_str(ps), pos_at(ps, ps->tok.off)};
    r = 0; /* a placeholder: the parse fails at the end, naming the first such uses */
  }
  *out = r;
  next(ps);
  return true;
}

/* range = "in" ("[" | "(") number "," number ("]" | ")") ; */
static bool parse_range(Parser *ps, Range *r) {
  next(ps);
  if (!tok_is(ps, "[") && !tok_is(ps, "(")) {
    perr(ps, ps->tok.off, "expected '[' or '(' to start a range, found %s", tok_desc(ps));
    return false;
  }
  r->lo_open = tok_is(ps, "(");
  next(ps);
  if (!parse_number(ps, &r->lo) || !expect(ps, ","))
    return false;
  size_t hi_off = ps->tok.off;
  if (!parse_number(ps, &r->hi))
    return false;
  if (!tok_is(ps, "]") && !tok_is(ps, ")")) {
    perr(ps, ps->tok.off, "expected ']' or ')' to end a range, found %s", tok_desc(ps));
    return false;
  }
  r->hi_open = tok_is(ps, ")");
  next(ps);
  if (!(r->lo <= r->hi)) {
    perr(ps, hi_off, "empty range: the upper bound is below the lower one");
    return false;
  }
  r->set = true;
  return true;
}

/* insn = [ "%" name "=" ] op operands [ ":" type ] ; */
static bool parse_insn(Parser *ps, const char *lead) {
  Graph *g = ps->g;
  size_t line_off = ps->tok.off;
  char *name = NULL;
  if (ps->tok.kind == T_VALUE) {
    if (ps->tok.n == 0) {
      perr(ps, ps->tok.off, "expected a value name after '%%'");
      return false;
    }
    name = tok_str(ps);
    Ref prev = namemap_get(&ps->values, ps->tok.s, ps->tok.n);
    if (prev != NOREF) {
      perr(ps, ps->tok.off, "value '%%%s' is defined twice", name);
      note_at(g->ins[prev].pos, "first defined here");
      return false;
    }
    next(ps);
    if (!expect(ps, "="))
      return false;
  }
  size_t op_off = ps->tok.off;
  Op op;
  if (ps->tok.kind != T_IDENT || !op_from_name(ps->tok.s, ps->tok.n, &op)) {
    if (ps->tok.kind == T_IDENT && !name &&
        (tok_is(ps, "param") || tok_is(ps, "grad") || tok_is(ps, "state")))
      perr(ps, op_off, "buffers must be declared before the first instruction");
    else
      perr(ps, op_off, "unknown op %s", tok_desc(ps));
    return false;
  }
  next(ps);
  const OpInfo *info = &op_info[op];
  if (op == OP_STORE && name) {
    perr(ps, line_off, "store has no result to name");
    return false;
  }
  if (op != OP_STORE && !name) {
    perr(ps, op_off, "the result of '%s' must be named: %%name = %s ...", info->name, info->name);
    return false;
  }
  Ins x = {.op = op, .seg = -1, .buf = -1, .dep = NOREF, .args = {NOREF, NOREF, NOREF}};
  size_t lit_off = 0;
  bool has_lit = false;
  double lit = 0;
  switch (op) {
  case OP_CONST:
  case OP_OPTION:
  case OP_INPUT:
    /* The literal is read after the type is known; remember where it is. */
    if (op == OP_OPTION && tok_is(ps, "nonzero")) {
      next(ps);
      if (!expect(ps, "(") || !parse_operand(ps, &x.dep) || !expect(ps, ")"))
        return false;
      break;
    }
    if (ps->tok.kind == T_NUMBER || tok_is(ps, "inf") || tok_is(ps, "nan") || tok_is(ps, "true") ||
        tok_is(ps, "false")) {
      has_lit = true;
      lit_off = ps->tok.off;
      /* skip the token; it is parsed again below with its type */
      next(ps);
    } else if (op == OP_CONST) {
      perr(ps, ps->tok.off, "const needs a value, found %s", tok_desc(ps));
      return false;
    } else if (op == OP_OPTION) {
      perr(ps, ps->tok.off, "option needs true, false or nonzero(%%input), found %s", tok_desc(ps));
      return false;
    }
    if (op == OP_INPUT && tok_is(ps, "in") && !parse_range(ps, &x.range))
      return false;
    break;
  case OP_LOAD:
  case OP_STORE: {
    if (ps->tok.kind != T_BUFFER) {
      perr(ps, ps->tok.off, "expected a buffer like @param, found %s", tok_desc(ps));
      return false;
    }
    x.buf = namemap_get(&ps->bufs, ps->tok.s, ps->tok.n);
    if (x.buf < 0) {
      perr(ps, ps->tok.off, "%s of undeclared buffer '@%s'", info->name, tok_str(ps));
      return false;
    }
    next(ps);
    if (op == OP_STORE && (!expect(ps, ",") || !parse_operand(ps, &x.args[0])))
      return false;
    break;
  }
  case OP_HOLD: {
    /* hold %x, @buf */
    if (!parse_operand(ps, &x.args[0]) || !expect(ps, ","))
      return false;
    if (ps->tok.kind != T_BUFFER) {
      perr(ps, ps->tok.off, "expected the buffer whose dtype holds the value, like @exp_avg, found %s",
           tok_desc(ps));
      return false;
    }
    x.buf = namemap_get(&ps->bufs, ps->tok.s, ps->tok.n);
    if (x.buf < 0) {
      perr(ps, ps->tok.off, "hold in undeclared buffer '@%s'", tok_str(ps));
      return false;
    }
    next(ps);
    break;
  }
  case OP_REDUCE: {
    bool found = false;
    for (int k = 0; k < NUM_REDS; k++) {
      if (tok_is(ps, red_names[k])) {
        x.red = (uint8_t)k;
        found = true;
      }
    }
    if (!found || ps->tok.kind != T_IDENT) {
      perr(ps, ps->tok.off, "expected a reduction (sum, sumsq, max, absmax), found %s", tok_desc(ps));
      return false;
    }
    next(ps);
    if (!parse_operand(ps, &x.args[0]))
      return false;
    if (!expect(ps, "to"))
      return false;
    Scope s;
    if (ps->tok.kind != T_IDENT || !scope_from_name(ps->tok.s, ps->tok.n, &s) || s == SCOPE_ELEM) {
      perr(ps, ps->tok.off, "expected 'block', 'tensor' or 'step' after 'to', found %s", tok_desc(ps));
      return false;
    }
    if (s == SCOPE_BLOCK && !g->block) {
      perr(ps, ps->tok.off, "a reduction to block needs the graph's block size: a line 'block N' before the buffers");
      return false;
    }
    x.to = (uint8_t)s;
    next(ps);
    break;
  }
  case OP_LOOKUP:
  case OP_SEARCH: {
    /* lookup BOOK %code, search BOOK %y */
    Book bk;
    if (ps->tok.kind != T_IDENT || !book_from_name(ps->tok.s, ps->tok.n, &bk)) {
      Buf list = {0};
      for (int k = 0; k < NUM_BOOKS; k++)
        buf_printf(&list, "%s%s", k ? ", " : "", codebook((Book)k)->name);
      perr(ps, ps->tok.off, "expected a code book (%s), found %s", list.data, tok_desc(ps));
      buf_free(&list);
      return false;
    }
    x.book = (uint8_t)bk;
    next(ps);
    if (!parse_operand(ps, &x.args[0]))
      return false;
    break;
  }
  default:
    for (int k = 0; k < info->nargs; k++) {
      if (k > 0 && !tok_is(ps, ",")) {
        perr(ps, ps->tok.off, "'%s' takes %d operands; expected ',', found %s", info->name,
             info->nargs, tok_desc(ps));
        return false;
      }
      if (k > 0)
        next(ps);
      if (!parse_operand(ps, &x.args[k]))
        return false;
    }
    if (tok_is(ps, ",")) {
      perr(ps, ps->tok.off, "'%s' takes %d operand%s", info->name, info->nargs,
           info->nargs == 1 ? "" : "s");
      return false;
    }
    break;
  }
  if (op == OP_STORE) {
    x.type = TY_VOID;
  } else {
    if (!tok_is(ps, ":")) {
      perr(ps, ps->tok.off, "expected ':' and the result type, found %s", tok_desc(ps));
      return false;
    }
    next(ps);
    Type t;
    if (!parse_type(ps, &t))
      return false;
    x.type = (uint8_t)t;
  }
  if (has_lit) {
    /* Re-read the literal now that the type is known. */
    const char *save_p = ps->p;
    Tok save_t = ps->tok;
    ps->p = ps->src->text + lit_off;
    next(ps);
    bool ok = parse_literal(ps, (Type)x.type, &lit);
    ps->p = save_p;
    ps->tok = save_t;
    if (!ok)
      return false;
    x.imm = lit;
    x.has_imm = true;
  }
  if (op == OP_INPUT && x.type == TY_BOOL) {
    perr(ps, op_off, "an input is a number; a bool chosen when the graph is built is an 'option'");
    return false;
  }
  if (op == OP_OPTION && x.type != TY_BOOL) {
    perr(ps, op_off, "an option is a bool, not %s", type_names[x.type]);
    return false;
  }
  x.name = name;
  x.lead = lead;
  x.pos = pos_at(ps, line_off);
  x.seg = (int16_t)ps->seg;
  arena_grow(g->arena, (void **)&g->ins, &g->capins, g->nins + 1, sizeof(Ins));
  if (name)
    namemap_add(&ps->values, name, strlen(name), g->nins);
  g->ins[g->nins++] = x;
  return true;
}

/* label = "^step" N ":" | "^phase" N ":" ; */
static bool parse_label(Parser *ps) {
  size_t off = ps->tok.off;
  const char *s = ps->tok.s;
  size_t n = ps->tok.n;
  int base, k = 0;
  size_t i;
  if (n > 4 && memcmp(s, "step", 4) == 0)
    base = 0, i = 4;
  else if (n > 5 && memcmp(s, "phase", 5) == 0)
    base = 1, i = 5;
  else {
    perr(ps, off, "unknown label %s; labels are ^stepN and ^phaseN", tok_desc(ps));
    return false;
  }
  for (; i < n; i++) {
    if (!isdigit((unsigned char)s[i])) {
      perr(ps, off, "malformed label %s", tok_desc(ps));
      return false;
    }
    k = k * 10 + (s[i] - '0');
    if (k >= IR_MAX_PHASES) {
      perr(ps, off, "label %s: a step has at most %d phases", tok_desc(ps), IR_MAX_PHASES);
      return false;
    }
  }
  int seg = 2 * k + base;
  if (seg <= ps->seg) {
    perr(ps, off, "label %s is out of order", tok_desc(ps));
    return false;
  }
  ps->seg = seg;
  ps->g->nphases = MAX(ps->g->nphases, k + 1);
  next(ps);
  return expect(ps, ":");
}

/* block = "block" N ;  N a power of two from 16 to 4096 (OPTC_REDUCE_BLOCK) */
static bool parse_block(Parser *ps, const char *lead) {
  size_t off = ps->tok.off;
  Graph *g = ps->g;
  if (g->block) {
    perr(ps, off, "the block size is given twice");
    return false;
  }
  if (g->nbufs > 0 || g->nins > 0) {
    perr(ps, off, "the block size comes before the buffers");
    return false;
  }
  next(ps);
  size_t num_off = ps->tok.off;
  double v;
  if (!parse_number(ps, &v))
    return false;
  int n = (int)v;
  if (v != n || n < 16 || n > 4096 || (n & (n - 1))) {
    perr(ps, num_off, "a block is a power of two from 16 to 4096 elements, not %g", v);
    return false;
  }
  g->block = n;
  g->block_lead = lead;
  return true;
}

Graph *ir_parse(const SrcFile *src, Arena *a) {
  Parser ps = {.src = src, .p = src->text, .end = src->text + src->len, .seg = -1,
               .kind_buf = {-1, -1, -1}};
  ps.g = graph_new(a);
  ps.g->src = src;
  namemap_init(&ps.values, a);
  namemap_init(&ps.bufs, a);
  /* Comments are kept as C strings, which a NUL byte would cut short. */
  const char *nul = memchr(src->text, 0, src->len);
  if (nul) {
    error_at(srcpos_of(src, (size_t)(nul - src->text)), "a NUL byte in the text");
    return NULL;
  }
  Buf lead = {0};
  /* one line per iteration */
  while (ps.p < ps.end && !ps.failed) {
    const char *line = ps.p;
    ps.line++;
    ps.line_off = (size_t)(line - src->text);
    next(&ps);
    if (ps.tok.kind == T_EOL) {
      /* A blank or comment-only line: keep it, verbatim, for the next item. */
      const char *e = ps.p;
      while (e < ps.end && *e != '\n')
        e++;
      if (e < ps.end)
        e++;
      buf_put(&lead, line, (size_t)(e - line));
      ps.p = e;
      continue;
    }
    const char *l = lead.len ? arena_strndup(a, lead.data, lead.len) : NULL;
    lead.len = 0;
    bool ok;
    const char **trail; /* where a comment after the item goes */
    if (ps.tok.kind == T_IDENT && tok_is(&ps, "block")) {
      ok = parse_block(&ps, l);
      trail = ok ? &ps.g->block_trail : NULL;
    } else if (ps.tok.kind == T_IDENT && (tok_is(&ps, "param") || tok_is(&ps, "grad") || tok_is(&ps, "state"))) {
      ok = parse_buffer(&ps, tok_is(&ps, "param") ? BUF_PARAM : tok_is(&ps, "grad") ? BUF_GRAD : BUF_STATE, l);
      trail = ok ? &ps.g->bufs[ps.g->nbufs - 1].trail : NULL;
    } else if (ps.tok.kind == T_LABEL) {
      /* Labels are written by the partition pass; they carry no comments. */
      if (l)
        perr(&ps, ps.tok.off, "a comment cannot come just before a label");
      ok = !l && parse_label(&ps);
      trail = NULL;
    } else {
      ok = parse_insn(&ps, l);
      trail = ok ? &ps.g->ins[ps.g->nins - 1].trail : NULL;
    }
    if (!ok) {
      ps.failed = true;
      break;
    }
    if (ps.tok.kind != T_EOL) {
      perr(&ps, ps.tok.off, "unexpected %s at end of line", tok_desc(&ps));
      break;
    }
    /* A comment after the item: keep the spaces before '#', drop the newline. */
    const char *e = ps.p;
    while (e < ps.end && *e != '\n')
      e++;
    if (e > ps.p && is_comment(&ps, ps.p)) {
      if (!trail) {
        perr(&ps, ps.tok.off, "a comment cannot follow a label");
        break;
      }
      const char *s = ps.p;
      while (s > line && (s[-1] == ' ' || s[-1] == '\t'))
        s--;
      *trail = arena_strndup(a, s, (size_t)(e - s));
    }
    ps.p = e < ps.end ? e + 1 : e;
  }
  if (!ps.failed && lead.len)
    ps.g->tail = arena_strndup(a, lead.data, lead.len);
  buf_free(&lead);
  /* Uses of names that were never defined before them: the first few, each
   * with its source line (which error_at finds by a scan of the file). */
  for (int i = 0; !ps.failed && i < ps.npending && i < MAX_PENDING_ERRORS; i++) {
    Pending *u = &ps.pending[i];
    Ref def = namemap_get(&ps.values, u->name, strlen(u->name));
    if (def != NOREF)
      error_at(u->pos, "value '%%%s' is used before it is defined (on line %d)", u->name,
               ps.g->ins[def].pos.line);
    else
      error_at(u->pos, "use of undefined value '%%%s'", u->name);
    if (i + 1 == MAX_PENDING_ERRORS && ps.npending > MAX_PENDING_ERRORS)
      error("%d more uses of values before their definition", ps.npending - MAX_PENDING_ERRORS);
  }
  if (ps.failed || ps.npending > 0)
    return NULL;
  /* Buffer initial values that name an input must name one. */
  for (int i = 0; i < ps.g->nbufs; i++) {
    Buffer *b = &ps.g->bufs[i];
    Ref in = b->init == INIT_INPUT ? namemap_get(&ps.values, b->init_input, strlen(b->init_input)) : NOREF;
    if (b->init == INIT_INPUT &&
        (in == NOREF || (ps.g->ins[in].op != OP_INPUT && ps.g->ins[in].op != OP_OPTION))) {
      error_at(b->pos, "initial value of '@%s' names '%%%s', which is not an input", b->name,
               b->init_input);
      return NULL;
    }
  }
  return ps.g;
}
