/* passes.h: the passes over a step graph, and the pipeline that runs them in
 * order (pipeline.c). Each pass lives in passes/NAME.c. */
#pragma once
#include "ir.h"

/* passes/canonicalize.c: folds constants and applies identities that keep
 * every result bit for bit. */
bool pass_canonicalize(Graph *g);
/* passes/cse.c: one value for each distinct computation. */
bool pass_cse(Graph *g);
/* passes/dce.c: drops values nothing stores or reduces, and state buffers
 * that nothing loads or stores. */
void pass_dce(Graph *g);
/* passes/hoist.c: step-scope values that need no reduction go first. */
bool pass_hoist(Graph *g);
/* passes/drop_grad_writeback.c: the grad store goes unless kept. */
bool pass_drop_grad_writeback(Graph *g);
/* passes/partition.c: ^stepK / ^phaseK segments, one memory pass each. */
bool pass_partition(Graph *g);

/* ---- pipeline.c ------------------------------------------------------------- */
typedef struct {
  const char *name; /* as --dump-ir=after-NAME spells it */
  const char *desc;
  bool (*run)(Graph *g); /* false: an error was reported */
} Pass;

extern const Pass pipeline_passes[];
extern const int pipeline_num_passes;

typedef struct {
  bool verify_each;    /* run the verifier after every pass */
  bool dump_input;     /* print the graph before the first pass */
  const char *dump_after; /* a pass name, "all", or NULL */
  FILE *dump;          /* where dumps go */
} PipelineOptions;

/* Index of a pass by name, or -1. */
int pipeline_find_pass(const char *name);
/* Runs every pass in order, dumping as asked. false on error. */
bool pipeline_run(Graph *g, const PipelineOptions *opt);
