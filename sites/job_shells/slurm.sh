# Mado Compute job shell: Slurm (sbatch; cancel with scancel).
#@common

# ---- Adjust to your site, or set these as variables NAME=VALUE on the computer or in My settings. ----
mmt_settings() {
    partition=${MMT_VAR_PARTITION:-}             # --partition; empty: the site's default partition
    cpus=${MMT_VAR_CPUS:-1}                      # --cpus-per-task
    account=${MMT_VAR_ACCOUNT:-${MMT_VAR_GROUP:-}}  # --account; empty: your default account
    gres_type=${MMT_VAR_GPU_TYPE:-}              # --gres=gpu:<type>:N when set, else gpu:N
}

# This job shell runs cluster jobs: one node and one runner (srun) per replica. Delete this function
# and Mado stops sending cluster jobs here.
mmt_supports_clusters() {
    return 0
}

mmt_submit() {
    local partition cpus account gres_type lead args out id
    exec 3>&1 1>&2  # only the job id goes to the real stdout (fd 3)
    mmt_check_values
    mmt_settings
    [ -d "$MMT_SPEC_DIR" ] || mmt_fail "The spec directory $MMT_SPEC_DIR does not exist."
    lead=$(mmt_lead_seconds)

    # The scheduler runs the runner itself (exec), so --signal=B:TERM reaches it before the limit.
    {
        mmt_batch_header
        if [ "$MMT_CLUSTER_SIZE" -gt 1 ]; then
            printf 'export MMT_CLUSTER_SIZE=%q MMT_NODES=%q\n' "$MMT_CLUSTER_SIZE" "$MMT_NODES"
            cat <<'BATCH'
export MMT_ARRAY_INDEX=0 MMT_JOB_ID="$MMT_JOB_IDS"
# The port main1's code listens on (MASTER_PORT): picked free here, on the first node, which is
# main1's; the same for every replica. Without it each runner derives one from the job id.
MMT_MASTER_PORT=$("$MMT_RUNNER" --free-port) || MMT_MASTER_PORT=
export MMT_MASTER_PORT
# One runner per node (main1 on this one); each learns its replica from SLURM_PROCID. srun hands
# the scheduler's SIGTERM before the limit to every runner. A runner's exit status does not stop
# the others: the server ends the Job and tells the other runners.
exec srun --nodes="$MMT_NODES" --ntasks="$MMT_CLUSTER_SIZE" --ntasks-per-node=1 --kill-on-bad-exit=0 \
    --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "$MMT_RUNNER" "$MMT_SPEC_DIR"
BATCH
        else
            cat <<'BATCH'
mmt_index=${SLURM_ARRAY_TASK_ID:-0}
IFS=, read -r -a mmt_ids <<<"$MMT_JOB_IDS"
export MMT_ARRAY_INDEX="$mmt_index" MMT_JOB_ID="${mmt_ids[$mmt_index]}"
mmt_job_spec_dir="${MMT_SPEC_DIR%/*}/$MMT_JOB_ID"  # each Job's own spec directory
exec "$MMT_RUNNER" "$mmt_job_spec_dir"
BATCH
        fi
    } >"$MMT_SPEC_DIR/batch.sh"
    chmod 700 "$MMT_SPEC_DIR/batch.sh"

    args=(--parsable --job-name="$(mmt_job_name)")
    if [ -n "$partition" ]; then mmt_word partition; args+=(--partition="$partition"); fi
    mmt_count cpus
    if [ "$MMT_CLUSTER_SIZE" -gt 1 ]; then
        args+=(--nodes="$MMT_NODES" --ntasks-per-node=1)  # one replica per node; --gres is per node
    else
        args+=(--nodes=1 --ntasks=1)
    fi
    args+=(--cpus-per-task="$cpus" --time="$MMT_WALLTIME" --signal="B:TERM@$lead"
        --no-requeue --export=ALL --chdir="$MMT_SPEC_DIR")
    if [ "$MMT_GPU_COUNT" -gt 0 ]; then
        if [ -n "$gres_type" ]; then
            mmt_word gres_type
            args+=(--gres="gpu:$gres_type:$MMT_GPU_COUNT")
        else
            args+=(--gres="gpu:$MMT_GPU_COUNT")
        fi
    fi
    if [ -n "$account" ]; then mmt_word account; args+=(--account="$account"); fi
    if [ "$MMT_ARRAY_SIZE" -gt 1 ]; then
        args+=(--array="0-$((MMT_ARRAY_SIZE - 1))" --output="$MMT_SPEC_DIR/slurm-%A_%a.out")
    else
        args+=(--output="$MMT_SPEC_DIR/slurm-%j.out")
    fi

    out=$(sbatch "${args[@]}" "$MMT_SPEC_DIR/batch.sh")
    out=$(printf '%s\n' "$out" | tail -n 1)
    id=${out%%;*}  # --parsable prints <id> or <id>;<cluster>
    [[ $id =~ ^[0-9]+$ ]] || mmt_fail "sbatch did not print a job id: $out"
    printf '%s\n' "$id" >&3
}

# The array's own id for an array (%F), as sbatch printed it; pending and running jobs only.
mmt_find() {
    local user out
    mmt_check_values
    user=$(id -un) || mmt_fail "id -un cannot name this account."
    out=$(squeue --noheader --user="$user" --name="$(mmt_job_name)" --format=%F) ||
        mmt_fail "squeue cannot list your jobs, so whether $(mmt_job_name) was submitted is unknown."
    mmt_found_id "$out"
}

mmt_cancel() {
    mmt_check_cancel_values
    scancel "$MMT_SCHEDULER_JOB_ID"
}
