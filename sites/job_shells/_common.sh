#
# Mado runs this script on the site's login node, through the launcher over SSH or through
# `mado-tracking submit`, with `set -eu`, `umask 077` and these variables exported, and then calls
# mmt_submit (mmt_find first when the answer to an earlier try was lost; mmt_cancel to cancel a
# submitted Job):
#
#   MMT_SPEC_DIR          spec directory <working dir>/.mmt-submissions/<first Job id> (700); each Job
#                         of an array has its own sibling directory named by its Job id
#   MMT_RUNNER            the runner program (it starts with the runner Python); argument: a spec directory
#   MMT_JOB_IDS           the Jobs submitted together, comma-separated: one array task per Job
#   MMT_ARRAY_SIZE        how many Jobs (1: no array)
#   MMT_GPU_COUNT         GPUs for each Job (for a cluster job: for each replica, that is each node)
#   MMT_CLUSTER_SIZE      cluster jobs only: N replicas (main1, sub1, …), one runner each; unset means 1
#   MMT_NODES             cluster jobs only: the nodes to ask for, one per replica (= MMT_CLUSTER_SIZE)
#   MMT_WALLTIME_SECONDS  the time limit in seconds (default 3600)
#   MMT_WALLTIME          the same as HH:MM:SS; hours may exceed 24
#   MMT_PROJECT_ID, MMT_TARGET_ID
#   MMT_VAR_<NAME>        the computer's variables NAME=VALUE, then your own from My settings
#   MMT_SCHEDULER_JOB_ID  mmt_cancel only: the id mmt_submit printed
#
# mmt_submit prints only the scheduler's job id, as the last line of stdout (nothing for hosts
# without a scheduler); everything else goes to stderr. Requeueing is disabled, and the runner gets
# SIGTERM before the time limit so the Job ends as "timed out" with its logs sent.
#
# mmt_find (optional) looks for this submission made by an earlier try whose answer was lost (the
# job name mmt-<first Job id> is what it looks for), so it is not submitted twice. It runs before
# mmt_submit, in a subshell where `set -e` does not apply, so it checks every command itself:
#   status 0  found: prints the scheduler job id (nothing for hosts without a scheduler);
#   status 1  not found: prints nothing, and mmt_submit runs;
#   other     it could not tell (mmt_fail, 2): nothing is submitted and the try fails.
#
# mmt_supports_clusters (optional) declares that mmt_submit runs cluster jobs: with MMT_CLUSTER_SIZE
# N > 1 it asks for MMT_NODES nodes and starts MMT_RUNNER once per node (each runner learns its replica
# from SLURM_PROCID, or from MMT_REPLICA_INDEX 0 … N-1 that your script sets). Mado sends cluster jobs
# only to job shells that define it; it is never called.

# ---- Checks of every value Mado passes in. Keep them: they refuse injection attempts. ----

mmt_fail() {
    printf 'mado job shell: %s\n' "$*" >&2
    exit 2
}

# A count: decimal, at most 9 digits, no leading zeros.
mmt_count() {
    [[ ${!1-} =~ ^(0|[1-9][0-9]{0,8})$ ]] || mmt_fail "$1 must be a whole number of at most 9 digits."
}

# An absolute path of letters, digits and . _ / + @ - without .. parts.
mmt_path() {
    [[ ${!1-} =~ ^/[A-Za-z0-9._/+@-]{0,1023}$ && ! ${!1} =~ (^|/)\.\.(/|$) ]] ||
        mmt_fail "$1 must be an absolute path of letters, digits and . _ / + @ - (no spaces or quotes)."
}

# A word: letters, digits and . _ -, not starting with -.
mmt_word() {
    [[ ${!1-} =~ ^[A-Za-z0-9._][A-Za-z0-9._-]{0,199}$ ]] ||
        mmt_fail "$1 must be a word of letters, digits and . _ - that does not start with -."
}

mmt_check_variables() {
    local name
    for name in "${!MMT_VAR_@}"; do
        [[ ${!name} =~ ^[A-Za-z0-9._][A-Za-z0-9._-]{0,199}$ || ${!name} =~ ^/[A-Za-z0-9._/+@-]{0,1023}$ ]] ||
            mmt_fail "$name must be a word (letters, digits, . _ -) or an absolute path."
        [[ ! ${!name} =~ (^|/)\.\.(/|$) ]] || mmt_fail "$name must not contain .. parts."
    done
}

