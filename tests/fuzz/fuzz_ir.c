/* fuzz_ir.c: the IR text's parser, verifier and printer.
 *
 * Property (STYLE.md 4, "the text round-trips"): text that parses and
 * verifies prints as P1; P1 parses and verifies again and prints as P1,
 * byte for byte. Then the pass pipeline runs on P1's graph (options at
 * their defaults, as `optc --emit=plan` runs it) with the verifier after
 * every pass: a pass may report an error, but a graph it leaves invalid is
 * a bug. Anything else may fail with an
 * error, never crash. */
#include "fuzz.h"
#include "frontend.h"
#include "ir.h"
#include "passes.h"

static bool print_text(const Graph *g, Buf *out) {
  ir_print(g, out);
  return out->data != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  SrcFile src = {"fuzz.optir", text, size};
  Arena *a = arena_new();
  Buf p1 = {0}, p2 = {0};
  fuzz_quiet_begin();
  Graph *g = ir_parse(&src, a);
  if (!g || !ir_verify(g))
    goto done;
  print_text(g, &p1);
  SrcFile src1 = {"print1.optir", p1.data ? p1.data : "", p1.len};
  Graph *g1 = ir_parse(&src1, a);
  FUZZ_CHECK(g1, "the printed form does not parse:\n%s", src1.text);
  FUZZ_CHECK(ir_verify(g1), "the printed form does not verify:\n%s", src1.text);
  print_text(g1, &p2);
  FUZZ_CHECK(p1.len == p2.len && memcmp(p1.data ? p1.data : "", p2.data ? p2.data : "", p1.len) == 0,
             "print(parse(print(g))) differs from print(g):\n--- first\n%s--- second\n%s", src1.text,
             p2.data ? p2.data : "");
  /* The passes, as `optc --emit=plan F.optir` runs them. */
  Graph *s = optir_specialize(g1, NULL, 0, a);
  if (s && ir_verify(s)) {
    for (int i = 0; i < pipeline_num_passes; i++) {
      if (!pipeline_passes[i].run(s))
        break;
      FUZZ_CHECK(ir_verify(s), "the IR is invalid after pass '%s' (%s); the input printed:\n%s",
                 pipeline_passes[i].name, fuzz_diag.data ? fuzz_diag.data : "", src1.text);
    }
  }
done:
  fuzz_quiet_end();
  buf_free(&p1);
  buf_free(&p2);
  arena_free(a);
  free(text);
  return 0;
}
