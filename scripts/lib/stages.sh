# How scripts/test runs a stage, stops one that hangs, and records what each said.
# Sourced after common.sh, with $results_dir (an empty directory), $logs and $root set.
# shellcheck shell=bash

# Every stage records "ok|FAIL  NAME (N s[; WHY])" in a file of $results_dir of its own
# (lanes write at once) and its name in $results_dir/names.
record() {  # record NAME STATUS SECONDS [WHY]
  printf '%s  %s (%s s%s)\n' "$2" "$1" "$3" "${4:+; $4}" > "$results_dir/$(date +%s%N)-$BASHPID"
  printf '%s\n' "$1" >> "$results_dir/names"
}

stage() {  # stage NAME COMMAND...: run with output on the terminal, timed, recorded
  local name=$1; shift
  local t0=$SECONDS
  say "== $name"
  if "$@"; then record "$name" "ok   " $((SECONDS - t0)); else record "$name" "FAIL " $((SECONDS - t0)); fi
}

# A lane's stage that hangs must fail the run, not hold it until CI's own limit; one that is
# only slow (a busy machine) must not. A stage is stopped when its log has not grown for
# stage_idle_s (every stage prints as it goes: a pytest dot per test, a line per test in the
# molecule verifiers (-v: molecule shows whole lines only), a line per Ansible task, and no
# single test or task waits that long), or when it has run stage_limit_s in
# all, far above the longest stage's quiet time (~19 min; docs/measurements.md).
stage_idle_s=${PDNODE_TEST_STAGE_IDLE_S:-900}
stage_limit_s=${PDNODE_TEST_STAGE_TIMEOUT_S:-4500}

watch_stage() {  # watch_stage PID LOG WHYFILE: stop PID's process group when its log stalls
  local pid=$1 log=$2 whyfile=$3 size last=-1 since=$SECONDS
  local every=$(( stage_idle_s >= 30 ? 10 : 1 ))  # a look every 10 s (1 s for a test's short bound)
  while sleep "$every"; do
    size=$(stat -c %s "$log" 2>/dev/null || echo 0)
    if [ "$size" != "$last" ]; then last=$size; since=$SECONDS; fi
    if [ $((SECONDS - since)) -ge "$stage_idle_s" ]; then
      echo "stopped: no output for ${stage_idle_s} s, a hang (PDNODE_TEST_STAGE_IDLE_S)" > "$whyfile"
      kill -TERM -- "-$pid" 2>/dev/null; sleep 60; kill -KILL -- "-$pid" 2>/dev/null
      return
    fi
  done
}

logged_stage() {  # logged_stage NAME COMMAND...: the same, output into a log of its own, hang-limited
  local name=$1; shift
  local t0=$SECONDS log rc=0 why="" pid watcher whyfile
  log="$logs/$(printf '%s' "$name" | tr -cs 'A-Za-z0-9' '-' | sed 's/-$//').log"
  whyfile="$results_dir/why-$BASHPID"; rm -f "$whyfile"
  say "start $name (log: ${log#"$root"/})"
  # timeout leads a process group of its own (the command's children with it): the
  # watcher's stop reaches all of them
  timeout -k 60 "$stage_limit_s" "$@" >"$log" 2>&1 & pid=$!
  # the watcher's output goes nowhere: a sleep it leaves behind must not hold the caller's
  # pipe open (CI reads this script's output to its end)
  watch_stage "$pid" "$log" "$whyfile" >/dev/null 2>&1 & watcher=$!
  wait "$pid" || rc=$?
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null || true
  if [ "$rc" -eq 0 ]; then
    record "$name" "ok   " $((SECONDS - t0)); say "ok    $name ($((SECONDS - t0)) s)"
  else
    if [ -f "$whyfile" ]; then why=$(cat "$whyfile")
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      why="stopped: ran ${stage_limit_s} s in all, past any slowness (PDNODE_TEST_STAGE_TIMEOUT_S)"
    fi
    echo "scripts/test: $name: exit code $rc${why:+; $why}" >> "$log"
    record "$name" "FAIL " $((SECONDS - t0)) "$why"
    say "FAIL  $name ($((SECONDS - t0)) s${why:+; $why}); log: ${log#"$root"/}"
    # what CI shows is the end of the output: the end of a failed stage's log goes there too
    echo "$log" >> "$results_dir/failed-logs"
  fi
}

record_unreported() {  # record_unreported NAME...: a FAIL for each stage that never reported
  local name
  for name in "$@"; do
    grep -qxF -- "$name" "$results_dir/names" 2>/dev/null \
      || record "$name" "FAIL " 0 "it never reported: its lane died before it"
  done
}

# The lanes at once: `lane N STAGE_FN` (scripts/test) runs lane N's stages one after the
# other, each by STAGE_FN; each lane in a background shell of its own, its stages' output
# in their logs. A lane that dies fails the run (its exit code), and so does each stage of
# it that never reported (`lane N expect` lists what should have).
run_lanes() {  # run_lanes N...: needs lane()
  local n i=0 rc pids=() expected=()
  for n in "$@"; do lane "$n" logged_stage & pids+=("$!"); done
  for n in "$@"; do
    rc=0; wait "${pids[$i]}" || rc=$?; i=$((i + 1))
    [ "$rc" -eq 0 ] || record "lane $n" "FAIL " "$SECONDS" "the lane exited with code $rc"
  done
  expect() { expected+=("$1"); }
  for n in "$@"; do lane "$n" expect; done
  record_unreported "${expected[@]}"
  if [ -f "$results_dir/failed-logs" ]; then
    while read -r log; do
      echo; echo "==== the end of ${log#"$root"/}"; tail -n 120 "$log"
    done < "$results_dir/failed-logs"
  fi
}

# The summary: every stage's line (in the order they ended), the counts, and (CI shows only
# the last lines of the output) what each failed stage said last about why (Ansible's
# fatal lines, pytest's failures), without colour codes: the last ones, since a check-mode
# run prints fatal lines it then ignores. Its exit code is the run's: 0 only when no stage
# (no lane) failed.
summarize() {
  local total failed log
  echo; cat "$results_dir"/[0-9]*
  total=$(cat "$results_dir"/[0-9]* | wc -l)
  failed=$(cat "$results_dir"/[0-9]* | grep -c '^FAIL' || true)
  echo "$((total - failed)) passed, $failed failed (${SECONDS} s)"
  if [ -f "$results_dir/failed-logs" ]; then
    while read -r log; do
      echo "why ${log#"$root"/} failed (its last error lines):"
      # error lines of a task that then says "...ignoring" (check mode on a fresh host) are dropped
      sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
        /TASK \[|RUNNING HANDLER/ { printf "%s", held; held = "" }
        /\.\.\.ignoring/ { held = "" }
        /fatal: |FAILED!|^E  |^FAILED |Error:|ERROR|Executed: Failed/ { held = held $0 "\n" }
        END { printf "%s", held }' | tail -n 15 | cut -c1-400 || true
    done < "$results_dir/failed-logs"
  fi
  [ "$failed" -eq 0 ]
}
