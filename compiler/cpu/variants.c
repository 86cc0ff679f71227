/* variants.c: the loops a phase may have besides its plain one, each a
 * Loop (emit.h) that emit_phase gives vec_loop when a check made once per
 * call allows it, and none of which changes a bit: a function of one bf16
 * as a table (tab_*), holds that round no tie rounded half up (tie_*), a
 * divide by a step value as a multiply (recip_*), and the pipelined loop's
 * vcvtneps2bf16 pass with its exact redo (cvt_pays, pipe_iter_cvt). */
#include "emit.h"

/* Whether the loop being emitted takes the vcvtneps2bf16 fast pass: where
 * every bf16 it stores is a rounding (fused=True's bits; the for-loop's
 * too, whose exp_avg and exp_avg_sq are read back, widened from the
 * words: one vpermw for the integer rounding's four ops). Not in the loop
 * that looks the denominator up (tab_find), where the gather held the
 * for-loop back all the same (the step measured no faster with it there).
 * Without the table it brings the for-loop's bits near the fused kernel's
 * time (bench/results.md, "Measurements behind the emitters' choices"). */
bool cvt_pays(const E *e, const Loop *lp) {
  const Graph *g = e->g;
  int n = 0;
  for (Ref k = e->ph->lo; k < e->ph->hi; k++) {
    const Ins *x = &g->ins[k];
    if (x->op != OP_STORE || g->bufs[x->buf].type != TY_BF16)
      continue;
    Ref r = stored_value(g, x);
    if (g->ins[r].op != OP_CVT || g->ins[r].type != TY_BF16 || (lp->tab && read_back(e, r)))
      return false;
    n++;
  }
  return n > 0;
}

/* A stored bf16 in the pipelined loop's fast pass (vec_loop): vcvtneps2bf16
 * rounds every finite normal f32 and infinity to nearest even, numerics.h's
 * bits, in one op where the integer rounding and vpermw's pack are five.
 * It treats a subnormal input as zero and keeps a NaN's payload: one
 * vfpclassps marks those lanes in e->special, and an iteration with any
 * is redone the exact way, its stores too, before it hands anything on. */
LLVMValueRef round_bf16_cvt(E *e, Ref i, LLVMValueRef f) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef words = call_intrinsic(e, "llvm.x86.avx512bf16.cvtneps2bf16.512", NULL, 0, &f, 1);
  words = LLVMBuildBitCast(b, words, vec(e->ti16, W), "");
  LLVMValueRef args[2] = {f, LLVMConstInt(e->ti32, 0xa1, 0)}; /* QNaN | denormal | SNaN */
  LLVMValueRef odd = call_intrinsic(e, "llvm.x86.avx512.fpclass.ps.512", NULL, 0, args, 2);
  e->special = e->special ? LLVMBuildOr(b, e->special, odd, "") : odd;
  /* what a later cvt back to f32 reads (exact where the lane is not special) */
  e->rnd[i] = LLVMBuildBitCast(b, bf16_to_f32(e, words), vec(e->ti32, W), "");
  return words;
}

/* ---- a function of one bf16, as a table ------------------------------------------------- */

/* In torch's for-loop AdamW on bf16 tensors, every op rounds to bf16, so
 * denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) is a
 * function of exp_avg_sq's 16 bits and two step values: 65536 results, a
 * square root, a divide, an add and three roundings each. tab_find finds
 * such a value: a bf16 hold (tab_o) computed from one 16-bit value (tab_u)
 * and step values alone, with a divide or square root on the way and
 * nothing between the two used elsewhere. The call then computes it once
 * for every bit pattern of tab_u, with the very code the loop would run,
 * into a table on its stack (tab_build), and the loop gathers it: a shift
 * and a vpgatherdd where that was ~20 vector ops and two divider ops. The
 * build, 4096 vectors of the cone, costs about what the table saves on
 * 128K elements: a call takes it from CPU_TABLE_MIN (codegen.h), twice
 * that, where it measured faster (bench/results.md, "Measurements behind
 * the emitters' choices"). */

