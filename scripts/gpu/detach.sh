# Sourced by the GPU-host scripts whose long jobs outlast the command that started them:
# a job is a file `<dir>/job.sh` that ends by touching `<dir>/done`.

# start_detached DIR: checks that DIR/job.sh parses (a heredoc that wrote it may have expanded
# something it should not have), then runs it under setsid, its output in DIR/log.
start_detached() {
  bash -n "$1/job.sh" || { echo "$1/job.sh does not parse: fix the script that wrote it"; exit 2; }
  setsid nohup bash "$1/job.sh" > "$1/log" 2>&1 < /dev/null &
}

# wait_done DIR SECONDS: returns once DIR/done exists or SECONDS have passed; exits 3 where no
# job was started on this host.
wait_done() {
  [ -f "$1/job.sh" ] || { echo "no job on this host: start one (ACTION=start)"; exit 3; }
  local end=$(( $(date +%s) + $2 ))
  while [ ! -f "$1/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
}
