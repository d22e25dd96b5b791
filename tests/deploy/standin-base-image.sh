#!/bin/sh
# Builds a stand-in for Docker Hub's python:3.11-slim-bookworm from Debian's packages and imports it into the
# Docker daemon at $DOCKER_HOST, so docker/Dockerfile.worker and docker/Dockerfile.server can be built and run
# on a machine that reaches Debian and PyPI but not Docker Hub (docs/deployment.md, "What is tested").
# Not the real image: Debian's Python 3.11 in /usr/bin (linked into /usr/local/bin as the image has it), pip
# allowed to install into the system, and this machine's CA certificates (an intercepting proxy's included).
#   apt-get install -y debootstrap && sh tests/deploy/standin-base-image.sh /tmp/standin
# About 4 minutes and 260 MB; then: DOCKER_BUILDKIT=0 docker build --network host -f docker/Dockerfile.worker .
set -eu
dir=${1:?give a work directory, for example /tmp/standin}
root=$dir/rootfs
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 1; }
docker version >/dev/null || { echo "No Docker daemon answers at ${DOCKER_HOST:-the default socket}." >&2; exit 1; }
if [ ! -x "$root/usr/bin/python3" ]; then
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,passwd,util-linux,ca-certificates \
        bookworm "$root" http://deb.debian.org/debian
fi
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
printf '#!/bin/sh\nexec python3 -m pip "$@"\n' > "$root/usr/local/bin/pip"
chmod 755 "$root/usr/local/bin/pip"
rm -f "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED "$root"/var/cache/apt/archives/*.deb
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - python:3.11-slim-bookworm
