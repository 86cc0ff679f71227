/* optc.c: the command line. */
#include "tools.h"

#include "args.h"
#include "bench.h"
#include "data.h"
#include "frontend.h"
#include "optc.h"
#include "passes.h"
#include "plan.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <string.h>

#ifndef OPTC_VERSION
#define OPTC_VERSION "0.1.0"
#endif

static const char usage_head[] =
    "usage: optc [compile] CONFIG [options]\n"
    "       optc SUBCOMMAND [options]\n"
    "       optc --help | --version\n"
    "\n"
    "optc compiles the optimizer step of a torchtune-shaped recipe into fused\n"
    "passes over memory. CONFIG is a recipe (.yaml) or a step graph (.optir);\n"
    "a built-in optimizer body may also be named alone (adamw, adam, sgd, lion,\n"
    "adagrad, rmsprop).\n"
    "\n"
    "subcommands:\n";

static void print_usage(FILE *f, const char *only); /* below the subcommands' table */

static const char usage_exec[] =
    "usage: optc exec CONFIG --in IN.safetensors --out OUT.safetensors [options] [KEY=VALUE ...]\n"
    "\n"
    "Runs optimizer steps of CONFIG (a recipe .yaml, an .optir file or a built-in\n"
    "name) on the tensors of IN and writes the result to OUT, atomically.\n"
    "\n"
    "IN holds, for each parameter NAME: NAME and NAME.grad; optionally its states\n"
    "under torch's state_dict names (NAME.exp_avg, NAME.exp_avg_sq,\n"
    "NAME.max_exp_avg_sq, NAME.momentum_buffer, NAME.sum, NAME.square_avg,\n"
    "NAME.grad_avg) and its step count NAME.step (or one scalar `step`).\n"
    "Missing states start as torch starts them. OUT holds the params, the states\n"
    "and NAME.step after the steps, and every other tensor of IN unchanged (the\n"
    "grads too, so OUT can be the next run's IN).\n"
    "\n"
    "When any grad is NaN or infinite the step is skipped for the whole group\n"
    "(params, states and step unchanged) and reported; the count is in OUT's\n"
    "metadata as optc.skipped_steps. With `nonfinite_grads: error` in the\n"
    "recipe it is an error instead, and OUT is not written.\n"
    "\n"
    "options:\n"
    "  --in FILE            input tensors\n"
    "  --out FILE           output tensors\n"
    "  --steps N            steps to run with the same grads (default 1)\n"
    "  --backend NAME       interp: the reference interpreter (the default)\n"
    "                       eager: the front end's graph op by op, as torch eager\n"
    "                       cpu: the compiled step (LLVM), multithreaded\n"
    "                       cuda: the compiled step on GPU 0 (NVRTC; the driver is dlopened)\n"
    "  --threads N          threads for --backend cpu (default: the cores available,\n"
    "                       divided among the ranks)\n"
    "  --nproc N            run the step sharded over N ranks (FSDP-style: grads\n"
    "                       reduce-scattered, params all-gathered) under mpirun;\n"
    "                       the output is byte-identical to --nproc 1\n"
    "  --set NAME=VALUE     a runtime input (lr, num_tokens, world_size, max_norm, ...)\n"
    "                       or, for an .optir CONFIG, an option (amsgrad=true)\n"
    "  KEY=VALUE            override a recipe key (optimizer.lr=1e-4)\n"
    "  -h, --help           this text\n";

static const char usage_compile[] =
    "usage: optc [compile] CONFIG [options] [KEY=VALUE ...]\n"
    "\n"
    "Builds the step graph of CONFIG (a recipe .yaml, or an .optir file) and\n"
    "runs the pass pipeline over it.\n"
    "\n"
    "options:\n"
    "  --dump-ir, --emit=ir  print the step graph the front end built (for an\n"
    "                        .optir file: the parsed program, which reads back)\n"
    "  --dump-ir=all         print it before the passes and after each pass,\n"
    "                        each under a '// ----- IR Dump ... -----' header\n"
    "  --dump-ir=after-PASS  print it after PASS (see the list below)\n"
    "  --emit=llvm           the CPU backend's LLVM IR, before and after default<O3>\n"
    "  --emit=asm            the CPU backend's assembly\n"
    "  --target=cpu          the backend --emit and --time compile for (cpu is the default)\n"
    "  --target=cuda         ... or the GPU backend: --emit=cuda (the CUDA C), ptx or cubin\n"
    "  --arch=sm_90          with --target=cuda: the GPU arch (default: GPU 0's, else sm_90;\n"
    "                        compute_90 gives PTX only)\n"
    "  --verbose             with --target=cuda: each kernel's registers, spills, stack,\n"
    "                        block size and shared memory (ptxas -v)\n"
    "  --cpu=NAME            compile for this CPU (e.g. skylake-avx512) instead of the host\n"
    "  --time                compile for the target and print the time of each stage\n"
    "  --emit=plan           print the phase plan: per phase, the buffers read and\n"
    "                        written, the reductions, and bytes moved per element\n"
    "  --json                with --emit=plan: as JSON\n"
    "  --eager               with --emit=plan: also the eager executor's bytes per\n"
    "                        element (the unoptimized graph, op by op)\n"
    "  --verify-each         run the verifier after every pass\n"
    "  -o FILE               write the output to FILE (atomically) instead of stdout\n"
    "  KEY=VALUE             override a recipe key, torchtune style (optimizer.lr=1e-4)\n"
    "  -h, --help            this text\n"
    "\n"
    "passes, in order:\n";