static bool tabulable(const Ins *x) {
  switch (x->op) {
  case OP_LOAD: case OP_STORE: case OP_REDUCE: case OP_CVT_SR: case OP_TAILPOS: case OP_LERP: return false;
  default: return in_body(x);
  }
}

void tab_find(E *e) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  e->tab_u = e->tab_o = NOREF;
  memset(e->intab, 0, (size_t)g->nins);
  /* AVX-512 only: where AVX2's gathers are slow (Haswell, Zen 3) LLVM
   * makes scalar loads of them, and no AVX2 machine here measures it. Nor
   * on AMD's AVX-512 (Zen 4): a zmm vpgatherdd is ~32 cycles there, and
   * runs beside nothing, so the loop that divides is the faster, and
   * faster again with vcvtneps2bf16 (cvt_pays; bench/results.md) */
  if (!e->avx512 || e->amd)
    return;
  uint8_t *cone = calloc((size_t)g->nins + 1, 2), *anc = cone + g->nins;
  ASSERT(cone);
  int best = 0;
  for (Ref u = ph->lo; u < ph->hi; u++) {
    if (!in_body(&g->ins[u]) || g->ins[u].type != TY_BF16)
      continue;
    /* what is computed from u and step values alone */
    memset(cone, 0, (size_t)g->nins);
    for (Ref i = u + 1; i < ph->hi; i++) {
      const Ins *x = &g->ins[i];
      if (!tabulable(x))
        continue;
      if (x->op == OP_CVT && x->type == TY_F32 && x->args[0] == u) {
        cone[i] = 2; /* u as f32: its bits, free in the loop */
        continue;
      }
      bool any = false, ok = true;
      for (int k = 0; k < op_info[x->op].nargs; k++) {
        const Ins *y = &g->ins[x->args[k]];
        if (x->args[k] == u || cone[x->args[k]])
          any = true;
        else if (y->scope != SCOPE_STEP && y->op != OP_CONST)
          ok = false;
      }
      cone[i] = ok && any;
    }
    for (Ref o = u + 1; o < ph->hi; o++) {
      const Ins *x = &g->ins[o];
      if (!cone[o] || x->op != OP_CVT || x->type != TY_BF16)
        continue;
      /* o's own part of the cone: used only within it, and worth a table */
      memset(anc, 0, (size_t)g->nins);
      anc[o] = 1;
      int cost = 0;
      for (Ref i = o; i > u; i--) {
        if (!anc[i])
          continue;
        Op op = (Op)g->ins[i].op;
        cost += op == OP_DIV || op == OP_SQRT || op == OP_SQRT_MKL || op == OP_SQRT_MKL_EX || op == OP_RSQRT ? 16 : 1;
        for (int k = 0; k < op_info[op].nargs; k++)
          if (cone[g->ins[i].args[k]] == 1)
            anc[g->ins[i].args[k]] = 1;
      }
      bool closed = cost >= 16;
      for (Ref j = ph->lo; closed && j < ph->hi; j++) {
        const Ins *y = &g->ins[j];
        for (int k = 0; k < op_info[y->op].nargs; k++) {
          Ref r = y->args[k];
          if (r == o ? y->op != OP_CVT || y->type != TY_F32 : anc[r] && !anc[j])
            closed = false;
        }
      }
      if (closed && cost > best) {
        best = cost;
        e->tab_u = u, e->tab_o = o;
        for (Ref i = u + 1; i < o; i++)
          e->intab[i] = cone[i] == 2 ? 2 : anc[i];
      }
    }
  }
  free(cone);
}

/* Once per call, in the entry block: whether the call's chunks hold
 * CPU_TABLE_MIN elements, and if so the table (4096 vectors of the cone). */
/* In the entry block: whether the call's chunks hold at least min
 * elements (the sum of their lengths, counted until it gets there). Leaves
 * the builder in a new block, with *from that block. */
