/* fuzz_recipe.c: the recipe front end, YAML text to step graph.
 *
 * Input: the recipe's text, then optionally NUL-separated overrides
 * (`key.sub=value`, `~key`), at most 8:  YAML \0 OVERRIDE \0 OVERRIDE ...
 * The recipe is read (recipe_from_text), its graph built (frontend_build)
 * and run through the pass pipeline, as optc_step_from_recipe does before
 * it compiles, with the verifier after every pass (a graph a pass leaves
 * invalid is a bug). Any of it may fail with an error; none of it may crash,
 * exit or abort.
 *
 * It also checks yaml_print's promise (frontend.h): the printed tree loads
 * back and prints to the same bytes (OPTC_FUZZ_YAML_ROUNDTRIP=0 turns that
 * off). */
#include "frontend.h"
#include "fuzz.h"
#include "passes.h"

enum { MAX_OVERRIDES = 8 };

static void check_yaml_roundtrip(const char *text, size_t len) {
  Arena *a = arena_new();
  SrcFile src = {"fuzz.yaml", text, len};
  YamlNode *n = yaml_load(&src, a);
  if (n) {
    Buf p1 = {0}, p2 = {0};
    yaml_print(&p1, n);
    SrcFile src1 = {"print1.yaml", p1.data ? p1.data : "", p1.len};
    YamlNode *n1 = yaml_load(&src1, a);
    FUZZ_CHECK(n1, "yaml_print's text does not load:\n%s", src1.text);
    yaml_print(&p2, n1);
    FUZZ_CHECK(p1.len == p2.len && memcmp(src1.text, p2.data ? p2.data : "", p1.len) == 0,
               "yaml_print(yaml_load(yaml_print(t))) differs:\n--- first\n%s--- second\n%s", src1.text,
               p2.data ? p2.data : "");
    buf_free(&p1);
    buf_free(&p2);
  }
  arena_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  /* the recipe, then the overrides, split at NULs */
  const char *ov[MAX_OVERRIDES];
  int nov = 0;
  size_t len = strlen(text);
  for (size_t i = len; i < size && nov < MAX_OVERRIDES; i += strlen(text + i + 1) + 1)
    ov[nov++] = text + i + 1;
  fuzz_quiet_begin();
  static int roundtrip = -1;
  if (roundtrip < 0)
    roundtrip = !getenv("OPTC_FUZZ_YAML_ROUNDTRIP") || atoi(getenv("OPTC_FUZZ_YAML_ROUNDTRIP")) > 0;
  if (roundtrip)
    check_yaml_roundtrip(text, len);
  Arena *a = arena_new();
  Recipe *r = recipe_from_text("fuzz.yaml", text, ov, nov, a);
  if (r) {
    recipe_note_unused(r);
    Graph *g = frontend_build(r);
    if (g) {
      Buf ir = {0};
      ir_print(g, &ir);
      buf_free(&ir);
      for (int i = 0; i < pipeline_num_passes; i++) {
        if (!pipeline_passes[i].run(g))
          break;
        FUZZ_CHECK(ir_verify(g), "the IR is invalid after pass '%s'", pipeline_passes[i].name);
      }
    }
  }
  arena_free(a);
  fuzz_quiet_end();
  free(text);
  return 0;
}