static void print_compile_help(void) {
  fputs(usage_compile, stdout);
  for (int i = 0; i < pipeline_num_passes; i++)
    printf("  %-12s %s\n", pipeline_passes[i].name, pipeline_passes[i].desc);
}

/* Builds the graph CONFIG names: a recipe (a file, or a bundled config such
 * as llama4/scout_17B_16E_full), an .optir file or a built-in. */
static Graph *load_config(const char *config, const char *const *overrides, int nov, Arena *a) {
  if (recipe_is_config(config)) {
    Recipe *r = recipe_open(config, overrides, nov, a, NULL);
    if (r)
      recipe_note_unused(r);
    return r ? frontend_build(r) : NULL;
  }
  if (nov > 0) {
    error("KEY=VALUE overrides apply to recipes (.yaml), not to '%s'", config);
    return NULL;
  }
  return optir_load(config, a);
}

typedef struct {
  FILE *f;
  const char *path; /* -o: written atomically from buf at the end */
  Buf buf;
} Output;

static int write_buf(FILE *f, void *ctx) {
  Buf *b = ctx;
  return b->len && fwrite(b->data, 1, b->len, f) != b->len ? -1 : 0;
}

static int cmd_compile(int argc, char **argv) {
  const char *config = NULL, *emit = NULL, *out_path = NULL;
  PipelineOptions po = {0};
  bool dump = false, json = false, eager = false, timing = false;
  CpuTarget target = {0};
  CudaTarget gpu = {0};
  bool cuda = false, verbose = false;
  const char **overrides = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  Args p;
  args_init(&p, "optc compile", argc, argv);
  const char *v;
  while (args_next(&p)) {
    const char *a = p.a;
    if (args_help(&p)) {
      print_compile_help();
      free(overrides);
      return 0;
    } else if (args_flag(&p, "--dump-ir")) {
      emit = "ir";
    } else if (args_value_eq(&p, "--dump-ir", &v)) {
      dump = true;
      if (!strcmp(v, "all")) {
        po.dump_input = true;
        po.dump_after = "all";
      } else if (!strncmp(v, "after-", 6) && pipeline_find_pass(v + 6) >= 0) {
        po.dump_after = v + 6;
      } else {
        Buf names = {0};
        for (int k = 0; k < pipeline_num_passes; k++)
          buf_printf(&names, "%safter-%s", k ? ", " : "", pipeline_passes[k].name);
        error("unknown --dump-ir value '%s'; expected all or one of: %s", v, names.data);
        buf_free(&names);
        p.rc = 2;
      }
    } else if (args_value(&p, "--emit", &v)) {
      emit = v;
      if (v && strcmp(emit, "ir") && strcmp(emit, "plan") && strcmp(emit, "llvm") && strcmp(emit, "asm") &&
          strcmp(emit, "cuda") && strcmp(emit, "ptx") && strcmp(emit, "cubin")) {
        error("unknown --emit value '%s'; expected ir, plan, llvm, asm, cuda, ptx or cubin", emit);
        p.rc = 2;
      }
    } else if (args_value(&p, "--target", &v)) {
      if (v && strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0) {
        error("unknown --target '%s'; expected cpu or cuda", v);
        p.rc = 2;
      }
      cuda = v && !strcmp(v, "cuda");
    } else if (args_value(&p, "--arch", &v)) {
      gpu.arch = v;
    } else if (args_flag(&p, "--verbose")) {
      verbose = true;
    } else if (args_value(&p, "--cpu", &v)) {
      target.cpu = v;
    } else if (args_flag(&p, "--time")) {
      timing = true;
    } else if (args_flag(&p, "--json")) {
      json = true;
    } else if (args_flag(&p, "--eager")) {
      eager = true;
    } else if (args_flag(&p, "--verify-each")) {
      po.verify_each = true;
    } else if (args_value(&p, "-o", &v)) {
      out_path = v;
    } else if (args_option(&p)) {
      args_unknown(&p);
    } else if (!config) {
      config = a;
    } else if (args_is_override(a)) {
      overrides[nov++] = a;
    } else {
      error("unexpected argument '%s': one CONFIG at a time", a);
      p.rc = 2;
    }
  }
  if (p.rc) {
    free(overrides);
    return p.rc;
  }
  if (!config) {
    fputs("optc: error: no CONFIG given\n", stderr);
    print_usage(stderr, NULL);
    free(overrides);
    return 2;
  }
  Arena *arena = arena_new();
  int rc = 1;
  Output out = {0};
  FILE *mem = NULL;
  if (out_path) {
    mem = open_memstream(&out.buf.data, &out.buf.len);
    out.f = mem;
  } else {
    out.f = stdout;
  }
  po.dump = dump ? out.f : NULL;
  CompileTimes times = {0};
  double t0 = now_seconds();
  Graph *g = load_config(config, overrides, nov, arena);
  bool plan = emit && !strcmp(emit, "plan");
  bool gpu_emit = emit && (!strcmp(emit, "cuda") || !strcmp(emit, "ptx") || !strcmp(emit, "cubin"));
  bool codegen = emit && (!strcmp(emit, "llvm") || !strcmp(emit, "asm") || gpu_emit);
  if (gpu_emit && !cuda) {
    error("--emit=%s is the GPU backend's: add --target=cuda", emit);
    free(overrides);
    arena_free(arena);
    return 2;
  }
  if (g && !recipe_is_config(config) && (plan || codegen || timing || verbose))
    g = optir_specialize(g, NULL, 0, arena); /* options take their defaults */
  times.frontend = (now_seconds() - t0) * 1e3;
  if (g && emit && !plan && !codegen && !dump)
    ir_print_file(g, out.f);
  double eager_bytes = -1;
  if (g && eager)
    eager_bytes = eager_traffic(g);
  t0 = now_seconds();
  bool passed = g && pipeline_run(g, &po);
  times.passes = (now_seconds() - t0) * 1e3;
  if (passed) {
    rc = 0;
    if (gpu_emit) {
      Buf b = {0};
      int r = !strcmp(emit, "cuda") ? cuda_emit_source(g, &gpu, &b)
              : !strcmp(emit, "ptx") ? cuda_emit_ptx(g, &gpu, &b)
                                     : cuda_emit_cubin(g, &gpu, &b);
      rc = r ? 1 : 0;
      if (b.len && fwrite(b.data, 1, b.len, out.f) != b.len) /* a cubin holds NULs */
        rc = 1;
      buf_free(&b);
    } else if (codegen) {
      Buf b = {0};
      if (!strcmp(emit, "asm")) {
        rc = cpu_emit_asm(g, &target, &b) ? 1 : 0;
      } else {
        buf_puts(&b, "; ----- LLVM IR before default<O3> -----\n");
        rc = cpu_emit_llvm(g, &target, false, &b) ? 1 : 0;
        buf_puts(&b, "; ----- LLVM IR after default<O3> -----\n");
        rc |= cpu_emit_llvm(g, &target, true, &b) ? 1 : 0;
      }
      if (b.data)
        fputs(b.data, out.f);
      buf_free(&b);
    }
    if ((timing || verbose) && cuda) {
      CudaTarget tt = gpu;
      tt.no_cache = true; /* time the whole compile; a second, cached compile is timed next */
      CudaProgram *prog = cuda_compile(g, &tt, &times);
      CompileTimes cached = {0};
      CudaProgram *again = prog ? cuda_compile(g, &gpu, &cached) : NULL;
      if (!prog)
        rc = 1;
      else {
        if (timing)
          fprintf(out.f,
                  "compile %s for %s: %d phase%s\n  front end   %8.2f ms\n  passes      %8.2f ms\n"
                  "  CUDA C      %8.2f ms\n  NVRTC       %8.2f ms\n  total       %8.2f ms\n",
                  config, prog->arch, g->nphases, g->nphases == 1 ? "" : "s", times.frontend, times.passes,
                  times.build, times.codegen, times.frontend + times.passes + times.build + times.codegen);
        if (timing && again)
          fprintf(out.f, "  warm (disk cache %s): %.2f ms\n", cached.cache_hit ? "hit" : "off",
                  cached.build + cached.codegen);
        if (verbose) {
          Buf b = {0};
          cuda_program_report(prog, &b);
          fputs(b.data, out.f);
          buf_free(&b);
        }
      }
      cuda_program_free(prog);
      cuda_program_free(again);
    } else if (timing) {
      CpuTarget tt = target;
      tt.no_cache = true; /* time the whole compile; a second, cached compile is timed next */
      CpuProgram *prog = cpu_compile(g, &tt, &times);
      CompileTimes cached = {0};
      CpuProgram *again = prog ? cpu_compile(g, &target, &cached) : NULL;
      if (!prog)
        rc = 1;
      else {
        double total = times.frontend + times.passes + times.build + times.opt + times.codegen + times.link;
        fprintf(out.f,
                "compile %s for %s: %d phase%s\n"
                "  front end   %8.2f ms\n  passes      %8.2f ms\n  LLVM build  %8.2f ms\n"
                "  O3          %8.2f ms\n  codegen     %8.2f ms\n  JIT link    %8.2f ms\n"
                "  total       %8.2f ms\n",
                config, target.cpu ? target.cpu : "the host CPU", g->nphases, g->nphases == 1 ? "" : "s",
                times.frontend, times.passes, times.build, times.opt, times.codegen, times.link, total);
        if (again)
          fprintf(out.f, "  warm (disk cache %s): %.2f ms to link\n", cached.cache_hit ? "hit" : "off",
                  cached.link + cached.build + cached.opt + cached.codegen);
      }
      cpu_program_free(prog);
      cpu_program_free(again);
    }
    if (plan) {
      Buf b = {0};
      if (json)
        plan_print_json(g->plan, eager_bytes, &b);
      else
        plan_print(g->plan, eager_bytes, &b);
      fputs(b.data, out.f);
      buf_free(&b);
    }
  }
  if (mem) {
    fclose(mem);
    if (rc == 0 && file_write_atomic_with(out_path, write_buf, &out.buf) != 0)
      rc = 1;
    free(out.buf.data);
  }
  fflush(stdout);
  arena_free(arena);
  free(overrides);
  return rc;
}