static LLVMValueRef call_at_least(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks, long min,
                                  LLVMBasicBlockRef *from) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  LLVMTypeRef chunk_t = chunk_type(e);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
  LLVMBasicBlockRef sum = LLVMAppendBasicBlockInContext(c, fn, "count");
  LLVMBasicBlockRef sum_body = LLVMAppendBasicBlockInContext(c, fn, "count.body");
  LLVMBasicBlockRef count_exit = LLVMAppendBasicBlockInContext(c, fn, "count.exit");
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0), one = LLVMConstInt(e->ti64, 1, 0);
  LLVMBuildBr(b, sum);
  LLVMPositionBuilderAtEnd(b, sum);
  LLVMValueRef ci = LLVMBuildPhi(b, e->ti64, "c"), tot = LLVMBuildPhi(b, e->ti64, "n");
  LLVMValueRef big = LLVMBuildICmp(b, LLVMIntSGE, tot, LLVMConstInt(e->ti64, (unsigned long long)min, 0), "");
  LLVMValueRef more = LLVMBuildICmp(b, LLVMIntSLT, ci, nchunks, "");
  LLVMBuildCondBr(b, LLVMBuildAnd(b, more, LLVMBuildNot(b, big, ""), ""), sum_body, count_exit);
  LLVMPositionBuilderAtEnd(b, sum_body);
  LLVMValueRef chp = LLVMBuildGEP2(b, chunk_t, chunks, &ci, 1, "");
  LLVMValueRef len = LLVMBuildLoad2(b, e->ti64, LLVMBuildStructGEP2(b, chunk_t, chp, 3, ""), "len");
  LLVMValueRef cnext = LLVMBuildAdd(b, ci, one, ""), tnext = LLVMBuildAdd(b, tot, len, "");
  LLVMBuildBr(b, sum);
  LLVMAddIncoming(ci, (LLVMValueRef[]){zero, cnext}, (LLVMBasicBlockRef[]){pre, sum_body}, 2);
  LLVMAddIncoming(tot, (LLVMValueRef[]){zero, tnext}, (LLVMBasicBlockRef[]){pre, sum_body}, 2);
  LLVMPositionBuilderAtEnd(b, count_exit);
  *from = count_exit;
  return big;
}

/* The 16 bit patterns 16k .. 16k + 15, as i32 lanes. */
static LLVMValueRef patterns(E *e, LLVMValueRef k) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef lanes[W];
  for (int l = 0; l < W; l++)
    lanes[l] = LLVMConstInt(e->ti32, (unsigned)l, 0);
  LLVMValueRef base = LLVMBuildTrunc(b, LLVMBuildMul(b, k, LLVMConstInt(e->ti64, W, 0), ""), e->ti32, "");
  return LLVMBuildAdd(b, broadcast(e, base), LLVMConstVector(lanes, W), "");
}

/* Once per call, in the entry block: whether the call's chunks hold
 * CPU_TABLE_MIN elements, and if so the table (4096 vectors of the cone). */
void tab_build(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  LLVMTypeRef tt = LLVMArrayType2(e->ti32, 65536);
  e->tab = LLVMBuildAlloca(b, tt, "tab");
  LLVMSetAlignment(e->tab, 64);
  LLVMBasicBlockRef count_exit;
  LLVMValueRef big = call_at_least(e, fn, chunks, nchunks, CPU_TABLE_MIN, &count_exit);
  LLVMBasicBlockRef build = LLVMAppendBasicBlockInContext(c, fn, "tab.build");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c, fn, "tab.done");
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0), one = LLVMConstInt(e->ti64, 1, 0);
  e->tab_ok = big;
  LLVMBuildCondBr(b, big, build, done);
  /* the build: vector k holds the patterns 16k .. 16k + 15 */
  LLVMPositionBuilderAtEnd(b, build);
  LLVMValueRef k = LLVMBuildPhi(b, e->ti64, "k");
  splat_step_values(e);
  LLVMValueRef pat = patterns(e, k);
  forget(e);
  e->mask = NULL;
  const Loop lp = {0};
  e->val[e->tab_u] = LLVMBuildTrunc(b, pat, vtype(e, TY_BF16), "");
  e->rnd[e->tab_u] = LLVMBuildShl(b, pat, ci32(e, 16), "");
  for (Ref i = e->tab_u + 1; i <= e->tab_o; i++)
    if (e->intab[i] || i == e->tab_o)
      e->val[i] = emit_ins(e, i, &lp);
  LLVMValueRef at = LLVMBuildMul(b, k, LLVMConstInt(e->ti64, W, 0), "");
  LLVMValueRef st = LLVMBuildStore(b, e->rnd[e->tab_o], LLVMBuildGEP2(b, e->ti32, e->tab, &at, 1, ""));
  LLVMSetAlignment(st, 64);
  LLVMValueRef knext = LLVMBuildAdd(b, k, one, "");
  LLVMAddIncoming(k, (LLVMValueRef[]){zero, knext}, (LLVMBasicBlockRef[]){count_exit, build}, 2);
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, knext, LLVMConstInt(e->ti64, 65536 / W, 0), ""), build, done);
  LLVMPositionBuilderAtEnd(b, done);
  forget(e);
}

