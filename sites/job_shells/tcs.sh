# Mado Compute job shell: Fujitsu Technical Computing Suite (pjsub; cancel with pjdel).
#@common

# ---- Adjust to your site, or set these as variables NAME=VALUE on the computer or in My settings. ----
mmt_settings() {
    rscgrp=${MMT_VAR_RSCGRP:-}                   # -L rscgrp=; empty: the default resource group
    group=${MMT_VAR_GROUP:-}                     # -g; the group your usage is charged to
}

mmt_submit() {
    local rscgrp group args out id
    exec 3>&1 1>&2  # only the job id goes to the real stdout (fd 3)
    mmt_check_values
    mmt_settings
    [ -d "$MMT_SPEC_DIR" ] || mmt_fail "The spec directory $MMT_SPEC_DIR does not exist."
    [ "$MMT_GPU_COUNT" -eq 0 ] ||
        mmt_fail "This job shell requests no GPUs; edit it with your site's GPU resource option to run GPU Jobs."

    # At the elapse limit TCS signals the job (SIGXCPU, or SIGTERM on pjdel): both reach the runner as SIGTERM.
    {
        mmt_batch_header
        cat <<'BATCH'
mmt_index=${PJM_BULKNUM:-0}
IFS=, read -r -a mmt_ids <<<"$MMT_JOB_IDS"
export MMT_ARRAY_INDEX="$mmt_index" MMT_JOB_ID="${mmt_ids[$mmt_index]}"
mmt_job_spec_dir="${MMT_SPEC_DIR%/*}/$MMT_JOB_ID"  # each Job's own spec directory
"$MMT_RUNNER" "$mmt_job_spec_dir" &
mmt_runner=$!
trap 'kill -TERM "$mmt_runner" 2>/dev/null || true' TERM XCPU
mmt_status=0
wait "$mmt_runner" || mmt_status=$?
while kill -0 "$mmt_runner" 2>/dev/null; do
    mmt_status=0
    wait "$mmt_runner" || mmt_status=$?
done
exit "$mmt_status"
BATCH
    } >"$MMT_SPEC_DIR/batch.sh"
    chmod 700 "$MMT_SPEC_DIR/batch.sh"

    args=(-N "$(mmt_job_name)")
    if [ -n "$rscgrp" ]; then mmt_word rscgrp; args+=(-L "rscgrp=$rscgrp"); fi
    args+=(-L node=1 -L "elapse=$MMT_WALLTIME" --norestart -j -o "$MMT_SPEC_DIR/pjm-%j.out" -X)
    if [ -n "$group" ]; then mmt_word group; args+=(-g "$group"); fi
    if [ "$MMT_ARRAY_SIZE" -gt 1 ]; then args+=(--bulk --sparam "0-$((MMT_ARRAY_SIZE - 1))"); fi

    out=$(cd "$MMT_SPEC_DIR" && pjsub "${args[@]}" "$MMT_SPEC_DIR/batch.sh")
    # [INFO] PJM 0000 pjsub Job 12345 submitted.
    [[ $out =~ pjsub\ Job\ ([^[:space:]]+)\ submitted\. ]] || mmt_fail "pjsub did not print a job id: $out"
    id=${BASH_REMATCH[1]}
    printf '%s\n' "$id" >&3
}

# pjstat lists a bulk job once, by the id pjsub printed; the name filter may match more than the
# exact name, so the JOB_NAME column is compared too.
mmt_find() {
    local user out
    mmt_check_values
    user=$(id -un) || mmt_fail "id -un cannot name this account."
    out=$(pjstat --filter "jnam=$(mmt_job_name)" --filter "usr=$user" --choose jid,jnam) ||
        mmt_fail "pjstat cannot list your jobs, so whether $(mmt_job_name) was submitted is unknown."
    out=$(printf '%s\n' "$out" | awk -v name="$(mmt_job_name)" '$2 == name && $1 ~ /^[0-9]/ { print $1 }') ||
        mmt_fail "awk cannot read pjstat's answer."
    mmt_found_id "$out"
}

mmt_cancel() {
    mmt_check_cancel_values
    pjdel "$MMT_SCHEDULER_JOB_ID"
}