static int cmd_exec(int argc, char **argv) {
  const char *config = NULL, *in_path = NULL, *out_path = NULL;
  long steps = 1;
  Backend backend = BACKEND_INTERP;
  Binding *sets = calloc((size_t)argc + 1, sizeof(Binding));
  const char **overrides = calloc((size_t)argc + 1, sizeof(char *));
  int nsets = 0, nov = 0, rc = 2;
  Arena *arena = arena_new();
  TensorFile in = {0}, out = {0};
  ParamGroup pg = {0};
  bool have_group = false;
  double *vals = NULL;
  void *grads0 = NULL;
  Executor ex;
  bool have_ex = false;
  int threads = 0, nproc = 1;
  bool mpi_rank = false; /* one of --nproc's ranks, started by mpirun */
  Coll *coll = NULL;
  Fsdp fsdp;
  bool have_fsdp = false;
  Binding *input_sets = NULL; /* for an .optir CONFIG: the --sets that are not options */
  int ninput_sets = 0;
  Args p;
  args_init(&p, "optc exec", argc, argv);
  while (args_next(&p)) {
    const char *a = p.a, *s;
    if (args_help(&p)) {
      fputs(usage_exec, stdout);
      rc = 0;
      goto done;
    } else if (args_flag(&p, "--mpi-rank")) {
      mpi_rank = true;
    } else if (args_value(&p, "--in", &in_path) || args_value(&p, "--out", &out_path)) {
    } else if (args_long(&p, "--steps", 1, LONG_MAX, &steps) || args_int(&p, "--nproc", 1, 4096, &nproc) ||
               args_int(&p, "--threads", 1, 1024, &threads)) {
    } else if (args_value(&p, "--backend", &s)) {
      if (s && !backend_from_name(s, &backend)) {
        error("unknown --backend '%s'; expected one of: interp, eager, cpu, cuda", s);
        p.rc = 2;
      }
    } else if (args_value(&p, "--set", &s)) {
      if (s && !parse_set(s, &sets[nsets]))
        p.rc = 2;
      else if (s)
        nsets++;
    } else if (args_option(&p)) {
      args_unknown(&p);
    } else if (!config) {
      config = a;
    } else if (args_is_override(a)) {
      overrides[nov++] = a;
    } else {
      args_unexpected(&p);
    }
  }
  if (p.rc)
    goto done;
  if (!config || !in_path || !out_path) {
    error("exec needs CONFIG, --in and --out (see optc exec --help)");
    goto done;
  }
  if (nproc > 1 && !mpi_rank) { /* every rank runs this same command */
    rc = launch_ranks(nproc, "exec", NULL, argc, argv, threads ? threads : MAX(1, pool_default_threads() / nproc));
    goto done;
  }
  rc = 1;
  if (mpi_rank) {
    char why[256];
    coll = coll_mpi(NULL, NULL, why, sizeof why);
    if (!coll) {
      error("%s", why);
      goto done;
    }
  }
  NonfiniteMode nonfinite = NONFINITE_SKIP;
  Graph *g;
  Recipe *recipe = NULL;
  if (recipe_is_config(config)) {
    recipe = recipe_open(config, overrides, nov, arena, NULL);
    g = recipe ? frontend_build(recipe) : NULL;
    if (recipe)
      nonfinite = recipe->nonfinite;
  } else {
    if (nov > 0) {
      error("KEY=VALUE overrides apply to recipes (.yaml), not to '%s'", config);
      goto done;
    }
    g = optir_load(config, arena);
    if (g) {
      /* --set may choose the program's options; the rest go to inputs. */
      Binding *opts = calloc((size_t)nsets + 1, sizeof(Binding));
      Binding *rest = calloc((size_t)nsets + 1, sizeof(Binding));
      int nopts = 0, nrest = 0;
      for (int k = 0; k < nsets; k++) {
        Ref x = graph_find_input(g, sets[k].name);
        if (x != NOREF && g->ins[x].op == OP_OPTION)
          opts[nopts++] = sets[k];
        else
          rest[nrest++] = sets[k];
      }
      g = optir_specialize(g, opts, nopts, arena);
      input_sets = rest;
      ninput_sets = nrest;
      free(opts);
    }
  }
  /* eager runs the graph as the front end built it, op by op; the other
   * backends run the pipeline's result */
  Graph *unopt = g ? graph_clone(g, arena) : NULL;
  if (!g || !pipeline_run(g, &(PipelineOptions){0}))
    goto done;
  /* A recipe's compiled step runs through the public API (include/optc.h),
   * as a library user's does, on one rank or sharded; the reference
   * backends (interp, eager) and .optir programs run the runtime's
   * executors. */
  if (recipe && (backend == BACKEND_CPU || backend == BACKEND_CUDA)) {
    optc_error err;
    optc_step *api;
    if (optc_step_from_recipe(config, recipe->src.text, overrides, nov,
                              backend == BACKEND_CPU ? OPTC_TARGET_CPU : OPTC_TARGET_CUDA, &api, &err) != OPTC_OK) {
      fprintf(stderr, "%s\n", err.message);
      goto done;
    }
    executor_init_api(&ex, api, g, threads, NULL);
  } else if (executor_init(&ex, backend, g, unopt, threads, NULL) != 0) {
    goto done;
  }
  have_ex = true;
  g = (Graph *)ex.g;
  vals = calloc((size_t)g->nins + 1, sizeof(double));
  Binding first_step = {"step", 1.0};
  if (inputs_resolve(g, input_sets ? input_sets : sets, input_sets ? ninput_sets : nsets, &first_step, 1, vals) != 0)
    goto done;
  if (st_read(in_path, &in) != 0)
    goto done;
  int finite;
  if (group_from_file(&pg, g, &in, vals, &finite) != 0)
    goto done;
  have_group = true;
  if (coll) {
    /* every rank read the whole file; each keeps its slice */
    if (fsdp_init(&fsdp, coll, g, pg.ntensors, pg.layout.numel, 0, NULL) != 0)
      goto done;
    have_fsdp = true;
    fsdp_load(&fsdp, &pg, coll_rank(coll) == 0);
  }
  bool talk = !coll || coll_rank(coll) == 0;
  Ref step_ref = graph_find_input(g, "step");
  int skipped = 0;
  /* The recipe's lr schedule feeds %lr every step: a runtime input, so it
   * never recompiles. torchtune's num_training_steps: this run's last step. */
  Schedule sched = {.kind = SCHED_CONSTANT};
  Ref lr_ref = graph_find_input(g, "lr");
  double base_lr = lr_ref != NOREF ? vals[lr_ref] : 0;
  if (recipe && sched_from_recipe(recipe, (long)pg.step + steps, &sched) != 0)
    goto done;
  /* Every step gets the same fresh grads, as a new backward would: a graph
   * that writes the scaled grads back (as torch does to p.grad) must not
   * feed them to the next step. */
  int gbuf = -1;
  for (int b = 0; b < g->nbufs; b++)
    if (g->bufs[b].kind == BUF_GRAD)
      gbuf = b;
  bool stores_grad = false;
  for (int i = 0; i < g->nins; i++)
    stores_grad |= g->ins[i].op == OP_STORE && g->ins[i].buf == gbuf;
  size_t gbytes = (size_t)pg.layout.total * (size_t)type_size(g->bufs[gbuf].type);
  grads0 = stores_grad && steps > 1 ? malloc(gbytes + 1) : NULL;
  if (grads0)
    memcpy(grads0, pg.bufs[gbuf], gbytes);
  for (long s = 0; s < steps; s++) {
    if (grads0 && !coll)
      memcpy(pg.bufs[gbuf], grads0, gbytes);
    double now = coll ? fsdp.step : pg.step;
    if (step_ref != NOREF)
      vals[step_ref] = now + 1;
    if (lr_ref != NOREF)
      vals[lr_ref] = sched_lr(&sched, base_lr, (long)now + 1);
    StepArgs args = {.inputs = vals, .grads_finite = finite, .propagate = nonfinite == NONFINITE_PROPAGATE};
    StepResult res;
    if ((coll ? fsdp_step(&fsdp, &ex, vals, &res) : executor_step(&ex, &pg, &args, &res)) != 0) {
      goto done;
    }
    if (res.skipped) {
      if (nonfinite == NONFINITE_ERROR) {
        if (talk)
          error("step %g: non-finite gradients (nonfinite_grads: error); %s not written", now + 1, out_path);
        goto done;
      }
      if (talk)
        fprintf(stderr, "optc: step %g skipped: non-finite gradients; params and states unchanged\n", now + 1);
      skipped++;
      continue;
    }
    if (!coll)
      pg.step += 1;
  }
  if (coll && fsdp_store(&fsdp, &pg) != 0)
    goto done;
  if (!talk) { /* rank 0 writes */
    rc = 0;
    goto done;
  }
  if (group_to_file(&pg, &in, &out) != 0)
    goto done;
  for (int i = 0; i < in.nmeta; i++)
    tf_set_meta(&out, in.meta_keys[i], in.meta_vals[i]);
  char num[32];
  snprintf(num, sizeof num, "%d", skipped);
  tf_set_meta(&out, "optc.skipped_steps", num);
  snprintf(num, sizeof num, "%g", pg.step);
  tf_set_meta(&out, "optc.step", num);
  tf_set_meta(&out, "optc.backend", backend_names[backend]);
  snprintf(num, sizeof num, "%d", coll ? coll_size(coll) : 1);
  tf_set_meta(&out, "optc.nproc", num);
  snprintf(num, sizeof num, "%d", cpu_compile_count());
  tf_set_meta(&out, "optc.compiles", num);
  snprintf(num, sizeof num, "%.17g", lr_ref != NOREF ? vals[lr_ref] : 0.0);
  tf_set_meta(&out, "optc.last_lr", num);
  if (st_write(out_path, &out) != 0)
    goto done;
  rc = 0;
done:
  if (have_fsdp)
    fsdp_free(&fsdp);
  if (have_group)
    group_free(&pg);
  if (have_ex)
    executor_free(&ex);
  coll_free(coll);
  tf_free(&in);
  tf_free(&out);
  for (int k = 0; k < nsets; k++)
    free((char *)sets[k].name);
  free(sets);
  free(input_sets);
  free(grads0);
  free(overrides);
  free(vals);
  arena_free(arena);
  return rc;
}

