/* ir.h: the optimizer IR. A step graph says what happens to one element of
 * one tensor in a parameter group during one optimizer step. Values are
 * small integer refs into the graph's instruction array, which lives in an
 * arena freed when the compile ends. */
#pragma once
#include "base.h"

/* ---- scopes (ir.c); the element types are base.h's ------------------------- */
/* Ordered from narrow to wide: a value at step scope is one number per step;
 * tensor scope, one per tensor; block scope, one per block of the graph's
 * block size (Graph.block: its elements kB .. kB + B - 1, the last block
 * of a tensor shorter when B does not divide it); elem scope, one per
 * element. */
typedef enum { SCOPE_STEP, SCOPE_TENSOR, SCOPE_BLOCK, SCOPE_ELEM, NUM_SCOPES } Scope;

extern const char *const scope_names[NUM_SCOPES];
bool scope_from_name(const char *s, size_t n, Scope *out);

/* ---- ops (ops.def) -------------------------------------------------------- */
typedef enum {
#define OP(e, s, n, t, sc, f) OP_##e,
#include "ops.def"
#undef OP
  NUM_OPS
} Op;

typedef enum { TR_LEAF, TR_LOAD, TR_STORE, TR_ARITH, TR_CMP, TR_TEST, TR_LOGIC, TR_SELECT,
               TR_CVT, TR_CVTSR, TR_REDUCE, TR_HOLD, TR_TAILPOS, TR_LOOKUP, TR_SEARCH } TypeRule;
typedef enum { SR_STEP, SR_ELEM, SR_WIDEST, SR_REDUCE, SR_MEM } ScopeRule;
enum { F_COMMUTE = 1, F_FOLD = 2, F_SIDE = 4, F_TRANSC = 8 };

typedef struct {
  const char *name;
  int nargs;
  TypeRule type_rule;
  ScopeRule scope_rule;
  int flags;
} OpInfo;
extern const OpInfo op_info[NUM_OPS];
bool op_from_name(const char *s, size_t n, Op *out);

typedef enum { RED_SUM, RED_SUMSQ, RED_MAX, RED_ABSMAX, NUM_REDS } RedKind;
extern const char *const red_names[NUM_REDS];

/* ---- code books (codebook.c) ------------------------------------------------
 * The sorted tables a quantized state's codes index: `lookup BOOK %c` is
 * BOOK's value of code c, `search BOOK %y` the code of y, as torchao's
 * quantize_{8,4}bit_with_qmap finds it (numerics_quant.h, optc_code_search).
 * torchao's and bitsandbytes' dynamic maps (create_dynamic_map: sign, a
 * decimal exponent and a linear fraction) and linear maps, each the fp32
 * values torch makes of them. */
typedef enum {
  BOOK_DYN8S, /* create_dynamic_map(signed=True): 8-bit exp_avg (torchao, bitsandbytes) */
  BOOK_DYN8U, /* create_dynamic_map(signed=False): 8-bit second moments */
  BOOK_DYN4S, /* create_dynamic_map(True, 3, 4): torchao's 4-bit exp_avg */
  BOOK_LIN4U, /* torch.linspace(0, 1, 17)[1:]: torchao's 4-bit second moments (no zero) */
  BOOK_LIN8S, /* torch.linspace(-1, 1, 256): bitsandbytes' signed linear map */
  BOOK_LIN8U, /* torch.linspace(0, 1, 256): its unsigned one */
  NUM_BOOKS
} Book;

typedef struct {
  const char *name;    /* dyn8s, ... as the IR names it */
  int n;               /* entries: 256 or 16, a power of two */
  bool is_signed;      /* has negative entries */
  const float *q;      /* (n) the values, ascending */
  const float *t;      /* (n - 1) thresholds: the code of y is how many t[j] <= y
                          (t[j] the least f32 that rounds up from code j): what
                          the backends search, equal to optc_code_search on every y */
} CodeBook;

const CodeBook *codebook(Book b);
bool book_from_name(const char *s, size_t n, Book *out);
/* The code type that holds book b's codes: u8 for 256 entries, u4 for 16. */
Type book_code_type(Book b);

