// Package doctor checks, before a relay runs, everything `relay run`
// needs from its surroundings: PostgreSQL and the outbox schema, what the
// chosen reader needs of the server (logical replication for cdc, table
// privileges for both), the embedded broker's data directory and
// listeners, and the Kafka cluster of the Kafka sink.
//
// Each check is a method of [Doctor] with a name ([Check]), returning one
// [Result]: PASS, WARN or FAIL, what was found, and the fix in one line.
// `relay doctor` prints them all and exits non-zero on a failure; `relay
// run` runs the same checks at start and logs each failure and warning once,
// in the same words. No check stops `relay run`: what follows is run's own
// behaviour for that cause, unchanged. Run ends with an error on what
// waiting cannot change (a database that does not exist, a login or a
// privilege refused, the HTTP address in use) and retries with backoff
// what may change (PostgreSQL or Kafka not up yet, wal_level or the
// REPLICATION right fixed by an operator, the data directory's lock held by
// a relay still stopping, the Kafka listener's address not yet free). The
// check's line names the cause and the fix once, at start, before run's
// retries report the error in their own words.
//
// The checks change nothing: the SQL runs in read-only transactions
// (default_transaction_read_only) under a statement timeout, reads the
// catalog and at most a bounded sample of the outbox; the data-directory
// check writes and removes one temporary file and takes the directory's
// lock for an instant, the listener checks bind and close their address,
// and the Kafka topic check asks the cluster to validate a creation
// without performing it.
package doctor