static const char usage_run[] =
    "usage: optc run [--nproc N] full_finetune_distributed --config CONFIG [KEY=VALUE ...]\n"
    "\n"
    "Finetunes the recipe's Llama 4 model on the CPU, as torchtune's\n"
    "full_finetune_distributed does: forward and backward with the full params,\n"
    "grads reduce-scattered over the ranks (FSDP-style), the optimizer step\n"
    "compiled (compile.optimizer_step: true) or eager on each rank's slice,\n"
    "params all-gathered. Logs loss, lr, grad norm, tokens/s per rank and peak\n"
    "memory each step (a progress bar on a terminal), writes metrics.jsonl to\n"
    "metric_logger.log_dir, checkpoints to checkpointer.output_dir every\n"
    "save_every_n_steps and at the end (model in HF's names, optimizer states\n"
    "in torch's, and where the run is); resume_from_checkpoint=true continues\n"
    "from the latest exactly.\n"
    "\n"
    "options:\n"
    "  --nproc N        ranks, under mpirun (default 1)\n"
    "  --config FILE    the recipe\n"
    "  KEY=VALUE        torchtune-style overrides: optimizer.lr=1e-4 max_steps=20\n"
    "  -h, --help       this text\n";

static int cmd_run(int argc, char **argv) {
  const char *config = NULL, *recipe = NULL;
  int nproc = 1;
  bool mpi_rank = false;
  const char **ov = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  Args p;
  args_init(&p, "optc run", argc, argv);
  int ignored;
  while (args_next(&p)) {
    const char *a = p.a;
    if (args_help(&p)) {
      fputs(usage_run, stdout);
      free(ov);
      return 0;
    } else if (args_flag(&p, "--mpi-rank")) {
      mpi_rank = true;
    } else if (args_int(&p, "--threads", 1, 1024, &ignored)) {
      /* the launcher passes it; the trainer divides the cores itself */
    } else if (args_int(&p, "--nproc", 1, 4096, &nproc) || args_value(&p, "--config", &config)) {
    } else if (args_option(&p)) {
      args_unknown(&p);
    } else if (!recipe && !args_is_override(a)) {
      recipe = a;
    } else if (args_is_override(a)) {
      ov[nov++] = a;
    } else {
      args_unexpected(&p);
    }
  }
  if (p.rc) {
    free(ov);
    return p.rc;
  }
  if (!recipe || strcmp(recipe, "full_finetune_distributed") != 0) {
    error("optc run runs the full_finetune_distributed recipe: optc run [--nproc N] full_finetune_distributed --config CONFIG");
    free(ov);
    return 2;
  }
  if (!config) {
    error("optc run needs --config CONFIG");
    free(ov);
    return 2;
  }
  if (nproc > 1 && !mpi_rank) {
    free(ov);
    return launch_ranks(nproc, "run", NULL, argc, argv, 0);
  }
  Arena *arena = arena_new();
  int rc = 1;
  char why[256];
  Coll *coll = mpi_rank ? coll_mpi(NULL, NULL, why, sizeof why) : coll_local();
  if (!coll) {
    error("%s", why);
  } else {
    TrainConfig tc;
    Recipe *r = recipe_open(config, ov, nov, arena, &tc);
    if (r && coll_rank(coll) == 0)
      recipe_note_unused(r);
    if (r && train_run(&tc, coll, &(TrainOptions){.eval = true}, NULL) == 0)
      rc = 0;
  }
  coll_free(coll);
  arena_free(arena);
  free(ov);
  return rc;
}

