#!/bin/sh
# netns_rsh.sh HOST COMMAND [ARG...]: runs COMMAND as if on the host HOST,
# for `troupe launch --rsh "tests/launcher/netns_rsh.sh {host}"` in
# tests/launcher/multihost_test.py. HOST is a network namespace of that name
# (`ip netns add HOST`), which gives it its own interfaces, addresses and
# routes (and /etc/netns/HOST/hosts as /etc/hosts). `ip netns exec` alone
# would share the hostname, the System V IPC and /dev/shm with every other
# "host": UCX would then pick shared memory between them and troupe's single
# copy (same hostname, same pid namespace) would read the peer's memory,
# bypassing the link. So the command also gets its own UTS namespace (the
# hostname HOST), IPC namespace and mount namespace with an empty /dev/shm.
# The pid namespace stays shared: pids in launch.json mean the same process
# to the test, which checks them. Standard input (the job token) passes
# through; the command is exec'd, so its pid is this script's.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: netns_rsh.sh HOST COMMAND [ARG...]" >&2
  exit 2
fi
host=$1
shift
exec ip netns exec "$host" unshare --uts --ipc --mount --propagation private \
  sh -c 'hostname "$0" && mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm && exec "$@"' \
  "$host" "$@"
