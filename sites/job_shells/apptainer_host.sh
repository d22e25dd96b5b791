# Mado Compute job shell: an Apptainer (or Singularity) host without a scheduler.
#@common

mmt_submit() {
    local runtime help flag
    exec 3>&1 1>&2  # nothing goes to the real stdout: there is no scheduler job id
    mmt_check_values
    [ -d "$MMT_SPEC_DIR" ] || mmt_fail "The spec directory $MMT_SPEC_DIR does not exist."
    runtime=$(command -v apptainer || command -v singularity) ||
        mmt_fail "Neither apptainer nor singularity is installed on $(hostname)."
    # The runner isolates Jobs with these flags; an older version without them is refused here.
    help=$("$runtime" exec --help)
    for flag in --cleanenv --containall --no-eval --no-home --no-mount --pwd; do
        [[ $help == *"$flag"* ]] || mmt_fail "$runtime exec lacks $flag; install a newer version."
    done
    if [ "$MMT_GPU_COUNT" -gt 0 ]; then
        [[ $help == *--nv* ]] || mmt_fail "$runtime exec lacks --nv, which GPU Jobs need."
    fi
    mmt_start_runners
}

#@hosts
