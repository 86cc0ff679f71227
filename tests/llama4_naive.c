/* llama4_naive.c: a plain-loop Llama 4 text decoder forward in double, the
 * reference test_llama4 checks the BLAS model against.
 *
 * Written from the model's description (HF Llama4TextModel and
 * Llama4ForCausalLM), one token and one formula at a time, with no BLAS and
 * no code shared with runtime/model: it takes L4Config for the dims only and
 * finds every tensor by its HF name, so it checks the names too. Slow on
 * purpose; meant for a few dozen tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama4.h"

double l4_naive_loss(const L4Config *c, int ntensors, const char *const *names,
                     const double *const *params, const int32_t *tokens,
                     const int32_t *targets, const int32_t *positions, const int32_t *segments,
                     int B, int T, int64_t *ntokens);

typedef struct {
  int n;
  const char *const *names;
  const double *const *params;
} Lookup;

static const double *get(const Lookup *lk, const char *fmt, int layer) {
  char name[160];
  snprintf(name, sizeof name, fmt, layer);
  for (int i = 0; i < lk->n; i++)
    if (strcmp(lk->names[i], name) == 0) return lk->params[i];
  fprintf(stderr, "llama4_naive: no tensor named %s\n", name);
  exit(2);
}

static double *zeros(size_t n) {
  double *p = calloc(n, sizeof(double));
  if (!p) {
    fprintf(stderr, "llama4_naive: out of memory\n");
    exit(2);
  }
  return p;
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sigmoid(x); }

/* out = x / sqrt(mean(x^2) + eps) * w, one vector of n */
static void rmsnorm(double *out, const double *x, const double *w, int n, double eps) {
  double ms = 0;
  for (int i = 0; i < n; i++) ms += x[i] * x[i];
  ms /= n;
  for (int i = 0; i < n; i++) out[i] = x[i] / sqrt(ms + eps) * (w ? w[i] : 1.0);
}

/* HF's llama3 rope scaling of one inverse frequency. */
static double rope_freq(const L4Config *c, int i) {
  double f = 1.0 / pow(c->rope_base, 2.0 * i / c->head_dim);
  if (c->rope_scale_factor <= 0) return f;
  double pi = acos(-1.0);
  double wavelen = 2 * pi / f;
  double low_wl = c->rope_old_context_len / c->rope_low_freq_factor;
  double high_wl = c->rope_old_context_len / c->rope_high_freq_factor;
  if (wavelen < high_wl) return f;
  if (wavelen > low_wl) return f / c->rope_scale_factor;
  double smooth = (c->rope_old_context_len / wavelen - c->rope_low_freq_factor) /
                  (c->rope_high_freq_factor - c->rope_low_freq_factor);
  return (1 - smooth) * f / c->rope_scale_factor + smooth * f;
}