/* optc cat CONFIG [KEY=VALUE | ~KEY ...]: the config as optc reads it, after
 * the overrides and ${key} interpolation, as torchtune's `tune cat` prints
 * a config; optc ls: the bundled configs, as `tune ls`. */
static int cmd_cat(int argc, char **argv) {
  const char *config = NULL;
  const char **ov = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  Args p;
  args_init(&p, "optc cat", argc, argv);
  while (args_next(&p)) {
    const char *a = p.a;
    if (args_help(&p)) {
      puts("usage: optc cat CONFIG [KEY=VALUE | ~KEY ...]\n"
           "\n"
           "Prints CONFIG (a .yaml file or a bundled config: optc ls) as optc reads it:\n"
           "with the overrides applied, ~KEY removed and ${key} references resolved.");
      free(ov);
      return 0;
    } else if (!config && !args_is_override(a)) {
      config = a;
    } else if (args_is_override(a)) {
      ov[nov++] = a;
    } else {
      args_unexpected(&p);
    }
  }
  if (p.rc) {
    free(ov);
    return p.rc;
  }
  if (!config) {
    error("optc cat needs a CONFIG (see optc cat --help)");
    free(ov);
    return 2;
  }
  Arena *arena = arena_new();
  Recipe *r = recipe_open(config, ov, nov, arena, NULL);
  if (r) {
    recipe_note_unused(r);
    Buf b = {0};
    yaml_print(&b, r->config);
    fputs(b.data ? b.data : "", stdout);
    buf_free(&b);
  }
  arena_free(arena);
  free(ov);
  return r ? 0 : 1;
}

