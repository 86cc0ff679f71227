/* scale_ir.c: the time of each stage from IR text to the phase plan, for
 * bench/scale_ir.py. It takes the path `optc --emit=plan FILE.optir` takes
 * (parse, verify, bind the options to their defaults, every pass of the
 * pipeline, the plan) and prints one line of milliseconds per stage, plus
 * printing the parsed graph (what --emit=ir does) and parsing that text
 * back, so that each stage's growth with the graph's size can be read off.
 *
 *   scale_ir FILE.optir
 *   parse=12.3 load-verify=1.2 print=5.6 reparse=11.9 specialize=... verify=... canonicalize=... plan=0.4 nins=200003 out=200003
 */
#include "frontend.h"
#include "passes.h"
#include "plan.h"

#include <string.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: scale_ir FILE.optir\n");
    return 2;
  }
  size_t len;
  char *text = file_read(argv[1], &len);
  if (!text)
    return 1;
  Arena *a = arena_new();
  SrcFile src = {argv[1], text, len};
  Buf times = {0};
  double t = now_seconds();
#define LAP(name)                                                        \
  do {                                                                   \
    double now = now_seconds();                                          \
    buf_printf(&times, "%s=%.2f ", (name), (now - t) * 1e3);             \
    t = now;                                                             \
  } while (0)
  int rc = 1;
  Graph *g = ir_parse(&src, a);
  LAP("parse");
  if (!g || !ir_verify(g))
    goto done;
  LAP("load-verify");
  int nin = g->nins;
  Buf printed = {0};
  ir_print(g, &printed);
  LAP("print");
  SrcFile again = {"<printed>", printed.data, printed.len};
  bool reparsed = ir_parse(&again, a) != NULL;
  LAP("reparse");
  if (!reparsed) {
    buf_free(&printed);
    goto done;
  }
  g = optir_specialize(g, NULL, 0, a);
  LAP("specialize");
  for (int i = 0; i < pipeline_num_passes; i++) {
    if (!pipeline_passes[i].run(g)) {
      buf_free(&printed);
      goto done;
    }
    LAP(pipeline_passes[i].name);
  }
  printf("%snins=%d out=%d\n", times.data, nin, g->nins);
  buf_free(&printed);
  rc = 0;
done:
  buf_free(&times);
  arena_free(a);
  free(text);
  return rc;
}
