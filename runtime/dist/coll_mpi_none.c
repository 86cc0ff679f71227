/* coll_mpi_none.c: coll_mpi in a build without MPI (meson -Dmpi=disabled). */
#include "coll.h"

#include <stdio.h>

Coll *coll_mpi(int *argc, char ***argv, char *err, size_t errlen) {
  (void)argc, (void)argv;
  snprintf(err, errlen, "this optc was built without MPI (meson -Dmpi=disabled): --nproc needs it");
  return NULL;
}
