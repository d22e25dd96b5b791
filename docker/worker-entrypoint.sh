#!/bin/sh
# Entry point of the worker image (compose.yaml, profile `worker`; seed 001 "Run with Docker Compose").
#
#   docker compose --profile worker up -d worker            -> mado-tracking-worker run
#   docker compose --profile worker run --rm worker doctor  -> mado-tracking-worker doctor
#   docker compose --profile worker run --rm worker sh      -> any other command, as the worker's user
#
# It starts as root only to hand the mounted files to the user the agent runs as, then drops to that user
# with no capabilities left:
# - the user: the owner of the SSH directory mounted read-only at ~/.ssh (./var/worker-ssh), because the
#   agent refuses private keys that anyone but their owner can read and cannot chmod a read-only mount;
#   the image's `worker` (uid 1000) when nothing or a root-owned directory is mounted;
# - the token: Compose passes a file secret as a bind mount with the host file's owner and mode (600,
#   often another uid); a private copy in a tmpfs, mode 600, is what MMT_API_TOKEN_FILE names;
# - the state directory (the volume worker-state): owned by that user, mode 700, as the agent demands.
# Started as any other user (docker run --user, or outside Docker) it changes nothing and runs as is.
#
# Every path can be moved by the environment, which is how tests/deploy runs this script outside Docker.
set -eu

secret=${MMT_WORKER_TOKEN_SECRET:-/run/secrets/worker_token}
state=${MMT_WORKER_STATE_DIR:-/var/lib/mado-tracking-worker}
runtime=${MMT_WORKER_RUNTIME_DIR:-/run/mado-tracking-worker}
HOME=${HOME:-/home/worker}
ssh_dir=$HOME/.ssh
agent=${MMT_WORKER_AGENT:-mado-tracking-worker}

say() { printf 'mado-worker: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }

if [ $# -eq 0 ]; then
    set -- run
fi
case $1 in
    run | doctor | status | -*) command=agent ;;
    *) command=other ;;
esac

# The token is needed by run and doctor; --help, --version and a shell start without it.
needs_token=false
if [ "$command" = agent ] && { [ "$1" = run ] || [ "$1" = doctor ]; }; then
    needs_token=true
fi
if [ "$needs_token" = true ]; then
    if [ -d "$secret" ]; then
        fail "$secret is a directory, not the token: the token file did not exist when the container was created. Put the worker token into ./var/worker-token (or the file MMT_WORKER_TOKEN_FILE names), then run: docker compose --profile worker up -d --force-recreate worker"
    fi
    if [ ! -f "$secret" ]; then
        fail "No worker token at $secret: put the worker token into ./var/worker-token (or point MMT_WORKER_TOKEN_FILE at the file holding it) and start the worker again."
    fi
fi
# The agent reads the token from the file only: a token in the environment would reach every process it starts.
unset MMT_API_TOKEN
# doctor takes MMT_WORKER_ID for "check the env file `install` wrote for this worker"; a container has none: its
# settings are this environment, which doctor checks without it.
if [ "$1" = doctor ]; then
    unset MMT_WORKER_ID
fi

if [ "$(id -u)" != 0 ]; then
    if [ "$needs_token" = true ]; then
        [ -r "$secret" ] || fail "The token file $secret cannot be read by uid $(id -u): make that user its owner (chmod 600)."
        export MMT_API_TOKEN_FILE="$secret"
    fi
    export HOME MMT_WORKER_STATE_DIR="$state"
    if [ "$command" = agent ]; then
        exec "$agent" "$@"
    fi
    exec "$@"
fi

# Root: choose the user, then prepare what it needs.
default_uid=$(id -u worker 2>/dev/null || echo 1000)
default_gid=$(id -g worker 2>/dev/null || echo 1000)
if [ -n "${MMT_WORKER_UID:-}" ]; then
    uid=$MMT_WORKER_UID
    gid=${MMT_WORKER_GID:-$MMT_WORKER_UID}
elif [ -d "$ssh_dir" ] && [ "$(stat -c %u "$ssh_dir")" != 0 ]; then
    uid=$(stat -c %u "$ssh_dir")
    gid=$(stat -c %g "$ssh_dir")
else
    uid=$default_uid
    gid=$default_gid
    if [ -d "$ssh_dir" ] && [ -n "$(ls -A "$ssh_dir")" ]; then
        say "$ssh_dir belongs to root, so the worker runs as uid $uid and cannot use keys only root may read: run chown -R \"\$(id -u):\$(id -g)\" on the host directory (./var/worker-ssh or MMT_WORKER_SSH_DIR)."
    fi
fi
case $uid$gid in
    *[!0-9]*) fail "MMT_WORKER_UID and MMT_WORKER_GID must be numbers (got $uid and $gid)." ;;
esac
if [ "$uid" = 0 ]; then
    fail "The worker does not run as root: set MMT_WORKER_UID to the owner of the SSH keys."
fi

if [ ! -d "$state" ]; then
    mkdir -p "$state"
fi
# A worker-state volume written under another uid (the SSH directory changed hands) is handed over whole:
# its job records must stay readable, or running jobs could not be taken over.
if [ "$(stat -c %u:%g "$state")" != "$uid:$gid" ]; then
    chown -R "$uid:$gid" "$state"
fi
chmod 700 "$state"
if [ -d "$HOME" ] && [ "$(stat -c %u "$HOME")" != "$uid" ]; then
    chown "$uid:$gid" "$HOME"
fi

if [ "$needs_token" = true ]; then
    mkdir -p "$runtime"
    chmod 700 "$runtime"
    (umask 077 && cat "$secret" > "$runtime/token.new") || fail "The token file $secret cannot be read."
    chown "$uid:$gid" "$runtime" "$runtime/token.new"
    mv "$runtime/token.new" "$runtime/token"
    export MMT_API_TOKEN_FILE="$runtime/token"
fi

export HOME MMT_WORKER_STATE_DIR="$state"
if [ "$command" = agent ]; then
    set -- "$agent" "$@"
fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"
