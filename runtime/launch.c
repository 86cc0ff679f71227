/* launch.c: `--nproc N` starts N ranks of this same optc under mpirun, with
 * the environment Open MPI needs to run as root, and waits for them. */
#include "rt.h"

#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int launch_mpirun(int nproc, int argc, char **argv, int threads_per_rank) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    error("cannot find this program's path: %s", strerror(errno));
    return 1;
  }
  self[n] = 0;
  /* mpirun [flags] optc ARGS... --rank-of-mpirun */
  const char *pre[] = {"mpirun", "--oversubscribe", "--bind-to", "none", "-np"};
  int np = (int)ARRAY_LEN(pre);
  char **av = calloc((size_t)(np + argc + 8), sizeof(char *));
  ASSERT(av);
  int k = 0;
  for (int i = 0; i < np; i++)
    av[k++] = (char *)pre[i];
  char nps[16], th[16];
  snprintf(nps, sizeof nps, "%d", nproc);
  av[k++] = nps;
  av[k++] = self;
  for (int i = 0; i < argc; i++)
    av[k++] = argv[i];
  av[k++] = "--mpi-rank";
  if (threads_per_rank > 0) {
    snprintf(th, sizeof th, "%d", threads_per_rank);
    av[k++] = "--threads";
    av[k++] = th;
  }
  av[k] = NULL;
  /* Open MPI refuses root unless told; the ranks inherit the environment. */
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    error("cannot start mpirun: %s", strerror(errno));
    free(av);
    return 1;
  }
  if (pid == 0) {
    execvp("mpirun", av);
    fprintf(stderr, "optc: error: cannot run mpirun: %s (install openmpi-bin)\n", strerror(errno));
    _exit(127);
  }
  free(av);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      error("waiting for mpirun: %s", strerror(errno));
      return 1;
    }
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  error("mpirun ended by signal %d", WTERMSIG(status));
  return 1;
}
