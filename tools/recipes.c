/* recipes.c: the recipe a command line names: a file, or one of the
 * configs bundled in optc (recipes/configs), as torchtune's --config names
 * them. */
#include "tools.h"

#include <string.h>
#include <unistd.h>

const BuiltinConfig *recipe_bundled(const char *name) {
  for (int i = 0; i < num_builtin_configs; i++)
    if (strcmp(builtin_configs[i].name, name) == 0 || strcmp(builtin_configs[i].path, name) == 0)
      return &builtin_configs[i];
  return NULL;
}

bool recipe_is_config(const char *config) { return recipe_is_yaml(config) || recipe_bundled(config); }

Recipe *recipe_open(const char *config, const char *const *overrides, int noverrides, Arena *a, TrainConfig *tc) {
  const BuiltinConfig *b = access(config, F_OK) != 0 ? recipe_bundled(config) : NULL;
  Recipe *r = b ? recipe_from_text(b->path, b->text, overrides, noverrides, a)
                : recipe_load(config, overrides, noverrides, a);
  TrainConfig mine;
  if (r && train_config_read(r, tc ? tc : &mine) != 0)
    return NULL;
  return r;
}
