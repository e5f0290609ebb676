#!/usr/bin/env bash
# Issue 17: chorus-run --elastic. The rendezvous store lives in chorus-run, so when a worker dies
# (rank 0 included, which otherwise hosts the store) the others shrink their communicator and go
# on (tests/launch/elastic_probe.c), and chorus-run keeps them running and says who died. Without
# --elastic the job stops. Usage: test_elastic.sh CHORUS_RUN ELASTIC_PROBE
set -u
run=$1 probe=$2
fail=0
for victim in 0 2; do
  out=$(timeout 90 "$run" --elastic -n 3 "$probe" $victim 2>&1); rc=$?; echo "$out"
  [ $rc = 0 ] || { echo "FAIL: --elastic, rank $victim killed: chorus-run exited $rc"; fail=1; }
  echo "$out" | grep -q "chorus-run: rank $victim (pid [0-9]*) was killed by signal 9 (SIGKILL); --elastic: ranks [0-9,]* go on" ||
    { echo "FAIL: --elastic: chorus-run did not say rank $victim died and the others go on"; fail=1; }
  n=0
  for r in 0 1 2; do
    [ $r = $victim ] && continue
    want=$([ $r -lt $victim ] && echo $r || echo $((r - 1)))
    echo "$out" | grep -q "rank $r: continued as rank $want of 2" && n=$((n + 1))
  done
  [ $n = 2 ] || { echo "FAIL: --elastic, rank $victim killed: $n of 2 survivors continued"; fail=1; }
done
# chorus-run slow to look (CHORUS_TEST_RUN_REAP_DELAY_MS, as on a loaded machine): one look finds
# rank 2 killed and the survivors, which shrank and finished meanwhile, all ended. The death still
# comes first: the others went on, and the job succeeded (it was taken for the last rank
# standing, exit 137, once in a CI run).
out=$(CHORUS_TEST_RUN_REAP_DELAY_MS=3000 timeout 90 "$run" --elastic -n 3 "$probe" 2 2>&1); rc=$?
echo "$out"
[ $rc = 0 ] && echo "$out" | grep -q "chorus-run: rank 2 (pid [0-9]*) was killed by signal 9 (SIGKILL); --elastic: ranks 0,1 go on" &&
  [ "$(echo "$out" | grep -c 'continued as rank')" = 2 ] ||
  { echo "FAIL: --elastic, a slow look at rank 2's death and the survivors' ends (rc $rc)"; fail=1; }
out=$(CHORUS_TEST_RUN_REAP_DELAY_MS=soon "$run" -n 1 true 2>&1); rc=$?; echo "$out"
[ $rc = 2 ] && echo "$out" | grep -q "CHORUS_TEST_RUN_REAP_DELAY_MS" && echo "$out" | grep -q "soon" ||
  { echo "FAIL: a bad CHORUS_TEST_RUN_REAP_DELAY_MS was not refused naming it (rc $rc)"; fail=1; }
# Without --elastic rank 0 hosts the store: its death stops the job.
out=$(timeout 90 "$run" -n 3 "$probe" 0 2>&1); rc=$?; echo "$out"
[ $rc != 0 ] && echo "$out" | grep -q "stopping ranks" ||
  { echo "FAIL: without --elastic the job went on after rank 0 died (rc $rc)"; fail=1; }
# --elastic --max-restarts 1: the dead worker is restarted once into the running job, told so
# (CHORUS_ELASTIC_REJOIN, CHORUS_ELASTIC_DIR); its second death is only reported; the meeting
# directory is gone at the end.
out=$(timeout 60 "$run" --elastic --max-restarts 1 -n 2 sh -c \
  'if [ "$RANK" = 1 ]; then echo "start rejoin=${CHORUS_ELASTIC_REJOIN:-0} dir=$CHORUS_ELASTIC_DIR"
   [ -d "$CHORUS_ELASTIC_DIR" ] || echo "no dir"; kill -9 $$; fi; sleep 2' 2>&1); rc=$?
echo "$out"
dir=$(echo "$out" | sed -n 's/.*start rejoin=1 dir=\([^ ]*\).*/\1/p')
[ $rc = 0 ] && echo "$out" | grep -q "start rejoin=0 dir=/" && [ -n "$dir" ] && [ ! -e "$dir" ] &&
  echo "$out" | grep -q "restarting rank 1 to rejoin them (restart 1 of 1)" &&
  ! echo "$out" | grep -q "no dir\|restart 2" &&
  [ "$(echo "$out" | grep -c 'was killed by signal 9')" = 2 ] ||
  { echo "FAIL: --elastic --max-restarts 1 did not restart rank 1 once to rejoin (rc $rc)"; fail=1; }
for bad in "--nnodes 2 --master-addr 127.0.0.1"; do
  out=$("$run" --elastic $bad -n 2 "$probe" 2>&1); rc=$?; echo "$out"
  [ $rc = 2 ] || { echo "FAIL: --elastic $bad was not refused as a usage error (rc $rc)"; fail=1; }
done
[ $fail = 0 ] && echo ok
exit $fail
