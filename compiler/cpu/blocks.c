/* blocks.c: quantized states on the CPU: codes in memory and in vectors,
 * the code-book lookup and search, and the loop of a phase with block
 * scope (a block reduction, a per-block buffer).
 *
 * Codes are u8 or u4 in memory and i32 lanes in a vector (a table index).
 * A u4 vector of 16 codes is 8 bytes, element 2k in the high nibble of byte
 * k; a chunk starts on an even element (layout.c), so every vector's bytes
 * are whole.
 *
 * A table of n f32 (a code book, or a level of the search's thresholds) is
 * looked up by permutes where the target has them: AVX-512's vpermps takes
 * 16 entries from one register and vpermt2ps 32 from two, so 256 entries
 * are 8 vpermt2ps and a tree of 7 selects on the index's top bits; AVX2's
 * vpermps takes 8 (two halves of a 16-lane vector). A table beyond that
 * is a gather (slow on AMD's cores: ~32 cycles a zmm there).
 *
 * The search is a binary search of the n - 1 thresholds (codebook.c): step
 * s compares y with t[c + s - 1], c a multiple of 2s, so it looks up a
 * table of n / 2s entries at c / 2s; the first steps are a constant, then
 * 2, 4, ... entries, and only the last two or three are large.
 *
 * A block phase (plan.h's block stages) runs each block of a chunk in its
 * stages: stage s is a loop over the block's vectors computing the values
 * of stage s, storing what they store and folding the block reductions of
 * them; the values a later stage reads are kept in scratch on the stack
 * (a vector per W elements of the block). Block-scope values are vectors
 * whose lanes are all the block's value: a per-block load broadcast, a
 * reduction's result broadcast, and the ops between them on those. */
#include "emit.h"

/* ---- codes in memory -------------------------------------------------------------------- */

/* The 16 codes of a u4 vector at byte p (8 bytes), as i32 lanes; where mask
 * is set, only the bytes of its even lanes are read. */
LLVMValueRef u4_load(E *e, LLVMValueRef p, LLVMValueRef mask) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef vb = vec(e->ti8, W / 2);
  LLVMValueRef bytes;
  if (mask) {
    LLVMValueRef even[W / 2];
    for (int k = 0; k < W / 2; k++)
      even[k] = LLVMConstInt(e->ti32, (unsigned)(2 * k), 0);
    LLVMValueRef m8 = LLVMBuildShuffleVector(b, mask, LLVMGetUndef(LLVMTypeOf(mask)), LLVMConstVector(even, W / 2), "");
    LLVMTypeRef over[2] = {vb, e->tptr};
    LLVMValueRef args[4] = {p, LLVMConstInt(e->ti32, 1, 0), m8, LLVMConstNull(vb)};
    bytes = call_intrinsic(e, "llvm.masked.load", over, 2, args, 4);
  } else {
    bytes = LLVMBuildLoad2(b, vb, p, "");
    LLVMSetAlignment(bytes, 1);
  }
  LLVMValueRef w = LLVMBuildZExt(b, bytes, vec(e->ti32, W / 2), "");
  LLVMValueRef hi = LLVMBuildLShr(b, w, splat_const(LLVMConstInt(e->ti32, 4, 0), W / 2), "");
  LLVMValueRef lo = LLVMBuildAnd(b, w, splat_const(LLVMConstInt(e->ti32, 15, 0), W / 2), "");
  LLVMValueRef idx[W];
  for (int k = 0; k < W; k++) /* element 2k the high nibble of byte k, 2k + 1 the low */
    idx[k] = LLVMConstInt(e->ti32, (unsigned)(k / 2 + (k % 2 ? W / 2 : 0)), 0);
  return LLVMBuildShuffleVector(b, hi, lo, LLVMConstVector(idx, W), "");
}

/* The 16 codes v (i32 lanes) as a u4 vector's 8 bytes at p; where mask is
 * set, only the bytes of its even lanes are written, an odd lane past it
 * written as 0 (a tensor of odd length ends in half a byte). */
