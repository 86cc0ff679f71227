/* tools.h: what the command line (tools/, and bench/'s subcommands of it)
 * has that no library does: the bundled configs, naming a recipe on the
 * command line, and optc plan. */
#pragma once
#include "frontend.h"
#include "train.h"

/* ---- configs.c (generated from recipes/configs): by torchtune's --config name */
typedef struct {
  const char *name; /* llama4/scout_17B_16E_full */
  const char *path; /* recipes/configs/NAME.yaml, for messages */
  const char *text;
} BuiltinConfig;
extern const BuiltinConfig builtin_configs[];
extern const int num_builtin_configs;

/* ---- recipes.c: the recipe a command line names --------------------------------------- */
/* The bundled config a name like llama4/scout_17B_16E_full names (as
 * torchtune's --config does), or NULL. */
const BuiltinConfig *recipe_bundled(const char *name);
/* Whether CONFIG names a recipe: a .yaml/.yml file or a bundled config. */
bool recipe_is_config(const char *config);
/* Reads CONFIG (a file, or, where there is no such file, a bundled
 * config's name) with overrides, as recipe_load does, and its training
 * keys into *tc (when not NULL; they are checked either way, so that every
 * command refuses the same recipes). NULL, error printed, on a mistake. */
Recipe *recipe_open(const char *config, const char *const *overrides, int noverrides, Arena *a, TrainConfig *tc);

/* ---- plan.c: optc plan ------------------------------------------------------------------ */
int cmd_plan(int argc, char **argv);
