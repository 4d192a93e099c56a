/* The guest checkers' one report line per check (tests/guest/tmpfile.c, setxattr.c): "ok NAME",
 * or "not ok NAME: what (errno ...)" and the run marked failed. */
#ifndef GUEST_CHECK_H
#define GUEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int failed;

static void check(int ok, const char *name, const char *what)
{
    if (ok) {
        printf("ok %s\n", name);
    } else {
        printf("not ok %s: %s (errno %s)\n", name, what, strerror(errno));
        failed = 1;
    }
    fflush(stdout);
}

#endif