void u4_store(E *e, LLVMValueRef p, LLVMValueRef v, LLVMValueRef mask) {
  LLVMBuilderRef b = e->b;
  if (mask)
    v = LLVMBuildSelect(b, mask, v, LLVMConstNull(LLVMTypeOf(v)), "");
  LLVMValueRef ev[W / 2], od[W / 2];
  for (int k = 0; k < W / 2; k++) {
    ev[k] = LLVMConstInt(e->ti32, (unsigned)(2 * k), 0);
    od[k] = LLVMConstInt(e->ti32, (unsigned)(2 * k + 1), 0);
  }
  LLVMValueRef hi = LLVMBuildShuffleVector(b, v, LLVMGetUndef(LLVMTypeOf(v)), LLVMConstVector(ev, W / 2), "");
  LLVMValueRef lo = LLVMBuildShuffleVector(b, v, LLVMGetUndef(LLVMTypeOf(v)), LLVMConstVector(od, W / 2), "");
  LLVMValueRef w = LLVMBuildOr(b, LLVMBuildShl(b, hi, splat_const(LLVMConstInt(e->ti32, 4, 0), W / 2), ""), lo, "");
  LLVMTypeRef vb = vec(e->ti8, W / 2);
  LLVMValueRef bytes = LLVMBuildTrunc(b, w, vb, "");
  if (mask) {
    LLVMValueRef m8 = LLVMBuildShuffleVector(b, mask, LLVMGetUndef(LLVMTypeOf(mask)), LLVMConstVector(ev, W / 2), "");
    LLVMTypeRef over[2] = {vb, e->tptr};
    LLVMValueRef args[4] = {bytes, p, LLVMConstInt(e->ti32, 1, 0), m8};
    call_intrinsic(e, "llvm.masked.store", over, 2, args, 4);
    return;
  }
  LLVMValueRef s = LLVMBuildStore(b, bytes, p);
  LLVMSetAlignment(s, 1);
}

/* ---- tables ------------------------------------------------------------------------------- */

static LLVMValueRef const_floats(E *e, const float *t, int n) {
  LLVMValueRef v[W];
  for (int i = 0; i < n; i++)
    v[i] = LLVMConstReal(e->tf32, t[i]);
  return LLVMConstVector(v, (unsigned)n);
}

/* Lanes [lo, lo + n) of v. */
static LLVMValueRef lanes_of(E *e, LLVMValueRef v, int lo, int n) {
  LLVMValueRef idx[W];
  for (int i = 0; i < n; i++)
    idx[i] = LLVMConstInt(e->ti32, (unsigned)(lo + i), 0);
  return LLVMBuildShuffleVector(e->b, v, LLVMGetUndef(LLVMTypeOf(v)), LLVMConstVector(idx, (unsigned)n), "");
}

static LLVMValueRef concat(E *e, LLVMValueRef a, LLVMValueRef c) {
  LLVMValueRef idx[W];
  for (int i = 0; i < W; i++)
    idx[i] = LLVMConstInt(e->ti32, (unsigned)i, 0);
  return LLVMBuildShuffleVector(e->b, a, c, LLVMConstVector(idx, W), "");
}

/* Lanes whose index has bit k set. */
static LLVMValueRef bit_set(E *e, LLVMValueRef idx, int k) {
  return LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, idx, ci32(e, 1u << k), ""), ci32(e, 0), "");
}

/* t[idx] by a gather from a constant array of the module. */
static LLVMValueRef gather(E *e, const float *t, int n, LLVMValueRef idx) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef init[256];
  for (int i = 0; i < n; i++)
    init[i] = LLVMConstReal(e->tf32, t[i]);
  LLVMValueRef arr = LLVMAddGlobal(e->m, LLVMArrayType2(e->tf32, (unsigned)n), "optc_table");
  LLVMSetInitializer(arr, LLVMConstArray2(e->tf32, init, (uint64_t)n));
  LLVMSetGlobalConstant(arr, 1);
  LLVMSetLinkage(arr, LLVMPrivateLinkage);
  LLVMSetAlignment(arr, 64);
  LLVMValueRef ptrs = LLVMBuildGEP2(b, e->tf32, arr, &idx, 1, "");
  LLVMTypeRef vf = vec(e->tf32, W);
  LLVMTypeRef over[2] = {vf, LLVMTypeOf(ptrs)};
  LLVMValueRef args[4] = {ptrs, LLVMConstInt(e->ti32, 4, 0), splat_const(LLVMConstInt(e->ti1, 1, 0), W),
                          LLVMGetUndef(vf)};
  return call_intrinsic(e, "llvm.masked.gather", over, 2, args, 4);
}

