// Package doctest holds the tests that keep the documentation true: the
// commands of docs/getting-started.md run against a throwaway PostgreSQL
// and the real binaries, every test docs/faults.md names exists, every
// alert of monitoring/alerts.yml has a runbook entry in docs/operating.md,
// and every relative link of README.md and docs/ resolves. It has no code
// of its own.
package doctest
