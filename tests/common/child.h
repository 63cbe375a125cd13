/* A test body run in a forked child with its stderr captured: for checks
 * whose success is that a process aborts (or exits) saying something. */
#ifndef GMA_TEST_CHILD_H
#define GMA_TEST_CHILD_H

#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* Runs body(arg) in a forked child whose stderr goes to a pipe; returns the
 * child's wait status, its stderr in out (NUL-terminated, at most cap - 1
 * bytes). A body that returns ends the child with status 0. */
static inline int child_run(void (*body)(void *), void *arg, char *out, size_t cap) {
  int fds[2];
  CHECK(pipe(fds) == 0 && cap > 0);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    body(arg);
    _exit(0);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t got;
  while (len + 1 < cap && (got = read(fds[0], out + len, cap - 1 - len)) > 0) len += (size_t)got;
  out[len] = '\0';
  close(fds[0]);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  return status;
}

#endif /* GMA_TEST_CHILD_H */
