// Package store owns the text of every SQL statement the relay's core
// (package relay) runs against its own tables: the leadership lease and
// its fence, the checkpoint, the acknowledgement's deletes, archive moves
// and dead letters, the held keys and their releases, the readiness
// heartbeat, the backlog count, retention and replay, the operator
// commands on dead letters and replay requests, and the reads of
// `relay status` (status.go: bounded counts, as the backlog's); in PollReader, the poll
// reader's (poller/: its ticks, page reads and listings, and the sleep
// lock that tells writers to notify, whose shapes and protocol its package
// doc explains); and, in CDCReader, the WAL reader's (cdc/: its
// preflight and publication, the replication slots' state, drop and
// count, the slot creation records in cdc_slots, the import of a new
// slot's snapshot and the read of the rows from before it, the slot's
// lag and the heartbeat). The replication protocol's commands
// (IDENTIFY_SYSTEM, CREATE_REPLICATION_SLOT, START_REPLICATION) are not
// SQL and stay in cdc/.
//
// A Postgres and a CDCReader are built from the schema name alone (the
// tables' names are fixed by the migrations); a PollReader from the
// schema and the message limit, which its statements' text carries. Each
// method is one statement (CDCReader.ImportSnapshot is two, which work
// only in that order at the start of one transaction), or queues one into
// a pgx.Batch, and runs on the executor it is given (a pool, a connection
// or a transaction), so the caller decides the transactions: the
// guarantees live in how the core groups these statements, which
// relay/doc.go, relay/leadership.go, relay/hold.go, relay/release.go and
// relay/replayer.go describe (for the readers, poller/doc.go and
// cdc/doc.go). In particular:
//
//   - Fence must be the first statement of every transaction that deletes
//     outbox rows, saves a checkpoint or moves a replay cursor: it holds
//     the leadership row FOR SHARE where the epoch is the caller's, and it
//     sets relay.allow_outbox_changes for the transaction, without which
//     migration 011's trigger refuses the deletes.
//   - DeleteRanges, DeleteIDs, ArchiveRows, CopyDeadLetter and the Queue
//     methods run in that one acknowledgement transaction, so the rows
//     leave the outbox exactly when the checkpoint, the dead letters and
//     the holds' progress are recorded.
//   - SwapLease is a compare-and-swap on (epoch, renewals): it changes
//     nothing when another relay moved first.
//   - CDCReader.BeginMark runs before a replication slot is created and
//     CompleteMark after, so a creation record without a position is a
//     creation that may not have finished (cdc/recovery.go).
//
// The methods change no statement's meaning from what the core ran when
// the statements lived beside their use; the conformance tests
// (store_test.go and the files beside it) run each against a migrated
// PostgreSQL and check its effect on the tables.
package store
