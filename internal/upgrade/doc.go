// Package upgrade holds the rolling-upgrade acceptance test of Relay's
// compatibility promise (docs/upgrading.md): relays of the previous
// release (release/RELEASES, built from git history) lead and stand by
// under load, the current release's `relay migrate up` runs beside them,
// and they are replaced one by one with the current release while SIGKILLs
// move the leadership between the two versions. The log must hold every
// committed event exactly once in per-key order, written by one leader at a
// time, with the poll and the WAL reader, the embedded broker on a shared
// data directory (which the current release upgrades in place) and the
// Kafka sink.
//
// The package has no non-test code besides this comment; its helpers are
// internal/e2e (processes, writers, the log checker) and internal/testbin
// (the binaries of both releases).
package upgrade
