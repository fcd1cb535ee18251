#!/usr/bin/env bash
# Installs replayd as a user would, and runs it. Builds a file-based
# GOPROXY from this tree (.ci/modproxy: the root module and each released
# nested module at the version the nested go.mod files require), then, in
# a module outside the tree with no go.work and no replace, `go get`s
# replaydpg and replaydprom from it and builds and runs .ci/consumer (a hub
# over SQLite, and over PostgreSQL when REPLAYD_PG_DSN is set). Fails if
# the nested modules disagree on the root's version, if go.work's replaces
# name another, if a module cannot be fetched or built that way, or if a
# test-only dependency of the root lands in the consumer's go.sum.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH="$PATH:/usr/local/go/bin"

# The released modules: the root and every nested module but the examples,
# the internal ones and the interop harness.
mods=(.)
for m in $(git ls-files '*/go.mod' | xargs -n1 dirname); do
  case "$m" in examples/* | internal/* | .ci/* | interop) ;; *) mods+=("$m") ;; esac
done

if grep -n '^[[:space:]]*replace\b' $(git ls-files '*go.mod') /dev/null; then
  echo "a committed go.mod holds a replace directive: it is ignored for users"; exit 1
fi

# The version a release tags: what every nested module requires of the
# root (and of another of ours: examples/cluster requires replaydpg).
version=
for m in $(git ls-files '*/go.mod' | xargs -n1 dirname); do
  for v in $(awk '{ for (i = 1; i < NF; i++) if ($i ~ /^github\.com\/replayd\/replayd(\/|$)/) print $(i + 1) }' "$m/go.mod"); do
    if [ -n "$version" ] && [ "$v" != "$version" ]; then
      echo "$m/go.mod requires one of our modules at $v, others at $version"; exit 1
    fi
    version=$v
  done
done
for m in "${mods[@]}"; do
  path=$(awk '$1 == "module" { print $2 }' "$m/go.mod")
  if ! go work edit -json | grep -q "\"Path\": \"$path\",\$" ||
     ! go work edit -json | grep -A1 "\"Path\": \"$path\",\$" | grep -q "\"Version\": \"$version\""; then
    echo "go.work does not replace $path $version => ./$m (see RELEASING.md)"; exit 1
  fi
done
if [ -z "$version" ]; then
  echo "no nested module requires github.com/replayd/replayd"; exit 1
fi
echo "modules ${mods[*]} at $version"

tmp=$(mktemp -d)
cleanup() {
  GOMODCACHE="$tmp/modcache" go clean -modcache 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

go vet .ci/modproxy/main.go
go run .ci/modproxy/main.go -version "$version" -out "$tmp/proxy" "${mods[@]}"

# The consumer: its own module cache, so no earlier build of this version
# is reused; third-party modules come from the machine's module cache when
# it has them, else from the real proxy, checked against the checksum
# database as usual. Ours are not in that database (GONOSUMDB).
machine_cache=$(go env GOMODCACHE)
export GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=github.com/replayd GOMODCACHE="$tmp/modcache"
export GOPROXY="file://$tmp/proxy,file://$machine_cache/cache/download,https://proxy.golang.org"
mkdir "$tmp/consumer"
cp .ci/consumer/main.go "$tmp/consumer/"
cd "$tmp/consumer"
go mod init example.com/consumer >/dev/null 2>&1
go get github.com/replayd/replayd/replaydpg@"$version" github.com/replayd/replayd/replaydprom@"$version"
go mod tidy
go vet .
go build -o consumer .
./consumer

# A user's go.sum carries what `go mod tidy` loads: their packages'
# dependencies and those dependencies' tests. The root's test-only
# dependencies must not be among it.
echo "== consumer go.sum: $(wc -l <go.sum) lines"
# (The browser tests drive Chromium through internal/headless/driver, a
# module of its own, for this reason.)
if grep -E 'chromedp|cdproto' go.sum; then
  echo "a test-only dependency of replayd lands in a user's go.sum"; exit 1
fi
echo "consumer ok"
