# Mado Compute job shell: a Docker host without a scheduler.
#@common

mmt_submit() {
    exec 3>&1 1>&2  # nothing goes to the real stdout: there is no scheduler job id
    mmt_check_values
    [ -d "$MMT_SPEC_DIR" ] || mmt_fail "The spec directory $MMT_SPEC_DIR does not exist."
    command -v docker >/dev/null || mmt_fail "Docker is not installed on $(hostname); install it to run Docker Jobs."
    docker version --format '{{.Server.Version}}' >/dev/null ||
        mmt_fail "$(id -un) cannot reach the Docker daemon on $(hostname): start it, or add the account to the docker group."
    mmt_start_runners
}

#@hosts
