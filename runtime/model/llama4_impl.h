/* llama4_impl.h: the decoder's forward and backward, written once over a
 * REAL element type. llama4.c includes it twice, defining
 *   REAL            float | double
 *   SUF(name)       name##_f32 | name##_f64
 *   GEMM            cblas_sgemm | cblas_dgemm
 *   R_EXP R_LOG R_SQRT   the libm functions of that type
 * and struct L4Model, the T_* tensor slots (layer_first, moe_layers_before)
 * and L4_HEAD_ROWS before it.
 * No include guard, on purpose.
 *
 * Notation: N = B*T tokens, D = embed_dim, QD = nh*hd, KVD = nkv*hd, E
 * experts of width H, shared width Hs, dense layers' width Hm; Lm MoE
 * layers and Ld dense ones. Matmuls are nn.Linear's y = x W^T
 * with W (out, in) unless a comment says otherwise. Reductions over a row
 * (norms, softmax sums) accumulate in double in both precisions. */

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
  REAL *logits;   /* (HEAD_ROWS, V) one block of the output head, then its gradient */
  REAL *rlogits;  /* (N, E) router logits */
  REAL *xin;      /* (N, D) routed input x*score in expert order; its gradient in backward */
  REAL *ybuf;     /* (N, D) routed output in expert order; the gathered dout in backward */
  REAL *hid;      /* (N, Hmax) silu(gate) * up; Hmax = max(H, Hs, Hm if Ld > 0) */
  REAL *dhid;     /* (N, Hmax) */
  REAL *dgu;      /* (N, 2 Hmax) gradient of gate|up */
  REAL *scores;   /* (T, T) one head's scores, then probabilities */
  REAL *dscores;  /* (T, T) */
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
  size_t N = (size_t)m->max_batch * m->max_seq, T = m->max_seq, L = c->num_layers;
  size_t D = c->embed_dim, nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
  size_t QD = nh * hd, KVD = nkv * hd, E = c->num_experts, H = c->hidden_dim;
  size_t Hs = c->shared_hidden_dim, V = c->vocab_size;
  size_t Lm = moe_layers_before(c, c->num_layers), Ld = L - Lm;
  size_t Hm = Ld ? (size_t)c->mlp_hidden_dim : 0;
  size_t Hmax = H > Hs ? H : Hs, rows = N < L4_HEAD_ROWS ? N : L4_HEAD_ROWS;
  if (Hm > Hmax) Hmax = Hm;
  SUF(Acts) unused;
  if (!a) a = &unused;
  size_t off = 0;
#define TAKE(f, n) (a->f = base ? base + off : NULL, off += (n))
  TAKE(res, (L + 1) * N * D);
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
  TAKE(sg, N * (Lm * Hs + Ld * Hm));
  TAKE(su, N * (Lm * Hs + Ld * Hm));
  TAKE(lnf, N * D);
  TAKE(lnf_rstd, N);
  TAKE(rope_cos, N * (hd / 2));
  TAKE(rope_sin, N * (hd / 2));
  TAKE(temp, N);
  TAKE(logits, rows * V);
  TAKE(rlogits, N * E);
  TAKE(xin, N * D);
  TAKE(ybuf, N * D);
  TAKE(hid, N * Hmax);
  TAKE(dhid, N * Hmax);
  TAKE(dgu, N * 2 * Hmax);
  TAKE(scores, T * T);
  TAKE(dscores, T * T);
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
  return (SUF(LayerActs)){
    .x = a->res + L * N * D, .h = a->h + L * N * D, .out = a->res + (L + 1) * N * D,
    .ln1 = a->ln1 + L * N * D, .ln1_rstd = a->ln1_rstd + L * N,
    .q = a->q + L * N * nh * hd, .q_rstd = a->q_rstd + L * N * nh,
    .k = a->k + L * N * nkv * hd, .k_rstd = a->k_rstd + L * N * nkv,
    .v = a->v + L * N * nkv * hd, .lse = a->lse + L * N * nh, .att = a->att + L * N * nh * hd,
    .ln2 = a->ln2 + L * N * D, .ln2_rstd = a->ln2_rstd + L * N, .score = a->score + L * N,
    .gu = moe ? a->gu + Lm * N * 2 * c->hidden_dim : NULL, .sg = a->sg + mlp, .su = a->su + mlp,
    .choice = m->choice + L * N, .order = m->order + L * N,
    .offsets = m->offsets + L * (c->num_experts + 1),
    .moe = moe, .mw = moe ? c->shared_hidden_dim : c->mlp_hidden_dim,
  };
}

