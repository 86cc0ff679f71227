/* launch.c: `--nproc N` starts N ranks of this same optc under mpirun, with
 * the environment Open MPI needs to run as root, and waits for them.
 *
 * mpirun's stderr comes through here: the ranks' own lines pass as they
 * are, and mpirun's framed banners (between lines of dashes) about a rank
 * that died become one line, "rank N was killed by signal S (NAME)"; a
 * banner this does not recognise is printed whole, so nothing is lost. */
#include "dist.h"

#include <errno.h>
#include <regex.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  bool in_banner, saw_error, have_signal, have_exit;
  int rank, code;      /* the first rank mpirun reports dead, and its signal or exit code */
  char signame[64];
  Buf banner, unknown; /* the current banner; the ones not understood */
} MpirunErr;

static bool match_int(const char *s, const char *pattern, int ngroups, int *out) {
  regex_t re;
  regmatch_t m[4];
  if (regcomp(&re, pattern, REG_EXTENDED) != 0)
    return false;
  bool ok = regexec(&re, s, 4, m, 0) == 0;
  for (int i = 0; ok && i < ngroups; i++)
    out[i] = atoi(s + m[i + 1].rm_so);
  regfree(&re);
  return ok;
}

/* A banner, whole: what it says about a dead rank, or kept to print. */
static void banner_done(MpirunErr *e) {
  const char *s = e->banner.data ? e->banner.data : "";
  int v[2];
  bool known = false;
  if (match_int(s, "process rank ([0-9]+) with PID [0-9]+ on node [^ ]+ exited on signal ([0-9]+)", 2, v)) {
    if (!e->have_signal) {
      e->rank = v[0], e->code = v[1], e->have_signal = true;
      const char *name = strsignal(v[1]);
      snprintf(e->signame, sizeof e->signame, "%s", name ? name : "?");
    }
    known = true;
  } else if (match_int(s, "Process name: \\[\\[[0-9]+,[0-9]+\\],([0-9]+)\\][^E]*Exit code: *([0-9]+)", 2, v)) {
    if (!e->have_exit && !e->have_signal)
      e->rank = v[0], e->code = v[1], e->have_exit = true;
    known = true;
  } else if (strstr(s, "terminated normally, but") || strstr(s, "exited with non-zero status") ||
             strstr(s, "has exited due to process rank")) {
    known = true; /* the framing of the two above */
  }
  if (!known)
    buf_puts(&e->unknown, s);
  e->banner.len = 0;
  if (e->banner.data)
    e->banner.data[0] = 0;
}

static void err_line(MpirunErr *e, const char *line) {
  bool dashes = strlen(line) >= 20 && strspn(line, "-") == strlen(line) - (line[strlen(line) - 1] == '\n');
  if (dashes) {
    if (e->in_banner)
      banner_done(e);
    e->in_banner = !e->in_banner;
    return;
  }
  if (e->in_banner) {
    buf_puts(&e->banner, line);
    return;
  }
  e->saw_error |= strstr(line, "error: ") != NULL; /* a rank said why, in optc's words */
  fputs(line, stderr);
  fflush(stderr);
}

static void err_finish(MpirunErr *e) {
  if (e->in_banner) /* cut short: keep what came */
    buf_puts(&e->unknown, e->banner.data ? e->banner.data : "");
  if (e->unknown.len)
    fputs(e->unknown.data, stderr);
  if (e->have_signal)
    error("rank %d was killed by signal %d (%s); mpirun stopped the other ranks", e->rank, e->code, e->signame);
  else if (e->have_exit && !e->saw_error)
    error("rank %d exited with status %d; mpirun stopped the other ranks", e->rank, e->code);
  buf_free(&e->banner);
  buf_free(&e->unknown);
}

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
  int pfd[2];
  if (pipe(pfd) != 0) {
    error("cannot start mpirun: %s", strerror(errno));
    free(av);
    return 1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    error("cannot start mpirun: %s", strerror(errno));
    close(pfd[0]);
    close(pfd[1]);
    free(av);
    return 1;
  }
  if (pid == 0) {
    close(pfd[0]);
    dup2(pfd[1], 2);
    close(pfd[1]);
    execvp("mpirun", av);
    fprintf(stderr, "optc: error: cannot run mpirun: %s (install openmpi-bin)\n", strerror(errno));
    _exit(127);
  }
  free(av);
  close(pfd[1]);
  FILE *in = fdopen(pfd[0], "r");
  ASSERT(in);
  MpirunErr me = {0};
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, in) >= 0)
    err_line(&me, line);
  free(line);
  fclose(in);
  err_finish(&me);
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

int launch_ranks(int nproc, const char *cmd, const char *sub, int argc, char **argv, int threads_per_rank) {
  char **av = calloc((size_t)argc + 3, sizeof(char *));
  ASSERT(av);
  int k = 0;
  av[k++] = (char *)cmd;
  if (sub)
    av[k++] = (char *)sub;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--nproc")) {
      i++;
      continue;
    }
    if (!strncmp(argv[i], "--nproc=", 8))
      continue;
    av[k++] = argv[i];
  }
  int rc = launch_mpirun(nproc, k, av, threads_per_rank);
  free(av);
  return rc;
}
