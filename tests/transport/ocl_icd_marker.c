// A stand-in OpenCL driver (ICD) for test_machine.cc: the OpenCL loader, pointed here by
// OCL_ICD_FILENAMES, loads it when a program first asks for OpenCL platforms; loading it creates
// the file named by CHORUS_TEST_OCL_MARKER. It has none of a driver's functions, so the loader
// then drops it.
#define _GNU_SOURCE  // O_CLOEXEC under -std=c11
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void mark_loaded(void) {
  const char* path = getenv("CHORUS_TEST_OCL_MARKER");
  if (path == NULL) return;
  int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
}
