/* emit.h: between the files of the CPU backend's emitter. emit_llvm.c
 * emits a phase's loops over its chunks (the core: the element computation,
 * memory, reductions, the pipelined loop); lanes.c is the arithmetic of
 * one vector of W lanes (bf16 and f16 rounding as numerics.h does it,
 * stochastic rounding, MKL's sqrt); variants.c the loop variants a phase
 * may also have (a table, holds rounded half up, divides as multiplies,
 * the vcvtneps2bf16 pass), each chosen per loop by a Loop argument. */
#pragma once
#include "llvm_emit.h"

#include <string.h>

enum { W = 16, PREFETCH = 512 };

typedef struct {
  LLVMContextRef c;
  LLVMModuleRef m;
  LLVMBuilderRef b;
  const Graph *g;
  const PlanPhase *ph;
  LLVMTypeRef tvoid, ti1, ti8, ti16, ti32, ti64, tf32, tf64, tptr;
  LLVMValueRef *val;     /* (nins) per-element values of the body being emitted */
  LLVMValueRef *scalar;  /* (nins) step-scope values, loaded at entry */
  LLVMValueRef *tscalar; /* (nins) tensor-scope reductions, loaded per chunk */
  LLVMValueRef *splat;   /* (nins) splats of the above, per chunk */
  LLVMValueRef *bufptr;  /* (nbufs) the chunk's first element of each buffer */
  LLVMValueRef *srkey;   /* (nins) the chunk's stochastic-rounding key of each cvt_sr */
  LLVMValueRef *tail;    /* (nins) tailpos: the chunk's <4 x i64> remainder regions {t0, e0, t1, e1} */
  LLVMValueRef mask;     /* NULL, or the tail's <W x i1> */
  LLVMValueRef j;        /* first element of this vector, within the chunk */
  LLVMValueRef start;    /* the chunk's first element within its tensor */
  LLVMValueRef *cscalar; /* (nins) step values with any NaN made 0x7fc00000 | sign */
  LLVMValueRef *csplat;  /* (nins) their splats, per chunk */
  LLVMValueRef *rnd;     /* (nins) a cvt to bf16: the rounded value as f32 bits */
  LLVMValueRef *lerp_w;  /* (nins) a lerp by a step value: the fma's weight, splat */
  LLVMValueRef *lerp_lo; /* (nins) ... and whether |w| < 0.5, splat */
  LLVMValueRef *recip;   /* (nins) a div taken as a multiply (recip_div): 1/c at entry */
  LLVMValueRef *rsplat;  /* (nins) ... its splat, per chunk */
  LLVMValueRef recip_ok; /* NULL, or whether every such multiply rounds as its div this call */
  Ref tab_u, tab_o;      /* a 16-bit value and a bf16 hold that is a function of it alone (tab_find), or NOREF */
  uint8_t *intab;        /* (nins) 1: what lies between them, computed only in the build; 2: tab_u as f32 */
  LLVMValueRef tab;      /* the table: 65536 f32 bits, tab_o's rounding for each bit pattern of tab_u */
  LLVMValueRef tab_ok;   /* NULL, or whether this call built it (it is large enough) */
  Ref *tie;              /* (nins) a hold tie_find took: the 16-bit-derived f32 its op reads, else NOREF */
  LLVMValueRef tie_ok;   /* NULL, or whether no such hold rounds a tie this call (tie_check) */
  uint8_t *fl;           /* (nins) FL_* of the phase being emitted */
  uint8_t *stage;        /* (nins) its stage in the pipelined loop: divides and square roots before it (stages) */
  Ref *cross;            /* (nins) the values a stage reads of an earlier one */
  int ncross, nstages;
  bool has_tailpos;      /* the phase's body computes tailpos */
  bool avx512;           /* the target has AVX-512F (vrsqrt14ps) */
  bool avx512bw;         /* ... and AVX-512BW (vpermw): bf16 packed and widened in one op */
  bool bf16cvt;          /* ... and AVX512-BF16 and DQ: vcvtneps2bf16 (the pipelined loop's fast pass) */
  bool amd;              /* an AMD CPU (znver*): no table (tab_find), holds half up (tie_find), no
                          * software prefetch (prefetch) */
  LLVMValueRef special;  /* the fast pass's (Loop.cvt) lanes vcvtneps2bf16 does not round as numerics.h (NULL: none yet) */
  LLVMValueRef *loads;   /* (nins) the fast pass's loads, which its exact redo (Loop.reuse_loads) reuses */
  bool perm_ok;          /* without AVX-512: the phase may widen in lane_elem's order (perm_find) */
  bool perm;             /* ... and the body being emitted does: f32 lane d holds element lane_elem(d) (body_begin) */
  LLVMValueRef perm_pack, perm_widen, odd_words; /* vpermw's operands, loaded at entry */
} E;

