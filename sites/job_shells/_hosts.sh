# ---- Hosts without a scheduler: one detached runner per Job (shared by the Docker and Apptainer host templates). ----

# One runner per Job, each in its own session so it survives the end of this login, holding none
# of the login's output (the launcher waits for it to close), stopped by
# SIGTERM at the time limit (SIGKILL 60 s later). runner-<index>.pid lets mmt_find see it.
mmt_start_runners() {
    local ids index
    IFS=, read -r -a ids <<<"$MMT_JOB_IDS"
    for index in "${!ids[@]}"; do
        MMT_ARRAY_INDEX=$index MMT_JOB_ID=${ids[$index]} \
            setsid timeout --signal=TERM --kill-after=60 "${MMT_WALLTIME_SECONDS}s" \
            "$MMT_RUNNER" "${MMT_SPEC_DIR%/*}/${ids[$index]}" \
            </dev/null >"$MMT_SPEC_DIR/runner-$index.log" 2>&1 3>&- &
        echo "$!" >"$MMT_SPEC_DIR/runner-$index.pid"
    done
}

# There is no scheduler job id: found (status 0, nothing printed) when the runner of every Job
# that an earlier try started is still running; otherwise mmt_submit starts them all again (a
# runner whose Job already has one is refused by Mado and exits).
mmt_find() {
    local ids index
    mmt_check_values
    IFS=, read -r -a ids <<<"$MMT_JOB_IDS"
    for index in "${!ids[@]}"; do
        mmt_runner_running "$index" "${MMT_SPEC_DIR%/*}/${ids[$index]}" || return 1
    done
    printf 'mado job shell: the runners of %s started by an earlier try are running; not starting them again.\n' \
        "$(mmt_job_name)" >&2
}

# Whether runner-<$1>.pid names a live process whose command line ends with the spec directory $2
# (a PID reused by another program does not count).
mmt_runner_running() {
    local pid command
    pid=$(cat "$MMT_SPEC_DIR/runner-$1.pid" 2>/dev/null) || return 1
    [[ $pid =~ ^[1-9][0-9]{0,9}$ ]] || return 1
    command=$(ps -ww -o args= -p "$pid" 2>/dev/null) || return 1
    [[ $command == *" $2" ]]
}

mmt_cancel() {
    # No scheduler: the runner stops its Job when Mado asks it to (heartbeat answer).
    mmt_check_cancel_values
}
