/* llama4_impl.h: the decoder's forward and backward, written once over a
 * REAL element type. llama4.c includes it twice, defining
 *   REAL            float | double
 *   SUF(name)       name##_f32 | name##_f64
 *   GEMM            cblas_sgemm | cblas_dgemm
 *   R_EXP R_LOG R_SQRT   the libm functions of that type
 * and struct L4Model, the T_* tensor slots (layer_first, moe_layers_before),
 * L4_ROW_BLOCK, head_block_rows and wgrad_chunk_rows before it.
 * No include guard, on purpose.
 *
 * Notation: N = B*T tokens, D = embed_dim, QD = nh*hd, KVD = nkv*hd, E
 * experts of width H, shared width Hs, dense layers' width Hm; Lm MoE
 * layers and Ld dense ones. Matmuls are nn.Linear's y = x W^T
 * with W (out, in) unless a comment says otherwise. Reductions over a row
 * (norms, softmax sums) accumulate in double in both precisions.
 *
 * The work is a sequence of phases, each a list of independent tasks that
 * blas_tasks hands to the pool's threads (llm.c's layout, one phase where
 * PyTorch launches a kernel per op):
 *   - row blocks: L4_ROW_BLOCK tokens through every per-token op of a stretch
 *     of the layer (RMSNorm, the projections, RoPE with QK-norm, SwiGLU, the
 *     router's top-1), each op fused with its neighbours over the block;
 *   - items: one attention (row, head), one expert's tokens;
 *   - weight gradients: dW += dY^T X split by rows of dW, each row summed
 *     over every token, and norm weights' gradients summed over tokens in
 *     token order.
 * No task reads what another task of its phase writes, and every sum runs
 * in the same order whatever the thread count: the bits do not depend on
 * it. */

/* ---- views ------------------------------------------------------------------------ */
/* One layer's parameters (or gradients), pointers into the caller's tensors.
 * A dense layer has no experts or router (NULL there); its MLP takes the
 * shared expert's place, since the two are the same module (HF's
 * Llama4TextMLP) at another width. */
typedef struct {
  REAL *wq;      /* (QD, D) self_attn.q_proj.weight */
  REAL *wk;      /* (KVD, D) */
  REAL *wv;      /* (KVD, D) */
  REAL *wo;      /* (D, QD) */
  REAL *gate_up; /* (E, D, 2H) experts.gate_up_proj: x @ gate_up[e], gate first */
  REAL *down;    /* (E, H, D) experts.down_proj: h @ down[e] */
  REAL *router;  /* (E, D) */
  REAL *sgate;   /* (Hs, D) shared_expert.gate_proj.weight; dense: (Hm, D) gate_proj.weight */
  REAL *sup;     /* (Hs, D); dense: (Hm, D) up_proj.weight */
  REAL *sdown;   /* (D, Hs); dense: (D, Hm) down_proj.weight */
  REAL *ln1;     /* (D) input_layernorm.weight */
  REAL *ln2;     /* (D) post_attention_layernorm.weight */
} SUF(LayerW);

static SUF(LayerW) SUF(layer_weights)(const L4Config *c, REAL *const *p, int l) {
  REAL *const *t = p + T_LAYER(c, l);
  if (!l4_layer_is_moe(c, l))
    return (SUF(LayerW)){
      .wq = t[T_WQ], .wk = t[T_WK], .wv = t[T_WV], .wo = t[T_WO],
      .sgate = t[T_MGATE], .sup = t[T_MUP], .sdown = t[T_MDOWN],
      .ln1 = t[T_DENSE_NORMS], .ln2 = t[T_DENSE_NORMS + 1],
    };
  return (SUF(LayerW)){
    .wq = t[T_WQ], .wk = t[T_WK], .wv = t[T_WV], .wo = t[T_WO],
    .gate_up = t[T_GATE_UP], .down = t[T_DOWN], .router = t[T_ROUTER],
    .sgate = t[T_SGATE], .sup = t[T_SUP], .sdown = t[T_SDOWN],
    .ln1 = t[T_MOE_NORMS], .ln2 = t[T_MOE_NORMS + 1],
  };
}

/* The workspace. Per-layer arrays hold max_batch*max_seq rows per layer;
 * a run with fewer tokens uses the front of each layer's slice. */
typedef struct {
  /* what the forward keeps for the backward */
  REAL *res;      /* (L+1, N, D) residual stream: res[l] enters layer l, res[L] the final norm */
  REAL *h;        /* (L, N, D) residual after attention */
  REAL *ln1;      /* (L, N, D) */
  REAL *ln1_rstd; /* (L, N) */
  REAL *q;        /* (L, N, QD) as attention reads it: after RoPE, QK-norm or temperature */
  REAL *q_rstd;   /* (L, N, nh) QK-norm's 1/rms */
  REAL *k;        /* (L, N, KVD) */
  REAL *k_rstd;   /* (L, N, nkv) */
  REAL *v;        /* (L, N, KVD) */
  REAL *lse;      /* (L, B, nh, T) log-sum-exp of each score row; the backward recomputes
                     the probabilities from it instead of keeping (B, nh, T, T) per layer */
  REAL *att;      /* (L, N, QD) attention output, o_proj's input */
  REAL *ln2;      /* (L, N, D) */
  REAL *ln2_rstd; /* (L, N) */
  REAL *score;    /* (L, N) sigmoid(router logit) of the chosen expert */
  REAL *gu;       /* (Lm, N, 2H) routed gate|up pre-activations, rows in expert order */
  REAL *sg;       /* (N, Hs) per MoE layer, (N, Hm) per dense one, in layer order:
                     the MLP's gate pre-activation (shared expert or dense MLP) */
  REAL *su;       /* as sg: the MLP's up */
  REAL *lnf;      /* (N, D) final norm output */
  REAL *lnf_rstd; /* (N) */
  REAL *rope_cos; /* (N, hd/2) cos(pos * inv_freq[i]) of this batch */
  REAL *rope_sin; /* (N, hd/2) */
  REAL *temp;     /* (N) NoPE layers' query temperature */
  /* scratch, reused by every layer */
  REAL *logits;   /* (head rows, V) one block of the output head, then its gradient */
  REAL *rlogits;  /* (N, E) router logits */
  REAL *xin;      /* (N, D) routed input x*score in expert order; its gradient in backward */
  REAL *ybuf;     /* (N, D) routed output in expert order; the gathered dout in backward */
  REAL *hid;      /* (N, Hmax) the MLP's silu(gate) * up; Hmax = max(Hs, Hm if Ld > 0) */
  REAL *dhid;     /* (N, Hmax) */
  REAL *dgu;      /* (2, N, Hmax) the MLP's dgate, then dup */
  REAL *ehid;     /* (N, H) the experts' silu(gate) * up, expert order */
  REAL *edhid;    /* (N, H) */
  REAL *edgu;     /* (N, 2H) gradient of the experts' gate|up */
  REAL *dres;     /* (N, D) gradient of the residual stream */
  REAL *dln;      /* (N, D) gradient of a norm's output */
  REAL *datt;     /* (N, QD) */
  REAL *dq;       /* (N, QD) */
  REAL *dk;       /* (N, KVD) */
  REAL *dv;       /* (N, KVD) */
} SUF(Acts);

/* Lays the workspace out from base; returns its element count. With base
 * NULL only counts (a may then be NULL too). */