static int cmd_ls(int argc, char **argv) {
  Args p;
  args_init(&p, "optc ls", argc, argv);
  while (args_next(&p)) {
    if (args_help(&p)) {
      puts("usage: optc ls\n\nThe configs bundled in optc, by the name --config takes, and their source.");
      return 0;
    }
    args_unexpected(&p);
  }
  if (p.rc)
    return p.rc;
  for (int i = 0; i < num_builtin_configs; i++)
    printf("%-36s %s\n", builtin_configs[i].name, builtin_configs[i].path);
  return 0;
}

/* ---- optc tokenize, optc data ------------------------------------------------------------- */

static const char usage_tokenize[] =
    "usage: optc tokenize --config CONFIG [FILE] [--decode] [KEY=VALUE ...]\n"
    "\n"
    "Encodes each line of FILE (or stdin) with the recipe's tokenizer as\n"
    "torchtune's encode(line, add_bos=True, add_eos=True) does and prints its ids,\n"
    "space-separated, one output line per input line (a line is the text before\n"
    "its newline; an empty line has no ids with the Llama 4 tokenizer, as in\n"
    "torchtune). With --decode each input line holds ids, and is printed as\n"
    "decode(ids) with torchtune's defaults (truncate_at_eos, skip_special_tokens).\n"
    "\n"
    "options:\n"
    "  --config FILE    the recipe, for its tokenizer: block\n"
    "  --decode         ids to text\n"
    "  KEY=VALUE        override a recipe key (tokenizer.path=/tmp/tokenizer.model)\n"
    "  -h, --help       this text\n";