/* ---- holds that round no tie ----------------------------------------------------------- */

/* Rounding f32 bits to the nearest bf16, ties to even, is u + 0x7fff + lsb
 * with the lsb (u >> 16) & 1: without AVX-512 the hold is five ops, a
 * shift, an and, two adds and the low half cleared. Half up, u + 0x8000,
 * drops the shift, the and and an add, and gives the same bits unless u's
 * low half is 0x8000, a tie. A bf16 hold of a product, quotient or square
 * root whose only per-element operand is a bf16 value (the for-loop's
 * p * (1 - lr * wd), v * beta2, sqrt(v), d * (1 / bias_correction2_sqrt))
 * has 65536 possible inputs: tie_find finds such holds, and tie_check
 * computes each one's op on all 65536, with the code the loop runs, once
 * per call; where none rounds a tie, the loop rounds them half up
 * (Loop.tie). Ties do occur: v * beta2 has 3062 with beta2 0.95, none
 * with 0.999; d + bf16(eps), a sum of two bf16, has them every step, so
 * sums are left out. Without AVX-512 (a hold is five ops there), and on
 * AMD's AVX-512, which has no table (tab_find) and where a hold is four
 * (bench/results.md has the gain). Not on Intel's, unmeasured there: its
 * large calls look the denominator up, which subsumes most of the holds.
 * Returns how many it found. */
int tie_find(E *e) {
  const Graph *g = e->g;
  for (int i = 0; i < g->nins; i++)
    e->tie[i] = NOREF;
  if (e->avx512 && !e->amd)
    return 0;
  int n = 0;
  uint8_t *grad = calloc((size_t)g->nins + 1, 1); /* a grad, or a hold of one op on one */
  ASSERT(grad);
  for (Ref h = e->ph->lo; h < e->ph->hi; h++) {
    const Ins *x = &g->ins[h];
    if (x->op == OP_LOAD && g->bufs[x->buf].kind == BUF_GRAD)
      grad[h] = 1;
    if (x->op != OP_CVT || x->type != TY_BF16 || !in_body(x))
      continue;
    const Ins *a = &g->ins[x->args[0]];
    /* a product, quotient or square root: an add of two bf16 values is
     * exact in f32, and often a tie (d + bf16(eps) is, every step) */
    bool op_ok = a->op == OP_MUL || a->op == OP_DIV || a->op == OP_SQRT || a->op == OP_SQRT_MKL ||
                 a->op == OP_SQRT_MKL_EX;
    if (!in_body(a) || a->type != TY_F32 || !op_ok)
      continue;
    Ref src = NOREF;
    bool ok = true;
    for (int k = 0; k < op_info[a->op].nargs; k++) {
      Ref r = a->args[k];
      const Ins *y = &g->ins[r];
      if (!in_body(y))
        ok &= y->scope == SCOPE_STEP; /* not a tensor-scope value: it is loaded per chunk */
      else if (y->op != OP_CVT || g->ins[y->args[0]].type != TY_BF16 || (src != NOREF && src != r))
        ok = false;
      else
        src = r;
    }
    /* not the grads, nor their holds of one op: scale_grads and the clip
     * multiply them by a new value every step, and ties are common there
     * (1 / num_tokens, a power of two, rounds 256 of the 65536 to a tie in
     * the subnormals; the clip's coefficient is a bf16, whose products
     * with a bf16 are exact) */
    if (ok && src != NOREF && grad[g->ins[src].args[0]]) {
      grad[h] = 1;
      continue;
    }
    if (ok && src != NOREF) {
      e->tie[h] = src;
      n++;
    }
  }
  free(grad);
  return n;
}