static size_t SUF(acts_bind)(const L4Model *m, REAL *base, SUF(Acts) *a) {
  const L4Config *c = &m->c;
  size_t N = (size_t)m->max_batch * m->max_seq, L = c->num_layers;
  size_t D = c->embed_dim, nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
  size_t QD = nh * hd, KVD = nkv * hd, E = c->num_experts, H = c->hidden_dim;
  size_t Hs = c->shared_hidden_dim, V = c->vocab_size;
  size_t Lm = moe_layers_before(c, c->num_layers), Ld = L - Lm;
  size_t Hm = Ld ? (size_t)c->mlp_hidden_dim : 0;
  size_t Hmax = Hs > Hm ? Hs : Hm;
  size_t mlp = N * (Lm * Hs + Ld * Hm); /* sg and su: every layer's MLP width */
  if (m->ac) { /* activation checkpointing: one layer's activations, recomputed for each backward */
    mlp = N * Hmax;
    L = 1, Lm = Lm ? 1 : 0;
  }
  SUF(Acts) unused;
  if (!a) a = &unused;
  size_t off = 0;
#define TAKE(f, n) (a->f = base ? base + off : NULL, off += (n))
  TAKE(res, ((size_t)c->num_layers + 1) * N * D); /* every layer's input, checkpointed or not */
  TAKE(h, L * N * D);
  TAKE(ln1, L * N * D);
  TAKE(ln1_rstd, L * N);
  TAKE(q, L * N * QD);
  TAKE(q_rstd, L * N * nh);
  TAKE(k, L * N * KVD);
  TAKE(k_rstd, L * N * nkv);
  TAKE(v, L * N * KVD);
  TAKE(lse, L * N * nh);
  TAKE(att, L * N * QD);
  TAKE(ln2, L * N * D);
  TAKE(ln2_rstd, L * N);
  TAKE(score, L * N);
  TAKE(gu, Lm * N * 2 * H);
  TAKE(sg, mlp);
  TAKE(su, mlp);
  TAKE(lnf, N * D);
  TAKE(lnf_rstd, N);
  TAKE(rope_cos, N * (hd / 2));
  TAKE(rope_sin, N * (hd / 2));
  TAKE(temp, N);
  TAKE(logits, head_block_rows(N, V) * V);
  TAKE(rlogits, N * E);
  TAKE(xin, N * D);
  TAKE(ybuf, N * D);
  TAKE(hid, N * Hmax);
  TAKE(dhid, N * Hmax);
  TAKE(dgu, 2 * N * Hmax);
  TAKE(ehid, Lm ? N * H : 0);
  TAKE(edhid, Lm ? N * H : 0);
  TAKE(edgu, Lm ? N * 2 * H : 0);
  TAKE(dres, N * D);
  TAKE(dln, N * D);
  TAKE(datt, N * QD);
  TAKE(dq, N * QD);
  TAKE(dk, N * KVD);
  TAKE(dv, N * KVD);
#undef TAKE
  return off;
}

/* Layer l's slices of the workspace. */
typedef struct {
  REAL *x, *h, *out;                    /* (N, D) input, after attention, output */
  REAL *ln1, *ln1_rstd, *q, *q_rstd, *k, *k_rstd, *v, *lse, *att;
  REAL *ln2, *ln2_rstd, *score, *gu, *sg, *su; /* gu: NULL on a dense layer */
  int32_t *choice, *order, *offsets;    /* (N), (N), (E+1) */
  int moe, mw;                          /* an MoE layer?; its MLP's width, Hs or Hm */
} SUF(LayerActs);

static SUF(LayerActs) SUF(layer_acts)(const L4Model *m, const SUF(Acts) *a, int l) {
  const L4Config *c = &m->c;
  size_t N = (size_t)m->max_batch * m->max_seq, D = c->embed_dim;
  size_t nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim, L = l;
  int moe = l4_layer_is_moe(c, l);
  size_t Lm = moe_layers_before(c, l), Ld = L - Lm; /* layers before l of each kind */
  size_t mlp = N * (Lm * c->shared_hidden_dim + Ld * c->mlp_hidden_dim);
  const REAL *res = a->res;
  if (m->ac) /* checkpointed: every layer's activations in the one slot, its input in res[l] */
    L = 0, Lm = 0, mlp = 0;
  return (SUF(LayerActs)){
    .x = (REAL *)res + (size_t)l * N * D, .h = a->h + L * N * D, .out = (REAL *)res + (size_t)(l + 1) * N * D,
    .ln1 = a->ln1 + L * N * D, .ln1_rstd = a->ln1_rstd + L * N,
    .q = a->q + L * N * nh * hd, .q_rstd = a->q_rstd + L * N * nh,
    .k = a->k + L * N * nkv * hd, .k_rstd = a->k_rstd + L * N * nkv,
    .v = a->v + L * N * nkv * hd, .lse = a->lse + L * N * nh, .att = a->att + L * N * nh * hd,
    .ln2 = a->ln2 + L * N * D, .ln2_rstd = a->ln2_rstd + L * N, .score = a->score + L * N,
    .gu = moe ? a->gu + Lm * N * 2 * c->hidden_dim : NULL, .sg = a->sg + mlp, .su = a->su + mlp,
    .choice = m->choice + (size_t)l * N, .order = m->order + (size_t)l * N,
    .offsets = m->offsets + (size_t)l * (c->num_experts + 1),
    .moe = moe, .mw = moe ? c->shared_hidden_dim : c->mlp_hidden_dim,
  };
}

/* ---- matmuls -------------------------------------------------------------------- */
/* y (n, out) = x (n, in) @ w (out, in)^T + beta * y */
static void SUF(matmul_forward)(REAL *y, const REAL *x, const REAL *w, int n, int in, int out,
                                REAL beta) {
  GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1, x, in, w, in, beta, y, out);
}

/* dx (n, in) = dy (n, out) @ w (out, in) + beta * dx */
static void SUF(matmul_dx)(REAL *dx, const REAL *dy, const REAL *w, int n, int in, int out,
                           REAL beta) {
  GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1, dy, out, w, in, beta, dx, in);
}

/* A weight gradient dw (out, in) += dy^T @ x over n tokens, dy rows of
 * stride ldy, x rows of stride ldx; done in tasks of `chunk` rows of dw. */
typedef struct {
  REAL *dw;
  const REAL *dy, *x;
  int out, in, n, ldy, ldx, chunk, ntasks;
} SUF(WGrad);

static SUF(WGrad) SUF(wgrad)(REAL *dw, const REAL *dy, int ldy, const REAL *x, int ldx, int out,
                             int in, int n) {
  int chunk = wgrad_chunk_rows(out, in);
  return (SUF(WGrad)){dw, dy, x, out, in, n, ldy, ldx, chunk, (out + chunk - 1) / chunk};
}

static void SUF(wgrad_task)(const SUF(WGrad) *g, int k) {
  int o0 = k * g->chunk, rows = g->out - o0 < g->chunk ? g->out - o0 : g->chunk;
  GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, rows, g->in, g->n, 1, g->dy + o0, g->ldy, g->x,
       g->ldx, 1, g->dw + (size_t)o0 * g->in, g->in);
}

/* ---- RMSNorm: y = x / sqrt(mean(x^2) + eps) * w ------------------------------------- */
static void SUF(rmsnorm_forward)(REAL *y, REAL *rstd, const REAL *x, const REAL *w, int n,
                                 int d, double eps) {
  for (int t = 0; t < n; t++) {
    const REAL *xt = x + (size_t)t * d;
    REAL *yt = y + (size_t)t * d;
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)xt[i] * xt[i];
    REAL r = (REAL)(1.0 / sqrt(ss / d + eps));
    rstd[t] = r;
    for (int i = 0; i < d; i++) yt[i] = xt[i] * r * w[i];
  }
}

/* With xhat = x*r: dx += r * (dy*w - xhat * mean(dy*w*xhat)), rows [0, n).
 * The weight's gradient is norm_wgrad's, summed over all rows at once. */