double l4_naive_loss(const L4Config *c, int ntensors, const char *const *names,
                     const double *const *params, const int32_t *tokens,
                     const int32_t *targets, const int32_t *positions, const int32_t *segments,
                     int B, int T, int64_t *ntokens) {
  Lookup lk = {ntensors, names, params};
  int D = c->embed_dim, nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
  int E = c->num_experts, H = c->hidden_dim, Hs = c->shared_hidden_dim, V = c->vocab_size;
  int Hm = c->moe_every_n_layers > 1 ? c->mlp_hidden_dim : 0, Hmax = H > Hs ? H : Hs;
  if (Hm > Hmax) Hmax = Hm;
  double *x = zeros((size_t)T * D), *xn = zeros((size_t)T * D), *hbuf = zeros((size_t)T * D);
  double *q = zeros((size_t)T * nh * hd), *k = zeros((size_t)T * nkv * hd);
  double *v = zeros((size_t)T * nkv * hd), *o = zeros((size_t)T * nh * hd);
  double *p = zeros(T), *gu = zeros(2 * (size_t)H), *hid = zeros(Hmax);
  double *xin = zeros(D), *logits = zeros(V > E ? V : E);
  double loss = 0;
  int64_t count = 0;

  for (int b = 0; b < B; b++) {
    const int32_t *tok = tokens + (size_t)b * T, *tgt = targets + (size_t)b * T;
    const int32_t *seg = segments ? segments + (size_t)b * T : NULL;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = positions ? positions[(size_t)b * T + t] : t;

    const double *emb = get(&lk, "model.embed_tokens.weight", 0);
    for (int t = 0; t < T; t++)
      for (int d = 0; d < D; d++) x[t * D + d] = emb[(size_t)tok[t] * D + d];

    for (int l = 0; l < c->num_layers; l++) {
      int use_rope = c->skip_rope_interval <= 0 || (l + 1) % c->skip_rope_interval != 0;
      /* torchtune's is_moe; HF's moe_layers = range(n - 1, L, n) */
      int is_moe = c->moe_every_n_layers <= 1 || l % c->moe_every_n_layers == c->moe_every_n_layers - 1;
      const double *wq = get(&lk, "model.layers.%d.self_attn.q_proj.weight", l);
      const double *wk = get(&lk, "model.layers.%d.self_attn.k_proj.weight", l);
      const double *wv = get(&lk, "model.layers.%d.self_attn.v_proj.weight", l);
      const double *wo = get(&lk, "model.layers.%d.self_attn.o_proj.weight", l);
      const double *ln1 = get(&lk, "model.layers.%d.input_layernorm.weight", l);
      const double *ln2 = get(&lk, "model.layers.%d.post_attention_layernorm.weight", l);
      const double *router = NULL, *gate_up = NULL, *down = NULL, *sg, *su, *sd;
      if (is_moe) {
        router = get(&lk, "model.layers.%d.feed_forward.router.weight", l);
        gate_up = get(&lk, "model.layers.%d.feed_forward.experts.gate_up_proj", l);
        down = get(&lk, "model.layers.%d.feed_forward.experts.down_proj", l);
        sg = get(&lk, "model.layers.%d.feed_forward.shared_expert.gate_proj.weight", l);
        su = get(&lk, "model.layers.%d.feed_forward.shared_expert.up_proj.weight", l);
        sd = get(&lk, "model.layers.%d.feed_forward.shared_expert.down_proj.weight", l);
      } else {
        sg = get(&lk, "model.layers.%d.feed_forward.gate_proj.weight", l);
        su = get(&lk, "model.layers.%d.feed_forward.up_proj.weight", l);
        sd = get(&lk, "model.layers.%d.feed_forward.down_proj.weight", l);
      }

      /* attention */
      for (int t = 0; t < T; t++) rmsnorm(xn + t * D, x + t * D, ln1, D, c->norm_eps);
      for (int t = 0; t < T; t++) {
        for (int j = 0; j < nh * hd; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += wq[(size_t)j * D + d] * xn[t * D + d];
          q[t * nh * hd + j] = s;
        }
        for (int j = 0; j < nkv * hd; j++) {
          double sk = 0, sv = 0;
          for (int d = 0; d < D; d++) {
            sk += wk[(size_t)j * D + d] * xn[t * D + d];
            sv += wv[(size_t)j * D + d] * xn[t * D + d];
          }
          k[t * nkv * hd + j] = sk;
          v[t * nkv * hd + j] = sv;
        }
        for (int hh = 0; hh < nh + nkv; hh++) {
          double *vec = hh < nh ? q + (t * nh + hh) * hd : k + (t * nkv + hh - nh) * hd;
          if (use_rope) {
            for (int i = 0; i < hd / 2; i++) {
              double ang = pos[t] * rope_freq(c, i), re = vec[2 * i], im = vec[2 * i + 1];
              vec[2 * i] = re * cos(ang) - im * sin(ang);
              vec[2 * i + 1] = re * sin(ang) + im * cos(ang);
            }
            if (c->use_qk_norm) rmsnorm(vec, vec, NULL, hd, c->norm_eps);
          } else if (c->attn_temperature_tuning && hh < nh) {
            double scale = log1p(floor((pos[t] + 1.0) / c->attn_floor_scale)) * c->attn_scale + 1;
            for (int i = 0; i < hd; i++) vec[i] *= scale;
          }
        }
      }
      for (int t = 0; t < T; t++)
        for (int hh = 0; hh < nh; hh++) {
          int g = hh / (nh / nkv);
          double mx = -INFINITY, sum = 0;
          for (int j = 0; j < T; j++) {
            int ok = j <= t && (!seg || seg[j] == seg[t]);
            if (use_rope && c->attention_chunk_size > 0)
              ok = ok && pos[j] / c->attention_chunk_size == pos[t] / c->attention_chunk_size;
            p[j] = -INFINITY;
            if (!ok) continue;
            double s = 0;
            for (int i = 0; i < hd; i++) s += q[(t * nh + hh) * hd + i] * k[(j * nkv + g) * hd + i];
            p[j] = s / sqrt(hd);
            if (p[j] > mx) mx = p[j];
          }
          for (int j = 0; j < T; j++) {
            p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx);
            sum += p[j];
          }
          for (int i = 0; i < hd; i++) {
            double s = 0;
            for (int j = 0; j < T; j++) s += p[j] / sum * v[(j * nkv + g) * hd + i];
            o[(t * nh + hh) * hd + i] = s;
          }
        }
      for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) {
          double s = 0;
          for (int j = 0; j < nh * hd; j++) s += wo[(size_t)d * nh * hd + j] * o[t * nh * hd + j];
          hbuf[t * D + d] = x[t * D + d] + s;
        }

      /* a dense MLP, y = h + down(silu(gate x) * up x), x = rmsnorm(h) */
      for (int t = 0; t < T && !is_moe; t++) {
        double *hx = hbuf + t * D, *y = x + t * D;
        rmsnorm(xn, hx, ln2, D, c->norm_eps);
        for (int i = 0; i < Hm; i++) {
          double a = 0, u = 0;
          for (int d = 0; d < D; d++) {
            a += sg[(size_t)i * D + d] * xn[d];
            u += su[(size_t)i * D + d] * xn[d];
          }
          hid[i] = silu(a) * u;
        }
        for (int d = 0; d < D; d++) {
          double s = 0;
          for (int i = 0; i < Hm; i++) s += sd[(size_t)d * Hm + i] * hid[i];
          y[d] = hx[d] + s;
        }
      }

      /* or a mixture of experts */
      for (int t = 0; t < T && is_moe; t++) {
        double *hx = hbuf + t * D, *y = x + t * D;
        rmsnorm(xn, hx, ln2, D, c->norm_eps);
        int best = 0;
        for (int e = 0; e < E; e++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += router[(size_t)e * D + d] * xn[d];
          logits[e] = s;
          if (s > logits[best]) best = e;
        }
        double score = sigmoid(logits[best]);
        for (int d = 0; d < D; d++) xin[d] = xn[d] * score;
        for (int j = 0; j < 2 * H; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += xin[d] * gate_up[((size_t)best * D + d) * 2 * H + j];
          gu[j] = s;
        }
        for (int i = 0; i < H; i++) hid[i] = silu(gu[i]) * gu[H + i];
        for (int d = 0; d < D; d++) {
          double s = 0;
          for (int i = 0; i < H; i++) s += hid[i] * down[((size_t)best * H + i) * D + d];
          y[d] = hx[d] + s;
        }
        for (int i = 0; i < Hs; i++) {
          double a = 0, u = 0;
          for (int d = 0; d < D; d++) {
            a += sg[(size_t)i * D + d] * xn[d];
            u += su[(size_t)i * D + d] * xn[d];
          }
          hid[i] = silu(a) * u;
        }
        for (int d = 0; d < D; d++) {
          double s = 0;
          for (int i = 0; i < Hs; i++) s += sd[(size_t)d * Hs + i] * hid[i];
          y[d] += s;
        }
      }
    }

    /* head */
    const double *nw = get(&lk, "model.norm.weight", 0), *lm = get(&lk, "lm_head.weight", 0);
    for (int t = 0; t < T; t++) {
      if (tgt[t] == -100) continue;
      rmsnorm(xn, x + t * D, nw, D, c->norm_eps);
      double mx = -INFINITY, sum = 0;
      for (int vv = 0; vv < V; vv++) {
        double s = 0;
        for (int d = 0; d < D; d++) s += lm[(size_t)vv * D + d] * xn[d];
        logits[vv] = s;
        if (s > mx) mx = s;
      }
      for (int vv = 0; vv < V; vv++) sum += exp(logits[vv] - mx);
      loss += -(logits[tgt[t]] - mx - log(sum));
      count++;
    }
    free(pos);
  }
  free(x), free(xn), free(hbuf), free(q), free(k), free(v), free(o), free(p), free(gu);
  free(hid), free(xin), free(logits);
  if (ntokens) *ntokens = count;
  return loss;
}