/* t[idx] for n entries (a power of two up to 256), idx in [0, n). */
LLVMValueRef table_lookup(E *e, const float *t, int n, LLVMValueRef idx) {
  LLVMBuilderRef b = e->b;
  if (n == 1)
    return fconst(vec(e->tf32, W), t[0]);
  if (n == 2)
    return LLVMBuildSelect(b, bit_set(e, idx, 0), fconst(vec(e->tf32, W), t[1]), fconst(vec(e->tf32, W), t[0]), "");
  if (e->avx512) {
    if (n <= 16) { /* vpermps: the table repeated to 16 lanes (its index is below n) */
      float rep[W];
      for (int i = 0; i < W; i++)
        rep[i] = t[i % n];
      LLVMValueRef args[2] = {const_floats(e, rep, W), idx};
      return call_intrinsic(e, "llvm.x86.avx512.permvar.sf.512", NULL, 0, args, 2);
    }
    /* vpermt2ps on 32 entries a piece (it reads the index's low 5 bits),
     * the pieces chosen by the bits above */
    int np = n / 32;
    LLVMValueRef piece[8];
    for (int k = 0; k < np; k++) {
      LLVMValueRef args[3] = {const_floats(e, t + 32 * k, W), idx, const_floats(e, t + 32 * k + 16, W)};
      piece[k] = call_intrinsic(e, "llvm.x86.avx512.vpermi2var.ps.512", NULL, 0, args, 3);
    }
    for (int bit = 5; np > 1; bit++, np /= 2) {
      LLVMValueRef hi = bit_set(e, idx, bit);
      for (int k = 0; k < np / 2; k++)
        piece[k] = LLVMBuildSelect(b, hi, piece[2 * k + 1], piece[2 * k], "");
    }
    return piece[0];
  }
  if (n <= 16) {
    /* AVX2's vpermps: 8 entries a register, on each half of the vector */
    LLVMValueRef half[2];
    for (int h = 0; h < 2; h++) {
      LLVMValueRef ix = lanes_of(e, idx, h * W / 2, W / 2);
      LLVMValueRef r[2] = {NULL, NULL};
      for (int k = 0; k < (n + 7) / 8; k++) {
        float rep[8];
        for (int i = 0; i < 8; i++)
          rep[i] = t[(8 * k + i) % n];
        LLVMValueRef args[2] = {const_floats(e, rep, 8), ix};
        r[k] = call_intrinsic(e, "llvm.x86.avx2.permps", NULL, 0, args, 2);
      }
      if (n == 16) {
        LLVMValueRef hi = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, ix, splat_const(LLVMConstInt(e->ti32, 8, 0), 8), ""),
                                        LLVMConstNull(LLVMTypeOf(ix)), "");
        r[0] = LLVMBuildSelect(b, hi, r[1], r[0], "");
      }
      half[h] = r[0];
    }
    return concat(e, half[0], half[1]);
  }
  return gather(e, t, n, idx);
}

/* optc_code_count: the code of each lane of y (f32) in code book cb, by the
 * binary search of its thresholds. */
LLVMValueRef code_search(E *e, const CodeBook *cb, LLVMValueRef y) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef c = ci32(e, 0);
  float sub[128];
  for (int s = cb->n / 2, sh = 0; s >= 1; s /= 2) {
    /* the thresholds this step can compare: t[k * 2s + s - 1] at k = c / 2s */
    int m = cb->n / (2 * s);
    for (int k = 0; k < m; k++)
      sub[k] = cb->t[k * 2 * s + s - 1];
    while ((1 << sh) < 2 * s)
      sh++;
    LLVMValueRef k = m == 1 ? ci32(e, 0) : LLVMBuildLShr(b, c, ci32(e, (uint32_t)sh), "");
    LLVMValueRef thr = table_lookup(e, sub, m, k);
    LLVMValueRef up = LLVMBuildFCmp(b, LLVMRealOGE, y, thr, "");
    c = LLVMBuildAdd(b, c, LLVMBuildSelect(b, up, ci32(e, (uint32_t)s), ci32(e, 0), ""), "");
    sh = 0;
  }
  return c;
}

