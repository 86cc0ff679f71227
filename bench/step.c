/* step.c: `optc bench step`: the whole training step of a recipe, with the
 * optimizer compiled and with it eager, in one run: tokens per second
 * side by side, the loss curve's start and end, and where the time of a
 * step goes (forward and backward, collectives, optimizer). It fails when
 * any run's loss at any step differs from the first run's. */
#include "bench.h"

#include "args.h"
#include "tools.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static const char usage[] =
    "usage: optc bench step --config CONFIG [--nproc N] [--steps N] [--reps R] [--json FILE] [KEY=VALUE ...]\n"
    "\n"
    "Trains the recipe for N steps (default 40) from the same start with the\n"
    "optimizer step compiled and eager, alternating, R times each (default 3),\n"
    "and prints the median tokens/s side by side, each run's loss at its first\n"
    "and last step and its held-out loss before and after, and the median time\n"
    "per step of forward+backward, collectives and the optimizer. With --nproc\n"
    "N (N ranks under mpirun, FSDP) also the units' all-gathers and\n"
    "reduce-scatters: their time and what of it the model waited for, and,\n"
    "with optimizer_in_bwd=true, the optimizer's time hidden behind the\n"
    "backward. No checkpoints or metrics files are written.\n"
    "\n"
    "Every run's loss at every step must be the same bits (the compiled step\n"
    "is torch eager's arithmetic): the first difference is printed, and the\n"
    "command fails.\n";

static int write_text(FILE *f, void *ctx) { return fputs(ctx, f) < 0 ? -1 : 0; }