static void SUF(rmsnorm_dx)(REAL *dx, const REAL *dy, const REAL *x, const REAL *rstd,
                            const REAL *w, int n, int d) {
  for (int t = 0; t < n; t++) {
    const REAL *xt = x + (size_t)t * d, *dyt = dy + (size_t)t * d;
    REAL *dxt = dx + (size_t)t * d, r = rstd[t];
    double dot = 0;
    for (int i = 0; i < d; i++) dot += (double)dyt[i] * w[i] * xt[i] * r;
    REAL mean = (REAL)(dot / d);
    for (int i = 0; i < d; i++) {
      REAL xhat = xt[i] * r;
      dxt[i] += r * (dyt[i] * w[i] - xhat * mean);
    }
  }
}

/* A norm weight's gradient dw += sum over tokens of dy * x * r, in token order. */
typedef struct {
  REAL *dw;
  const REAL *dy, *x, *rstd;
} SUF(NGrad);

static void SUF(ngrad_task)(const SUF(NGrad) *g, int n, int d) {
  for (int t = 0; t < n; t++) {
    const REAL *xt = g->x + (size_t)t * d, *dyt = g->dy + (size_t)t * d;
    REAL r = g->rstd[t];
    for (int i = 0; i < d; i++) g->dw[i] += dyt[i] * (xt[i] * r);
  }
}

/* ---- RoPE on interleaved pairs, (x[2i] + i x[2i+1]) * e^{i pos f_i}, then
 * on QK-norm layers HF's Llama4TextL2Norm, x / sqrt(mean(x^2) + eps) per head
 * with no weight: one pass per head. rstd NULL: no norm. */
static void SUF(rope_norm_forward)(REAL *x, REAL *rstd, const SUF(Acts) *a, int t0, int n,
                                   int heads, int hd, double eps) {
  int half = hd / 2;
  for (int t = 0; t < n; t++) {
    const REAL *ct = a->rope_cos + (size_t)(t0 + t) * half;
    const REAL *st = a->rope_sin + (size_t)(t0 + t) * half;
    for (int hh = 0; hh < heads; hh++) {
      REAL *xh = x + ((size_t)t * heads + hh) * hd;
      double ss = 0;
      for (int i = 0; i < half; i++) {
        REAL x0 = xh[2 * i], x1 = xh[2 * i + 1], cs = ct[i], sn = st[i];
        REAL y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
        xh[2 * i] = y0, xh[2 * i + 1] = y1;
        ss += (double)y0 * y0;
        ss += (double)y1 * y1;
      }
      if (!rstd) continue;
      REAL r = (REAL)(1.0 / sqrt(ss / hd + eps));
      rstd[(size_t)t * heads + hh] = r;
      for (int i = 0; i < hd; i++) xh[i] *= r;
    }
  }
}

/* The backward, in place over d: the norm's, y = x*r: d = r * (d - y *
 * mean(d*y)), then the rotation back (a rotation's transpose is its
 * inverse). y is the forward's output; rstd NULL: no norm. */
static void SUF(rope_norm_backward)(REAL *d, const REAL *y, const REAL *rstd, const SUF(Acts) *a,
                                    int t0, int n, int heads, int hd) {
  int half = hd / 2;
  for (int t = 0; t < n; t++) {
    const REAL *ct = a->rope_cos + (size_t)(t0 + t) * half;
    const REAL *st = a->rope_sin + (size_t)(t0 + t) * half;
    for (int hh = 0; hh < heads; hh++) {
      REAL *dh = d + ((size_t)t * heads + hh) * hd;
      const REAL *yh = y + ((size_t)t * heads + hh) * hd;
      REAL r = 1, mean = 0;
      if (rstd) {
        double dot = 0;
        for (int i = 0; i < hd; i++) dot += (double)dh[i] * yh[i];
        mean = (REAL)(dot / hd), r = rstd[(size_t)t * heads + hh];
      }
      for (int i = 0; i < half; i++) {
        REAL g0 = dh[2 * i], g1 = dh[2 * i + 1];
        if (rstd) g0 = r * (g0 - yh[2 * i] * mean), g1 = r * (g1 - yh[2 * i + 1] * mean);
        REAL cs = ct[i], sn = -st[i];
        dh[2 * i] = g0 * cs - g1 * sn;
        dh[2 * i + 1] = g0 * sn + g1 * cs;
      }
    }
  }
}

/* x (n, width) row t scaled by s[t]: the temperature, and its backward. */
static void SUF(rows_scale)(REAL *x, const REAL *s, int n, int width) {
  for (int t = 0; t < n; t++)
    for (int i = 0; i < width; i++) x[(size_t)t * width + i] *= s[t];
}

/* ---- SwiGLU ---------------------------------------------------------------------------- */
static inline REAL SUF(sigmoid)(REAL x) { return 1 / (1 + R_EXP(-x)); }

/* hid (n, width) = silu(gate) * up; gate and up are rows of stride ld. */
static void SUF(swiglu_forward)(REAL *hid, const REAL *gate, const REAL *up, int n, int width,
                                int ld) {
  for (int t = 0; t < n; t++)
    for (int i = 0; i < width; i++) {
      REAL g = gate[(size_t)t * ld + i];
      hid[(size_t)t * width + i] = g * SUF(sigmoid)(g) * up[(size_t)t * ld + i];
    }
}

/* From dhid: dgate = dhid * up * silu'(gate), dup = dhid * silu(gate),
 * silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). gate and up rows have
 * stride ld, dgate and dup rows stride ldd. */
static void SUF(swiglu_backward)(REAL *dgate, REAL *dup, const REAL *dhid, const REAL *gate,
                                 const REAL *up, int n, int width, int ld, int ldd) {
  for (int t = 0; t < n; t++)
    for (int i = 0; i < width; i++) {
      size_t o = (size_t)t * ld + i, od = (size_t)t * ldd + i;
      REAL g = gate[o], s = SUF(sigmoid)(g), dh = dhid[(size_t)t * width + i];
      dgate[od] = dh * up[o] * s * (1 + g * (1 - s));
      dup[od] = dh * g * s;
    }
}

/* ---- a phase: tasks on the pool ---------------------------------------------------------
 * Tasks [0, nitem) are items, then nrow row blocks of L4_ROW_BLOCK tokens,
 * then the weight gradients' chunks, then the norm weights' gradients. */
typedef struct SUF(Phase) SUF(Phase);
struct SUF(Phase) {
  L4Model *m;
  SUF(Acts) *a;
  SUF(LayerActs) *la;
  const SUF(LayerW) *w, *gw;
  const L4Batch *bt;
  REAL *const *p, *const *g; /* all parameters and gradients: the head's phases */
  int l, n, h0, hn;          /* layer, tokens; the head block's first row and rows */
  void (*item)(SUF(Phase) *ph, int k, int slot);
  void (*rows)(SUF(Phase) *ph, int t0, int nt, int slot);
  int nitem, nrow, nwg, nng;
  SUF(WGrad) wg[4];
  SUF(NGrad) ng[2];
};

static void SUF(phase_task)(void *ctx, int k, int slot) {
  SUF(Phase) *ph = ctx;
  if (k < ph->nitem) {
    ph->item(ph, k, slot);
    return;
  }
  k -= ph->nitem;
  if (k < ph->nrow) {
    int t0 = ph->h0 + k * L4_ROW_BLOCK, end = ph->h0 + ph->hn;
    ph->rows(ph, t0, end - t0 < L4_ROW_BLOCK ? end - t0 : L4_ROW_BLOCK, slot);
    return;
  }
  k -= ph->nrow;
  for (int j = 0; j < ph->nwg; j++) {
    if (k < ph->wg[j].ntasks) {
      SUF(wgrad_task)(&ph->wg[j], k);
      return;
    }
    k -= ph->wg[j].ntasks;
  }
  SUF(ngrad_task)(&ph->ng[k], ph->n, ph->m->c.embed_dim);
}