/* A loop's variant: what its body (emit_body, emit_stage, emit_ins) is
 * emitted with. emit_phase gives each loop over a chunk's vectors its own
 * (vec_loop); the variants differ in how a value is computed, never in its
 * bits. */
typedef struct {
  bool plain;       /* the chunk is in none of torch's loop remainders (chunk_hit): tailpos is -1 in every
                     * lane, and bf16 may widen in lane_elem's order (perm_find) */
  bool tab;         /* tab_o is looked up in the table (tab_find), and what lies between is not computed */
  bool tie;         /* tie_find's holds round half up (tie_check passed this call) */
  bool recip;       /* a divide by a step value multiplies by its reciprocal (recip_div) */
  bool cvt;         /* the pipelined loop's fast pass: stored bf16 round by vcvtneps2bf16 (cvt_pays) */
  bool reuse_loads; /* ... and its exact redo, which takes the fast pass's loads */
} Loop;

/* What emit_phase knows about a value before it emits the body (analyze).
 * The point is the bf16 hold, cvt(cvt(x : bf16) : f32): rounding x in its
 * f32 bits with the NaN case left out is a third of optc_f32_to_bf16's
 * work, and gives a NaN back as itself when its low 16 payload bits are
 * zero, where numerics.h gives 0x7fc0 | sign. The two differ only in a
 * NaN's payload, never in its sign, and a payload is seen only by a few
 * uses: a store of an f32 or f64, a reduction. So a hold skips the NaN
 * case (FL_FAST) when its operand's NaNs have clean low bits (FL_P) and
 * no such use sees its result through NaN-propagating arithmetic
 * (FL_SENS). A 16-bit store packs with the NaN case, so the bits in memory
 * are numerics.h's either way. */
enum {
  FL_SENS = 1,  /* a NaN's payload here reaches an f32/f64 store or a reduction */
  FL_CLEAN = 2, /* its step-value operands may be canonical-NaN copies (cscalar) */
  FL_P = 4,     /* as f32, any NaN here has its low 16 payload bits zero */
  FL_FAST = 8,  /* a cvt to bf16 whose f32 uses may skip the NaN case */
  FL_CANON = 16 /* a bf16 value whose NaNs are 0x7fc0 | sign: not a load */
};

/* ---- lanes.c: one vector's arithmetic --------------------------------------------------- */
LLVMTypeRef scalar_type(E *e, Type t);
LLVMValueRef splat_const(LLVMValueRef c, int n);
LLVMValueRef ci32(E *e, uint32_t x);
LLVMValueRef broadcast(E *e, LLVMValueRef s);
LLVMValueRef call_intrinsic(E *e, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args,
                            int nargs);
