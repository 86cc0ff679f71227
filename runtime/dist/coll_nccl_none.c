/* coll_nccl_none.c: coll_nccl in a build without NCCL, NVRTC or MPI. */
#include "coll.h"

#include <stdio.h>

Coll *coll_nccl(int *argc, char ***argv, int device, char *err, size_t errlen) {
  (void)argc, (void)argv, (void)device;
  snprintf(err, errlen, "this optc was built without NCCL: no GPU collectives");
  return NULL;
}