/* ---- the block loop ----------------------------------------------------------------------- */

bool block_phases_supported(const Graph *g) {
  const Plan *p = g->plan;
  for (int k = 0; k < p->nphases; k++) {
    const PlanPhase *ph = &p->phases[k];
    bool blocks = false;
    for (Ref i = ph->lo; i < ph->hi; i++)
      blocks |= g->ins[i].scope == SCOPE_BLOCK;
    if (blocks && ph->nreds > 0) {
      error("cpu backend: phase %d has block reductions and reductions over the group; a phase here runs one or "
            "the other", k);
      return false;
    }
    if (blocks && g->block < W) {
      error("cpu backend: blocks of %d elements; the CPU backend's are %d or more", g->block, W);
      return false;
    }
  }
  return true;
}

bool block_phase(const E *e) {
  for (Ref i = e->ph->lo; i < e->ph->hi; i++)
    if (e->g->ins[i].scope == SCOPE_BLOCK)
      return true;
  return false;
}

static bool is_bred(const Ins *x) { return x->op == OP_REDUCE && x->to == SCOPE_BLOCK; }

/* Marks the element values a later block stage reads (e->cross, ncross). */
static void find_crossing(E *e) {
  const Graph *g = e->g;
  const uint8_t *bst = g->plan->bstage;
  e->ncross = 0;
  uint8_t *seen = calloc((size_t)g->nins + 1, 1);
  ASSERT(seen);
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope != SCOPE_ELEM || is_bred(x))
      continue;
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      Ref r = x->args[k];
      if (g->ins[r].scope == SCOPE_ELEM && bst[r] < bst[i] && !seen[r]) {
        seen[r] = 1;
        e->cross[e->ncross++] = r;
      }
    }
  }
  free(seen);
}

/* The scratch slot of cross value c for the vector vi of the block. */
static LLVMValueRef slot(E *e, LLVMValueRef *scratch, int c, LLVMValueRef vi) {
  Ref r = e->cross[c];
  LLVMTypeRef vt = vtype(e, (Type)e->g->ins[r].type);
  if (e->g->ins[r].type == TY_BOOL)
    vt = vec(e->ti1, W);
  return LLVMBuildGEP2(e->b, vt, scratch[c], &vi, 1, "");
}

/* One vector of block stage bs at e->j (masked by e->mask): its element
 * values, stores and reductions' terms (acc, nan: per block reduction). */
