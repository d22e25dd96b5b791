# Mado Compute job shell: PBS Professional (qsub; cancel with qdel).
#@common

# ---- Adjust to your site, or set these as variables NAME=VALUE on the computer or in My settings. ----
mmt_settings() {
    queue=${MMT_VAR_QUEUE:-}                     # -q; empty: the default queue
    cpus=${MMT_VAR_CPUS:-}                       # ncpus in -l select; empty: the queue's default
    account=${MMT_VAR_ACCOUNT:-${MMT_VAR_GROUP:-}}  # -A; empty: none
}

mmt_submit() {
    local queue cpus account select args out id
    exec 3>&1 1>&2  # only the job id goes to the real stdout (fd 3)
    mmt_check_values
    mmt_settings
    [ -d "$MMT_SPEC_DIR" ] || mmt_fail "The spec directory $MMT_SPEC_DIR does not exist."

    # Output goes to the submission directory, the spec directory (cd below).
    # PBS sends SIGTERM at the time limit (then SIGKILL after kill_delay): the runner is exec'd to get it.
    {
        mmt_batch_header
        cat <<'BATCH'
mmt_index=${PBS_ARRAY_INDEX:-0}
IFS=, read -r -a mmt_ids <<<"$MMT_JOB_IDS"
export MMT_ARRAY_INDEX="$mmt_index" MMT_JOB_ID="${mmt_ids[$mmt_index]}"
mmt_job_spec_dir="${MMT_SPEC_DIR%/*}/$MMT_JOB_ID"  # each Job's own spec directory
exec "$MMT_RUNNER" "$mmt_job_spec_dir"
BATCH
    } >"$MMT_SPEC_DIR/batch.sh"
    chmod 700 "$MMT_SPEC_DIR/batch.sh"

    select=1
    if [ -n "$cpus" ]; then mmt_count cpus; select="$select:ncpus=$cpus"; fi
    if [ "$MMT_GPU_COUNT" -gt 0 ]; then select="$select:ngpus=$MMT_GPU_COUNT"; fi
    args=(-N "$(mmt_job_name)")
    if [ -n "$queue" ]; then mmt_word queue; args+=(-q "$queue"); fi
    args+=(-l "select=$select" -l "walltime=$MMT_WALLTIME" -r n -j oe -S /bin/bash
        -v "$(mmt_exported)")
    if [ -n "$account" ]; then mmt_word account; args+=(-A "$account"); fi
    if [ "$MMT_ARRAY_SIZE" -gt 1 ]; then args+=(-J "0-$((MMT_ARRAY_SIZE - 1))"); fi

    out=$(cd "$MMT_SPEC_DIR" && qsub "${args[@]}" "$MMT_SPEC_DIR/batch.sh")
    id=$(printf '%s\n' "$out" | tail -n 1)  # 12345.server, or 12345[].server for an array
    [[ $id =~ ^[0-9]+(\[\])?(\.[A-Za-z0-9._-]+)?$ ]] || mmt_fail "qsub did not print a job id: $out"
    printf '%s\n' "$id" >&3
}

# qselect lists an array once, by the id qsub printed (12345[].server); finished jobs are not listed.
mmt_find() {
    local user out
    mmt_check_values
    user=$(id -un) || mmt_fail "id -un cannot name this account."
    out=$(qselect -N "$(mmt_job_name)" -u "$user") ||
        mmt_fail "qselect cannot list your jobs, so whether $(mmt_job_name) was submitted is unknown."
    mmt_found_id "$out"
}

mmt_cancel() {
    mmt_check_cancel_values
    qdel "$MMT_SCHEDULER_JOB_ID"
}