/* Runs the phase: items, rows (over [h0, h0 + hn), all n tokens unless the
 * head set a block), weight and norm gradients. */
static void SUF(phase_run)(SUF(Phase) *ph, int nitem,
                           void (*item)(SUF(Phase) *, int, int),
                           void (*rows)(SUF(Phase) *, int, int, int)) {
  if (ph->hn == 0) ph->h0 = 0, ph->hn = ph->n;
  ph->item = item, ph->nitem = item ? nitem : 0;
  ph->rows = rows, ph->nrow = rows ? (ph->hn + L4_ROW_BLOCK - 1) / L4_ROW_BLOCK : 0;
  int total = ph->nitem + ph->nrow + ph->nng;
  for (int j = 0; j < ph->nwg; j++) total += ph->wg[j].ntasks;
  blas_tasks(ph->m->pool, total, SUF(phase_task), ph);
  ph->nwg = ph->nng = 0, ph->hn = 0;
}

static REAL *SUF(slot_scratch)(const L4Model *m, int slot) {
  return (REAL *)m->scratch + (size_t)slot * 2 * m->max_seq * m->max_seq;
}

/* ---- attention --------------------------------------------------------------------- */
/* May query i attend to key j <= i of the same row? Same segment, and on
 * chunked layers the same chunk (floor(pos / chunk_size), precomputed per
 * token). The diagonal always may, so no row is empty. seg and cid point at
 * the row's first token, or are NULL when that test is off. */
static inline int SUF(attn_allowed)(const int32_t *seg, const int32_t *cid, int i, int j) {
  return (!seg || seg[j] == seg[i]) && (!cid || cid[j] == cid[i]);
}

/* S (T, T) = scale * Q K^T for row b, query head hh; masked entries and
 * j > i are left as they come out: callers look only at allowed ones. */
static void SUF(attn_scores)(const L4Model *m, const SUF(LayerActs) *la, int b, int hh, int T,
                             REAL *S) {
  const L4Config *c = &m->c;
  int hd = c->head_dim, QD = c->num_heads * hd, KVD = c->num_kv_heads * hd;
  int kvh = hh / (c->num_heads / c->num_kv_heads);
  const REAL *Q = la->q + (size_t)b * T * QD + hh * hd;
  const REAL *K = la->k + (size_t)b * T * KVD + kvh * hd;
  GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, (REAL)(1.0 / sqrt(hd)), Q, QD, K, KVD,
       0, S, T);
}

static int SUF(attn_chunked)(const SUF(Phase) *ph) {
  const L4Config *c = &ph->m->c;
  return l4_layer_uses_rope(c, ph->l) && c->attention_chunk_size > 0;
}

/* Item b * nh + hh: att = softmax(mask(scale * q k^T)) v for row b, head
 * hh; keeps each score row's log-sum-exp. */
static void SUF(attention_forward_item)(SUF(Phase) *ph, int item, int slot) {
  const L4Model *m = ph->m;
  const L4Config *c = &m->c;
  const SUF(LayerActs) *la = ph->la;
  int T = ph->bt->T, nh = c->num_heads, hd = c->head_dim, b = item / nh, hh = item % nh;
  int QD = nh * hd, KVD = c->num_kv_heads * hd, grp = nh / c->num_kv_heads;
  const int32_t *seg = ph->bt->segments ? ph->bt->segments + (size_t)b * T : NULL;
  const int32_t *cid = SUF(attn_chunked)(ph) ? m->chunk_id + (size_t)b * T : NULL;
  REAL *S = SUF(slot_scratch)(m, slot);
  SUF(attn_scores)(m, la, b, hh, T, S);
  REAL *lse = la->lse + ((size_t)b * nh + hh) * T;
  for (int i = 0; i < T; i++) {
    REAL *si = S + (size_t)i * T, mx = si[i];
    for (int j = 0; j < i; j++)
      if (SUF(attn_allowed)(seg, cid, i, j) && si[j] > mx) mx = si[j];
    double sum = 0;
    for (int j = 0; j < T; j++) {
      if (j <= i && SUF(attn_allowed)(seg, cid, i, j)) {
        si[j] = R_EXP(si[j] - mx);
        sum += si[j];
      } else {
        si[j] = 0;
      }
    }
    REAL inv = (REAL)(1.0 / sum);
    for (int j = 0; j <= i; j++) si[j] *= inv;
    lse[i] = mx + (REAL)log(sum);
  }
  const REAL *V = la->v + (size_t)b * T * KVD + (hh / grp) * hd;
  REAL *Y = la->att + (size_t)b * T * QD + hh * hd;
  GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1, S, T, V, KVD, 0, Y, QD);
}

/* Item b * nkv + g: from datt, dq (set) for the group's heads, dk and dv
 * (set, summed over the group's heads in order).
 *   P = exp(S - lse) on allowed entries
 *   dP = dY V^T;  dV += P^T dY;  dS = P * (dP - rowsum(P * dP))
 *   dQ = scale dS K;  dK += scale dS^T Q */
static void SUF(attention_backward_item)(SUF(Phase) *ph, int item, int slot) {
  const L4Model *m = ph->m;
  const L4Config *c = &m->c;
  const SUF(LayerActs) *la = ph->la;
  SUF(Acts) *a = ph->a;
  int T = ph->bt->T, nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
  int QD = nh * hd, KVD = nkv * hd, grp = nh / nkv, b = item / nkv, kvh = item % nkv;
  const int32_t *seg = ph->bt->segments ? ph->bt->segments + (size_t)b * T : NULL;
  const int32_t *cid = SUF(attn_chunked)(ph) ? m->chunk_id + (size_t)b * T : NULL;
  REAL scale = (REAL)(1.0 / sqrt(hd)), *P = SUF(slot_scratch)(m, slot), *dP = P + (size_t)T * T;
  size_t kvo = (size_t)b * T * KVD + kvh * hd;
  for (int t = 0; t < T; t++) {
    memset(a->dk + kvo + (size_t)t * KVD, 0, sizeof(REAL) * (size_t)hd);
    memset(a->dv + kvo + (size_t)t * KVD, 0, sizeof(REAL) * (size_t)hd);
  }
  for (int hh = kvh * grp; hh < (kvh + 1) * grp; hh++) {
    size_t qo = (size_t)b * T * QD + hh * hd;
    const REAL *lse = la->lse + ((size_t)b * nh + hh) * T;
    SUF(attn_scores)(m, la, b, hh, T, P);
    for (int i = 0; i < T; i++) {
      REAL *pi = P + (size_t)i * T;
      for (int j = 0; j < T; j++)
        pi[j] = j <= i && SUF(attn_allowed)(seg, cid, i, j) ? R_EXP(pi[j] - lse[i]) : 0;
    }
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1, a->datt + qo, QD, la->v + kvo,
         KVD, 0, dP, T);
    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1, P, T, a->datt + qo, QD, 1,
         a->dv + kvo, KVD);
    for (int i = 0; i < T; i++) {
      REAL *pi = P + (size_t)i * T, *dpi = dP + (size_t)i * T;
      double dot = 0;
      for (int j = 0; j <= i; j++) dot += (double)pi[j] * dpi[j];
      for (int j = 0; j < T; j++) dpi[j] = pi[j] * (dpi[j] - (REAL)dot);
    }
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, scale, dP, T, la->k + kvo, KVD,
         0, a->dq + qo, QD);
    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, scale, dP, T, la->q + qo, QD, 1,
         a->dk + kvo, KVD);
  }
}