/* ---- matmuls -------------------------------------------------------------------- */
/* y (n, out) = x (n, in) @ w (out, in)^T + beta * y */
static void SUF(matmul_forward)(REAL *y, const REAL *x, const REAL *w, int n, int in, int out,
                                REAL beta) {
  GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1, x, in, w, in, beta, y, out);
}

/* dx (n, in) = dy @ w + dx_beta * dx;  dw (out, in) += dy^T @ x */
static void SUF(matmul_backward)(REAL *dx, REAL *dw, const REAL *dy, const REAL *x,
                                 const REAL *w, int n, int in, int out, REAL dx_beta) {
  GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1, dy, out, w, in, dx_beta, dx,
       in);
  GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1, dy, out, x, in, 1, dw, in);
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

/* With xhat = x*r: dw += dy*xhat;  dx += r * (dy*w - xhat * mean(dy*w*xhat)). */
static void SUF(rmsnorm_backward)(REAL *dx, REAL *dw, const REAL *dy, const REAL *x,
                                  const REAL *rstd, const REAL *w, int n, int d) {
  for (int t = 0; t < n; t++) {
    const REAL *xt = x + (size_t)t * d, *dyt = dy + (size_t)t * d;
    REAL *dxt = dx + (size_t)t * d, r = rstd[t];
    double dot = 0;
    for (int i = 0; i < d; i++) dot += (double)dyt[i] * w[i] * xt[i] * r;
    REAL mean = (REAL)(dot / d);
    for (int i = 0; i < d; i++) {
      REAL xhat = xt[i] * r;
      dxt[i] += r * (dyt[i] * w[i] - xhat * mean);
      dw[i] += dyt[i] * xhat;
    }
  }
}

/* ---- RoPE on interleaved pairs: (x[2i] + i x[2i+1]) * e^{i pos f_i} ------------------- */
static void SUF(rope_tables)(L4Model *m, SUF(Acts) *a, int n) {
  int half = m->c.head_dim / 2;
  for (int t = 0; t < n; t++)
    for (int i = 0; i < half; i++) {
      double ang = (double)m->pos[t] * m->inv_freq[i];
      a->rope_cos[(size_t)t * half + i] = (REAL)cos(ang);
      a->rope_sin[(size_t)t * half + i] = (REAL)sin(ang);
    }
}

/* x (n, heads*hd) rotated in place; sign -1 rotates back, which is the
 * backward, since a rotation's transpose is its inverse. */
static void SUF(rope_rotate)(REAL *x, const SUF(Acts) *a, int n, int heads, int hd, int sign) {
  int half = hd / 2;
  for (int t = 0; t < n; t++) {
    const REAL *ct = a->rope_cos + (size_t)t * half, *st = a->rope_sin + (size_t)t * half;
    for (int hh = 0; hh < heads; hh++) {
      REAL *xh = x + ((size_t)t * heads + hh) * hd;
      for (int i = 0; i < half; i++) {
        REAL x0 = xh[2 * i], x1 = xh[2 * i + 1], cs = ct[i], sn = sign * st[i];
        xh[2 * i] = x0 * cs - x1 * sn;
        xh[2 * i + 1] = x0 * sn + x1 * cs;
      }
    }
  }
}

/* ---- QK-norm: HF's Llama4TextL2Norm, x / sqrt(mean(x^2) + eps) per head, no weight ----- */
static void SUF(headnorm_forward)(REAL *x, REAL *rstd, int n, int heads, int hd, double eps) {
  for (size_t j = 0; j < (size_t)n * heads; j++) {
    REAL *xh = x + j * hd;
    double ss = 0;
    for (int i = 0; i < hd; i++) ss += (double)xh[i] * xh[i];
    REAL r = (REAL)(1.0 / sqrt(ss / hd + eps));
    rstd[j] = r;
    for (int i = 0; i < hd; i++) xh[i] *= r;
  }
}