/* Once per call, in the entry block, after the step values' reciprocals
 * (the loop that rounds half up multiplies by them): whether the call holds
 * CPU_TIE_MIN elements, and if so whether none of tie_find's holds rounds
 * a tie on any of the 65536 inputs (e->tie_ok). */
void tie_check(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  const Graph *g = e->g;
  LLVMBasicBlockRef count_exit;
  LLVMValueRef big = call_at_least(e, fn, chunks, nchunks, CPU_TIE_MIN, &count_exit);
  LLVMBasicBlockRef check = LLVMAppendBasicBlockInContext(c, fn, "tie.check");
  LLVMBasicBlockRef checked = LLVMAppendBasicBlockInContext(c, fn, "tie.checked");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c, fn, "tie.done");
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0), one = LLVMConstInt(e->ti64, 1, 0);
  LLVMTypeRef vb = vec(e->ti1, W);
  LLVMBuildCondBr(b, big, check, done);
  /* vector k: the patterns 16k .. 16k + 15 as f32, into every such op */
  LLVMPositionBuilderAtEnd(b, check);
  LLVMValueRef k = LLVMBuildPhi(b, e->ti64, "k"), acc = LLVMBuildPhi(b, vb, "tie");
  splat_step_values(e);
  for (int r = 0; r < g->nins; r++)
    if (e->recip[r])
      e->rsplat[r] = broadcast(e, e->recip[r]);
  forget(e);
  e->mask = NULL;
  const Loop lp = {.recip = true}; /* as the loop that rounds half up */
  LLVMValueRef f = LLVMBuildBitCast(b, LLVMBuildShl(b, patterns(e, k), ci32(e, 16), ""), vec(e->tf32, W), "");
  LLVMValueRef any = acc;
  for (Ref h = e->ph->lo; h < e->ph->hi; h++) {
    if (e->tie[h] == NOREF)
      continue;
    Ref a = g->ins[h].args[0];
    e->val[e->tie[h]] = f;
    LLVMValueRef u = LLVMBuildBitCast(b, emit_ins(e, a, &lp), vec(e->ti32, W), "");
    LLVMValueRef t = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildAnd(b, u, ci32(e, 0xffff), ""), ci32(e, 0x8000), "");
    any = LLVMBuildOr(b, any, t, "");
  }
  forget(e);
  LLVMValueRef knext = LLVMBuildAdd(b, k, one, "");
  LLVMBasicBlockRef check_end = LLVMGetInsertBlock(b);
  LLVMAddIncoming(k, (LLVMValueRef[]){zero, knext}, (LLVMBasicBlockRef[]){count_exit, check_end}, 2);
  LLVMAddIncoming(acc, (LLVMValueRef[]){LLVMConstNull(vb), any}, (LLVMBasicBlockRef[]){count_exit, check_end}, 2);
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, knext, LLVMConstInt(e->ti64, 65536 / W, 0), ""), check, checked);
  LLVMPositionBuilderAtEnd(b, checked);
  LLVMTypeRef iw = LLVMIntTypeInContext(c, W);
  LLVMValueRef none = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildBitCast(b, any, iw, ""), LLVMConstInt(iw, 0, 0), "");
  LLVMBuildBr(b, done);
  LLVMPositionBuilderAtEnd(b, done);
  e->tie_ok = LLVMBuildPhi(b, e->ti1, "tie.ok");
  LLVMAddIncoming(e->tie_ok, (LLVMValueRef[]){LLVMConstInt(e->ti1, 0, 0), none},
                  (LLVMBasicBlockRef[]){count_exit, checked}, 2);
}

