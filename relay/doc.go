// Package relay is the pipeline between an outbox reader and a log.
//
// A Source (poller/ or cdc/) delivers committed outbox events in commit
// order. The core validates and routes each one into a Message (topic, key,
// headers plus the event id), hands batches to a Sink (the embedded broker or
// Kafka), and once the sink reports them durable, it acknowledges them in one
// Postgres transaction: the published rows are deleted (or archived) and the
// source position and the sink's state are saved together. Only after that
// commit does the source learn the events are done (the WAL reader then
// advances its slot). Events that can never be published go to the
// dead-letter table in the same transaction; under the hold-key policy the
// later events of their key follow them there, held, until the leader
// releases them in order after a retry or discard (fault model in hold.go
// and release.go). Readiness is end to end: the leader's heartbeat rows go
// the same way and /readyz fails when none got through within the bound
// (heartbeat.go). An event a source
// delivered without its content (too large, Event.TooLarge) is copied to
// the dead letters from its outbox row in SQL, before the row's deletion,
// so a crash before the commit leaves the row to be read and dead-lettered
// again, and a commit records it exactly once (oversize.go). Memory is
// bounded by a byte budget as well as rows (budget.go).
package relay
