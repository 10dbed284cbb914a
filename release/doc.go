// Package release holds Relay's release tooling: build.sh, which builds the
// static, reproducible binaries of a version with their SHA256SUMS (and
// the container image where Docker runs), and RELEASES, the record of
// every release's version, commit and date that upgrade tests build the
// previous release from. The package's test checks that a build is
// reproducible.
package release