LLVMValueRef unary_intrinsic(E *e, const char *name, LLVMValueRef x);
LLVMValueRef bf16_to_f32(E *e, LLVMValueRef h);
LLVMValueRef bf16_round_sum(E *e, LLVMValueRef u, bool half_up);
LLVMValueRef bf16_round_bits(E *e, LLVMValueRef u);
LLVMValueRef bf16_round_exact(E *e, LLVMValueRef f, LLVMValueRef fast);
LLVMValueRef bf16_pack(E *e, LLVMValueRef bits);
LLVMValueRef sr_key(E *e, LLVMValueRef seed, LLVMValueRef step, LLVMValueRef tensor);
LLVMValueRef sr_bits(E *e, LLVMValueRef key);
LLVMValueRef f32_to_bf16_sr(E *e, LLVMValueRef f, LLVMValueRef bits);
LLVMValueRef f32_to_f16_sr(E *e, LLVMValueRef f, LLVMValueRef bits);
LLVMValueRef to_f32(E *e, LLVMValueRef v, Type t);
LLVMValueRef from_f32(E *e, LLVMValueRef v, Type t);
LLVMValueRef max_nan(E *e, LLVMValueRef a, LLVMValueRef x, bool is_min);
LLVMValueRef fconst(LLVMTypeRef vt, double x);
LLVMValueRef arith(E *e, Op op, LLVMValueRef *a);
LLVMValueRef convert(E *e, LLVMValueRef v, Type from, Type to);

/* ---- emit_llvm.c: the core, what the variants use of it ---------------------------------- */
LLVMValueRef operand(E *e, Ref r);
LLVMTypeRef mem_type(E *e, Type t);
LLVMValueRef load_vec(E *e, int buf);
void store_vec(E *e, int buf, LLVMValueRef v);
Ref stored_value(const Graph *g, const Ins *store);
bool read_back(const E *e, Ref i);
LLVMValueRef emit_ins(E *e, Ref i, const Loop *lp);
LLVMTypeRef chunk_type(E *e);
void splat_step_values(E *e);
void forget(E *e);
void pipe_iter(E *e, LLVMValueRef *acc, LLVMValueRef k, int lo, int hi, LLVMValueRef *mask, LLVMValueRef *h,
               LLVMValueRef *hr, const Loop *lp);

/* ---- variants.c: the loop variants -------------------------------------------------------- */
bool cvt_pays(const E *e, const Loop *lp);
LLVMValueRef round_bf16_cvt(E *e, Ref i, LLVMValueRef f);
void tab_find(E *e);
void tab_build(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks);
int tie_find(E *e);
void tie_check(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks);
void tab_gather(E *e);
void pipe_iter_cvt(E *e, LLVMValueRef fn, LLVMValueRef k, LLVMValueRef *h, LLVMValueRef *hr, const Loop *lp);
bool recip_div(const Graph *g, Ref i);
LLVMValueRef recip_check(E *e, LLVMValueRef c, LLVMValueRef r);

/* ---- blocks.c: codes, code books, block phases ----------------------------------------- */
LLVMValueRef u4_load(E *e, LLVMValueRef p, LLVMValueRef mask);
void u4_store(E *e, LLVMValueRef p, LLVMValueRef v, LLVMValueRef mask);
LLVMValueRef table_lookup(E *e, const float *t, int n, LLVMValueRef idx);
LLVMValueRef code_search(E *e, const CodeBook *cb, LLVMValueRef y);
bool block_phase(const E *e);
void block_scratch(E *e, LLVMValueRef *scratch);
void block_chunk(E *e, LLVMValueRef fn, LLVMValueRef len, LLVMValueRef *scratch);

/* ---- small helpers ------------------------------------------------------------------------ */
static inline bool is16(Type t) { return t == TY_BF16 || t == TY_F16; }

static inline bool in_body(const Ins *x) { return x->scope == SCOPE_ELEM; }

static inline LLVMTypeRef vec(LLVMTypeRef t, int n) { return LLVMVectorType(t, (unsigned)n); }

static inline LLVMTypeRef vtype(E *e, Type t) { return vec(scalar_type(e, t), W); }

/* Without AVX-512 an f32 vector is two ymm, and widening 16 bf16 in order
 * takes two vpmovzxwd and two shifts; vpunpck{l,h}wd against zero widen
 * them in two ops, each within its 128-bit lanes: elements 0-3 and 8-11
 * into the first ymm, 4-7 and 12-15 into the second. vpackusdw packs that
 * order back in one op (no vpermq). So where every lane is on its own (a
 * phase perm_find accepts), f32 lane d holds element lane_elem(d), and a
 * 16-bit vector is always in memory's order. */
static inline unsigned lane_elem(int d) { return (unsigned)((d & 4) * 2 + (d & 8) / 2 + (d & 3)); }
