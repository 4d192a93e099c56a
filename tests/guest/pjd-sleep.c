/*
 * A plain static "sleep SECONDS" for pjdfstest's ETXTBSY cases: they copy `which sleep` under a
 * random name into the filesystem under test and run it. Busybox's sleep would not work there
 * (a busybox copied under another name finds no applet and exits at once, so the file is no
 * longer busy). pjdfstest.sh puts this first on PATH as "sleep".
 */
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	unsigned int s = argc > 1 ? (unsigned int)strtoul(argv[1], NULL, 10) : 1;

	while (s > 0)
		s = sleep(s);
	return 0;
}