static void stage_body(E *e, int bs, LLVMValueRef *scratch, LLVMValueRef vi, LLVMValueRef *bval, LLVMValueRef *acc,
                       LLVMValueRef *nan) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  const uint8_t *bst = g->plan->bstage;
  LLVMBuilderRef b = e->b;
  const Loop lp = {0};
  forget(e);
  for (Ref i = ph->lo; i < ph->hi; i++)
    if (bval[i])
      e->val[i] = bval[i];
  for (int c = 0; c < e->ncross; c++) {
    Ref r = e->cross[c];
    if (bst[r] < bs) {
      LLVMTypeRef vt = g->ins[r].type == TY_BOOL ? vec(e->ti1, W) : vtype(e, (Type)g->ins[r].type);
      e->val[r] = LLVMBuildLoad2(b, vt, slot(e, scratch, c, vi), "");
    }
  }
  int nb = 0;
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (is_bred(x)) {
      if (bst[i] == bs + 1) {
        /* the block's max so far, NaNs apart: a NaN anywhere makes it the
         * default NaN at the end (interp.c) */
        Type at = (Type)g->ins[x->args[0]].type;
        LLVMValueRef v = operand(e, x->args[0]);
        if (at == TY_BF16 || at == TY_F16)
          v = to_f32(e, v, at);
        if (x->red == RED_ABSMAX)
          v = unary_intrinsic(e, "llvm.fabs", v);
        LLVMValueRef isnan = LLVMBuildFCmp(b, LLVMRealUNO, v, v, "");
        LLVMValueRef more = LLVMBuildFCmp(b, LLVMRealOGT, v, acc[nb], "");
        if (e->mask) {
          isnan = LLVMBuildAnd(b, isnan, e->mask, "");
          more = LLVMBuildAnd(b, more, e->mask, "");
        }
        acc[nb] = LLVMBuildSelect(b, more, v, acc[nb], "");
        nan[nb] = LLVMBuildOr(b, nan[nb], isnan, "");
      }
      nb++;
      continue;
    }
    if (x->scope != SCOPE_ELEM || bst[i] != bs)
      continue;
    if (x->op == OP_LOAD)
      e->val[i] = load_vec(e, x->buf);
    else if (x->op == OP_STORE)
      store_vec(e, x->buf, operand(e, x->args[0]));
    else
      e->val[i] = emit_ins(e, i, &lp);
  }
  for (int c = 0; c < e->ncross; c++)
    if (bst[e->cross[c]] == bs)
      LLVMBuildStore(b, e->val[e->cross[c]], slot(e, scratch, c, vi));
}

/* A loop over vectors [0, nvec) of the block at boff, each at e->j = boff +
 * 16 v, then the block's last blen % W elements masked, where there are. */
static void stage_loop(E *e, LLVMValueRef fn, int bs, LLVMValueRef boff, LLVMValueRef blen, LLVMValueRef *scratch,
                       LLVMValueRef *bval, LLVMValueRef *acc, LLVMValueRef *nan) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  int nbr = e->ph->nbreds;
  LLVMValueRef wv = LLVMConstInt(e->ti64, W, 0);
  LLVMValueRef nvec = LLVMBuildUDiv(b, blen, wv, "");
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
  LLVMBasicBlockRef cond = LLVMAppendBasicBlockInContext(c, fn, "stage");
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(c, fn, "stage.body");
  LLVMBasicBlockRef tail = LLVMAppendBasicBlockInContext(c, fn, "stage.tail");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c, fn, "stage.done");
  LLVMBuildBr(b, cond);
  LLVMPositionBuilderAtEnd(b, cond);
  LLVMValueRef v = LLVMBuildPhi(b, e->ti64, "v");
  LLVMValueRef aphi[64], nphi[64];
  for (int r = 0; r < nbr; r++) {
    aphi[r] = LLVMBuildPhi(b, LLVMTypeOf(acc[r]), "bacc");
    nphi[r] = LLVMBuildPhi(b, LLVMTypeOf(nan[r]), "bnan");
  }
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntULT, v, nvec, ""), body, tail);
  LLVMPositionBuilderAtEnd(b, body);
  LLVMValueRef a2[64], n2[64];
  memcpy(a2, aphi, sizeof(LLVMValueRef) * (size_t)nbr);
  memcpy(n2, nphi, sizeof(LLVMValueRef) * (size_t)nbr);
  e->mask = NULL;
  e->j = LLVMBuildAdd(b, boff, LLVMBuildMul(b, v, wv, ""), "");
  stage_body(e, bs, scratch, v, bval, a2, n2);
  LLVMValueRef vnext = LLVMBuildAdd(b, v, LLVMConstInt(e->ti64, 1, 0), "");
  LLVMBasicBlockRef body_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, cond);
  LLVMAddIncoming(v, (LLVMValueRef[]){LLVMConstInt(e->ti64, 0, 0), vnext}, (LLVMBasicBlockRef[]){pre, body_end}, 2);
  for (int r = 0; r < nbr; r++) {
    LLVMAddIncoming(aphi[r], (LLVMValueRef[]){acc[r], a2[r]}, (LLVMBasicBlockRef[]){pre, body_end}, 2);
    LLVMAddIncoming(nphi[r], (LLVMValueRef[]){nan[r], n2[r]}, (LLVMBasicBlockRef[]){pre, body_end}, 2);
  }
  /* the tail: blen % W elements, masked */
  LLVMPositionBuilderAtEnd(b, tail);
  LLVMValueRef rem = LLVMBuildURem(b, blen, wv, "");
  LLVMBasicBlockRef masked = LLVMAppendBasicBlockInContext(c, fn, "stage.masked");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntNE, rem, LLVMConstInt(e->ti64, 0, 0), ""), masked, done);
  LLVMPositionBuilderAtEnd(b, masked);
  LLVMValueRef lanes[W];
  for (int i = 0; i < W; i++)
    lanes[i] = LLVMConstInt(e->ti64, (unsigned)i, 0);
  e->mask = LLVMBuildICmp(b, LLVMIntULT, LLVMConstVector(lanes, W), broadcast(e, rem), "mask");
  e->j = LLVMBuildAdd(b, boff, LLVMBuildMul(b, nvec, wv, ""), "");
  LLVMValueRef a3[64], n3[64];
  memcpy(a3, aphi, sizeof(LLVMValueRef) * (size_t)nbr);
  memcpy(n3, nphi, sizeof(LLVMValueRef) * (size_t)nbr);
  stage_body(e, bs, scratch, nvec, bval, a3, n3);
  e->mask = NULL;
  LLVMBasicBlockRef masked_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, done);
  LLVMPositionBuilderAtEnd(b, done);
  for (int r = 0; r < nbr; r++) {
    LLVMValueRef pa = LLVMBuildPhi(b, LLVMTypeOf(acc[r]), "bacc.end");
    LLVMValueRef pn = LLVMBuildPhi(b, LLVMTypeOf(nan[r]), "bnan.end");
    LLVMAddIncoming(pa, (LLVMValueRef[]){aphi[r], a3[r]}, (LLVMBasicBlockRef[]){tail, masked_end}, 2);
    LLVMAddIncoming(pn, (LLVMValueRef[]){nphi[r], n3[r]}, (LLVMBasicBlockRef[]){tail, masked_end}, 2);
    acc[r] = pa;
    nan[r] = pn;
  }
}