static const char usage_data[] =
    "usage: optc data --config CONFIG [--dump N] [KEY=VALUE ...]\n"
    "\n"
    "Builds the recipe's dataset: block with its tokenizer: block, as torchtune's\n"
    "dataset would be built (samples cut at tokenizer.max_seq_len, not at the\n"
    "model's), and prints a summary; with --dump N, the first N samples (or packs)\n"
    "as JSON lines, exactly as torchtune's dataset yields them before batching:\n"
    "{\"tokens\": [...], \"labels\": [...]} with labels already shifted and -100 where\n"
    "masked, and for packs \"input_pos\" and \"seq_lens\" too. With optc's\n"
    "holdout_fraction the held-out samples come last.\n"
    "\n"
    "options:\n"
    "  --config FILE    the recipe\n"
    "  --dump N         print N samples\n"
    "  KEY=VALUE        override a recipe key (dataset.split=train[:10])\n"
    "  -h, --help       this text\n";

/* The recipe's tokenizer, for tokenize and data. */
static bool load_tokenizer(const char *config, const char *const *ov, int nov, Arena *arena, Recipe **rp,
                           Tokenizer *tok) {
  Recipe *r = recipe_open(config, ov, nov, arena, NULL);
  if (!r)
    return false;
  const YamlNode *tn = yaml_get(r->root, "tokenizer");
  if (!tn) {
    error("%s: the recipe has no tokenizer: block", config);
    return false;
  }
  *rp = r;
  return tokenizer_from_config(tn, tok);
}

/* The arguments tokenize and data share: --config, KEY=VALUE; *flag is set
 * by its name, *num read after --dump. 0 to go on, else the exit code. */
static int data_args(int argc, char **argv, const char *usage, const char **config, const char **file,
                     bool *decode, long *dump, const char **ov, int *nov) {
  Args p;
  args_init(&p, decode ? "optc tokenize" : "optc data", argc, argv);
  while (args_next(&p)) {
    const char *a = p.a;
    if (args_help(&p)) {
      fputs(usage, stdout);
      return -1;
    } else if (args_value(&p, "--config", config)) {
    } else if (decode && args_flag(&p, "--decode")) {
      *decode = true;
    } else if (dump && args_long(&p, "--dump", 0, LONG_MAX, dump)) {
    } else if (args_option(&p)) {
      args_unknown(&p);
    } else if (args_is_override(a)) {
      ov[(*nov)++] = a;
    } else if (file && !*file) {
      *file = a;
    } else {
      args_unexpected(&p);
    }
  }
  if (p.rc)
    return p.rc;
  if (!*config) {
    error("%s needs --config CONFIG", decode ? "optc tokenize" : "optc data");
    return 2;
  }
  return 0;
}

static int cmd_tokenize(int argc, char **argv) {
  const char *config = NULL, *file = NULL;
  bool decode = false;
  const char **ov = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  int rc = data_args(argc, argv, usage_tokenize, &config, &file, &decode, NULL, ov, &nov);
  if (rc) {
    free(ov);
    return rc < 0 ? 0 : rc;
  }
  Arena *arena = arena_new();
  Recipe *r = NULL;
  Tokenizer tok = {0};
  rc = 1;
  Buf in = {0}, out = {0};
  Ids ids = {0};
  if (!load_tokenizer(config, ov, nov, arena, &r, &tok))
    goto done;
  FILE *f = file ? fopen(file, "rb") : stdin;
  if (!f) {
    error("cannot open '%s': %s", file, strerror(errno));
    goto done;
  }
  char chunk[1 << 16];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
    buf_put(&in, chunk, got);
  bool rerr = ferror(f);
  if (file)
    fclose(f);
  if (rerr) {
    error("reading %s: %s", file ? file : "stdin", strerror(errno));
    goto done;
  }
  SrcFile src = {file ? file : "<stdin>", in.data, in.len};
  bool ok = true;
  size_t i = 0;
  for (int line = 1; i < in.len && ok; line++) {
    size_t s = i;
    while (i < in.len && in.data[i] != '\n')
      i++;
    size_t e = i++;
    out.len = 0;
    ids.n = 0;
    if (!decode) {
      ok = tokenizer_encode(&tok, in.data + s, e - s, true, true, &ids) >= 0;
      for (int k = 0; ok && k < ids.n; k++)
        buf_printf(&out, "%s%d", k ? " " : "", ids.v[k]);
    } else {
      for (size_t k = s; k < e && ok;) {
        while (k < e && (in.data[k] == ' ' || in.data[k] == '\t' || in.data[k] == '\r'))
          k++;
        if (k == e)
          break;
        char *end;
        errno = 0;
        long v = strtol(in.data + k, &end, 10);
        if (end == in.data + k || (size_t)(end - in.data) > e || errno || v < INT32_MIN || v > INT32_MAX ||
            (end < in.data + e && *end != ' ' && *end != '\t' && *end != '\r')) {
          error_at((SrcPos){&src, line, (int)(k - s) + 1}, "expected a token id");
          ok = false;
          break;
        }
        ids_push(&ids, (int32_t)v);
        k = (size_t)(end - in.data);
      }
      ok = ok && tokenizer_decode(&tok, ids.v, ids.n, true, true, &out) == 0;
    }
    if (!ok) {
      note_at((SrcPos){&src, line, 1}, "in line %d", line);
      break;
    }
    buf_putc(&out, '\n');
    if (fwrite(out.data, 1, out.len, stdout) != out.len) {
      error("writing the output: %s", strerror(errno));
      ok = false;
    }
  }
  if (ok && fflush(stdout) != 0) {
    error("writing the output: %s", strerror(errno));
    ok = false;
  }
  rc = ok ? 0 : 1;
done:
  tokenizer_free(&tok);
  ids_free(&ids);
  buf_free(&in);
  buf_free(&out);
  arena_free(arena);
  free(ov);
  return rc;
}

