#!/usr/bin/env bash
# Debian packages a real node of the e2e tier needs: the CNI plugins, a static busybox (the
# workload image), and a static libc for the sandbox image and runc's nsexec. Installed only when missing.
set -euo pipefail
need=()
[ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
[ -x /bin/busybox ] || need+=(busybox-static)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
[ -e /usr/include/seccomp.h ] || need+=(libseccomp-dev)
command -v openssl >/dev/null || need+=(openssl)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)  # make image
command -v skopeo >/dev/null || need+=(skopeo)          # reads the image as a registry would
# Level 3's network namespace: its links and addresses, a sysctl, kube-proxy's rules.
command -v ip >/dev/null || need+=(iproute2)
command -v sysctl >/dev/null || need+=(procps)
command -v iptables-save >/dev/null || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "e2e: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
    exit 1
  fi
  echo "e2e: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