/* y = x*r: dx = r * (dy - y * mean(dy*y)), in place over dy. */
static void SUF(headnorm_backward)(REAL *d, const REAL *y, const REAL *rstd, int n, int heads,
                                   int hd) {
  for (size_t j = 0; j < (size_t)n * heads; j++) {
    REAL *dh = d + j * hd;
    const REAL *yh = y + j * hd;
    double dot = 0;
    for (int i = 0; i < hd; i++) dot += (double)dh[i] * yh[i];
    REAL mean = (REAL)(dot / hd);
    for (int i = 0; i < hd; i++) dh[i] = rstd[j] * (dh[i] - yh[i] * mean);
  }
}

/* x (n, width) row t scaled by s[t]: the temperature, and its backward. */
static void SUF(rows_scale)(REAL *x, const REAL *s, int n, int width) {
  for (int t = 0; t < n; t++)
    for (int i = 0; i < width; i++) x[(size_t)t * width + i] *= s[t];
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

/* att = softmax(mask(scale * q k^T)) v, per row and head; keeps each score
 * row's log-sum-exp. */
static void SUF(attention_forward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la,
                                   const L4Batch *bt, int chunked) {
  const L4Config *c = &m->c;
  int B = bt->B, T = bt->T, nh = c->num_heads, hd = c->head_dim;
  int QD = nh * hd, KVD = c->num_kv_heads * hd, grp = nh / c->num_kv_heads;
  REAL *S = a->scores;
  for (int b = 0; b < B; b++) {
    const int32_t *seg = bt->segments ? bt->segments + (size_t)b * T : NULL;
    const int32_t *cid = chunked ? m->chunk_id + (size_t)b * T : NULL;
    for (int hh = 0; hh < nh; hh++) {
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
  }
}

/* From datt: dq (set), dk and dv (accumulated over the heads of a group).
 *   P = exp(S - lse) on allowed entries
 *   dP = dY V^T;  dV += P^T dY;  dS = P * (dP - rowsum(P * dP))
 *   dQ = scale dS K;  dK += scale dS^T Q */
static void SUF(attention_backward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la,
                                    const L4Batch *bt, int chunked) {
  const L4Config *c = &m->c;
  int B = bt->B, T = bt->T, nh = c->num_heads, hd = c->head_dim;
  int QD = nh * hd, KVD = c->num_kv_heads * hd, grp = nh / c->num_kv_heads;
  REAL scale = (REAL)(1.0 / sqrt(hd)), *P = a->scores, *dP = a->dscores;
  memset(a->dk, 0, sizeof(REAL) * (size_t)B * T * KVD);
  memset(a->dv, 0, sizeof(REAL) * (size_t)B * T * KVD);
  for (int b = 0; b < B; b++) {
    const int32_t *seg = bt->segments ? bt->segments + (size_t)b * T : NULL;
    const int32_t *cid = chunked ? m->chunk_id + (size_t)b * T : NULL;
    for (int hh = 0; hh < nh; hh++) {
      size_t qo = (size_t)b * T * QD + hh * hd, kvo = (size_t)b * T * KVD + (hh / grp) * hd;
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
}

/* ---- the attention block: h = x + o_proj(attn(rmsnorm(x))) ------------------------------
 * q, k: RoPE, then QK-norm, on RoPE layers; the temperature on NoPE
 * layers. The two never meet in one layer, so q holds the QK-norm's output
 * whenever the backward needs it. */
static void SUF(attn_block_forward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la,
                                    const SUF(LayerW) *w, const L4Batch *bt, int l) {
  const L4Config *c = &m->c;
  int n = bt->B * bt->T, D = c->embed_dim, nh = c->num_heads, nkv = c->num_kv_heads;
  int hd = c->head_dim, QD = nh * hd, KVD = nkv * hd, rope = l4_layer_uses_rope(c, l);
  SUF(rmsnorm_forward)(la->ln1, la->ln1_rstd, la->x, w->ln1, n, D, c->norm_eps);
  SUF(matmul_forward)(la->q, la->ln1, w->wq, n, D, QD, 0);
  SUF(matmul_forward)(la->k, la->ln1, w->wk, n, D, KVD, 0);
  SUF(matmul_forward)(la->v, la->ln1, w->wv, n, D, KVD, 0);
  if (rope) {
    SUF(rope_rotate)(la->q, a, n, nh, hd, 1);
    SUF(rope_rotate)(la->k, a, n, nkv, hd, 1);
    if (c->use_qk_norm) {
      SUF(headnorm_forward)(la->q, la->q_rstd, n, nh, hd, c->norm_eps);
      SUF(headnorm_forward)(la->k, la->k_rstd, n, nkv, hd, c->norm_eps);
    }
  } else if (c->attn_temperature_tuning) {
    SUF(rows_scale)(la->q, a->temp, n, QD);
  }
  SUF(attention_forward)(m, a, la, bt, rope && c->attention_chunk_size > 0);
  memcpy(la->h, la->x, sizeof(REAL) * (size_t)n * D);
  SUF(matmul_forward)(la->h, la->att, w->wo, n, QD, D, 1);
}

/* a->dres: in, dL/dh; out, dL/dx. */
static void SUF(attn_block_backward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la,
                                     const SUF(LayerW) *w, const SUF(LayerW) *gw,
                                     const L4Batch *bt, int l) {
  const L4Config *c = &m->c;
  int n = bt->B * bt->T, D = c->embed_dim, nh = c->num_heads, nkv = c->num_kv_heads;
  int hd = c->head_dim, QD = nh * hd, KVD = nkv * hd, rope = l4_layer_uses_rope(c, l);
  SUF(matmul_backward)(a->datt, gw->wo, a->dres, la->att, w->wo, n, QD, D, 0);
  SUF(attention_backward)(m, a, la, bt, rope && c->attention_chunk_size > 0);
  if (rope) {
    if (c->use_qk_norm) {
      SUF(headnorm_backward)(a->dq, la->q, la->q_rstd, n, nh, hd);
      SUF(headnorm_backward)(a->dk, la->k, la->k_rstd, n, nkv, hd);
    }
    SUF(rope_rotate)(a->dq, a, n, nh, hd, -1);
    SUF(rope_rotate)(a->dk, a, n, nkv, hd, -1);
  } else if (c->attn_temperature_tuning) {
    SUF(rows_scale)(a->dq, a->temp, n, QD);
  }
  SUF(matmul_backward)(a->dln, gw->wq, a->dq, la->ln1, w->wq, n, D, QD, 0);
  SUF(matmul_backward)(a->dln, gw->wk, a->dk, la->ln1, w->wk, n, D, KVD, 1);
  SUF(matmul_backward)(a->dln, gw->wv, a->dv, la->ln1, w->wv, n, D, KVD, 1);
  SUF(rmsnorm_backward)(a->dres, gw->ln1, a->dln, la->x, la->ln1_rstd, w->ln1, n, D);
}

/* ---- the feed-forward block, out = h + ffn(x), x = rmsnorm(h) --------------------------
 * dense layer: ffn(x) = mlp(x), mlp(x) = down(silu(gate x) * up x) (HF's Llama4TextMLP)
 * MoE layer:   ffn(x) = mlp(x) + expert_e*(x * sigmoid(logit_e*)), mlp the shared
 *              expert, e* = argmax(x @ router^T), lowest index on ties */
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
 * silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). Strides as in the forward. */
static void SUF(swiglu_backward)(REAL *dgate, REAL *dup, const REAL *dhid, const REAL *gate,
                                 const REAL *up, int n, int width, int ld) {
  for (int t = 0; t < n; t++)
    for (int i = 0; i < width; i++) {
      size_t o = (size_t)t * ld + i;
      REAL g = gate[o], s = SUF(sigmoid)(g), dh = dhid[(size_t)t * width + i];
      dgate[o] = dh * up[o] * s * (1 + g * (1 - s));
      dup[o] = dh * g * s;
    }
}

/* xin[r] = x[order[r]] * score[order[r]]: the routed input, grouped by expert. */
static void SUF(moe_gather_input)(SUF(Acts) *a, const SUF(LayerActs) *la, int n, int D) {
  for (int r = 0; r < n; r++) {
    int t = la->order[r];
    for (int i = 0; i < D; i++) a->xin[(size_t)r * D + i] = la->ln2[(size_t)t * D + i] * la->score[t];
  }
}

/* out (n, D) += mlp(x), keeping gate x and up x (n, mw) for the backward. */
static void SUF(mlp_forward)(SUF(Acts) *a, SUF(LayerActs) *la, const SUF(LayerW) *w, int n,
                             int D) {
  int W = la->mw;
  SUF(matmul_forward)(la->sg, la->ln2, w->sgate, n, D, W, 0);
  SUF(matmul_forward)(la->su, la->ln2, w->sup, n, D, W, 0);
  SUF(swiglu_forward)(a->hid, la->sg, la->su, n, W, W);
  SUF(matmul_forward)(la->out, a->hid, w->sdown, n, W, D, 1);
}

/* From dout: the MLP's weight gradients, and a->dln = dL/dx (set):
 * dln = dsg @ gate + dsu @ up. */
static void SUF(mlp_backward)(SUF(Acts) *a, SUF(LayerActs) *la, const SUF(LayerW) *w,
                              const SUF(LayerW) *gw, const REAL *dout, int n, int D) {
  int W = la->mw;
  SUF(swiglu_forward)(a->hid, la->sg, la->su, n, W, W);
  SUF(matmul_backward)(a->dhid, gw->sdown, dout, a->hid, w->sdown, n, W, D, 0);
  REAL *dsg = a->dgu, *dsu = a->dgu + (size_t)n * W;
  SUF(swiglu_backward)(dsg, dsu, a->dhid, la->sg, la->su, n, W, W);
  SUF(matmul_backward)(a->dln, gw->sgate, dsg, la->ln2, w->sgate, n, D, W, 0);
  SUF(matmul_backward)(a->dln, gw->sup, dsu, la->ln2, w->sup, n, D, W, 1);
}

/* The routed half of an MoE layer: out += expert_e*(x * score), after the
 * shared expert, so out = (h + mlp(x)) + routed in that order. */
static void SUF(moe_forward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la, const SUF(LayerW) *w,
                             int n) {
  const L4Config *c = &m->c;
  int D = c->embed_dim, E = c->num_experts, H = c->hidden_dim;

  /* route: top-1 by logit, the score is the sigmoid of that logit */
  SUF(matmul_forward)(a->rlogits, la->ln2, w->router, n, D, E, 0);
  memset(la->offsets, 0, sizeof(int32_t) * (size_t)(E + 1));
  for (int t = 0; t < n; t++) {
    const REAL *lg = a->rlogits + (size_t)t * E;
    int best = 0;
    for (int e = 1; e < E; e++)
      if (lg[e] > lg[best]) best = e;
    la->choice[t] = best;
    la->score[t] = SUF(sigmoid)(lg[best]);
    la->offsets[best + 1]++;
  }
  for (int e = 0; e < E; e++) la->offsets[e + 1] += la->offsets[e];
  memcpy(m->cursor, la->offsets, sizeof(int32_t) * (size_t)E);
  for (int t = 0; t < n; t++) la->order[m->cursor[la->choice[t]]++] = t;

  /* routed experts, one (tokens, D) @ (D, 2H) and (tokens, H) @ (H, D) each */
  SUF(moe_gather_input)(a, la, n, D);
  for (int e = 0; e < E; e++) {
    int r0 = la->offsets[e], ne = la->offsets[e + 1] - r0;
    if (ne == 0) continue;
    REAL *gu = la->gu + (size_t)r0 * 2 * H, *hid = a->hid + (size_t)r0 * H;
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, ne, 2 * H, D, 1, a->xin + (size_t)r0 * D, D,
         w->gate_up + (size_t)e * D * 2 * H, 2 * H, 0, gu, 2 * H);
    SUF(swiglu_forward)(hid, gu, gu + H, ne, H, 2 * H);
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, ne, D, H, 1, hid, H,
         w->down + (size_t)e * H * D, D, 0, a->ybuf + (size_t)r0 * D, D);
  }
  for (int r = 0; r < n; r++) {
    REAL *o = la->out + (size_t)la->order[r] * D;
    const REAL *y = a->ybuf + (size_t)r * D;
    for (int i = 0; i < D; i++) o[i] += y[i];
  }
}

/* The routed half's backward, from a->dres = dL/dout: adds into a->dln.
 * The top-1 choice is not differentiated: the router learns through the
 * score alone,
 *   dscore = <dxin, x>,  dlogit_e* = dscore * s (1 - s). */
static void SUF(moe_backward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la, const SUF(LayerW) *w,
                              const SUF(LayerW) *gw, int n) {
  const L4Config *c = &m->c;
  int D = c->embed_dim, E = c->num_experts, H = c->hidden_dim;
  const REAL *dout = a->dres;

  /* routed experts: dy gathered into expert order; dxin overwrites xin
   * once gate_up's weight gradient has read it */
  for (int r = 0; r < n; r++)
    memcpy(a->ybuf + (size_t)r * D, dout + (size_t)la->order[r] * D, sizeof(REAL) * (size_t)D);
  SUF(moe_gather_input)(a, la, n, D);
  for (int e = 0; e < E; e++) {
    int r0 = la->offsets[e], ne = la->offsets[e + 1] - r0;
    if (ne == 0) continue;
    const REAL *gu = la->gu + (size_t)r0 * 2 * H, *dy = a->ybuf + (size_t)r0 * D;
    const REAL *wgu = w->gate_up + (size_t)e * D * 2 * H, *wd = w->down + (size_t)e * H * D;
    REAL *xin = a->xin + (size_t)r0 * D, *hid = a->hid, *dhid = a->dhid, *dgu = a->dgu;
    SUF(swiglu_forward)(hid, gu, gu + H, ne, H, 2 * H);
    /* down: y = hid @ wd, so dwd += hid^T dy and dhid = dy wd^T */
    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, H, D, ne, 1, hid, H, dy, D, 1,
         gw->down + (size_t)e * H * D, D);
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, ne, H, D, 1, dy, D, wd, D, 0, dhid, H);
    SUF(swiglu_backward)(dgu, dgu + H, dhid, gu, gu + H, ne, H, 2 * H);
    /* gate_up: gu = xin @ wgu, so dwgu += xin^T dgu and dxin = dgu wgu^T */
    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, D, 2 * H, ne, 1, xin, D, dgu, 2 * H, 1,
         gw->gate_up + (size_t)e * D * 2 * H, 2 * H);
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, ne, D, 2 * H, 1, dgu, 2 * H, wgu, 2 * H, 0, xin,
         D);
  }
  for (int r = 0; r < n; r++) {
    int t = la->order[r], e = la->choice[t];
    REAL s = la->score[t], *dx = a->dln + (size_t)t * D;
    const REAL *dxin = a->xin + (size_t)r * D, *x = la->ln2 + (size_t)t * D;
    const REAL *wr = w->router + (size_t)e * D;
    REAL *gr = gw->router + (size_t)e * D;
    double ds = 0;
    for (int i = 0; i < D; i++) ds += (double)dxin[i] * x[i];
    REAL dlogit = (REAL)ds * s * (1 - s);
    for (int i = 0; i < D; i++) {
      dx[i] += s * dxin[i] + dlogit * wr[i];
      gr[i] += dlogit * x[i];
    }
  }
}