/* tab_o in the loop: its rounded bits from the table, at tab_u's 16 bits. */
void tab_gather(E *e) {
  LLVMBuilderRef b = e->b;
  Ref u = e->tab_u, o = e->tab_o;
  LLVMValueRef idx = e->rnd[u] ? LLVMBuildLShr(b, e->rnd[u], ci32(e, 16), "")
                               : LLVMBuildZExt(b, operand(e, u), vec(e->ti32, W), "");
  LLVMValueRef ptrs = LLVMBuildGEP2(b, e->ti32, e->tab, &idx, 1, "");
  LLVMValueRef ones[W];
  for (int l = 0; l < W; l++)
    ones[l] = LLVMConstInt(e->ti1, 1, 0);
  LLVMTypeRef over[2] = {vec(e->ti32, W), LLVMTypeOf(ptrs)};
  LLVMValueRef args[4] = {ptrs, LLVMConstInt(e->ti32, 4, 0), LLVMConstVector(ones, W), LLVMGetUndef(vec(e->ti32, W))};
  LLVMValueRef bits = call_intrinsic(e, "llvm.masked.gather", over, 2, args, 4);
  e->rnd[o] = bits;
  e->val[o] = LLVMBuildTrunc(b, LLVMBuildLShr(b, bits, ci32(e, 16), ""), vtype(e, TY_BF16), "");
}

/* The loop's iteration k with AVX512-BF16 (no reductions): a fast pass
 * whose stored bf16 round by vcvtneps2bf16 (round_bf16_cvt), then, in
 * the rare iteration where one of them met a NaN or a subnormal, the
 * iteration again the exact way from the same loaded vectors and handed-on
 * values: its stores are written again and what it hands on is the redo's.
 * One branch an iteration, after everything, so the fast pass is one block
 * for the scheduler: a branch at each rounding made the loop slower than
 * no vcvtneps2bf16 at all. */
void pipe_iter_cvt(E *e, LLVMValueRef fn, LLVMValueRef k, LLVMValueRef *h, LLVMValueRef *hr, const Loop *lp) {
  LLVMBuilderRef b = e->b;
  int ns = e->nstages, nx = e->ncross;
  LLVMValueRef *in = calloc((size_t)(2 * ns * nx + 2 * nx + 1), sizeof(LLVMValueRef)), *fast = in + 2 * ns * nx;
  ASSERT(in);
  memcpy(in, h, sizeof(LLVMValueRef) * (size_t)(2 * ns * nx));
  Loop fast_pass = *lp, redo_pass = *lp;
  fast_pass.cvt = true;
  redo_pass.reuse_loads = true;
  e->special = NULL;
  pipe_iter(e, NULL, k, 0, ns - 1, NULL, h, hr, &fast_pass);
  if (!e->special) { /* nothing stored is bf16 */
    free(in);
    return;
  }
  memcpy(fast, h, sizeof(LLVMValueRef) * (size_t)nx);
  memcpy(fast + nx, hr, sizeof(LLVMValueRef) * (size_t)nx);
  LLVMValueRef any = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildBitCast(b, e->special, e->ti16, ""),
                                   LLVMConstInt(e->ti16, 0, 0), "");
  LLVMBasicBlockRef at = LLVMGetInsertBlock(b);
  LLVMBasicBlockRef redo = LLVMAppendBasicBlockInContext(e->c, fn, "pipe.exact");
  LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(e->c, fn, "pipe.next");
  LLVMValueRef br = LLVMBuildCondBr(b, any, redo, join);
  LLVMMetadataRef w[3] = {LLVMMDStringInContext2(e->c, "branch_weights", 14),
                          LLVMValueAsMetadata(LLVMConstInt(e->ti32, 1, 0)),
                          LLVMValueAsMetadata(LLVMConstInt(e->ti32, 1 << 20, 0))};
  LLVMSetMetadata(br, LLVMGetMDKindIDInContext(e->c, "prof", 4),
                  LLVMMetadataAsValue(e->c, LLVMMDNodeInContext2(e->c, w, 3)));
  LLVMPositionBuilderAtEnd(b, redo);
  memcpy(h, in, sizeof(LLVMValueRef) * (size_t)(2 * ns * nx));
  pipe_iter(e, NULL, k, 0, ns - 1, NULL, h, hr, &redo_pass);
  LLVMBasicBlockRef redo_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, join);
  LLVMPositionBuilderAtEnd(b, join);
  for (int q = 0; q < 2 * nx; q++) {
    LLVMValueRef *slot = q < nx ? &h[q] : &hr[q - nx];
    if (!fast[q] && !*slot)
      continue;
    ASSERT(fast[q] && *slot && LLVMTypeOf(fast[q]) == LLVMTypeOf(*slot));
    LLVMValueRef p = LLVMBuildPhi(b, LLVMTypeOf(fast[q]), "");
    LLVMAddIncoming(p, (LLVMValueRef[]){fast[q], *slot}, (LLVMBasicBlockRef[]){at, redo_end}, 2);
    *slot = p;
  }
  free(in);
}

