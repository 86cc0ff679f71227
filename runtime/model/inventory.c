/* inventory.c: the parameter inventory of a recipe's model. The model's
 * own tensors are HF's (llama4.c); torchtune's layout, which splits the
 * experts' fused gate_up_proj into gate and up and names everything its
 * own way, is what torchtune's FSDP shards, so plan and bench count both. */
#include "llama4.h"

#include "base.h"

#include <string.h>

static void add(InvTensor **out, int *n, int *cap, const char *name, int ndim, const int64_t *shape) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    *out = realloc(*out, sizeof(InvTensor) * (size_t)*cap);
    ASSERT(*out);
  }
  InvTensor *t = &(*out)[(*n)++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->numel = 1;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    t->numel *= shape[i];
  }
}

int inventory_tensors(const L4Config *m, bool torchtune, InvTensor **out) {
  *out = NULL;
  int n = 0, cap = 0;
  if (!torchtune) {
    int count = l4_tensors(m, NULL);
    L4Tensor *ts = calloc((size_t)count, sizeof(L4Tensor));
    ASSERT(ts);
    l4_tensors(m, ts);
    for (int i = 0; i < count; i++)
      add(out, &n, &cap, ts[i].name, ts[i].ndim, ts[i].shape);
    free(ts);
    return n;
  }
  int64_t D = m->embed_dim, V = m->vocab_size, E = m->num_experts, H = m->hidden_dim, Hs = m->shared_hidden_dim;
  int64_t Hm = m->mlp_hidden_dim, q = (int64_t)m->num_heads * m->head_dim, kv = (int64_t)m->num_kv_heads * m->head_dim;
  char name[160];
  add(out, &n, &cap, "tok_embeddings.weight", 2, (int64_t[]){V, D});
  for (long l = 0; l < m->num_layers; l++) {
    /* torchtune's llama4_decoder: MoE when moe_every_n_layers is None or
     * (l + 1) % n == 0, else llama4_mlp, a FeedForward whose w1, w2, w3 are
     * gate, down, up */
    bool moe = m->moe_every_n_layers <= 1 || (l + 1) % m->moe_every_n_layers == 0;
    enum { ALL, MOE, DENSE };
    struct { const char *part; int nd; int64_t s[3]; int in; } parts[] = {
        {"sa_norm.scale", 1, {D}, ALL},
        {"attn.q_proj.weight", 2, {q, D}, ALL},
        {"attn.k_proj.weight", 2, {kv, D}, ALL},
        {"attn.v_proj.weight", 2, {kv, D}, ALL},
        {"attn.output_proj.weight", 2, {D, q}, ALL},
        {"mlp_norm.scale", 1, {D}, ALL},
        {"mlp.router.gate.weight", 2, {E, D}, MOE},
        {"mlp.experts.gate_proj", 3, {E, D, H}, MOE},
        {"mlp.experts.down_proj", 3, {E, H, D}, MOE},
        {"mlp.experts.up_proj", 3, {E, D, H}, MOE},
        {"mlp.shared_expert.w1.weight", 2, {Hs, D}, MOE},
        {"mlp.shared_expert.w2.weight", 2, {D, Hs}, MOE},
        {"mlp.shared_expert.w3.weight", 2, {Hs, D}, MOE},
        {"mlp.w1.weight", 2, {Hm, D}, DENSE},
        {"mlp.w2.weight", 2, {D, Hm}, DENSE},
        {"mlp.w3.weight", 2, {Hm, D}, DENSE},
    };
    for (size_t k = 0; k < ARRAY_LEN(parts); k++) {
      if (parts[k].in != ALL && parts[k].in != (moe ? MOE : DENSE))
        continue;
      if (!m->use_shared_expert && strstr(parts[k].part, "shared_expert"))
        continue;
      snprintf(name, sizeof name, "layers.%ld.%s", l, parts[k].part);
      add(out, &n, &cap, name, parts[k].nd, parts[k].s);
    }
  }
  add(out, &n, &cap, "norm.scale", 1, (int64_t[]){D});
  add(out, &n, &cap, "output.weight", 2, (int64_t[]){V, D});
  return n;
}