/* ---- graphs (ir.c) -------------------------------------------------------- */
typedef int32_t Ref; /* index into Graph.ins */
#define NOREF (-1)

typedef enum { BUF_PARAM, BUF_GRAD, BUF_STATE, NUM_BUFKINDS } BufKind;
extern const char *const bufkind_names[NUM_BUFKINDS];

/* How a state buffer starts when no saved state exists, as torch does it. */
typedef enum { INIT_CONST, INIT_PARAM, INIT_INPUT } InitKind;

typedef struct {
  const char *name; /* torch state_dict name for states: exp_avg, sum, ... */
  BufKind kind;
  Type type;
  bool per_block;         /* one element per block of the graph's block size, not per element
                             (a quantized state's scales): its loads and stores are block scope */
  bool nonneg;            /* a state whose values are never negative (second moments): a
                             quantized copy takes the unsigned code book */
  InitKind init;
  double init_value;      /* INIT_CONST */
  const char *init_input; /* INIT_INPUT: name of an input whose value is used */
  bool writeback;         /* grad: its stores are results (else nobody reads them) */
  const char *lead;       /* comment and blank lines before the line, verbatim */
  const char *trail;      /* a comment after the line, verbatim */
  SrcPos pos;
} Buffer;

/* The allowed values of an input: lo <..< hi, each end open or closed. */
typedef struct {
  bool set;
  double lo, hi;
  bool lo_open, hi_open;
} Range;

typedef struct {
  uint8_t op;     /* Op */
  uint8_t type;   /* Type of the result; TY_VOID for store */
  uint8_t scope;  /* Scope, computed by ir_infer_scopes */
  uint8_t red;    /* REDUCE: RedKind */
  uint8_t to;     /* REDUCE: target Scope */
  uint8_t book;   /* LOOKUP, SEARCH: Book */
  bool has_imm;   /* INPUT: a default is given; OPTION: a literal is given */
  int16_t seg;    /* -1, or after partition: 2k = step scalars before phase k,
                     2k+1 = the element loop of phase k */
  Ref args[3];
  int buf;        /* LOAD/STORE/HOLD: index into Graph.bufs */
  double imm;     /* CONST value; INPUT default; OPTION literal */
  Range range;    /* INPUT */
  Ref dep;        /* OPTION nonzero(%x): the input x */
  const char *name;  /* SSA name without '%', or NULL */
  const char *lead;  /* comment and blank lines before the line, verbatim */
  const char *trail; /* a comment after the line, verbatim */
  SrcPos pos;
} Ins;

struct Plan;

/* A step has at most this many phases (passes over memory): real optimizers
 * have one to three, and Ins.seg holds 2k + 1 for phase k. */
enum { IR_MAX_PHASES = 64 };

typedef struct {
  Arena *arena;
  struct Plan *plan; /* set by the plan pass */
  Buffer *bufs;
  int nbufs, capbufs;
  Ins *ins;
  int nins, capins;
  int nphases;      /* 0 until partition */
  int block;        /* the block of block scope, in elements: a power of two (0: none) */
  const char *block_lead; /* comment and blank lines before the `block` line */
  const char *block_trail; /* a comment after it */
  const char *tail; /* comment lines after the last line */
  const SrcFile *src;
} Graph;

/* The graph lives in arena a, which its creator frees. */
Graph *graph_new(Arena *a);
/* A deep copy into arena a. */
Graph *graph_clone(const Graph *g, Arena *a);
int graph_find_buffer(const Graph *g, const char *name);
Ref graph_find_value(const Graph *g, const char *name); /* by SSA name */
Ref graph_find_input(const Graph *g, const char *name); /* an INPUT or OPTION */
int graph_add_buffer(Graph *g, const char *name, BufKind kind, Type type);
int graph_count_uses(const Graph *g, Ref r);

/* What a buffer holds for its tensors: bytes per element of the tensor
 * (0.5 for u4; a per-block buffer's element over the block); the bytes
 * for a tensor of n elements; and the byte offset of element i, which is a
 * multiple of the block for a per-block buffer and even for u4 (a chunk's
 * first element always is: layout.c). */
