/* test_eager: the eager backend on two threads, against the interpreter.
 *
 * eager.c splits each tensor of 32,768 elements or more between the pool's
 * threads and runs every op over a thread's share before the next op, with
 * in-place writes and reused temporaries planned once per step; the goldens'
 * tensors are too small to reach that path. Here six optimizers (with the
 * options that change their graphs) x five dtype layouts x clipping off and
 * on run 3 steps on tensors of 1 to 70,001 elements, per tensor (torch's
 * for-loop) and op-major (foreach), and every buffer, the reductions and
 * the skip flag must equal the interpreter's byte for byte. The third
 * step's grads hold an Inf in the last element of the 70,001: all three
 * skip it and write nothing. */
#include "steplib.h"

/* splitmix64: params in [-1, 1), grads 100x smaller, states small and
 * positive, and one value in 1024 scaled by 1e-30 (MKL sqrt's small range) */
static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void fill_group(ParamGroup *pg, uint64_t seed) {
  const Graph *g = pg->g;
  uint64_t s = seed;
  for (int b = 0; b < g->nbufs; b++) {
    Type t = (Type)g->bufs[b].type;
    BufKind k = g->bufs[b].kind;
    for (int64_t i = 0; i < pg->layout.total; i++) {
      float u = (float)((double)(mix(&s) >> 40) / 16777216.0) * 2.0f - 1.0f;
      if ((mix(&s) & 1023) == 0)
        u *= 1e-30f;
      float v = k == BUF_PARAM ? u : k == BUF_GRAD ? u * 0.01f : k == BUF_STATE ? fabsf(u) * 1e-3f : 0;
      if (t == TY_F32)
        ((float *)pg->bufs[b])[i] = v;
      else if (t == TY_BF16)
        ((uint16_t *)pg->bufs[b])[i] = optc_f32_to_bf16(v);
      else if (t == TY_F16)
        ((uint16_t *)pg->bufs[b])[i] = optc_f32_to_f16(v);
      else
        ((double *)pg->bufs[b])[i] = v;
    }
  }
}

/* grad element flat (of the group's flat buffer) = +Inf */
static void inf_grad(ParamGroup *pg, int64_t flat) {
  const Graph *g = pg->g;
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind != BUF_GRAD)
      continue;
    Type t = (Type)g->bufs[b].type;
    if (t == TY_F32)
      ((float *)pg->bufs[b])[flat] = INFINITY;
    else if (t == TY_BF16)
      ((uint16_t *)pg->bufs[b])[flat] = 0x7f80;
    else if (t == TY_F16)
      ((uint16_t *)pg->bufs[b])[flat] = 0x7c00;
    else
      ((double *)pg->bufs[b])[flat] = INFINITY;
  }
}

int main(void) {
  static const char *const optimizers[] = {
      "torch.optim.AdamW",
      "torch.optim.Adam",
      "torch.optim.Adam\n  amsgrad: True",
      "torch.optim.SGD\n  momentum: 0.9\n  nesterov: True",
      "torch.optim.Adagrad",
      "torch.optim.RMSprop\n  centered: True\n  momentum: 0.5",
  };
  static const char *const dtypes[][2] = {
      {"fp32", "fp32"}, {"bf16", "bf16"}, {"bf16", "fp32"}, {"fp16", "fp16"}, {"fp32", "bf16"}};
  static const int64_t sizes[] = {40000, 70001, 5000, 1, 33000};
  const int nt = (int)ARRAY_LEN(sizes);
  ThreadPool *pool = pool_create(2);
  for (size_t o = 0; o < ARRAY_LEN(optimizers); o++)
    for (size_t d = 0; d < ARRAY_LEN(dtypes); d++)
      for (int clip = 0; clip < 2; clip++) {
        Arena *arena = arena_new();
        char text[512], name[128];
        snprintf(text, sizeof text,
                 "optimizer:\n  _component_: %s\n  lr: 2e-3\n  weight_decay: 0.01\ndtype: %s\n"
                 "optimizer_state_dtype: %s\n%s",
                 optimizers[o], dtypes[d][0], dtypes[d][1], clip ? "clip_grad_norm: 1.0\n" : "");
        snprintf(name, sizeof name, "%.*s %s/%s%s", (int)strcspn(optimizers[o], "\n"), optimizers[o], dtypes[d][0],
                 dtypes[d][1], clip ? " clip" : "");
        Recipe *r = recipe_from_text("<test>", text, NULL, 0, arena);
        Graph *g = r ? frontend_build(r) : NULL;
        CHECK(g, "%s: builds", name);
        if (!g) {
          arena_free(arena);
          continue;
        }
        ParamGroup pi, pe, pf; /* interpreter, eager for-loop, eager foreach */
        group_alloc(&pi, g, nt, sizes);
        group_alloc(&pe, g, nt, sizes);
        group_alloc(&pf, g, nt, sizes);
        fill_group(&pi, 7);
        fill_group(&pe, 7);
        fill_group(&pf, 7);
        double *vals = calloc((size_t)g->nins + 1, sizeof(double));
        Ref step = NOREF;
        for (int i = 0; i < g->nins; i++) {
          vals[i] = g->ins[i].imm;
          if (g->ins[i].op == OP_INPUT && g->ins[i].name && !strcmp(g->ins[i].name, "step"))
            step = i;
        }
        for (int k = 1; k <= 3; k++) {
          if (step != NOREF)
            vals[step] = k;
          if (k == 3) {
            int64_t last = pi.layout.offset[1] + sizes[1] - 1;
            inf_grad(&pi, last);
            inf_grad(&pe, last);
            inf_grad(&pf, last);
          }
          StepArgs a = {vals, -1};
          StepResult ri, re, rf;
          interp_step(g, &pi.layout, pi.bufs, &a, &ri);
          eager_run(g, &pe.layout, pe.bufs, &a, &re, false, pool);
          eager_run(g, &pf.layout, pf.bufs, &a, &rf, true, pool);
          for (int b = 0; b < g->nbufs; b++) {
            size_t nb = (size_t)pi.layout.total * type_size((Type)g->bufs[b].type);
            CHECK(!memcmp(pi.bufs[b], pe.bufs[b], nb), "%s step %d @%s: for-loop eager differs", name, k,
                  g->bufs[b].name);
            CHECK(!memcmp(pi.bufs[b], pf.bufs[b], nb), "%s step %d @%s: foreach eager differs", name, k,
                  g->bufs[b].name);
          }
          CHECK(ri.nred == re.nred && (!ri.nred || !memcmp(ri.red, re.red, sizeof(double) * (size_t)ri.nred)),
                "%s step %d: the reductions differ", name, k);
          CHECK(ri.skipped == re.skipped && ri.skipped == rf.skipped, "%s step %d: the skip differs", name, k);
          CHECK(ri.skipped == (k == 3), "%s step %d: skipped %d", name, k, ri.skipped);
        }
        group_free(&pi);
        group_free(&pe);
        group_free(&pf);
        free(vals);
        arena_free(arena);
      }
  pool_free(pool);
  printf("test_eager: %d checks, %d failed\n", nchecks, nfailed);
  return nfailed != 0;
}