static void SUF(ffn_forward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la, const SUF(LayerW) *w,
                             int n) {
  const L4Config *c = &m->c;
  int D = c->embed_dim;
  SUF(rmsnorm_forward)(la->ln2, la->ln2_rstd, la->h, w->ln2, n, D, c->norm_eps);
  memcpy(la->out, la->h, sizeof(REAL) * (size_t)n * D);
  SUF(mlp_forward)(a, la, w, n, D);
  if (la->moe) SUF(moe_forward)(m, a, la, w, n);
}

/* a->dres: in, dL/dout; out, dL/dh. */
static void SUF(ffn_backward)(L4Model *m, SUF(Acts) *a, SUF(LayerActs) *la, const SUF(LayerW) *w,
                              const SUF(LayerW) *gw, int n) {
  int D = m->c.embed_dim;
  SUF(mlp_backward)(a, la, w, gw, a->dres, n, D);
  if (la->moe) SUF(moe_backward)(m, a, la, w, gw, n);
  SUF(rmsnorm_backward)(a->dres, gw->ln2, a->dln, la->h, la->ln2_rstd, w->ln2, n, D);
}

/* ---- the output head: rmsnorm, lm_head, summed cross-entropy ------------------------------
 * Blocks of L4_HEAD_ROWS tokens: logits, then in place their gradient
 * softmax - onehot, then lm_head's gradients. Blocks without a counted
 * target skip the matmuls. Sets a->dln to dL/dlnf when g is not NULL. */
