#!/usr/bin/env bash
# Install the Debian packages Bootseer's real components need (idempotent).
#
# Run as root. Only packages that are missing get installed, and the script says which.
# Add a line to PACKAGES (with a comment saying who needs it) for new components.
set -euo pipefail

PACKAGES=(
  # bootseer_dev.cluster: local Apache Hadoop 2.7.3 HDFS
  openjdk-17-jdk-headless        # JVM for NameNode/DataNodes (hdfs:// stores need none)
  libjersey1-core-java           # WebHDFS is Jersey 1; the pyspark jars only carry Jersey 2
  libjersey1-server-java
  libjersey1-servlet-java
  libjersey1-json-java
  libjsr311-api-java
  libjaxb-java
  libjettison-java
  iproute2                       # tc: per-DataNode link caps on lo (--link); the fleet
                                 # lab's ip netns, veths, bridge and htb caps
  # bootseer_dev.fleet: the multi-node lab (nsenter comes with util-linux, essential)
  procps                         # sysctl in each lab namespace (IPv6 off: IPv4 lab only)
  # FUSE mounts: bootseer/fuse speaks the protocol itself (no libfuse); fuse3 brings
  # fusermount3, which mounts for users without CAP_SYS_ADMIN.
  fuse3
  # bootseer.prefetch.metaimage: a warmed image's names and attributes as an EROFS image
  erofs-utils                    # mkfs.erofs (1.5: chunked sparse stubs, xattrs)
  # bootseer_dev.image: real Debian images for the lazy-image tests and demo (issue 5)
  debootstrap                    # builds the bookworm minbase root filesystem (layer 1)
  debian-archive-keyring         # debootstrap checks the archive's Release signature with it
  runc                           # runs commands in an unpacked or lazily mounted image
  # bootseer.prefetch.sources and its tests: images from a registry and from a Docker engine
  skopeo                         # docker:// sources are copied into an OCI layout
  docker-registry                # a real OCI registry (distribution 2.8) on loopback
  docker.io                      # dockerd with a private data root, for docker-daemon:
  # agents/: bootseer-hook (hooks.d precreate/poststop) is tested with a real podman
  podman
  # agents/: bootseer-runtime as the runc v2 shim's BinaryName, tested with a private
  # containerd (1.6, config version 2; ctr as its client, and its CRI plugin as the kubelet
  # drives it)
  containerd
  catatonit                      # static init: the CRI pods' sandbox (pause) image
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-system-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-system-deps: missing ${missing[*]}; run as root (or apt-get install them)" >&2
  exit 1
fi

echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when they are absent or older than a day.
if [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1) ]]; then
  apt-get update -q
fi
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-system-deps: done"
