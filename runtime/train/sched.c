/* sched.c: learning-rate schedules, as torchtune's. A schedule gives each
 * step's lr, which the step graph takes as a runtime input, so a schedule
 * never recompiles anything. */
#include "train.h"

#include <math.h>
#include <string.h>

static const char cosine[] = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup";
static const char constant[] = "torchtune.training.lr_schedulers.get_constant_schedule";

int sched_from_recipe(const Recipe *r, long total_steps, Schedule *out) {
  memset(out, 0, sizeof *out);
  out->kind = SCHED_CONSTANT;
  out->total = total_steps;
  out->num_cycles = 0.5;
  const YamlNode *n = yaml_get(r->root, "lr_scheduler");
  if (yaml_is_null(n))
    return 0;
  const YamlNode *comp = yaml_get(n, "_component_");
  const char *c;
  if (!comp) {
    error_at(n->pos, "lr_scheduler: missing _component_ (e.g. %s)", cosine);
    return -1;
  }
  if (!yaml_string(comp, "lr_scheduler._component_", &c))
    return -1;
  if (strcmp(c, cosine) == 0) {
    out->kind = SCHED_COSINE_WARMUP;
  } else if (strcmp(c, constant) != 0) {
    error_at(comp->pos, "lr_scheduler._component_: unknown schedule '%s'; expected %s or %s", c, cosine, constant);
    return -1;
  }
  for (int i = 0; i < n->n; i++) {
    const char *k = n->keys[i];
    const YamlNode *v = n->items[i];
    char what[96];
    snprintf(what, sizeof what, "lr_scheduler.%s", k);
    long l;
    if (!strcmp(k, "_component_"))
      continue;
    if (out->kind == SCHED_COSINE_WARMUP && !strcmp(k, "num_warmup_steps")) {
      if (!yaml_int_in(v, what, 0, INT32_MAX, &l))
        return -1;
      out->warmup = l;
    } else if (out->kind == SCHED_COSINE_WARMUP && !strcmp(k, "num_training_steps")) {
      if (!yaml_int_in(v, what, 1, INT32_MAX, &l))
        return -1;
      out->total = l;
    } else if (out->kind == SCHED_COSINE_WARMUP && !strcmp(k, "num_cycles")) {
      if (!yaml_double(v, what, &out->num_cycles))
        return -1;
      if (!(out->num_cycles >= 0 && out->num_cycles <= 1e6)) {
        error_at(v->pos, "%s: %s is out of range [0, 1e6]", what, v->str);
        return -1;
      }
    } else if (!strcmp(k, "last_epoch")) {
      if (!yaml_int_in(v, what, -1, INT32_MAX, &l))
        return -1;
    } else {
      error_at(n->key_pos[i], "unknown key '%s' for %s", what, c);
      return -1;
    }
  }
  return 0;
}

/* torch's LambdaLR: optimizer step t (from 1) runs with
 * base_lr * lambda(t - 1), the scheduler having stepped t - 1 times. The
 * cosine lambda, as torchtune's get_cosine_schedule_with_warmup:
 *   s < warmup:  s / max(1, warmup)
 *   else:        max(0, 0.5 * (1 + cos(pi * num_cycles * 2 * progress))),
 *                progress = (s - warmup) / max(1, total - warmup)
 * in doubles, as Python computes it. */
double sched_lr(const Schedule *s, double base_lr, long step) {
  long k = step - 1;
  if (s->kind == SCHED_CONSTANT)
    return base_lr;
  double lambda;
  if (k < s->warmup) {
    lambda = (double)k / (double)MAX(1, s->warmup);
  } else {
    double progress = (double)(k - s->warmup) / (double)MAX(1, s->total - s->warmup);
    lambda = MAX(0.0, 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * progress)));
  }
  return base_lr * lambda;
}