/* The block-scope values of block stage bs (bval: broadcast vectors): the
 * per-block loads at bs = 0, the reductions' results, the ops on them. */
static void block_values(E *e, int bs, LLVMValueRef boff, LLVMValueRef *bval, LLVMValueRef *acc, LLVMValueRef *nan) {
  const Graph *g = e->g;
  const uint8_t *bst = g->plan->bstage;
  LLVMBuilderRef b = e->b;
  const Loop lp = {0};
  forget(e);
  for (Ref i = e->ph->lo; i < e->ph->hi; i++)
    if (bval[i])
      e->val[i] = bval[i];
  LLVMValueRef bidx = LLVMBuildUDiv(b, boff, LLVMConstInt(e->ti64, (unsigned)g->block, 0), "");
  int nb = 0;
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    const Ins *x = &g->ins[i];
    bool red = is_bred(x);
    if (x->scope != SCOPE_BLOCK || x->op == OP_STORE || bst[i] != bs) {
      nb += red;
      continue;
    }
    if (red) {
      /* the lanes' maximum; the default NaN where a lane saw one */
      LLVMValueRef m = unary_intrinsic(e, "llvm.vector.reduce.fmax", acc[nb]);
      LLVMValueRef any = unary_intrinsic(e, "llvm.vector.reduce.or", nan[nb]);
      m = LLVMBuildFPExt(b, m, e->tf64, "");
      m = LLVMBuildSelect(b, any, LLVMConstReal(e->tf64, NAN), m, "");
      bval[i] = broadcast(e, m);
      nb++;
    } else if (x->op == OP_LOAD) {
      Type t = (Type)g->bufs[x->buf].type;
      LLVMValueRef p = LLVMBuildGEP2(b, scalar_type(e, t), e->bufptr[x->buf], &bidx, 1, "");
      bval[i] = broadcast(e, LLVMBuildLoad2(b, scalar_type(e, t), p, ""));
    } else {
      bval[i] = emit_ins(e, i, &lp);
    }
    e->val[i] = bval[i];
  }
}

