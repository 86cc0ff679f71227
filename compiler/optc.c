/* optc.c: the command line. */
#include "frontend.h"
#include "passes.h"

#include <string.h>

#ifndef OPTC_VERSION
#define OPTC_VERSION "0.1.0"
#endif

static const char usage_main[] =
    "usage: optc [compile] CONFIG [options]\n"
    "       optc --help | --version\n"
    "\n"
    "optc compiles the optimizer step of a torchtune-shaped recipe into fused\n"
    "passes over memory. CONFIG is a recipe (.yaml) or a step graph (.optir);\n"
    "a built-in optimizer body may also be named alone (adamw, adam, sgd, lion,\n"
    "adagrad, rmsprop).\n"
    "\n"
    "subcommands:\n"
    "  compile       (the default) build, verify and print the step graph\n"
    "\n"
    "Run 'optc compile --help' for the options.\n";

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

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Builds the graph CONFIG names: a recipe, an .optir file or a built-in. */
static Graph *load_config(const char *config, const char *const *overrides, int nov, Arena *a) {
  if (ends_with(config, ".yaml") || ends_with(config, ".yml")) {
    Recipe *r = recipe_load(config, overrides, nov, a);
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
  bool dump = false;
  const char **overrides = calloc((size_t)argc + 1, sizeof(char *));
  int nov = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      print_compile_help();
      free(overrides);
      return 0;
    } else if (!strcmp(a, "--dump-ir")) {
      emit = "ir";
    } else if (!strncmp(a, "--dump-ir=", 10)) {
      const char *v = a + 10;
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
        free(overrides);
        return 2;
      }
    } else if (!strncmp(a, "--emit=", 7) || !strcmp(a, "--emit")) {
      emit = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : "");
      if (strcmp(emit, "ir") != 0) {
        error("unknown --emit value '%s'; expected ir", emit);
        free(overrides);
        return 2;
      }
    } else if (!strcmp(a, "--verify-each")) {
      po.verify_each = true;
    } else if (!strcmp(a, "-o")) {
      if (i + 1 >= argc) {
        error("-o needs a file name");
        free(overrides);
        return 2;
      }
      out_path = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      error("unknown option '%s' (see optc compile --help)", a);
      free(overrides);
      return 2;
    } else if (!config) {
      config = a;
    } else if (strchr(a, '=')) {
      overrides[nov++] = a;
    } else {
      error("unexpected argument '%s': one CONFIG at a time", a);
      free(overrides);
      return 2;
    }
  }
  if (!config) {
    fputs("optc: error: no CONFIG given\n", stderr);
    fputs(usage_main, stderr);
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
  Graph *g = load_config(config, overrides, nov, arena);
  if (g && emit && !dump)
    ir_print_file(g, out.f);
  if (g && pipeline_run(g, &po))
    rc = 0;
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

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage_main, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    fputs(usage_main, stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("optc %s\n", OPTC_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "compile"))
    return cmd_compile(argc - 2, argv + 2);
  return cmd_compile(argc - 1, argv + 1);
}