/* ---- the attention block: h = x + o_proj(attn(rmsnorm(x))) ------------------------------
 * q, k: RoPE, then QK-norm, on RoPE layers; the temperature on NoPE
 * layers. The two never meet in one layer, so q holds the QK-norm's output
 * whenever the backward needs it. */

/* Rows: ln1 = rmsnorm(x); q, k, v; RoPE with QK-norm, or the temperature. */
static void SUF(attn_in_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  const L4Config *c = &ph->m->c;
  const SUF(LayerW) *w = ph->w;
  SUF(LayerActs) *la = ph->la;
  int D = c->embed_dim, nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
  int QD = nh * hd, KVD = nkv * hd, qk = c->use_qk_norm;
  REAL *ln1 = la->ln1 + (size_t)t0 * D, *q = la->q + (size_t)t0 * QD, *k = la->k + (size_t)t0 * KVD;
  SUF(rmsnorm_forward)(ln1, la->ln1_rstd + t0, la->x + (size_t)t0 * D, w->ln1, nt, D, c->norm_eps);
  SUF(matmul_forward)(q, ln1, w->wq, nt, D, QD, 0);
  SUF(matmul_forward)(k, ln1, w->wk, nt, D, KVD, 0);
  SUF(matmul_forward)(la->v + (size_t)t0 * KVD, ln1, w->wv, nt, D, KVD, 0);
  if (l4_layer_uses_rope(c, ph->l)) {
    SUF(rope_norm_forward)(q, qk ? la->q_rstd + (size_t)t0 * nh : NULL, ph->a, t0, nt, nh, hd,
                           c->norm_eps);
    SUF(rope_norm_forward)(k, qk ? la->k_rstd + (size_t)t0 * nkv : NULL, ph->a, t0, nt, nkv, hd,
                           c->norm_eps);
  } else if (c->attn_temperature_tuning) {
    SUF(rows_scale)(q, ph->a->temp + t0, nt, QD);
  }
}

/* ---- the feed-forward block, out = h + ffn(x), x = rmsnorm(h) --------------------------
 * dense layer: ffn(x) = mlp(x), mlp(x) = down(silu(gate x) * up x) (HF's Llama4TextMLP)
 * MoE layer:   ffn(x) = mlp(x) + expert_e*(x * sigmoid(logit_e*)), mlp the shared
 *              expert, e* = argmax(x @ router^T), lowest index on ties
 * out = (h + mlp(x)) + routed, in that order. */

/* Rows: h = x + o_proj(att); ln2 = rmsnorm(h); out = h + mlp(ln2) keeping
 * gate and up; on an MoE layer the router's logits, top-1 choice and score. */
static void SUF(attn_out_mlp_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  const L4Config *c = &ph->m->c;
  const SUF(LayerW) *w = ph->w;
  SUF(LayerActs) *la = ph->la;
  SUF(Acts) *a = ph->a;
  int D = c->embed_dim, QD = c->num_heads * c->head_dim, W = la->mw, E = c->num_experts;
  size_t rD = (size_t)t0 * D;
  REAL *h = la->h + rD, *ln2 = la->ln2 + rD, *out = la->out + rD, *hid = a->hid + (size_t)t0 * W;
  memcpy(h, la->x + rD, sizeof(REAL) * (size_t)nt * D);
  SUF(matmul_forward)(h, la->att + (size_t)t0 * QD, w->wo, nt, QD, D, 1);
  SUF(rmsnorm_forward)(ln2, la->ln2_rstd + t0, h, w->ln2, nt, D, c->norm_eps);
  memcpy(out, h, sizeof(REAL) * (size_t)nt * D);
  REAL *sg = la->sg + (size_t)t0 * W, *su = la->su + (size_t)t0 * W;
  SUF(matmul_forward)(sg, ln2, w->sgate, nt, D, W, 0);
  SUF(matmul_forward)(su, ln2, w->sup, nt, D, W, 0);
  SUF(swiglu_forward)(hid, sg, su, nt, W, W);
  SUF(matmul_forward)(out, hid, w->sdown, nt, W, D, 1);
  if (!la->moe) return;
  /* route: top-1 by logit, the score is the sigmoid of that logit */
  REAL *rl = a->rlogits + (size_t)t0 * E;
  SUF(matmul_forward)(rl, ln2, w->router, nt, D, E, 0);
  for (int t = 0; t < nt; t++) {
    const REAL *lg = rl + (size_t)t * E;
    int best = 0;
    for (int e = 1; e < E; e++)
      if (lg[e] > lg[best]) best = e;
    la->choice[t0 + t] = best;
    la->score[t0 + t] = SUF(sigmoid)(lg[best]);
  }
}

/* Groups the tokens by expert (ascending within one) and cuts each
 * expert's rows into the forward's items of at most L4_ROW_BLOCK rows. */
static int SUF(moe_group)(L4Model *m, SUF(LayerActs) *la, int n) {
  int E = m->c.num_experts, nitem = 0;
  memset(la->offsets, 0, sizeof(int32_t) * (size_t)(E + 1));
  for (int t = 0; t < n; t++) la->offsets[la->choice[t] + 1]++;
  for (int e = 0; e < E; e++) la->offsets[e + 1] += la->offsets[e];
  memcpy(m->cursor, la->offsets, sizeof(int32_t) * (size_t)E);
  for (int t = 0; t < n; t++) la->order[m->cursor[la->choice[t]]++] = t;
  for (int e = 0; e < E; e++)
    for (int r = la->offsets[e]; r < la->offsets[e + 1]; r += L4_ROW_BLOCK) {
      int left = la->offsets[e + 1] - r;
      m->items[nitem++] = (L4Item){e, r, left < L4_ROW_BLOCK ? left : L4_ROW_BLOCK};
    }
  return nitem;
}

/* xin[r] = x[order[r]] * score[order[r]] for rows [r0, r0 + ne): the routed
 * input, grouped by expert. */
static void SUF(moe_gather_input)(SUF(Acts) *a, const SUF(LayerActs) *la, int r0, int ne, int D) {
  for (int r = r0; r < r0 + ne; r++) {
    int t = la->order[r];
    for (int i = 0; i < D; i++) a->xin[(size_t)r * D + i] = la->ln2[(size_t)t * D + i] * la->score[t];
  }
}

/* Item: rows of one expert, out[order[r]] += expert_e(xin[r]), one
 * (rows, D) @ (D, 2H) and (rows, H) @ (H, D). A token has one expert, so
 * the items write disjoint rows of out. */
static void SUF(moe_forward_item)(SUF(Phase) *ph, int k, int slot) {
  (void)slot;
  const L4Config *c = &ph->m->c;
  SUF(Acts) *a = ph->a;
  SUF(LayerActs) *la = ph->la;
  const SUF(LayerW) *w = ph->w;
  int D = c->embed_dim, H = c->hidden_dim;
  L4Item it = ph->m->items[k];
  int e = it.expert, r0 = it.r0, ne = it.rows;
  REAL *gu = la->gu + (size_t)r0 * 2 * H, *hid = a->ehid + (size_t)r0 * H;
  REAL *y = a->ybuf + (size_t)r0 * D;
  SUF(moe_gather_input)(a, la, r0, ne, D);
  GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, ne, 2 * H, D, 1, a->xin + (size_t)r0 * D, D,
       w->gate_up + (size_t)e * D * 2 * H, 2 * H, 0, gu, 2 * H);
  SUF(swiglu_forward)(hid, gu, gu + H, ne, H, 2 * H);
  GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, ne, D, H, 1, hid, H,
       w->down + (size_t)e * H * D, D, 0, y, D);
  for (int r = 0; r < ne; r++) {
    REAL *o = la->out + (size_t)la->order[r0 + r] * D;
    const REAL *yr = y + (size_t)r * D;
    for (int i = 0; i < D; i++) o[i] += yr[i];
  }
}