mmt_check_values() {
    local ids
    mmt_path MMT_SPEC_DIR
    mmt_path MMT_RUNNER
    mmt_count MMT_GPU_COUNT
    mmt_count MMT_WALLTIME_SECONDS
    mmt_count MMT_ARRAY_SIZE
    mmt_count MMT_PROJECT_ID
    mmt_count MMT_TARGET_ID
    [[ ${MMT_JOB_IDS-} =~ ^[1-9][0-9]{0,8}(,[1-9][0-9]{0,8})*$ ]] ||
        mmt_fail "MMT_JOB_IDS must be Job ids separated by commas."
    IFS=, read -r -a ids <<<"$MMT_JOB_IDS"
    [ "${#ids[@]}" -eq "$MMT_ARRAY_SIZE" ] || mmt_fail "MMT_ARRAY_SIZE must be the number of MMT_JOB_IDS."
    [ "$MMT_WALLTIME_SECONDS" -ge 1 ] || mmt_fail "MMT_WALLTIME_SECONDS must be at least 1."
    [[ ${MMT_WALLTIME-} =~ ^[0-9]{2,}:[0-5][0-9]:[0-5][0-9]$ ]] || mmt_fail "MMT_WALLTIME must be HH:MM:SS."
    mmt_check_cluster_values
    mmt_check_variables
}

# A cluster job: alone (never an array), and only for a job shell that declares it runs them.
mmt_check_cluster_values() {
    : "${MMT_CLUSTER_SIZE:=1}" "${MMT_NODES:=1}"
    mmt_count MMT_CLUSTER_SIZE
    mmt_count MMT_NODES
    if [ "$MMT_CLUSTER_SIZE" -lt 1 ] || [ "$MMT_CLUSTER_SIZE" -gt 64 ]; then
        mmt_fail "MMT_CLUSTER_SIZE must be from 1 to 64."
    fi
    if [ "$MMT_NODES" -lt 1 ] || [ "$MMT_NODES" -gt "$MMT_CLUSTER_SIZE" ]; then
        mmt_fail "MMT_NODES must be from 1 to MMT_CLUSTER_SIZE."
    fi
    if [ "$MMT_CLUSTER_SIZE" -gt 1 ]; then
        [ "$MMT_ARRAY_SIZE" -eq 1 ] || mmt_fail "A cluster job (MMT_CLUSTER_SIZE > 1) is submitted alone, not in an array."
        declare -F mmt_supports_clusters >/dev/null ||
            mmt_fail "This job shell does not run cluster jobs (it defines no mmt_supports_clusters); submit it to a Slurm site."
    fi
}

mmt_check_cancel_values() {
    [[ ${MMT_SCHEDULER_JOB_ID-} =~ ^[A-Za-z0-9][][A-Za-z0-9._:-]{0,199}$ ]] ||
        mmt_fail "MMT_SCHEDULER_JOB_ID must be a scheduler job id (letters, digits and . _ : - [ ])."
    mmt_check_variables
}

# Seconds before the time limit at which the runner gets SIGTERM: 120, or half of a short limit.
mmt_lead_seconds() {
    if [ "$MMT_WALLTIME_SECONDS" -ge 240 ]; then echo 120; else echo $((MMT_WALLTIME_SECONDS / 2)); fi
}

# The first lines of the batch script the scheduler runs: the values it needs, written out so the
# script does not depend on how the scheduler passes the environment.
mmt_batch_header() {
    printf '#!/bin/bash\nset -eu\numask 077\n'
    printf 'export MMT_SPEC_DIR=%q MMT_RUNNER=%q MMT_JOB_IDS=%q MMT_WALLTIME_SECONDS=%q\n' \
        "$MMT_SPEC_DIR" "$MMT_RUNNER" "$MMT_JOB_IDS" "$MMT_WALLTIME_SECONDS"
}

# The variables a scheduler's -v passes to the batch job (the essential ones are also written into it).
mmt_exported() {
    echo MMT_SPEC_DIR,MMT_RUNNER,MMT_JOB_IDS,MMT_ARRAY_SIZE,MMT_WALLTIME_SECONDS,MMT_GPU_COUNT,MMT_PROJECT_ID,MMT_TARGET_ID
}

mmt_job_name() {
    echo "mmt-${MMT_JOB_IDS%%,*}"
}

# mmt_find's answer from the scheduler job ids in $1, one a line (one per job or array task): the
# first one submitted (status 0), or status 1 when there is none.
mmt_found_id() {
    local ids id
    ids=$(printf '%s\n' "$1" | awk 'NF { print $1 }' | sort -n -u)
    [ -n "$ids" ] || return 1
    id=$(printf '%s\n' "$ids" | head -n 1)
    [[ $id =~ ^[A-Za-z0-9][][A-Za-z0-9._:-]{0,199}$ ]] || mmt_fail "The scheduler listed $(mmt_job_name) as $id."
    if [ "$id" != "$ids" ]; then
        printf 'mado job shell: %s is in the queue more than once (%s); keeping %s.\n' \
            "$(mmt_job_name)" "${ids//$'\n'/ }" "$id" >&2
    fi
    printf 'mado job shell: %s was submitted by an earlier try as %s; not submitting it again.\n' \
        "$(mmt_job_name)" "$id" >&2
    printf '%s\n' "$id"
}