static int cmd_data(int argc, char **argv) {
  const char *config = NULL;
  long dump = -1;
  const char **ov = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  int rc = data_args(argc, argv, usage_data, &config, NULL, NULL, &dump, ov, &nov);
  if (rc) {
    free(ov);
    return rc < 0 ? 0 : rc;
  }
  Arena *arena = arena_new();
  Recipe *r = NULL;
  Tokenizer tok = {0};
  Dataset *ds = NULL;
  rc = 1;
  if (!load_tokenizer(config, ov, nov, arena, &r, &tok))
    goto done;
  /* torchtune's dataset knows only the tokenizer's max_seq_len (None: no cut) */
  ds = dataset_from_config(yaml_get(r->root, "dataset"), &tok, tok.max_seq_len ? tok.max_seq_len : 1 << 30);
  if (!ds)
    goto done;
  Buf out = {0};
  if (dump < 0) {
    dataset_describe(ds, &out);
    buf_putc(&out, '\n');
  }
  int n = dataset_num_samples(ds, SPLIT_ALL);
  bool ok = true;
  for (int i = 0; i < n && i < dump && ok; i++) {
    dataset_dump_row(ds, SPLIT_ALL, i, &out);
    if (out.len > (1 << 20) || i + 1 == n || i + 1 == dump) {
      ok = fwrite(out.data, 1, out.len, stdout) == out.len;
      out.len = 0;
    }
  }
  if (out.len)
    ok = ok && fwrite(out.data, 1, out.len, stdout) == out.len;
  buf_free(&out);
  if (!ok || fflush(stdout) != 0) {
    error("writing the output: %s", strerror(errno));
    goto done;
  }
  rc = 0;
done:
  dataset_free(ds);
  tokenizer_free(&tok);
  arena_free(arena);
  free(ov);
  return rc;
}

/* ---- the subcommands --------------------------------------------------------------------- */

/* `optc NAME [SUB] ARGS...`: run gets the ARGS after NAME (and SUB). */
typedef struct {
  const char *name, *sub;
  int (*run)(int argc, char **argv);
  const char *what; /* optc --help's line */
} Command;

static const Command commands[] = {
    {"compile", NULL, cmd_compile, "(the default) build, verify and print the step graph"},
    {"exec", NULL, cmd_exec, "run optimizer steps on tensors from a safetensors file"},
    {"bench", "optimizer", bench_optimizer,
     "the step against eager, foreach, a fused loop and the memory bandwidth"},
    {"bench", "step", bench_step, "a training step, compiled and eager"},
    {"plan", NULL, cmd_plan, "per-rank memory, traffic and step time of a recipe"},
    {"run", NULL, cmd_run, "a finetune: optc run [--nproc N] full_finetune_distributed --config CONFIG"},
    {"tokenize", NULL, cmd_tokenize, "encode (or --decode) lines with a recipe's tokenizer, as torchtune's encode"},
    {"data", NULL, cmd_data, "a recipe's dataset as torchtune builds it (--dump N: its first samples)"},
    {"cat", NULL, cmd_cat, "a config as optc reads it (overrides, ~KEY, ${key} resolved)"},
    {"ls", NULL, cmd_ls, "the bundled configs (--config llama4/scout_17B_16E_full names one)"},
};

static void print_usage(FILE *f, const char *only) {
  if (!only)
    fputs(usage_head, f);
  for (size_t k = 0; k < ARRAY_LEN(commands); k++) {
    const Command *c = &commands[k];
    if (only && strcmp(c->name, only) != 0)
      continue;
    char name[32];
    snprintf(name, sizeof name, "%s%s%s", c->name, c->sub ? " " : "", c->sub ? c->sub : "");
    fprintf(f, "  %s%-16s %s\n", only ? "optc " : "", name, c->what);
  }
  if (!only)
    fputs("\nRun 'optc SUBCOMMAND --help' for the options of each.\n", f);
}

int main(int argc, char **argv) {
  /* a file past `ulimit -f` is a write error (EFBIG) that names the file,
   * not a kill */
  signal(SIGXFSZ, SIG_IGN);
  if (argc < 2) {
    print_usage(stderr, NULL);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    print_usage(stdout, NULL);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("optc %s\n", OPTC_VERSION);
    return 0;
  }
  bool has_subs = false;
  for (size_t k = 0; k < ARRAY_LEN(commands); k++) {
    const Command *c = &commands[k];
    if (strcmp(c->name, cmd) != 0)
      continue;
    if (!c->sub)
      return c->run(argc - 2, argv + 2);
    has_subs = true;
    if (argc >= 3 && !strcmp(argv[2], c->sub))
      return c->run(argc - 3, argv + 3);
  }
  if (has_subs) { /* optc bench, with no or another subcommand */
    bool help = argc >= 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"));
    if (!help)
      error("optc %s needs one of these:", cmd);
    print_usage(help ? stdout : stderr, cmd);
    return help ? 0 : 2;
  }
  return cmd_compile(argc - 1, argv + 1); /* optc CONFIG ...: compile */
}