/* Rows, from a->dres = dL/dout: the MLP's hid (again), dhid, dgate, dup,
 * and a->dln = dL/dx (set) = dgate @ gate + dup @ up. */
static void SUF(mlp_back_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  SUF(Acts) *a = ph->a;
  SUF(LayerActs) *la = ph->la;
  const SUF(LayerW) *w = ph->w;
  int D = ph->m->c.embed_dim, W = la->mw;
  size_t rW = (size_t)t0 * W;
  REAL *dsg = a->dgu + rW, *dsu = a->dgu + (size_t)ph->n * W + rW, *dln = a->dln + (size_t)t0 * D;
  SUF(swiglu_forward)(a->hid + rW, la->sg + rW, la->su + rW, nt, W, W);
  SUF(matmul_dx)(a->dhid + rW, a->dres + (size_t)t0 * D, w->sdown, nt, W, D, 0);
  SUF(swiglu_backward)(dsg, dsu, a->dhid + rW, la->sg + rW, la->su + rW, nt, W, W, W);
  SUF(matmul_dx)(dln, dsg, w->sgate, nt, D, W, 0);
  SUF(matmul_dx)(dln, dsu, w->sup, nt, D, W, 1);
}

/* Item: expert e's backward over all its tokens (its weights' gradients
 * sum over them), adding into a->dln. The top-1 choice is not
 * differentiated: the router learns through the score alone,
 *   dscore = <dxin, x>,  dlogit_e* = dscore * s (1 - s),
 * and router row e's gradient is this item's alone. */
static void SUF(moe_backward_item)(SUF(Phase) *ph, int e, int slot) {
  (void)slot;
  const L4Config *c = &ph->m->c;
  SUF(Acts) *a = ph->a;
  SUF(LayerActs) *la = ph->la;
  const SUF(LayerW) *w = ph->w, *gw = ph->gw;
  int D = c->embed_dim, H = c->hidden_dim;
  int r0 = la->offsets[e], ne = la->offsets[e + 1] - r0;
  if (ne == 0) return;
  const REAL *gu = la->gu + (size_t)r0 * 2 * H;
  const REAL *wgu = w->gate_up + (size_t)e * D * 2 * H, *wd = w->down + (size_t)e * H * D;
  REAL *dy = a->ybuf + (size_t)r0 * D, *xin = a->xin + (size_t)r0 * D;
  REAL *hid = a->ehid + (size_t)r0 * H, *dhid = a->edhid + (size_t)r0 * H;
  REAL *dgu = a->edgu + (size_t)r0 * 2 * H;
  /* dy gathered into expert order; dxin overwrites xin once gate_up's
   * weight gradient has read it */
  for (int r = 0; r < ne; r++)
    memcpy(dy + (size_t)r * D, a->dres + (size_t)la->order[r0 + r] * D, sizeof(REAL) * (size_t)D);
  SUF(moe_gather_input)(a, la, r0, ne, D);
  SUF(swiglu_forward)(hid, gu, gu + H, ne, H, 2 * H);
  /* down: y = hid @ wd, so dwd += hid^T dy and dhid = dy wd^T */
  GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, H, D, ne, 1, hid, H, dy, D, 1,
       gw->down + (size_t)e * H * D, D);
  GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, ne, H, D, 1, dy, D, wd, D, 0, dhid, H);
  SUF(swiglu_backward)(dgu, dgu + H, dhid, gu, gu + H, ne, H, 2 * H, 2 * H);
  /* gate_up: gu = xin @ wgu, so dwgu += xin^T dgu and dxin = dgu wgu^T */
  GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, D, 2 * H, ne, 1, xin, D, dgu, 2 * H, 1,
       gw->gate_up + (size_t)e * D * 2 * H, 2 * H);
  GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, ne, D, 2 * H, 1, dgu, 2 * H, wgu, 2 * H, 0, xin,
       D);
  const REAL *wr = w->router + (size_t)e * D;
  REAL *gr = gw->router + (size_t)e * D;
  for (int r = r0; r < r0 + ne; r++) {
    int t = la->order[r];
    REAL s = la->score[t], *dx = a->dln + (size_t)t * D;
    const REAL *dxin = a->xin + (size_t)r * D, *x = la->ln2 + (size_t)t * D;
    double ds = 0;
    for (int i = 0; i < D; i++) ds += (double)dxin[i] * x[i];
    REAL dlogit = (REAL)ds * s * (1 - s);
    for (int i = 0; i < D; i++) {
      dx[i] += s * dxin[i] + dlogit * wr[i];
      gr[i] += dlogit * x[i];
    }
  }
}

/* Rows: dres (dL/dout, which flows through the residual) += the ln2
 * norm's dx: dL/dh. Then datt = dL/dh @ o_proj, the attention's dy. */
static void SUF(ffn_norm_back_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  const L4Config *c = &ph->m->c;
  SUF(Acts) *a = ph->a;
  SUF(LayerActs) *la = ph->la;
  int D = c->embed_dim, QD = c->num_heads * c->head_dim;
  size_t rD = (size_t)t0 * D;
  SUF(rmsnorm_dx)(a->dres + rD, a->dln + rD, la->h + rD, la->ln2_rstd + t0, ph->w->ln2, nt, D);
  SUF(matmul_dx)(a->datt + (size_t)t0 * QD, a->dres + rD, ph->w->wo, nt, QD, D, 0);
}

/* Rows: QK-norm and RoPE backward on dq, dk (or the temperature's), then
 * dln = dq @ wq + dk @ wk + dv @ wv and dres (dL/dh) += the ln1 norm's dx:
 * dL/dx. */
static void SUF(attn_in_back_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  const L4Config *c = &ph->m->c;
  SUF(Acts) *a = ph->a;
  SUF(LayerActs) *la = ph->la;
  const SUF(LayerW) *w = ph->w;
  int D = c->embed_dim, nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
  int QD = nh * hd, KVD = nkv * hd, qk = c->use_qk_norm;
  size_t rD = (size_t)t0 * D;
  REAL *dq = a->dq + (size_t)t0 * QD, *dk = a->dk + (size_t)t0 * KVD, *dln = a->dln + rD;
  if (l4_layer_uses_rope(c, ph->l)) {
    SUF(rope_norm_backward)(dq, la->q + (size_t)t0 * QD, qk ? la->q_rstd + (size_t)t0 * nh : NULL,
                            a, t0, nt, nh, hd);
    SUF(rope_norm_backward)(dk, la->k + (size_t)t0 * KVD,
                            qk ? la->k_rstd + (size_t)t0 * nkv : NULL, a, t0, nt, nkv, hd);
  } else if (c->attn_temperature_tuning) {
    SUF(rows_scale)(dq, a->temp + t0, nt, QD);
  }
  SUF(matmul_dx)(dln, dq, w->wq, nt, D, QD, 0);
  SUF(matmul_dx)(dln, dk, w->wk, nt, D, KVD, 1);
  SUF(matmul_dx)(dln, a->dv + (size_t)t0 * KVD, w->wv, nt, D, KVD, 1);
  SUF(rmsnorm_dx)(a->dres + rD, dln, la->x + rD, la->ln1_rstd + t0, w->ln1, nt, D);
}

