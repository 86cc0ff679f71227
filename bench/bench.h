/* bench.h: the benchmarks optc's command line runs (optc bench). */
#pragma once

/* ---- bench.c: optc bench optimizer ------------------------------------------------------------ */
int bench_optimizer(int argc, char **argv);
/* ---- step.c: optc bench step */
int bench_step(int argc, char **argv);
