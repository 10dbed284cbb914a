#!/usr/bin/env bash
# Builds a Relay release: static relay binaries for every platform, their
# SHA256SUMS, and the container image when a Docker engine is present.
#
#   release/build.sh [--out DIR] [--platforms "linux/amd64 ..."] [--allow-dirty] VERSION
#
# VERSION is a semantic version with a leading v (v0.2.0, v1.0.0-rc.1). The
# binaries are reproducible: the same commit and Go toolchain give the same
# bytes on any machine and in any directory (CGO_ENABLED=0, -trimpath,
# -buildvcs stamping the commit and its time, fixed -ldflags, no build
# timestamps; SOURCE_DATE_EPOCH is the commit's time and dates the image).
# A release is built from a clean work tree; --allow-dirty builds anyway
# (for tests and trials; the binaries then say vcs.modified=true).
set -euo pipefail

usage() {
	echo "usage: release/build.sh [--out DIR] [--platforms \"linux/amd64 ...\"] [--allow-dirty] VERSION" >&2
	exit 2
}

out=dist
platforms="linux/amd64 linux/arm64 darwin/amd64 darwin/arm64"
allow_dirty=0
version=""
while [ $# -gt 0 ]; do
	case "$1" in
	--out)
		[ $# -ge 2 ] || usage
		out=$2
		shift 2
		;;
	--platforms)
		[ $# -ge 2 ] || usage
		platforms=$2
		shift 2
		;;
	--allow-dirty)
		allow_dirty=1
		shift
		;;
	-h | --help) usage ;;
	-*)
		echo "release/build.sh: unknown flag $1" >&2
		usage
		;;
	*)
		[ -z "$version" ] || usage
		version=$1
		shift
		;;
	esac
done
[ -n "$version" ] || usage
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
if ! [[ "$version" =~ $semver ]]; then
	echo "release/build.sh: version \"$version\" is not a semantic version such as v0.2.0" >&2
	exit 2
fi

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
commit=$(git rev-parse HEAD)
if [ "$allow_dirty" = 0 ] && [ -n "$(git status --porcelain)" ]; then
	echo "release/build.sh: the work tree has uncommitted changes; commit them (or pass --allow-dirty for a trial build)" >&2
	exit 1
fi
# A version already released must be rebuilt from its own commit.
recorded=$(awk -v v="$version" '$1 == v { print $2 }' release/RELEASES)
if [ -n "$recorded" ] && [ "$recorded" != "$commit" ]; then
	echo "release/build.sh: $version was released from $recorded (release/RELEASES), not from HEAD $commit" >&2
	exit 1
fi

SOURCE_DATE_EPOCH=$(git log -1 --format=%ct HEAD)
export SOURCE_DATE_EPOCH
ldflags="-s -w -buildid= -X github.com/outboxrelay/relay/internal/buildinfo.Version=$version"
mkdir -p "$out"
out=$(cd "$out" && pwd)

names=()
for platform in $platforms; do
	goos=${platform%/*}
	goarch=${platform#*/}
	name="relay_${version}_${goos}_${goarch}"
	echo "building $name"
	# GOFLAGS and friends from the caller's environment must not change the
	# bytes: the build sees only what is set here.
	env -u GOFLAGS -u GOAMD64 -u GOARM64 -u GOEXPERIMENT \
		CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" \
		go build -trimpath -buildvcs=true -ldflags "$ldflags" -o "$out/$name" ./cmd/relay
	# Go stamps the commit only where .git is a directory (not in a git
	# worktree); a release binary must say which commit it is.
	if ! go version -m "$out/$name" | grep -q "vcs.revision=$commit"; then
		echo "release/build.sh: go build did not stamp commit $commit into $name (build from a clone, not a git worktree)" >&2
		exit 1
	fi
	names+=("$name")
done
(cd "$out" && sha256sum "${names[@]}" >SHA256SUMS)
echo "wrote $out/SHA256SUMS (commit $commit, SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH)"

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
	image_platforms=""
	for platform in $platforms; do
		case "$platform" in linux/*) image_platforms="${image_platforms:+$image_platforms,}$platform" ;; esac
	done
	if [ -n "$image_platforms" ]; then
		echo "building the image relay:$version for $image_platforms"
		docker buildx build --platform "$image_platforms" \
			--build-arg VERSION="$version" --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
			--label org.opencontainers.image.version="$version" \
			--label org.opencontainers.image.revision="$commit" \
			--output "type=oci,dest=$out/relay_${version}_image.oci.tar,rewrite-timestamp=true" \
			--tag "relay:$version" .
		(cd "$out" && sha256sum "relay_${version}_image.oci.tar" >>SHA256SUMS)
	fi
else
	echo "no Docker engine here: the container image is not built (run this script where docker buildx works)"
fi