static void SUF(layer_forward)(SUF(Phase) *ph) {
  L4Model *m = ph->m;
  const L4Config *c = &m->c;
  SUF(phase_run)(ph, 0, NULL, SUF(attn_in_rows));
  SUF(phase_run)(ph, ph->bt->B * c->num_heads, SUF(attention_forward_item), NULL);
  SUF(phase_run)(ph, 0, NULL, SUF(attn_out_mlp_rows));
  if (ph->la->moe) SUF(phase_run)(ph, SUF(moe_group)(m, ph->la, ph->n), SUF(moe_forward_item), NULL);
}

/* a->dres: in, dL/dout of the layer; out, dL/dx. */
static void SUF(layer_backward)(SUF(Phase) *ph) {
  const L4Config *c = &ph->m->c;
  SUF(Acts) *a = ph->a;
  SUF(LayerActs) *la = ph->la;
  const SUF(LayerW) *gw = ph->gw;
  int n = ph->n, D = c->embed_dim, W = la->mw, QD = c->num_heads * c->head_dim;
  int KVD = c->num_kv_heads * c->head_dim;
  /* the feed-forward: the MLP's rows, then the experts beside the MLP's
   * weight gradients */
  SUF(phase_run)(ph, 0, NULL, SUF(mlp_back_rows));
  ph->wg[ph->nwg++] = SUF(wgrad)(gw->sdown, a->dres, D, a->hid, W, D, W, n);
  ph->wg[ph->nwg++] = SUF(wgrad)(gw->sgate, a->dgu, W, la->ln2, D, W, D, n);
  ph->wg[ph->nwg++] = SUF(wgrad)(gw->sup, a->dgu + (size_t)n * W, W, la->ln2, D, W, D, n);
  SUF(phase_run)(ph, la->moe ? c->num_experts : 0, SUF(moe_backward_item), NULL);
  /* ln2's dx and o_proj's dx by rows, beside ln2's weight gradient */
  ph->ng[ph->nng++] = (SUF(NGrad)){gw->ln2, a->dln, la->h, la->ln2_rstd};
  SUF(phase_run)(ph, 0, NULL, SUF(ffn_norm_back_rows));
  /* attention, beside o_proj's weight gradient */
  ph->wg[ph->nwg++] = SUF(wgrad)(gw->wo, a->dres, D, la->att, QD, D, QD, n);
  SUF(phase_run)(ph, ph->bt->B * c->num_kv_heads, SUF(attention_backward_item), NULL);
  SUF(phase_run)(ph, 0, NULL, SUF(attn_in_back_rows));
  ph->wg[ph->nwg++] = SUF(wgrad)(gw->wq, a->dq, QD, la->ln1, D, QD, D, n);
  ph->wg[ph->nwg++] = SUF(wgrad)(gw->wk, a->dk, KVD, la->ln1, D, KVD, D, n);
  ph->wg[ph->nwg++] = SUF(wgrad)(gw->wv, a->dv, KVD, la->ln1, D, KVD, D, n);
  ph->ng[ph->nng++] = (SUF(NGrad)){gw->ln1, a->dln, la->x, la->ln1_rstd};
  SUF(phase_run)(ph, 0, NULL, NULL);
}

/* ---- the output head: rmsnorm, lm_head, summed cross-entropy ------------------------------
 * The final norm of every row; then, in blocks of head_block_rows, the
 * rows whose target counts, gathered into xin (a row whose target is
 * ignored has no loss and no gradient: its logits would be thrown away):
 * their logits, then in place their gradient softmax - onehot, then
 * lm_head's gradient over the block and the norm's input gradient, put
 * back at the rows' places (zero at the others). */

/* Rows: lnf = rmsnorm(x_L); a row's loss 0 until its block sets it; with
 * grads, dL/dlnf 0 until its block sets it. */
static void SUF(head_norm_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  L4Model *m = ph->m;
  const L4Config *c = &m->c;
  SUF(Acts) *a = ph->a;
  int D = c->embed_dim;
  const REAL *xf = a->res + (size_t)c->num_layers * m->max_batch * m->max_seq * D;
  SUF(rmsnorm_forward)(a->lnf + (size_t)t0 * D, a->lnf_rstd + t0, xf + (size_t)t0 * D, ph->p[T_NORM(c)], nt, D,
                       c->norm_eps);
  for (int r = 0; r < nt; r++) m->row_loss[t0 + r] = 0;
  if (ph->g) memset(a->dln + (size_t)t0 * D, 0, sizeof(REAL) * (size_t)nt * D);
}

/* Counted rows [t0, t0 + nt) of the block at h0 (indices into m->head_idx):
 * their lnf gathered into xin, their logits, each one's loss, and with
 * grads its gradient in place. */
