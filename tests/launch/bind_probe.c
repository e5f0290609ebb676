/* After an all-reduce, prints the CPUs each of this process's threads may run on, as
 * "rank R: main CPUS; others CPUS CPUS ...", for test_bind.sh. The progress thread binds itself
 * when it starts, so the probe waits (at most 3 s) until some other thread may run on the CPUs
 * PROBE_EXPECT names (when set); threads that end meanwhile are left out. */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chorus/chorus.h>

static void allowed(const char* task, char* out, size_t len) {
  char path[128], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%s/status", task);
  FILE* f = fopen(path, "r");
  snprintf(out, len, "?");
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
      char* v = line + 18;
      while (*v == ' ' || *v == '\t') v++;
      v[strcspn(v, "\n")] = 0;
      snprintf(out, len, "%s", v);
    }
  fclose(f);
}

int main(void) {
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    fprintf(stderr, "init failed: %s\n", chorusGetLastError(NULL));
    return 2;
  }
  int rank = -1;
  chorusCommUserRank(comm, &rank);
  float x = 1.0f;
  if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, NULL) != chorusSuccess) return 3;
  char self[32], main_cpus[64], cpus[64], others[1024];
  snprintf(self, sizeof self, "%d", (int)getpid());
  allowed(self, main_cpus, sizeof main_cpus);
  const char* expect = getenv("PROBE_EXPECT");
  for (int tries = 0; tries < 300; tries++) {
    int found = 0;
    others[0] = 0;
    DIR* d = opendir("/proc/self/task");
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.' || strcmp(e->d_name, self) == 0) continue;
      allowed(e->d_name, cpus, sizeof cpus);
      if (strcmp(cpus, "?") == 0) continue;
      if (expect && strcmp(cpus, expect) == 0) found = 1;
      size_t used = strlen(others);
      snprintf(others + used, sizeof others - used, " %s", cpus);
    }
    if (d) closedir(d);
    if (found || !expect) break;
    usleep(10000);
  }
  printf("rank %d: main %s; others%s\n", rank, main_cpus, others);
  chorusCommDestroy(comm);
  return 0;
}