static double SUF(head_run)(L4Model *m, SUF(Acts) *a, REAL *const *p, REAL *const *g,
                            const L4Batch *bt, int64_t *count) {
  const L4Config *c = &m->c;
  int n = bt->B * bt->T, D = c->embed_dim, V = c->vocab_size;
  const REAL *W = p[T_LM_HEAD(c)];
  double loss = 0;
  *count = 0;
  for (int r0 = 0; r0 < n; r0 += L4_HEAD_ROWS) {
    int rows = n - r0 < L4_HEAD_ROWS ? n - r0 : L4_HEAD_ROWS, counted = 0;
    for (int r = 0; r < rows; r++) counted += bt->targets[r0 + r] != -100;
    if (counted == 0) {
      if (g) memset(a->dln + (size_t)r0 * D, 0, sizeof(REAL) * (size_t)rows * D);
      continue;
    }
    SUF(matmul_forward)(a->logits, a->lnf + (size_t)r0 * D, W, rows, D, V, 0);
    for (int r = 0; r < rows; r++) {
      REAL *lg = a->logits + (size_t)r * V;
      int tgt = bt->targets[r0 + r];
      if (tgt == -100) {
        if (g) memset(lg, 0, sizeof(REAL) * (size_t)V);
        continue;
      }
      REAL mx = lg[0], picked = lg[tgt];
      for (int v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
      double sum = 0;
      if (g) { /* keep exp(logit - max): the gradient is it / sum, minus the one-hot */
        for (int v = 0; v < V; v++) sum += lg[v] = R_EXP(lg[v] - mx);
        REAL inv = (REAL)(1.0 / sum);
        for (int v = 0; v < V; v++) lg[v] *= inv;
        lg[tgt] -= 1;
      } else {
        for (int v = 0; v < V; v++) sum += R_EXP(lg[v] - mx);
      }
      loss += mx + log(sum) - picked;
      (*count)++;
    }
    if (g)
      SUF(matmul_backward)(a->dln + (size_t)r0 * D, g[T_LM_HEAD(c)], a->logits,
                           a->lnf + (size_t)r0 * D, W, rows, D, V, 0);
  }
  return loss;
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
  SUF(rope_tables)(m, &a, n);
  for (int t = 0; t < n; t++) {
    double f = floor((m->pos[t] + 1.0) / c->attn_floor_scale);
    a.temp[t] = c->attn_temperature_tuning ? (REAL)(log1p(f) * c->attn_scale + 1.0) : 1;
  }

  for (int t = 0; t < n; t++)
    memcpy(a.res + (size_t)t * D, p[T_EMBED] + (size_t)bt->tokens[t] * D,
           sizeof(REAL) * (size_t)D);
  for (int l = 0; l < L; l++) {
    SUF(LayerActs) la = SUF(layer_acts)(m, &a, l);
    SUF(LayerW) w = SUF(layer_weights)(c, p, l);
    SUF(attn_block_forward)(m, &a, &la, &w, bt, l);
    SUF(ffn_forward)(m, &a, &la, &w, n);
  }
  const REAL *xf = a.res + (size_t)L * m->max_batch * m->max_seq * D;
  SUF(rmsnorm_forward)(a.lnf, a.lnf_rstd, xf, p[T_NORM(c)], n, D, c->norm_eps);
  int64_t count;
  double loss = SUF(head_run)(m, &a, p, g, bt, &count);
  if (ntokens) *ntokens = count;
  if (!g) return loss;

  memset(a.dres, 0, sizeof(REAL) * (size_t)n * D);
  SUF(rmsnorm_backward)(a.dres, g[T_NORM(c)], a.dln, xf, a.lnf_rstd, p[T_NORM(c)], n, D);
  for (int l = L - 1; l >= 0; l--) {
    SUF(LayerActs) la = SUF(layer_acts)(m, &a, l);
    SUF(LayerW) w = SUF(layer_weights)(c, p, l), gw = SUF(layer_weights)(c, g, l);
    SUF(ffn_backward)(m, &a, &la, &w, &gw, n);
    SUF(attn_block_backward)(m, &a, &la, &w, &gw, bt, l);
  }
  for (int t = 0; t < n; t++) {
    REAL *ge = g[T_EMBED] + (size_t)bt->tokens[t] * D;
    const REAL *d = a.dres + (size_t)t * D;
    for (int i = 0; i < D; i++) ge[i] += d[i];
  }
  return loss;
}