static void SUF(head_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  L4Model *m = ph->m;
  const L4Config *c = &m->c;
  SUF(Acts) *a = ph->a;
  int D = c->embed_dim, V = c->vocab_size, grads = ph->g != NULL;
  REAL *xc = a->xin + (size_t)t0 * D, *logits = a->logits + (size_t)(t0 - ph->h0) * V;
  for (int r = 0; r < nt; r++)
    memcpy(xc + (size_t)r * D, a->lnf + (size_t)m->head_idx[t0 + r] * D, sizeof(REAL) * (size_t)D);
  SUF(matmul_forward)(logits, xc, ph->p[T_LM_HEAD(c)], nt, D, V, 0);
  for (int r = 0; r < nt; r++) {
    REAL *lg = logits + (size_t)r * V;
    int row = m->head_idx[t0 + r], tgt = ph->bt->targets[row];
    REAL picked = lg[tgt];
    /* the max and the sum of exp(logit - max) in HEAD_LANES lanes (lane k
     * takes v = k mod HEAD_LANES), combined in lane order: loops the
     * compiler vectorizes, where one running sum is a chain of dependent
     * adds, and the same bits on any thread count */
    REAL lmx[HEAD_LANES];
    double lsum[HEAD_LANES];
    int vl = V / HEAD_LANES * HEAD_LANES;
    for (int k = 0; k < HEAD_LANES; k++) lmx[k] = lg[0], lsum[k] = 0;
    for (int v = 0; v < vl; v += HEAD_LANES)
      for (int k = 0; k < HEAD_LANES; k++) lmx[k] = lg[v + k] > lmx[k] ? lg[v + k] : lmx[k];
    REAL mx = lmx[0];
    for (int k = 1; k < HEAD_LANES; k++) mx = lmx[k] > mx ? lmx[k] : mx;
    for (int v = vl; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
    if (grads) { /* keep exp(logit - max): the gradient is it / sum, minus the one-hot */
      for (int v = 0; v < V; v++) lg[v] = R_EXP(lg[v] - mx);
      for (int v = 0; v < vl; v += HEAD_LANES)
        for (int k = 0; k < HEAD_LANES; k++) lsum[k] += lg[v + k];
    } else {
      for (int v = 0; v < vl; v += HEAD_LANES)
        for (int k = 0; k < HEAD_LANES; k++) lsum[k] += R_EXP(lg[v + k] - mx);
    }
    double sum = 0;
    for (int k = 0; k < HEAD_LANES; k++) sum += lsum[k];
    for (int v = vl; v < V; v++) sum += grads ? lg[v] : R_EXP(lg[v] - mx);
    if (grads) {
      REAL inv = (REAL)(1.0 / sum);
      for (int v = 0; v < V; v++) lg[v] *= inv;
      lg[tgt] -= 1;
    }
    m->row_loss[row] = mx + log(sum) - picked;
  }
}

/* Counted rows: dL/dlnf = dlogits @ lm_head, computed in ybuf and put at the rows' places. */
static void SUF(head_back_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  L4Model *m = ph->m;
  const L4Config *c = &m->c;
  SUF(Acts) *a = ph->a;
  int D = c->embed_dim, V = c->vocab_size;
  REAL *dx = a->ybuf + (size_t)t0 * D;
  SUF(matmul_dx)(dx, a->logits + (size_t)(t0 - ph->h0) * V, ph->p[T_LM_HEAD(c)], nt, D, V, 0);
  for (int r = 0; r < nt; r++)
    memcpy(a->dln + (size_t)m->head_idx[t0 + r] * D, dx + (size_t)r * D, sizeof(REAL) * (size_t)D);
}

/* Rows: dres = the final norm's dx. */
static void SUF(final_norm_back_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  L4Model *m = ph->m;
  const L4Config *c = &m->c;
  SUF(Acts) *a = ph->a;
  int D = c->embed_dim;
  size_t rD = (size_t)t0 * D;
  const REAL *xf = a->res + (size_t)c->num_layers * m->max_batch * m->max_seq * D;
  memset(a->dres + rD, 0, sizeof(REAL) * (size_t)nt * D);
  SUF(rmsnorm_dx)(a->dres + rD, a->dln + rD, xf + rD, a->lnf_rstd + t0, ph->p[T_NORM(c)], nt, D);
}

/* Rows: the batch's RoPE tables and temperatures, and the embeddings. */
static void SUF(prologue_rows)(SUF(Phase) *ph, int t0, int nt, int slot) {
  (void)slot;
  L4Model *m = ph->m;
  const L4Config *c = &m->c;
  SUF(Acts) *a = ph->a;
  int half = c->head_dim / 2, D = c->embed_dim;
  for (int t = t0; t < t0 + nt; t++) {
    for (int i = 0; i < half; i++) {
      double ang = (double)m->pos[t] * m->inv_freq[i];
      a->rope_cos[(size_t)t * half + i] = (REAL)cos(ang);
      a->rope_sin[(size_t)t * half + i] = (REAL)sin(ang);
    }
    double f = floor((m->pos[t] + 1.0) / c->attn_floor_scale);
    a->temp[t] = c->attn_temperature_tuning ? (REAL)(log1p(f) * c->attn_scale + 1.0) : 1;
    memcpy(a->res + (size_t)t * D, ph->p[T_EMBED] + (size_t)ph->bt->tokens[t] * D,
           sizeof(REAL) * (size_t)D);
  }
}

/* ---- the whole model ---------------------------------------------------------------- */
static double SUF(model_run)(L4Model *m, REAL *const *p, REAL *const *g, const L4Batch *bt,
                             int64_t *ntokens) {
  const L4Config *c = &m->c;
  int B = bt->B, T = bt->T, n = B * T, D = c->embed_dim, V = c->vocab_size, L = c->num_layers;
  L4_CHECK(B >= 1 && B <= m->max_batch && T >= 1 && T <= m->max_seq,
           "batch %dx%d exceeds the model's %dx%d", B, T, m->max_batch, m->max_seq);
  for (int t = 0; t < n; t++) {
    L4_CHECK(bt->tokens[t] >= 0 && bt->tokens[t] < V, "token %d at %d out of [0, %d)",
             bt->tokens[t], t, V);
    L4_CHECK(bt->targets[t] == -100 || (bt->targets[t] >= 0 && bt->targets[t] < V),
             "target %d at %d out of [0, %d)", bt->targets[t], t, V);
    m->pos[t] = bt->positions ? bt->positions[t] : t % T;
    L4_CHECK(m->pos[t] >= 0, "negative position %d at %d", m->pos[t], t);
    m->chunk_id[t] = c->attention_chunk_size > 0 ? m->pos[t] / c->attention_chunk_size : 0;
  }
  SUF(Acts) a;
  SUF(acts_bind)(m, m->acts, &a);
  SUF(Phase) ph = {.m = m, .a = &a, .bt = bt, .p = p, .g = g, .n = n};
  /* each FSDP unit between its hooks (l4_set_hooks): the embedding, the
   * layers, the head */
  m->hooks_failed = 0;
  if (hook(m, 1, 0, L4_FORWARD)) return NAN;
  SUF(phase_run)(&ph, 0, NULL, SUF(prologue_rows));
  if (hook(m, 0, 0, L4_FORWARD)) return NAN;
  SUF(LayerActs) la;
  for (int l = 0; l < L; l++) {
    if (hook(m, 1, 1 + l, L4_FORWARD)) return NAN;
    la = SUF(layer_acts)(m, &a, l);
    SUF(LayerW) w = SUF(layer_weights)(c, p, l);
    ph.la = &la, ph.w = &w, ph.l = l;
    SUF(layer_forward)(&ph);
    if (hook(m, 0, 1 + l, L4_FORWARD)) return NAN;
  }
  ph.la = NULL, ph.w = NULL;
  if (hook(m, 1, L + 1, L4_FORWARD) || (g && hook(m, 1, L + 1, L4_BACKWARD))) return NAN;

  /* the head: every row's norm, then block by block over the counted
   * rows; the loss summed in token order */
  SUF(phase_run)(&ph, 0, NULL, SUF(head_norm_rows));
  int nc = 0;
  for (int t = 0; t < n; t++)
    if (bt->targets[t] != -100) m->head_idx[nc++] = t;
  int hb = (int)head_block_rows((size_t)(nc ? nc : 1), (size_t)V);
  for (int h0 = 0; h0 < nc; h0 += hb) {
    int rows = nc - h0 < hb ? nc - h0 : hb;
    ph.h0 = h0, ph.hn = rows;
    SUF(phase_run)(&ph, 0, NULL, SUF(head_rows));
    if (!g) continue;
    ph.h0 = h0, ph.hn = rows;
    ph.wg[ph.nwg++] = SUF(wgrad)(g[T_LM_HEAD(c)], a.logits, V, a.xin + (size_t)h0 * D, D, V, D, rows);
    SUF(phase_run)(&ph, 0, NULL, SUF(head_back_rows));
  }
  double loss = 0;
  int64_t count = 0;
  for (int t = 0; t < n; t++)
    if (bt->targets[t] != -100) loss += m->row_loss[t], count++;
  if (ntokens) *ntokens = count;
  if (!g) return hook(m, 0, L + 1, L4_FORWARD) ? NAN : loss;

  const REAL *xf = a.res + (size_t)L * m->max_batch * m->max_seq * D;
  ph.ng[ph.nng++] = (SUF(NGrad)){g[T_NORM(c)], a.dln, xf, a.lnf_rstd};
  SUF(phase_run)(&ph, 0, NULL, SUF(final_norm_back_rows));
  if (hook(m, 0, L + 1, L4_BACKWARD)) return NAN;
  for (int l = L - 1; l >= 0; l--) {
    if (hook(m, 1, 1 + l, L4_BACKWARD)) return NAN;
    la = SUF(layer_acts)(m, &a, l);
    SUF(LayerW) w = SUF(layer_weights)(c, p, l), gw = SUF(layer_weights)(c, g, l);
    ph.la = &la, ph.w = &w, ph.gw = &gw, ph.l = l;
    /* checkpointed: the layer's forward again from its input (the same
     * bits), but for the last, whose activations are still in the slot */
    if (m->ac && l < L - 1) SUF(layer_forward)(&ph);
    SUF(layer_backward)(&ph);
    if (hook(m, 0, 1 + l, L4_BACKWARD)) return NAN;
  }
  /* the embedding's gradient: rows of a repeated token add in token order */
  if (hook(m, 1, 0, L4_BACKWARD)) return NAN;
  for (int t = 0; t < n; t++) {
    REAL *ge = g[T_EMBED] + (size_t)bt->tokens[t] * D;
    const REAL *d = a.dres + (size_t)t * D;
    for (int i = 0; i < D; i++) ge[i] += d[i];
  }
  return hook(m, 0, 0, L4_BACKWARD) ? NAN : loss;
}
