# Mado Compute job shell: Grid Engine (qsub -terse; cancel with qdel).
#@common

# ---- Adjust to your site, or set these as variables NAME=VALUE on the computer or in My settings. ----
mmt_settings() {
    queue=${MMT_VAR_QUEUE:-}                     # -q; empty: any queue
    account=${MMT_VAR_ACCOUNT:-${MMT_VAR_GROUP:-}}  # -A; empty: none
    gpu_resource=${MMT_VAR_GPU_RESOURCE:-gpu}    # -l <resource>=N for GPUs (a site-defined complex)
}

mmt_submit() {
    local queue account gpu_resource lead args out id
    exec 3>&1 1>&2  # only the job id goes to the real stdout (fd 3)
    mmt_check_values
    mmt_settings
    [ -d "$MMT_SPEC_DIR" ] || mmt_fail "The spec directory $MMT_SPEC_DIR does not exist."
    lead=$(mmt_lead_seconds)

    # h_rt ends a job with SIGKILL, so a timer (timeout) sends the runner SIGTERM $lead s early.
    # SGE_TASK_ID is "undefined" outside arrays.
    {
        mmt_batch_header
        printf 'mmt_term_after=%s\n' "$((MMT_WALLTIME_SECONDS - lead))"
        cat <<'BATCH'
case ${SGE_TASK_ID:-undefined} in undefined | "") mmt_index=0 ;; *) mmt_index=$((SGE_TASK_ID - 1)) ;; esac
IFS=, read -r -a mmt_ids <<<"$MMT_JOB_IDS"
export MMT_ARRAY_INDEX="$mmt_index" MMT_JOB_ID="${mmt_ids[$mmt_index]}"
mmt_job_spec_dir="${MMT_SPEC_DIR%/*}/$MMT_JOB_ID"  # each Job's own spec directory
exec timeout --signal=TERM "${mmt_term_after}s" "$MMT_RUNNER" "$mmt_job_spec_dir"
BATCH
    } >"$MMT_SPEC_DIR/batch.sh"
    chmod 700 "$MMT_SPEC_DIR/batch.sh"

    args=(-terse -N "$(mmt_job_name)" -l "h_rt=$MMT_WALLTIME" -r n -j y -S /bin/bash)
    # shellcheck disable=SC2016 # $JOB_ID and $TASK_ID are expanded by Grid Engine, not by bash
    args+=(-o "$MMT_SPEC_DIR"'/sge-$JOB_ID.$TASK_ID.out')
    args+=(-v "$(mmt_exported)")
    if [ -n "$queue" ]; then mmt_word queue; args+=(-q "$queue"); fi
    if [ "$MMT_GPU_COUNT" -gt 0 ]; then mmt_word gpu_resource; args+=(-l "$gpu_resource=$MMT_GPU_COUNT"); fi
    if [ -n "$account" ]; then mmt_word account; args+=(-A "$account"); fi
    if [ "$MMT_ARRAY_SIZE" -gt 1 ]; then args+=(-t "1-$MMT_ARRAY_SIZE"); fi

    out=$(cd "$MMT_SPEC_DIR" && qsub "${args[@]}" "$MMT_SPEC_DIR/batch.sh")
    out=$(printf '%s\n' "$out" | tail -n 1)
    id=${out%%.*}  # an array prints <id>.1-N:1
    [[ $id =~ ^[0-9]+$ ]] || mmt_fail "qsub did not print a job id: $out"
    printf '%s\n' "$id" >&3
}

# qstat cuts names to 10 characters; -r adds each job's "Full jobname:" line. A job being
# deleted (state d) does not count. An array lists one line per task, all with the array's id.
mmt_find() {
    local user out
    mmt_check_values
    user=$(id -un) || mmt_fail "id -un cannot name this account."
    out=$(qstat -u "$user" -r) ||
        mmt_fail "qstat cannot list your jobs, so whether $(mmt_job_name) was submitted is unknown."
    out=$(printf '%s\n' "$out" | awk -v name="$(mmt_job_name)" '
        $1 ~ /^[0-9]+$/ { id = ($5 ~ /d/) ? "" : $1 }
        $1 == "Full" && $2 == "jobname:" && $3 == name && id != "" { print id }') ||
        mmt_fail "awk cannot read qstat's answer."
    mmt_found_id "$out"
}

mmt_cancel() {
    mmt_check_cancel_values
    qdel "$MMT_SCHEDULER_JOB_ID"
}