double buffer_elem_bytes(const Graph *g, int b);
int64_t buffer_bytes(const Graph *g, int b, int64_t n);
int64_t buffer_offset(const Graph *g, int b, int64_t i);

/* ---- ir.c: names to small integers ------------------------------------------
 * An open-addressing hash table in an arena, for lookups by name that must
 * not scan the graph (the parser's symbol tables, the printer's fresh
 * names, a pass that asks who defines a name): every stage stays linear in
 * the graph's size. Keys are kept by pointer and length, so the text they
 * point to must outlive the map. */
typedef struct {
  const char *s; /* NULL: an empty slot */
  size_t n;
  uint32_t hash;
  int32_t val;
} NameSlot;

typedef struct {
  Arena *arena;
  NameSlot *slots; /* (cap), cap a power of two, at most half full */
  int n, cap;
} NameMap;

void namemap_init(NameMap *m, Arena *a);
/* The value of name s[0..n), or -1. */
int namemap_get(const NameMap *m, const char *s, size_t n);
/* Adds s[0..n) -> v (v >= 0) unless s is there already. Returns the value
 * s had, or -1 when it was added. */
int namemap_add(NameMap *m, const char *s, size_t n, int v);
/* Maps each value name to its first instruction: what graph_find_value
 * finds, for every name at once. */
void graph_value_map(const Graph *g, NameMap *m);

/* Builder: each call appends one instruction and returns its ref. */
Ref ir_emit(Graph *g, Op op, Type type, int nargs, const Ref *args);
Ref ir_const(Graph *g, Type t, double v);
Ref ir_input(Graph *g, const char *name, Type t);
Ref ir_load(Graph *g, int buf);
void ir_store(Graph *g, int buf, Ref v);
Ref ir_op1(Graph *g, Op op, Ref a);
Ref ir_op2(Graph *g, Op op, Ref a, Ref b);
Ref ir_op3(Graph *g, Op op, Ref a, Ref b, Ref c);
Ref ir_cvt(Graph *g, Ref a, Type to);
Ref ir_reduce(Graph *g, RedKind k, Scope to, Ref a);
Ref ir_lookup(Graph *g, Book b, Ref code); /* f32 */
Ref ir_search(Graph *g, Book b, Ref y);    /* book_code_type(b) */
Ref ir_name(Graph *g, Ref r, const char *name); /* returns r */

/* Rewrites every use of `from` (at or after index `start`) to `to`. */
void ir_replace_uses(Graph *g, Ref from, Ref to, Ref start);
/* Keeps the instructions with keep[i] set, in order, and renumbers refs.
 * A kept instruction must not use a dropped one. */
void graph_compact(Graph *g, const bool *keep);
/* Reorders the instructions by order[] (a permutation, new index -> old index),
 * renumbering refs. Operands must still come before their users. */
void graph_permute(Graph *g, const Ref *order);
/* Lowers every hold: with keep, a hold in a narrower buffer becomes a
 * rounding to the buffer's dtype and back (torch's for-loop semantics), and
 * any other hold is its operand; without keep, every hold is its operand. */
void ir_lower_holds(Graph *g, bool keep);
/* Recomputes every value's scope from its operands. */
void ir_infer_scopes(Graph *g);

/* ---- print.c ------------------------------------------------------------- */
/* Appends the textual form; parse(print(g)) prints to the same bytes. */
void ir_print(const Graph *g, Buf *out);
void ir_print_file(const Graph *g, FILE *f);
/* The text of one literal value of type t, as the printer writes it. */
void ir_format_imm(char out[40], Type t, double v);

/* ---- parse.c ------------------------------------------------------------- */
/* Parses src into a new graph in arena a. On error, prints positioned
 * messages and returns NULL. src must outlive the graph. */
Graph *ir_parse(const SrcFile *src, Arena *a);

/* ---- verify.c ------------------------------------------------------------ */
/* Checks types, scopes, SSA order, buffers and stores. Prints the first
 * problem at its position and returns false. */
bool ir_verify(Graph *g);