/* The block's stores to per-block buffers: lane 0 of each value. */
static void block_stores(E *e, LLVMValueRef boff, LLVMValueRef *bval) {
  const Graph *g = e->g;
  LLVMBuilderRef b = e->b;
  LLVMValueRef bidx = LLVMBuildUDiv(b, boff, LLVMConstInt(e->ti64, (unsigned)g->block, 0), "");
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->op != OP_STORE || x->scope != SCOPE_BLOCK)
      continue;
    Ref a = x->args[0];
    LLVMValueRef v = g->ins[a].scope == SCOPE_STEP ? operand(e, a) : bval[a];
    ASSERT(v);
    Type t = (Type)g->bufs[x->buf].type;
    LLVMValueRef s = LLVMBuildExtractElement(b, v, LLVMConstInt(e->ti32, 0, 0), "");
    LLVMBuildStore(b, s, LLVMBuildGEP2(b, scalar_type(e, t), e->bufptr[x->buf], &bidx, 1, ""));
  }
}

/* The chunk's elements [0, len) block by block: from the current builder
 * position (the chunk's buffers, step values and keys set), ending in the
 * block the chunk's loop goes on from (left unterminated). */
void block_chunk(E *e, LLVMValueRef fn, LLVMValueRef len, LLVMValueRef *scratch) {
  const Graph *g = e->g;
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  int nbr = e->ph->nbreds;
  LLVMValueRef bsz = LLVMConstInt(e->ti64, (unsigned)g->block, 0);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
  LLVMBasicBlockRef cond = LLVMAppendBasicBlockInContext(c, fn, "block");
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(c, fn, "block.body");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(c, fn, "block.exit");
  LLVMBuildBr(b, cond);
  LLVMPositionBuilderAtEnd(b, cond);
  LLVMValueRef boff = LLVMBuildPhi(b, e->ti64, "boff");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntULT, boff, len, ""), body, exit);
  LLVMPositionBuilderAtEnd(b, body);
  LLVMValueRef left = LLVMBuildSub(b, len, boff, "");
  LLVMValueRef blen = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntULT, left, bsz, ""), left, bsz, "blen");
  LLVMValueRef *bval = calloc((size_t)g->nins + 1, sizeof(LLVMValueRef));
  ASSERT(bval && nbr <= 64);
  LLVMValueRef acc[64], nan[64];
  for (int bs = 0; bs < e->ph->nbstages; bs++) {
    block_values(e, bs, boff, bval, acc, nan);
    int nb = 0;
    for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
      const Ins *x = &g->ins[i];
      if (!is_bred(x))
        continue;
      Type at = (Type)g->ins[x->args[0]].type;
      LLVMTypeRef vt = vtype(e, at == TY_F64 ? TY_F64 : TY_F32);
      acc[nb] = fconst(vt, -INFINITY);
      nan[nb] = LLVMConstNull(vec(e->ti1, W));
      nb++;
    }
    stage_loop(e, fn, bs, boff, blen, scratch, bval, acc, nan);
  }
  block_stores(e, boff, bval);
  free(bval);
  LLVMValueRef next = LLVMBuildAdd(b, boff, bsz, "");
  LLVMBasicBlockRef body_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, cond);
  LLVMAddIncoming(boff, (LLVMValueRef[]){LLVMConstInt(e->ti64, 0, 0), next}, (LLVMBasicBlockRef[]){pre, body_end}, 2);
  LLVMPositionBuilderAtEnd(b, exit);
}

/* The scratch of a block phase's crossing values: one vector per W
 * elements of a block, each, allocated in the function's entry. */
void block_scratch(E *e, LLVMValueRef *scratch) {
  find_crossing(e);
  for (int c = 0; c < e->ncross; c++) {
    Ref r = e->cross[c];
    LLVMTypeRef vt = e->g->ins[r].type == TY_BOOL ? vec(e->ti1, W) : vtype(e, (Type)e->g->ins[r].type);
    scratch[c] = LLVMBuildArrayAlloca(e->b, vt, LLVMConstInt(e->ti64, (unsigned)(e->g->block / W), 0), "scratch");
  }
}