int bench_step(int argc, char **argv) {
  const char *config = NULL, *json_path = NULL;
  long steps = 40;
  int reps = 3, nproc = 1;
  bool mpi_rank = false; /* one of --nproc's ranks, started by mpirun */
  const char **ov = calloc((size_t)argc + 2, sizeof(char *));
  int nov = 0;
  Args p;
  args_init(&p, "optc bench step", argc, argv);
  int ignored;
  while (args_next(&p)) {
    const char *a = p.a;
    if (args_help(&p)) {
      fputs(usage, stdout);
      free(ov);
      return 0;
    } else if (args_flag(&p, "--mpi-rank")) {
      mpi_rank = true;
    } else if (args_int(&p, "--threads", 1, 1024, &ignored)) {
      /* the launcher passes it; the trainer divides the cores itself */
    } else if (args_value(&p, "--config", &config) || args_value(&p, "--json", &json_path) ||
               args_int(&p, "--nproc", 1, 4096, &nproc) || args_int(&p, "--reps", 1, 16, &reps) ||
               args_long(&p, "--steps", 1, INT32_MAX, &steps)) {
    } else if (args_is_override(a)) {
      ov[nov++] = a;
    } else {
      args_unknown(&p);
    }
  }
  if (p.rc) {
    free(ov);
    return p.rc;
  }
  if (!config) {
    error("bench step needs --config CONFIG");
    free(ov);
    return 2;
  }
  if (nproc > 1 && !mpi_rank) { /* every rank runs this command */
    free(ov);
    return launch_ranks(nproc, "bench", "step", argc, argv, 0);
  }
  char why[256];
  Coll *coll = mpi_rank ? coll_mpi(NULL, NULL, why, sizeof why) : coll_local();
  if (!coll) {
    error("%s", why);
    free(ov);
    return 1;
  }
  bool talk = coll_rank(coll) == 0;
  /* The machine's noise moves whole runs: alternate the two, keep the median. */
  TrainResult all[2][16] = {{{0}}};
  reps = MIN(reps, 16);
  /* every run's loss at every step: all of them must be the same bits */
  double *losses = calloc((size_t)(2 * reps) * (size_t)steps, sizeof(double));
  ASSERT(losses);
  const char *name[2] = {"compiled", "eager"};
  int rc = 0;
  for (int rep = 0; rep < reps && rc == 0; rep++)
    for (int k = 0; k < 2 && rc == 0; k++) {
      ov[nov] = k == 0 ? "compile.optimizer_step=true" : "compile.optimizer_step=false";
      Arena *arena = arena_new();
      TrainConfig tc;
      Recipe *r = recipe_open(config, ov, nov + 1, arena, &tc);
      if (talk)
        fprintf(stderr, "\n== %s optimizer, run %d of %d\n", name[k], rep + 1, reps);
      TrainOptions to = {.steps = steps, .bench = true, .eval = rep == 0, .quiet = !talk};
      all[k][rep].losses = losses + (size_t)(2 * rep + k) * (size_t)steps;
      all[k][rep].max_losses = (int)steps;
      if (!r || train_run(&tc, coll, &to, &all[k][rep]) != 0)
        rc = 1;
      arena_free(arena);
    }
  int world = coll_size(coll);
  coll_free(coll);
  free(ov);
  if (rc != 0 || !talk) {
    free(losses);
    return rc;
  }
  /* The first run's losses against every other run's, step by step. */
  const TrainResult *ref = &all[0][0];
  const char *differs = NULL;
  int diff_rep = 0;
  long diff_step = 0;
  for (int rep = 0; rep < reps && !differs; rep++)
    for (int k = 0; k < 2 && !differs; k++) {
      const TrainResult *t = &all[k][rep];
      if (t->nlosses != ref->nlosses || t->nlosses != (int)ref->steps) {
        differs = name[k], diff_rep = rep, diff_step = -1;
        break;
      }
      for (int s = 0; s < t->nlosses; s++)
        if (memcmp(&t->losses[s], &ref->losses[s], sizeof(double)) != 0) {
          differs = name[k], diff_rep = rep, diff_step = s + 1;
          break;
        }
    }
  TrainResult res[2];
  for (int k = 0; k < 2; k++) {
    /* the run with the median tokens/s, with the first run's held-out losses */
    int order[16];
    for (int i = 0; i < reps; i++)
      order[i] = i;
    for (int i = 1; i < reps; i++)
      for (int j = i; j > 0 && all[k][order[j]].tokens_per_second < all[k][order[j - 1]].tokens_per_second; j--) {
        int tmp = order[j];
        order[j] = order[j - 1];
        order[j - 1] = tmp;
      }
    res[k] = all[k][order[reps / 2]];
    res[k].heldout_before = all[k][0].heldout_before;
    res[k].heldout_after = all[k][0].heldout_after;
  }
  double ms[2][3], unit_ms[2][2], hidden_ms[2];
  for (int k = 0; k < 2; k++) {
    ms[k][0] = res[k].t_fwdbwd / res[k].steps * 1e3;
    ms[k][1] = res[k].t_coll / res[k].steps * 1e3;
    ms[k][2] = res[k].t_opt / res[k].steps * 1e3;
    unit_ms[k][0] = res[k].t_units / res[k].steps * 1e3;
    unit_ms[k][1] = res[k].t_units_waited / res[k].steps * 1e3;
    hidden_ms[k] = res[k].t_opt_hidden / res[k].steps * 1e3;
  }
  printf("\noptc bench step: %s, %d rank%s, %ld steps, median of %d runs each (rank 0's figures)\n", config, world,
         world == 1 ? "" : "s", res[0].steps, reps);
  printf("  %-26s %14s %14s\n", "", "compiled", "eager");
  printf("  %-26s %14.0f %14.0f   (%.2fx)\n", "tokens/s per rank", res[0].tokens_per_second,
         res[1].tokens_per_second, res[0].tokens_per_second / res[1].tokens_per_second);
  printf("  %-26s %6.4f->%6.4f %6.4f->%6.4f\n", "loss, first -> last step", res[0].first_loss, res[0].last_loss,
         res[1].first_loss, res[1].last_loss);
  printf("  %-26s %6.4f->%6.4f %6.4f->%6.4f\n", "held-out loss", res[0].heldout_before, res[0].heldout_after,
         res[1].heldout_before, res[1].heldout_after);
  printf("  %-26s %14.2f %14.2f\n", "forward+backward ms/step", ms[0][0], ms[1][0]);
  printf("  %-26s %14.2f %14.2f\n", "collectives ms/step", ms[0][1], ms[1][1]);
  printf("  %-26s %14.2f %14.2f   (%.1fx)\n", "optimizer ms/step", ms[0][2], ms[1][2], ms[1][2] / ms[0][2]);
  if (world > 1 || res[0].units.steps > 0) {
    printf("  %-26s %14.2f %14.2f   (%s)\n", "units' collectives ms/step", unit_ms[0][0], unit_ms[1][0],
           res[0].units.threaded ? "on a thread of their own" : "on the model's thread");
    printf("  %-26s %14.2f %14.2f\n", "  of which waited for", unit_ms[0][1], unit_ms[1][1]);
    printf("  %-26s %14.2f %14.2f   (%s)\n", "optimizer hidden ms/step", hidden_ms[0], hidden_ms[1],
           res[0].units.steps == 0            ? "stepped after the backward: nothing hidden"
           : !res[0].units.threaded           ? "its work in the backward ran on the model's thread"
                                              : "its work in the backward, beside it");
  }
  if (!differs)
    printf("  (every run's loss at each of its %d steps is the same, bit for bit)\n", ref->nlosses);
  else if (diff_step < 0)
    printf("  DIFFERENT: the %s run %d logged %d losses, the first compiled run %d of %ld steps\n", differs,
           diff_rep + 1, all[differs == name[0] ? 0 : 1][diff_rep].nlosses, ref->nlosses, ref->steps);
  else
    printf("  DIFFERENT: the %s run %d's loss at step %ld is %.17g, the first compiled run's %.17g\n", differs,
           diff_rep + 1, diff_step, all[differs == name[0] ? 0 : 1][diff_rep].losses[diff_step - 1],
           ref->losses[diff_step - 1]);
  if (differs)
    rc = 1;
  if (json_path) {
    json_t *o = json_pack("{s:s, s:i, s:I, s:[]}", "config", config, "nproc", world, "steps", (json_int_t)res[0].steps,
                          "results");
    for (int k = 0; k < 2; k++)
      json_array_append_new(json_object_get(o, "results"),
                            json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "optimizer",
                                      name[k], "tokens_per_second_per_rank", res[k].tokens_per_second, "first_loss",
                                      res[k].first_loss, "last_loss", res[k].last_loss, "heldout_before",
                                      res[k].heldout_before, "heldout_after", res[k].heldout_after,
                                      "forward_backward_ms", ms[k][0], "collectives_ms", ms[k][1], "optimizer_ms",
                                      ms[k][2], "unit_collectives_ms", unit_ms[k][0], "unit_collectives_waited_ms",
                                      unit_ms[k][1], "optimizer_hidden_ms", hidden_ms[k]));
    json_object_set_new(o, "speedup", json_real(res[0].tokens_per_second / res[1].tokens_per_second));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (file_write_atomic_with(json_path, write_text, text) != 0)
      rc = 1;
    free(text);
    json_decref(o);
  }
  free(losses);
  return rc;
}