/* ---- a divide by a step value, as a multiply where that is exact ---------------------- */

/* Whether div i is d / c in f32 with c a step value, d a bf16 hold of a
 * square root, and every use of the quotient a rounding to bf16: the
 * for-loop AdamW's exp_avg_sq.sqrt() / bias_correction2_sqrt on bf16
 * tensors. Then bf16(d * RN(1/c)) is bf16(d / c) for every d as soon as it
 * is for the 128 significands of a bf16 in [1, 2), with c in [2^-40,
 * 2^40]: d is a zero, an Inf or a NaN (the same either way, c > 0), or a
 * normal in [2^-76, 2^65] (an f32's square root in 8 bits), so the
 * quotient and the product are normal, and scaling d by 2^k scales both
 * and their roundings by 2^k. recip_check tests the 128 once per call (a
 * thread's share of a step); the loop multiplies only where they agree. */
bool recip_div(const Graph *g, Ref i) {
  const Ins *x = &g->ins[i];
  if (x->op != OP_DIV || x->type != TY_F32 || !in_body(x))
    return false;
  const Ins *c = &g->ins[x->args[1]], *h = &g->ins[x->args[0]];
  if (c->scope != SCOPE_STEP || c->type != TY_F32 || h->op != OP_CVT || h->type != TY_F32 || !in_body(h))
    return false;
  const Ins *y = &g->ins[h->args[0]];
  if (y->op != OP_CVT || y->type != TY_BF16 || !in_body(y))
    return false;
  const Ins *z = &g->ins[y->args[0]];
  if ((z->op != OP_SQRT && z->op != OP_SQRT_MKL && z->op != OP_SQRT_MKL_EX) || z->type != TY_F32 || !in_body(z))
    return false;
  for (Ref u = i + 1; u < g->nins; u++)
    for (int k = 0; k < op_info[g->ins[u].op].nargs; k++)
      if (g->ins[u].args[k] == i && (g->ins[u].op != OP_CVT || g->ins[u].type != TY_BF16))
        return false;
  return true;
}

/* Whether bf16(m / c) == bf16(m * r) for the 128 significands m of a bf16
 * in [1, 2), and c is in [2^-40, 2^40] (not for a NaN): an i1. */
LLVMValueRef recip_check(E *e, LLVMValueRef c, LLVMValueRef r) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef iw = LLVMIntTypeInContext(e->c, W);
  LLVMValueRef cs = broadcast(e, c), rs = broadcast(e, r), differ = NULL;
  for (int k = 0; k < 128; k += W) {
    LLVMValueRef m[W];
    for (int l = 0; l < W; l++)
      m[l] = LLVMConstReal(e->tf32, 1.0 + (k + l) / 128.0);
    LLVMValueRef mv = LLVMConstVector(m, W);
    LLVMValueRef q = LLVMBuildBitCast(b, LLVMBuildFDiv(b, mv, cs, ""), vec(e->ti32, W), "");
    LLVMValueRef p = LLVMBuildBitCast(b, LLVMBuildFMul(b, mv, rs, ""), vec(e->ti32, W), "");
    LLVMValueRef ne = LLVMBuildICmp(b, LLVMIntNE, bf16_round_bits(e, q), bf16_round_bits(e, p), "");
    differ = differ ? LLVMBuildOr(b, differ, ne, "") : ne;
  }
  LLVMValueRef same = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildBitCast(b, differ, iw, ""), LLVMConstInt(iw, 0, 0), "");
  LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOGE, c, LLVMConstReal(e->tf32, 0x1p-40), ""),
                                 LLVMBuildFCmp(b, LLVMRealOLE, c, LLVMConstReal(e->tf32, 0x1p40), ""), "");
  return LLVMBuildAnd(b, in, same, "");
}
